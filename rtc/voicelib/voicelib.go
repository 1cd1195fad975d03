// Package voicelib is the voice library: reference clips uploaded by users (a target voice
// for conversion, a speaker for text to speech), kept in a directory so they survive
// restarts, and served over HTTP at /v1/voices.
package voicelib

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/dsp/wav"
)

// Limits on uploaded clips.
const (
	DefaultMaxBytes   = 16 << 20
	DefaultMaxSeconds = 30.0
	DefaultMinSeconds = 1.0
	maxNameLen        = 100
	maxVoices         = 1000
)

// ErrNotFound is returned for an id the library does not have.
var ErrNotFound = errors.New("no such voice")

// Voice is a library entry's metadata.
type Voice struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
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

	mu     sync.RWMutex
	voices map[string]Voice
}

// idPattern keeps ids to what the library itself makes, so no request can name a path.
var idPattern = regexp.MustCompile(`^v_[0-9a-f]{16}$`)

// ValidID reports whether s has the shape of a library id.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// Open loads (or creates) the library in dir. Damaged entries are skipped with a note in
// the returned warnings, never fatal.
func Open(dir string) (*Library, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("voice library: %w", err)
	}
	l := &Library{dir: dir, MaxBytes: DefaultMaxBytes, MaxSeconds: DefaultMaxSeconds, MinSeconds: DefaultMinSeconds,
		voices: map[string]Voice{}}
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
	return l, warn, nil
}

// Dir is the library's directory.
func (l *Library) Dir() string { return l.dir }

func (l *Library) clipPath(id string) string { return filepath.Join(l.dir, id+".wav") }
func (l *Library) metaPath(id string) string { return filepath.Join(l.dir, id+".json") }

// List returns the voices, oldest first.
func (l *Library) List() []Voice {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]Voice, 0, len(l.voices))
	for _, v := range l.voices {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b Voice) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Get finds a voice by id, or by name when exactly one voice has it.
func (l *Library) Get(idOrName string) (Voice, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if v, ok := l.voices[idOrName]; ok {
		return v, nil
	}
	var found []Voice
	for _, v := range l.voices {
		if v.Name == idOrName {
			found = append(found, v)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return Voice{}, fmt.Errorf("%w: %q", ErrNotFound, idOrName)
	}
	return Voice{}, fmt.Errorf("%d voices are named %q: use an id", len(found), idOrName)
}

// Clip returns a voice's samples (mono) and rate.
func (l *Library) Clip(idOrName string) ([]float32, int, error) {
	v, err := l.Get(idOrName)
	if err != nil {
		return nil, 0, err
	}
	a, err := wav.ReadFile(l.clipPath(v.ID))
	if err != nil {
		return nil, 0, fmt.Errorf("voice %s: %w", v.ID, err)
	}
	return a.Mono(), a.SampleRate, nil
}

// ClipError is a problem with an uploaded clip (the client's fault).
type ClipError struct{ Msg string }

func (e *ClipError) Error() string { return e.Msg }

// Add checks a WAV clip and stores it under a new id. The clip is written first and the
// metadata last, each atomically, so a crash leaves either no voice or a whole one.
func (l *Library) Add(name string, wavData []byte) (Voice, error) {
	name = strings.TrimSpace(name)
	if name == "" || len([]rune(name)) > maxNameLen || strings.ContainsAny(name, "\x00\r\n") {
		return Voice{}, &ClipError{fmt.Sprintf("name must be 1–%d characters on one line", maxNameLen)}
	}
	if int64(len(wavData)) > l.MaxBytes {
		return Voice{}, &ClipError{fmt.Sprintf("clip of %d bytes is over the %d-byte limit", len(wavData), l.MaxBytes)}
	}
	a, err := wav.Read(bytes.NewReader(wavData))
	if err != nil {
		return Voice{}, &ClipError{"file is not a WAV clip we can read: " + err.Error()}
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
	l.mu.RLock()
	n := len(l.voices)
	l.mu.RUnlock()
	if n >= maxVoices {
		return Voice{}, &ClipError{fmt.Sprintf("the library is full (%d voices); delete some first", maxVoices)}
	}
	var rb [8]byte
	rand.Read(rb[:])
	v := Voice{ID: "v_" + hex.EncodeToString(rb[:]), Name: name, SampleRate: a.SampleRate, Seconds: math.Round(secs*100) / 100,
		Created: time.Now().UTC().Truncate(time.Millisecond)}
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
	l.mu.Lock()
	l.voices[v.ID] = v
	l.mu.Unlock()
	return v, nil
}

// Delete removes a voice: metadata first, so a crash in between leaves an orphan clip that
// Open ignores rather than an entry without its clip.
func (l *Library) Delete(id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.voices[id]; !ok {
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
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("voice library: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("voice library: %w", err)
	}
	return nil
}
