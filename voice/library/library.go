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
	"io/fs"
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
//
// Several processes may use one directory at once (servers behind a load balancer on a
// network filesystem): the directory, not memory, is the truth. A voice exists exactly
// while its metadata file does; every read checks the directory (an open and a stat when
// nothing changed, a re-read of its listing when it did), so an upload or a delete by
// another process is seen at the next request. Uploads check the cap and the owner's names and
// write their metadata under an exclusive lock on DIR/voxpipe-library-write.lock, so names
// stay unique per owner and MaxVoices holds across processes; see docs/deploy.md for what
// a network filesystem must provide.
type Library struct {
	dir        string
	MaxBytes   int64
	MaxSeconds float64
	MinSeconds float64
	MaxVoices  int // the cap on stored plus in-flight uploads
	// Log gets the details of failures that clients only see in outline (paths, OS
	// errors). nil: slog.Default().
	Log *slog.Logger

	mu sync.Mutex
	// voices is the directory's voices as last scanned. Metadata is written once and never
	// changed, so an id's entry stays right for as long as its file exists.
	voices map[string]Voice
	// pending holds this process's uploads being written: they count towards MaxVoices and
	// reserve their names, so two uploads here cannot both pass the checks.
	pending map[string]Voice
	scanned dirState        // the directory as of the last scan
	warned  map[string]bool // damaged entries already reported

	commit *sync.Mutex // serializes this process's writers of dir (flock is per open file)
	// held is DIR/voxpipe-library.lock, locked shared while the library is open, so a
	// process that opens the library knows whether another one has it open; write is
	// DIR/voxpipe-library-write.lock, locked exclusively around each commit. Both nil where
	// file locks are not available.
	held, write *os.File
}

// The lock files (see Library). They are not voices and not leftovers: nothing removes them.
const (
	heldLockName  = "voxpipe-library.lock"
	writeLockName = "voxpipe-library-write.lock"
)

// staleAfter is how old a temporary file or an orphan clip must be before Open removes it
// while another process has the library open (it may be that process's upload in progress;
// an upload writes for seconds, not an hour).
const staleAfter = time.Hour

// rescanAfter bounds how long the listing is trusted on the directory's modification time
// alone; settleTime is how far in the past that time must lie to be trusted at all (a
// filesystem's clock ticks coarsely: two changes within one tick leave one time).
const (
	rescanAfter = 5 * time.Second
	settleTime  = 2 * time.Second
)

// dirState is what decides whether the directory changed since a scan.
type dirState struct {
	info   os.FileInfo // the directory's, taken just before the scan's listing
	at     time.Time   // when
	trusty bool        // info's modification time was settled (see settleTime)
}

// commitLocks are the in-process locks of the directories open in this process, by path:
// two Library values on one directory exclude each other like two processes do.
var commitLocks sync.Map // string → *sync.Mutex

// idPattern keeps ids to what the library itself makes, so no request can name a path.
var idPattern = regexp.MustCompile(`^v_[0-9a-f]{16}$`)

// ValidID reports whether s has the shape of a library id.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// Open loads (or creates) the library in dir. Damaged entries are skipped with a note in
// the returned warnings, never fatal. Leftovers of a crash are removed, each with a note:
// temporary files (.tmp-*) and clips without metadata (Add writes the clip before the
// metadata and Delete removes the metadata first, so such a clip is never a voice). When
// another process has the library open (a second server on a shared directory), a leftover
// may be its upload in progress, so only those older than an hour are removed. Close
// releases the library's file locks.
func Open(dir string) (*Library, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("voice library: %w", err)
	}
	l := &Library{dir: dir, MaxBytes: DefaultMaxBytes, MaxSeconds: DefaultMaxSeconds, MinSeconds: DefaultMinSeconds,
		MaxVoices: DefaultMaxVoices, voices: map[string]Voice{}, pending: map[string]Voice{}, warned: map[string]bool{}}
	key := dir
	if abs, err := filepath.Abs(dir); err == nil {
		key = abs
	}
	mu, _ := commitLocks.LoadOrStore(key, new(sync.Mutex))
	l.commit = mu.(*sync.Mutex)
	alone, warn := l.openLocks()
	warn = append(warn, l.removeLeftovers(alone)...)
	if l.held != nil && alone {
		// Others may open it now; they wait for this lock, and then clean only old leftovers.
		if err := lockFile(l.held, false, true); err != nil {
			warn = append(warn, fmt.Sprintf("%s: %v", heldLockName, err))
		}
	}
	l.mu.Lock()
	w, err := l.scanLocked(true)
	l.mu.Unlock()
	if err != nil {
		l.Close()
		return nil, nil, fmt.Errorf("voice library: %w", err)
	}
	return l, append(warn, w...), nil
}

// openLocks opens the lock files and takes the held lock: exclusively when no other process
// has the library open (alone), else shared. Where locks are not available it says so in a
// warning and reports alone false, so nothing that could be another server's is removed.
func (l *Library) openLocks() (alone bool, warn []string) {
	fail := func(err error) (bool, []string) {
		for _, f := range []*os.File{l.held, l.write} {
			if f != nil {
				f.Close()
			}
		}
		l.held, l.write = nil, nil
		return false, []string{fmt.Sprintf("file locks are not available (%v): only this process may use the directory", err)}
	}
	var err error
	if l.held, err = os.OpenFile(filepath.Join(l.dir, heldLockName), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return fail(err)
	}
	if l.write, err = os.OpenFile(filepath.Join(l.dir, writeLockName), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return fail(err)
	}
	switch err := lockFile(l.held, true, false); {
	case err == nil:
		return true, nil
	case !isWouldBlock(err):
		return fail(err)
	}
	if err := lockFile(l.held, false, true); err != nil {
		return fail(err)
	}
	return false, nil
}

// Close releases the library's file locks. The Library must not be used after it.
func (l *Library) Close() error {
	var first error
	for _, f := range []*os.File{l.held, l.write} {
		if f != nil {
			if err := f.Close(); first == nil {
				first = err
			}
		}
	}
	l.held, l.write = nil, nil
	return first
}

// lockWrites takes the library's write lock: this process's, then the file lock that other
// processes take. unlock releases both.
func (l *Library) lockWrites() (unlock func(), err error) {
	l.commit.Lock()
	if l.write != nil {
		if err := lockFile(l.write, true, true); err != nil {
			l.commit.Unlock()
			return nil, fmt.Errorf("voice library: lock %s: %w", writeLockName, err)
		}
	}
	return func() {
		if l.write != nil {
			unlockFile(l.write)
		}
		l.commit.Unlock()
	}, nil
}

// removeLeftovers deletes temporary files and orphan clips (see Open), under the write
// lock: an upload in another process checks that its clip is still there under the same
// lock before it writes the metadata. Unless alone, only leftovers older than staleAfter go.
func (l *Library) removeLeftovers(alone bool) []string {
	unlock, err := l.lockWrites()
	if err != nil {
		return []string{err.Error()}
	}
	defer unlock()
	var warn []string
	remove := func(path, why string) {
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			return // only plain files the library could have written
		}
		if !alone && time.Since(fi.ModTime()) < staleAfter {
			return // perhaps another process's upload in progress
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

// readMeta reads and checks id's metadata file.
func (l *Library) readMeta(id string) (Voice, error) {
	var v Voice
	data, err := os.ReadFile(l.metaPath(id))
	if err == nil {
		err = json.Unmarshal(data, &v)
	}
	if err == nil && v.ID != id {
		err = fmt.Errorf("metadata names id %q", v.ID)
	}
	return v, err
}

// refreshLocked brings the index up to date with the directory (see scanLocked) and logs
// what is wrong with it; l.mu is held. A directory that cannot be read leaves the index as
// it was, so a passing failure of a network filesystem does not empty the listing.
func (l *Library) refreshLocked(force bool) error {
	warn, err := l.scanLocked(force)
	for _, w := range warn {
		l.log().Warn("voice library: damaged entry", "problem", w)
	}
	if err != nil {
		l.log().Warn("voice library: cannot read the directory; serving the last listing", "err", err)
	}
	return err
}

// scanLocked re-reads the directory's listing when it may have changed since the last
// scan (or always, with force): new metadata files are read, vanished ones dropped. It
// returns the problems with entries not reported before. l.mu is held.
func (l *Library) scanLocked(force bool) ([]string, error) {
	now := time.Now()
	// Opened, not just stat'ed: an NFS client revalidates a directory's attributes when it
	// is opened (close-to-open consistency), where a stat may answer from its cache.
	f, err := os.Open(l.dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if s := l.scanned; !force && s.info != nil && s.trusty && now.Sub(s.at) < rescanAfter &&
		os.SameFile(s.info, fi) && fi.ModTime().Equal(s.info.ModTime()) {
		return nil, nil
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	files := make(map[string]bool, len(names))
	for _, n := range names {
		files[n] = true
	}
	var warn []string
	problem := func(name string, err error) {
		if l.warned[name] {
			return
		}
		l.warned[name] = true
		warn = append(warn, fmt.Sprintf("%s: skipped: %v", name, err))
	}
	found := make(map[string]bool, len(names)/2)
	for _, n := range names {
		id, ok := strings.CutSuffix(n, ".json")
		if !ok || !ValidID(id) {
			continue
		}
		if _, ok := l.voices[id]; ok {
			found[id] = true
			continue
		}
		if !files[id+".wav"] {
			// A listing read while files are added may miss one: ask for the clip itself.
			if _, err := os.Lstat(l.clipPath(id)); err != nil {
				problem(n, fmt.Errorf("%w: its clip %s.wav is missing", fs.ErrNotExist, id))
				continue
			}
		}
		v, err := l.readMeta(id)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // deleted since the listing
		case err != nil:
			problem(n, err)
			continue
		}
		delete(l.warned, n)
		l.voices[id] = v
		found[id] = true
	}
	for id := range l.voices {
		if !found[id] {
			delete(l.voices, id)
		}
	}
	l.scanned = dirState{info: fi, at: now, trusty: now.Sub(fi.ModTime()) > settleTime}
	return warn, nil
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
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refreshLocked(false)
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
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refreshLocked(false)
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
		if _, serr := os.Lstat(l.metaPath(v.ID)); errors.Is(serr, fs.ErrNotExist) {
			// Deleted (by this process or another) between the lookup and the read.
			return nil, 0, fmt.Errorf("%w: %q", ErrNotFound, idOrName)
		}
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
	// The clip is written outside the write lock (it is large, and a clip without metadata
	// is no voice); the checks and the metadata, the voice's one moment of existence, are
	// under it.
	if err := writeAtomic(l.clipPath(v.ID), clip.Bytes()); err != nil {
		return Voice{}, err
	}
	if err := l.commitMeta(v); err != nil {
		os.Remove(l.clipPath(v.ID))
		return Voice{}, err
	}
	stored = true
	return v, nil
}

// reserve checks the cap and the name against the directory and this process's uploads in
// progress, and records v as pending, in one step under l.mu. commitMeta checks again
// against the directory under the write lock: uploads in other processes are only seen
// there.
func (l *Library) reserve(v Voice) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refreshLocked(false)
	if n := len(l.voices) + len(l.pending); n >= l.MaxVoices {
		return l.fullError()
	}
	for _, m := range []map[string]Voice{l.voices, l.pending} {
		if err := nameTaken(m, v); err != nil {
			return err
		}
	}
	l.pending[v.ID] = v
	return nil
}

func (l *Library) fullError() error {
	return fmt.Errorf("%w (%d voices): delete some first", ErrFull, l.MaxVoices)
}

// nameTaken reports ErrNameTaken when m holds another voice of v's owner with v's name.
func nameTaken(m map[string]Voice, v Voice) error {
	for _, o := range m {
		if o.ID != v.ID && o.Owner == v.Owner && o.Name == v.Name {
			return fmt.Errorf("%w: you already have a voice named %q (%s): delete it or choose another name",
				ErrNameTaken, v.Name, o.ID)
		}
	}
	return nil
}

// commitMeta writes v's metadata, making it a voice, under the write lock: the directory
// is re-read there, so a voice another process stored in the meantime counts against the
// cap and its name is taken. The clip must still be there: a process that opened the
// library believing itself alone may have removed it as a leftover.
func (l *Library) commitMeta(v Voice) error {
	unlock, err := l.lockWrites()
	if err != nil {
		return err
	}
	defer unlock()
	l.mu.Lock()
	err = l.refreshLocked(true) // a listing from the server, not a cached one
	stored := len(l.voices)
	if err == nil {
		err = nameTaken(l.voices, v)
	}
	l.mu.Unlock()
	switch {
	case err != nil:
		return err
	case stored >= l.MaxVoices:
		return l.fullError()
	}
	if fi, err := os.Lstat(l.clipPath(v.ID)); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("voice library: the clip of %s vanished before its metadata was written: %v", v.ID, err)
	}
	meta, _ := json.MarshalIndent(v, "", "  ")
	return writeAtomic(l.metaPath(v.ID), meta)
}

// Delete removes one of principal's visible voices: metadata first, so a crash in between
// leaves an orphan clip (which Open removes) rather than an entry without its clip. The
// voice is looked up on disk, so one stored by another process can be deleted here; when
// two deletes of one voice race (in one process or two), one succeeds and the other is
// ErrNotFound.
func (l *Library) Delete(principal, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	l.mu.Lock()
	v, ok := l.voices[id]
	l.mu.Unlock()
	if !ok {
		var err error
		if v, err = l.readMeta(id); err != nil {
			return fmt.Errorf("%w: %q", ErrNotFound, id)
		}
	}
	if !visible(v, principal) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	err := os.Remove(l.metaPath(id))
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		l.mu.Lock()
		delete(l.voices, id)
		l.mu.Unlock()
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	case err != nil:
		return err
	}
	os.Remove(l.clipPath(id))
	return nil
}

func writeAtomic(path string, data []byte) error {
	if err := atomicfile.Write(path, data, 0o600, ".tmp-*"); err != nil {
		return fmt.Errorf("voice library: %w", err)
	}
	return nil
}
