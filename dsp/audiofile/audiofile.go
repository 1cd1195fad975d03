// Package audiofile reads audio files of the formats voxpipe accepts as input — WAV, FLAC,
// Ogg Vorbis, Ogg Opus and MP3 — into float32 PCM. The format is detected from the content
// (magic bytes), never from the file name: RIFF/WAVE goes to dsp/wav, "fLaC" to
// github.com/mewkiz/flac, "OggS" to libopusfile (Opus, through gopkg.in/hraban/opus.v2) or to
// github.com/jfreymuth/vorbis (Vorbis) depending on the stream's first packet, and an ID3v2
// tag or an MPEG layer III frame header to github.com/hajimehoshi/go-mp3. Anything else is
// ErrUnknownFormat, whose message lists the accepted formats.
//
// Input is treated as untrusted. Limits bounds what one call may cost: the bytes read, the
// decoded duration and the decoded samples (the memory). Nothing is allocated from a length
// a header claims; the third-party decoders only ever see input that was checked to stay
// within what they handle safely (the Vorbis headers are validated here first: see
// vorbis.go), and a panic inside one of them is turned into an error. A stream that is cut
// off or damaged after audio has been decoded returns the audio before the damage with
// Audio.Truncated set, as dsp/wav does for a short data chunk.
package audiofile

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/voxpipe/voxpipe/dsp/wav"
)

// Format names a detected file format.
type Format string

// The formats Read decodes.
const (
	WAV    Format = "WAV"
	FLAC   Format = "FLAC"
	Vorbis Format = "Ogg Vorbis"
	Opus   Format = "Ogg Opus"
	MP3    Format = "MP3"
)

// Accepted lists the accepted formats for messages.
const Accepted = "WAV, FLAC, Ogg Vorbis, Ogg Opus or MP3"

// Extensions are the file name extensions (lower case) of the accepted formats, for
// callers that must tell a file path from another kind of name (a voice library id).
var Extensions = []string{".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3"}

// HasAudioExt reports whether path ends in one of Extensions (any case).
func HasAudioExt(path string) bool {
	ext := strings.ToLower(filepath.Ext(path))
	for _, e := range Extensions {
		if ext == e {
			return true
		}
	}
	return false
}

var (
	// ErrUnknownFormat: the content is none of the accepted formats.
	ErrUnknownFormat = errors.New("audiofile: not a " + Accepted + " file")
	// ErrUnsupported: an accepted container holding something not decoded here (Ogg FLAC,
	// MPEG layer I/II, 32-bit FLAC, …).
	ErrUnsupported = errors.New("audiofile: unsupported")
	// ErrTooLarge: the input is over Limits.MaxBytes, or decodes to more than
	// Limits.MaxSamples samples.
	ErrTooLarge = errors.New("audiofile: too large")
	// ErrTooLong: the audio is longer than Limits.MaxSeconds.
	ErrTooLong = errors.New("audiofile: too long")
	// ErrCorrupt: the file is of an accepted format but cannot be decoded.
	ErrCorrupt = errors.New("audiofile: corrupt")
)

// Audio is decoded audio: the format it came in, and the samples as dsp/wav gives them
// (interleaved by channel, nominally in −1..1; Truncated when the input ended early or was
// damaged after audio had been decoded, with Data holding the audio before that point).
type Audio struct {
	Format Format
	wav.Audio
}

// Limits bound the cost of one Read. A zero field takes its default.
type Limits struct {
	// MaxBytes is the most input read (default DefaultMaxBytes).
	MaxBytes int64
	// MaxSeconds is the longest audio decoded (default DefaultMaxSeconds).
	MaxSeconds float64
	// MaxSamples is the most samples decoded, counting every channel: the memory bound
	// (4 bytes a sample; default DefaultMaxSamples).
	MaxSamples int
}

// Defaults for untrusted input.
const (
	DefaultMaxBytes   = 16 << 20
	DefaultMaxSeconds = 600.0
	DefaultMaxSamples = 1 << 24 // 64 MiB of float32, what a 16 MiB 8-bit WAV decodes to
)

// FileLimits suit the operator's own files (convert's input, reference clips given on the
// command line): as large as a WAV file can be, a day of audio, 8 GiB of samples.
var FileLimits = Limits{MaxBytes: 4 << 30, MaxSeconds: 24 * 3600, MaxSamples: 1 << 31}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxSeconds <= 0 {
		l.MaxSeconds = DefaultMaxSeconds
	}
	if l.MaxSamples <= 0 {
		l.MaxSamples = DefaultMaxSamples
	}
	return l
}

// maxRate bounds the sample rate of every format (dsp/wav's own bound).
const maxRate = 1 << 24

// ReadFile reads and decodes the audio file at path.
func ReadFile(path string, lim Limits) (*Audio, error) {
	lim = lim.withDefaults()
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audiofile: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > lim.MaxBytes {
		return nil, fmt.Errorf("%w: %s is %d bytes, over the %d-byte limit", ErrTooLarge, path, st.Size(), lim.MaxBytes)
	}
	a, err := Read(f, lim)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return a, nil
}

// Decode decodes an audio file held in memory.
func Decode(data []byte, lim Limits) (*Audio, error) {
	lim = lim.withDefaults()
	if int64(len(data)) > lim.MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrTooLarge, len(data), lim.MaxBytes)
	}
	return Read(bytes.NewReader(data), lim)
}

// peekSize is how much of the stream detection looks at (after any ID3v2 tags).
const peekSize = 64 << 10

// maxID3Tags bounds the ID3v2 tags skipped before the audio.
const maxID3Tags = 16

// Read decodes an audio stream, reading at most lim.MaxBytes (more is ErrTooLarge).
func Read(r io.Reader, lim Limits) (*Audio, error) {
	lim = lim.withDefaults()
	cr := &countingReader{r: r, max: lim.MaxBytes}
	br := bufio.NewReaderSize(cr, peekSize)
	a, err := read(br, lim)
	if cr.over {
		return nil, fmt.Errorf("%w: input is over the %d-byte limit", ErrTooLarge, lim.MaxBytes)
	}
	if err != nil {
		return nil, err
	}
	if a.Channels < 1 || a.SampleRate < 1 || len(a.Data)%a.Channels != 0 {
		// The decoders guarantee this; a broken promise must not reach the callers.
		return nil, fmt.Errorf("%w: %s decoder returned %d samples of %d channels at %d Hz", ErrCorrupt, a.Format, len(a.Data), a.Channels, a.SampleRate)
	}
	return a, nil
}

func read(br *bufio.Reader, lim Limits) (*Audio, error) {
	tags := 0
	for {
		head, err := br.Peek(peekSize)
		if err != nil && err != io.EOF && err != bufio.ErrBufferFull {
			return nil, fmt.Errorf("audiofile: reading: %w", err)
		}
		if len(head) == 0 {
			if tags > 0 {
				return nil, fmt.Errorf("%w: an ID3 tag and no audio after it", ErrCorrupt)
			}
			return nil, fmt.Errorf("%w: the file is empty", ErrUnknownFormat)
		}
		if n, ok, err := id3Size(head); ok || err != nil {
			if err != nil {
				return nil, err
			}
			if tags++; tags > maxID3Tags {
				return nil, fmt.Errorf("%w: more than %d ID3 tags", ErrCorrupt, maxID3Tags)
			}
			if _, err := br.Discard(n); err != nil {
				return nil, fmt.Errorf("%w: ID3 tag of %d bytes is cut off", ErrCorrupt, n)
			}
			continue
		}
		switch {
		case len(head) >= 12 && string(head[8:12]) == "WAVE" &&
			(string(head[0:4]) == "RIFF" || string(head[0:4]) == "RIFX" || string(head[0:4]) == "RF64" || string(head[0:4]) == "BW64"):
			return readWAV(br, lim)
		case bytes.HasPrefix(head, []byte("fLaC")):
			return readFLAC(br, lim)
		case bytes.HasPrefix(head, []byte("OggS")):
			return readOgg(br, head, lim)
		}
		if off, h, ok := findMP3(head, tags > 0); ok {
			if _, err := br.Discard(off); err != nil {
				return nil, fmt.Errorf("audiofile: reading: %w", err)
			}
			return readMP3(br, h, lim)
		}
		if h, ok := parseMPEGHeader(head); ok && h.layer != 3 {
			return nil, fmt.Errorf("%w: MPEG layer %s audio (want layer III, MP3): accepted formats are %s", ErrUnsupported, []string{"", "I", "II"}[h.layer], Accepted)
		}
		if tags > 0 {
			return nil, fmt.Errorf("%w: an ID3 tag followed by no MP3 or FLAC audio", ErrUnknownFormat)
		}
		return nil, fmt.Errorf("%w (it starts with %q)", ErrUnknownFormat, printable(head[:min(len(head), 8)]))
	}
}

// id3Size reports the size of an ID3v2 tag (header, body, footer) at the start of b. ok is
// false when b does not start with one; err is set for a malformed one.
func id3Size(b []byte) (n int, ok bool, err error) {
	if len(b) < 3 || string(b[:3]) != "ID3" {
		return 0, false, nil
	}
	if len(b) < 10 {
		return 0, false, fmt.Errorf("%w: ID3 tag header cut off", ErrCorrupt)
	}
	if b[3] < 2 || b[3] > 4 || b[4] == 0xFF {
		return 0, false, fmt.Errorf("%w: ID3 tag of version 2.%d.%d", ErrCorrupt, b[3], b[4])
	}
	size := 0
	for _, c := range b[6:10] {
		if c >= 0x80 {
			return 0, false, fmt.Errorf("%w: ID3 tag size is not a syncsafe integer", ErrCorrupt)
		}
		size = size<<7 | int(c)
	}
	n = 10 + size
	if b[3] == 4 && b[5]&0x10 != 0 {
		n += 10 // footer
	}
	return n, true, nil
}

func printable(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '.'
		}
		out[i] = c
	}
	return string(out)
}

// countingReader reads at most max bytes; reading past that sets over and fails (decoders
// that swallow read errors, such as libopusfile's, are checked through over).
type countingReader struct {
	r    io.Reader
	n    int64
	max  int64
	over bool
}

var errOverLimit = errors.New("audiofile: input over the byte limit")

func (c *countingReader) Read(p []byte) (int, error) {
	if c.over {
		return 0, errOverLimit
	}
	if left := c.max + 1 - c.n; int64(len(p)) > left {
		p = p[:left]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		c.over = true
		return 0, errOverLimit
	}
	return n, err
}

// sink collects decoded samples within the limits.
type sink struct {
	format     Format
	rate, ch   int
	data       []float32
	maxFrames  int64 // from MaxSeconds
	maxSamples int
	lim        Limits
	truncated  bool
}

// frameSlack lets a stream run over MaxSeconds by up to one codec frame (FLAC's are up to
// 65535) while it decodes: lossy codecs decode a little more than the final length and
// trim it at the end (granule position, encoder padding); finish checks the exact length.
const frameSlack = 1 << 16

func newSink(f Format, rate, ch int, lim Limits) (*sink, error) {
	if rate < 1 || rate > maxRate {
		return nil, fmt.Errorf("%w: %s sample rate %d Hz out of range (1..%d)", ErrCorrupt, f, rate, maxRate)
	}
	if ch < 1 {
		return nil, fmt.Errorf("%w: %s stream of %d channels", ErrCorrupt, f, ch)
	}
	return &sink{format: f, rate: rate, ch: ch, lim: lim, maxSamples: lim.MaxSamples,
		maxFrames: int64(lim.MaxSeconds * float64(rate))}, nil
}

func (s *sink) frames() int64 { return int64(len(s.data) / s.ch) }

// add appends interleaved samples (whole frames), failing once a limit is passed.
func (s *sink) add(x []float32) error {
	if len(s.data)+len(x) > s.maxSamples {
		return s.tooLarge()
	}
	s.data = append(s.data, x...)
	if s.frames() > s.maxFrames+frameSlack {
		return s.tooLong()
	}
	return nil
}

func (s *sink) tooLarge() error {
	return fmt.Errorf("%w: %s audio of %d channels decodes to more than %d samples", ErrTooLarge, s.format, s.ch, s.maxSamples)
}

func (s *sink) tooLong() error {
	return fmt.Errorf("%w: %s audio is longer than the %g s limit", ErrTooLong, s.format, s.lim.MaxSeconds)
}

// cut drops n frames from frame from on.
func (s *sink) cut(from, n int64) {
	from = min(max(from, 0), s.frames())
	n = min(max(n, 0), s.frames()-from)
	ch := int64(s.ch)
	s.data = append(s.data[:from*ch], s.data[(from+n)*ch:]...)
}

// trimTo keeps the first n frames.
func (s *sink) trimTo(n int64) {
	if n >= 0 && n < s.frames() {
		s.data = s.data[:n*int64(s.ch)]
	}
}

// finish checks the final length and returns the audio.
func (s *sink) finish() (*Audio, error) {
	if s.frames() > s.maxFrames {
		return nil, s.tooLong()
	}
	return &Audio{Format: s.format, Audio: wav.Audio{SampleRate: s.rate, Channels: s.ch, Data: s.data, Truncated: s.truncated}}, nil
}

// stop decides how an error part way through ends the decode. A limit error, or any error
// before audio was decoded, stands; after audio, the audio so far is the result (nil
// error, truncated set), like dsp/wav's reading of a cut-off file.
func (s *sink) stop(err error) error {
	if errors.Is(err, ErrTooLarge) || errors.Is(err, ErrTooLong) || errors.Is(err, errOverLimit) || len(s.data) == 0 {
		return err
	}
	s.truncated = true
	return nil
}

// try runs a step of a third-party decoder, turning a panic into an ErrCorrupt error.
func try(f Format, step func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: the %s decoder failed on this input (%v)", ErrCorrupt, f, p)
		}
	}()
	return step()
}

func readWAV(r io.Reader, lim Limits) (*Audio, error) {
	w, err := wav.Read(r)
	if err != nil {
		if errors.Is(err, errOverLimit) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	s, err := newSink(WAV, w.SampleRate, w.Channels, lim)
	if err != nil {
		return nil, err
	}
	if len(w.Data) > s.maxSamples {
		return nil, s.tooLarge()
	}
	s.data, s.truncated = w.Data, w.Truncated
	return s.finish()
}
