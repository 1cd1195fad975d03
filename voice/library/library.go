// Package voicelib is the voice library: reference clips uploaded by users (a target voice
// for conversion, a speaker for text to speech), kept in a directory so they survive
// restarts, and served over HTTP at /v1/voices.
package library

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/internal/atomicfile"
	"github.com/voxpipe/voxpipe/server/auth"
)

// Limits on uploaded clips.
const (
	DefaultMaxBytes   = 16 << 20
	DefaultMaxSeconds = 30.0
	DefaultMinSeconds = 1.0
	DefaultMaxVoices  = 1000
	maxNameLen        = 100
	// A clip's rate must lie in [MinRate, MaxRate] and convert to every rate the models
	// embed clips at (resampleTargets): odd rates such as 44101 Hz make ratios the
	// resampler refuses, and would fail every synthesis with that voice much later.
	MinRate = 8000
	MaxRate = 192000
)

// resampleTargets are the rates models resample reference clips to: MeanVC2's 16 kHz, a
// 24 kHz codec, and MioCodec's 44.1 kHz.
var resampleTargets = []int{16000, 24000, 44100}

var (
	// ErrNotFound is returned for a voice the library does not have, or that belongs to
	// another principal: the two look the same, so ids cannot be probed.
	ErrNotFound = errors.New("no such voice")
	// ErrNameTaken is returned when the owner already has a voice with the name.
	ErrNameTaken = errors.New("name taken")
	// ErrFull is returned when the library holds MaxVoices voices.
	ErrFull = errors.New("voice library is full")
	// ErrUnreadable is returned (wrapped by *UnreadableError) for a voice whose stored clip
	// cannot be read.
	ErrUnreadable = errors.New("clip is unreadable")
)

// Voice is a library entry's metadata. Owner is the principal that uploaded it
// (auth.PrincipalOf; "" for entries made before voices had owners, which only Admin sees).
// It is shown to clients as is: a principal is derived from a hash of its key, not the key,
// and a client only ever sees its own voices, so it only learns its own principal.
type Voice struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Owner      string    `json:"owner,omitempty"`
	SampleRate int       `json:"sample_rate"`
	Seconds    float64   `json:"seconds"`
	Created    time.Time `json:"created"`
}

// Library stores clips as DIR/ID.wav (mono 16-bit) with DIR/ID.json metadata.
type Library struct {
	dir        string
	MaxBytes   int64
	MaxSeconds float64
	MinSeconds float64
	MaxVoices  int // the cap on stored plus in-flight uploads
	// Log gets the details of failures that clients only see in outline (paths, OS
	// errors). nil: slog.Default().
	Log *slog.Logger

	mu     sync.RWMutex
	voices map[string]Voice
	// pending holds uploads being written: they count towards MaxVoices and reserve their
	// names, so the checks and the insert are one atomic step even though the files are
	// written outside the lock.
	pending map[string]Voice
}

// idPattern keeps ids to what the library itself makes, so no request can name a path.
var idPattern = regexp.MustCompile(`^v_[0-9a-f]{16}$`)

// ValidID reports whether s has the shape of a library id.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// Open loads (or creates) the library in dir. Damaged entries are skipped with a note in
// the returned warnings, never fatal. Leftovers of a crash are removed, each with a note:
// temporary files (.tmp-*) and clips without metadata (Add writes the clip before the
// metadata and Delete removes the metadata first, so such a clip is never a voice). Open
// runs at startup, before any Add, so nothing it removes can be an upload in progress.
func Open(dir string) (*Library, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("voice library: %w", err)
	}
	l := &Library{dir: dir, MaxBytes: DefaultMaxBytes, MaxSeconds: DefaultMaxSeconds, MinSeconds: DefaultMinSeconds,
		MaxVoices: DefaultMaxVoices, voices: map[string]Voice{}, pending: map[string]Voice{}}
	metas, err := filepath.Glob(filepath.Join(dir, "v_*.json"))
	if err != nil {
		return nil, nil, err
	}
	var warn []string
	for _, m := range metas {
		var v Voice
		data, err := os.ReadFile(m)
		if err == nil {
			err = json.Unmarshal(data, &v)
		}
		if err == nil && (!ValidID(v.ID) || filepath.Base(m) != v.ID+".json") {
			err = fmt.Errorf("metadata names id %q", v.ID)
		}
		if err == nil {
			_, err = os.Stat(l.clipPath(v.ID))
		}
		if err != nil {
			warn = append(warn, fmt.Sprintf("%s: skipped: %v", filepath.Base(m), err))
			continue
		}
		l.voices[v.ID] = v
	}
	warn = append(warn, l.removeLeftovers()...)
	return l, warn, nil
}

// removeLeftovers deletes temporary files and orphan clips (see Open).
func (l *Library) removeLeftovers() []string {
	var warn []string
	remove := func(path, why string) {
		if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
			return // only plain files the library could have written
		}
		if err := os.Remove(path); err != nil {
			warn = append(warn, fmt.Sprintf("%s: %s, could not remove it: %v", filepath.Base(path), why, err))
			return
		}
		warn = append(warn, fmt.Sprintf("%s: removed (%s)", filepath.Base(path), why))
	}
	tmps, _ := filepath.Glob(filepath.Join(l.dir, ".tmp-*"))
	for _, p := range tmps {
		remove(p, "temporary file left by an interrupted write")
	}
	clips, _ := filepath.Glob(filepath.Join(l.dir, "v_*.wav"))
	for _, p := range clips {
		id := strings.TrimSuffix(filepath.Base(p), ".wav")
		if !ValidID(id) {
			continue
		}
		// A clip whose metadata exists but is damaged stays: the operator may repair it.
		if _, err := os.Lstat(l.metaPath(id)); os.IsNotExist(err) {
			remove(p, "clip without metadata left by an interrupted upload or delete")
		}
	}
	return warn
}

// Dir is the library's directory.
func (l *Library) Dir() string { return l.dir }

func (l *Library) clipPath(id string) string { return filepath.Join(l.dir, id+".wav") }
func (l *Library) metaPath(id string) string { return filepath.Join(l.dir, id+".json") }

func (l *Library) log() *slog.Logger {
	if l.Log != nil {
		return l.Log
	}
	return slog.Default()
}

// visible reports whether principal may see v. An empty principal sees nothing: callers
// that act for the server itself pass auth.Admin explicitly.
func visible(v Voice, principal string) bool {
	return principal != "" && auth.CanSee(v.Owner, principal)
}

// List returns the voices principal can see, oldest first.
func (l *Library) List(principal string) []Voice {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]Voice, 0, len(l.voices))
	for _, v := range l.voices {
		if visible(v, principal) {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b Voice) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// owns reports whether v is principal's own; legacy voices (no owner) are the admin's.
func owns(v Voice, principal string) bool {
	return principal != "" && (v.Owner == principal || principal == auth.Admin && v.Owner == "")
}

// Get finds one of principal's visible voices by id, or by name. A name means the caller's
// own voice when it has one (names are unique per owner), else the only visible voice with
// that name: so a client's upload can never make the admin's names (such as the server's
// default voice) ambiguous. Another principal's voice is ErrNotFound, like a missing one.
func (l *Library) Get(principal, idOrName string) (Voice, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if v, ok := l.voices[idOrName]; ok && visible(v, principal) {
		return v, nil
	}
	var own, found []Voice
	for _, v := range l.voices {
		if v.Name == idOrName && visible(v, principal) {
			found = append(found, v)
			if owns(v, principal) {
				own = append(own, v)
			}
		}
	}
	if len(own) > 0 {
		found = own // more than one only among legacy voices
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return Voice{}, fmt.Errorf("%w: %q", ErrNotFound, idOrName)
	}
	return Voice{}, fmt.Errorf("%d voices are named %q: use an id", len(found), idOrName)
}

// UnreadableError is a voice whose stored clip cannot be read. Its message names the voice
// only: the cause (an OS error with a server path) is logged and reachable with
// errors.Unwrap, never part of the text a client may be shown.
type UnreadableError struct {
	ID    string
	Cause error
}

func (e *UnreadableError) Error() string   { return fmt.Sprintf("voice %s: %v", e.ID, ErrUnreadable) }
func (e *UnreadableError) Unwrap() []error { return []error{ErrUnreadable, e.Cause} }

// Clip returns the samples (mono) and rate of one of principal's visible voices.
func (l *Library) Clip(principal, idOrName string) ([]float32, int, error) {
	v, err := l.Get(principal, idOrName)
	if err != nil {
		return nil, 0, err
	}
	a, err := wav.ReadFile(l.clipPath(v.ID))
	if err != nil {
		l.log().Error("voice library: clip is unreadable", "voice", v.ID, "err", err)
		return nil, 0, &UnreadableError{ID: v.ID, Cause: err}
	}
	return a.Mono(), a.SampleRate, nil
}

// ClipError is a problem with an uploaded clip (the client's fault).
type ClipError struct{ Msg string }

func (e *ClipError) Error() string { return e.Msg }

// checkRate accepts rates every model can resample from (see MinRate).
func checkRate(rate int) error {
	ok := rate >= MinRate && rate <= MaxRate
	for _, to := range resampleTargets {
		if !ok {
			break
		}
		_, err := dsp.NewResampler(rate, to)
		ok = err == nil
	}
	if !ok {
		return &ClipError{fmt.Sprintf("sample rate %d Hz is not supported: use a standard rate from %d to %d Hz (such as 16000, 44100 or 48000)",
			rate, MinRate, MaxRate)}
	}
	return nil
}

// Add checks an uploaded clip and stores it under a new id, owned by owner. The clip may be
// any format dsp/audiofile reads (WAV, FLAC, Ogg Vorbis, Ogg Opus, MP3: detected from the
// content, not the name); it is stored as what the rest of the server reads, a mono 16-bit
// WAV at the clip's own rate, and the uploaded bytes are not kept. The owner's voices must
// have distinct names (ErrNameTaken). The clip is written first and the metadata last,
// each atomically, so a crash leaves either no voice or a whole one (plus at most an orphan
// clip, which Open removes).
func (l *Library) Add(owner, name string, data []byte) (Voice, error) {
	if owner == "" {
		return Voice{}, errors.New("voice library: a voice needs an owner")
	}
	name = strings.TrimSpace(name)
	if name == "" || len([]rune(name)) > maxNameLen || strings.ContainsAny(name, "\x00\r\n") {
		return Voice{}, &ClipError{fmt.Sprintf("name must be 1–%d characters on one line", maxNameLen)}
	}
	if int64(len(data)) > l.MaxBytes {
		return Voice{}, &ClipError{fmt.Sprintf("clip of %d bytes is over the %d-byte limit", len(data), l.MaxBytes)}
	}
	// Decoding stops at the duration limit, so a long or hostile file costs no more than an
	// accepted one.
	a, err := audiofile.Decode(data, audiofile.Limits{MaxBytes: l.MaxBytes, MaxSeconds: l.MaxSeconds})
	switch {
	case errors.Is(err, audiofile.ErrTooLong):
		return Voice{}, &ClipError{fmt.Sprintf("clip is longer than %.0f s: the limit is %.0f s", l.MaxSeconds, l.MaxSeconds)}
	case errors.Is(err, audiofile.ErrTooLarge):
		return Voice{}, &ClipError{"clip decodes to too much audio (too many channels or too high a rate for its length): " + err.Error()}
	case errors.Is(err, audiofile.ErrUnknownFormat):
		return Voice{}, &ClipError{"file is not a " + audiofile.Accepted + " clip"}
	case err != nil:
		return Voice{}, &ClipError{"clip cannot be read: " + err.Error()}
	}
	if err := checkRate(a.SampleRate); err != nil {
		return Voice{}, err
	}
	mono := a.Mono()
	secs := float64(len(mono)) / float64(a.SampleRate)
	switch {
	case secs > l.MaxSeconds:
		return Voice{}, &ClipError{fmt.Sprintf("clip is %.1f s long; the limit is %.0f s", secs, l.MaxSeconds)}
	case secs < l.MinSeconds:
		return Voice{}, &ClipError{fmt.Sprintf("clip is %.2f s long; at least %.0f s of speech is needed", secs, l.MinSeconds)}
	}
	var peak float64
	for _, v := range mono {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return Voice{}, &ClipError{"clip has NaN or infinite samples"}
		}
		peak = max(peak, math.Abs(float64(v)))
	}
	if peak < 1e-3 {
		return Voice{}, &ClipError{"clip is silent"}
	}
	var rb [8]byte
	rand.Read(rb[:])
	v := Voice{ID: "v_" + hex.EncodeToString(rb[:]), Name: name, Owner: owner, SampleRate: a.SampleRate,
		Seconds: math.Round(secs*100) / 100, Created: time.Now().UTC().Truncate(time.Millisecond)}
	if err := l.reserve(v); err != nil {
		return Voice{}, err
	}
	stored := false
	defer func() {
		l.mu.Lock()
		delete(l.pending, v.ID)
		if stored {
			l.voices[v.ID] = v
		}
		l.mu.Unlock()
	}()
	var clip bytes.Buffer
	if err := wav.Write(&clip, mono, a.SampleRate, 1); err != nil {
		return Voice{}, err
	}
	if err := writeAtomic(l.clipPath(v.ID), clip.Bytes()); err != nil {
		return Voice{}, err
	}
	meta, _ := json.MarshalIndent(v, "", "  ")
	if err := writeAtomic(l.metaPath(v.ID), meta); err != nil {
		os.Remove(l.clipPath(v.ID))
		return Voice{}, err
	}
	stored = true
	return v, nil
}

// reserve checks the cap and the name and records v as pending, in one step under the lock.
func (l *Library) reserve(v Voice) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.voices) + len(l.pending); n >= l.MaxVoices {
		return fmt.Errorf("%w (%d voices): delete some first", ErrFull, l.MaxVoices)
	}
	for _, m := range []map[string]Voice{l.voices, l.pending} {
		for _, o := range m {
			if o.Owner == v.Owner && o.Name == v.Name {
				return fmt.Errorf("%w: you already have a voice named %q (%s): delete it or choose another name",
					ErrNameTaken, v.Name, o.ID)
			}
		}
	}
	l.pending[v.ID] = v
	return nil
}

// Delete removes one of principal's visible voices: metadata first, so a crash in between
// leaves an orphan clip (which Open removes) rather than an entry without its clip.
func (l *Library) Delete(principal, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.voices[id]; !ok || !visible(v, principal) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err := os.Remove(l.metaPath(id)); err != nil && !os.IsNotExist(err) {
		return err
	}
	os.Remove(l.clipPath(id))
	delete(l.voices, id)
	return nil
}

func writeAtomic(path string, data []byte) error {
	if err := atomicfile.Write(path, data, 0o600, ".tmp-*"); err != nil {
		return fmt.Errorf("voice library: %w", err)
	}
	return nil
}
