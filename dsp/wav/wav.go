// Package wav reads and writes RIFF/WAVE audio files.
//
// Read accepts integer PCM of 1–32 bits (8-bit unsigned, wider signed, in 8/16/24/32-bit
// containers), IEEE float of 32 or 64 bits, and WAVE_FORMAT_EXTENSIBLE wrapping either, with
// any number of channels. Chunks other than "fmt " and "data" are skipped. Input is treated
// as untrusted: header fields are validated, and nothing is allocated for data that is not
// actually there.
//
// Truncated data: if the data chunk declares more bytes than the stream holds (a recording
// cut off), Read returns the whole frames that are present and sets Audio.Truncated rather
// than failing; a data size of 0xFFFFFFFF (left by streaming writers that never patched it)
// means "until the end of the stream" and is not flagged. A file cut anywhere before the
// audio data starts is an error. Chunks after the data chunk are not read.
//
// Write and Writer produce 16-bit PCM.
package wav

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

// Audio is decoded audio.
type Audio struct {
	SampleRate int
	Channels   int
	// Data holds the samples, interleaved by channel, scaled to −1..1 for integer formats
	// (float files are passed through unchanged and may exceed that range).
	Data []float32

	// BitsPerSample is the stored sample width (the container width for integer PCM).
	BitsPerSample int
	// Float reports an IEEE float source.
	Float bool
	// Truncated reports that the data chunk declared more bytes than the stream held.
	Truncated bool
}

// Frames is the number of samples per channel.
func (a *Audio) Frames() int {
	if a.Channels <= 0 {
		return 0
	}
	return len(a.Data) / a.Channels
}

// Duration is the length of the audio.
func (a *Audio) Duration() time.Duration {
	if a.SampleRate <= 0 {
		return 0
	}
	return time.Duration(int64(a.Frames()) * int64(time.Second) / int64(a.SampleRate))
}

// Mono returns the audio averaged over channels. For mono audio it returns Data itself.
func (a *Audio) Mono() []float32 {
	if a.Channels <= 1 {
		return a.Data
	}
	n := a.Frames()
	out := make([]float32, n)
	scale := 1 / float32(a.Channels)
	for i := range out {
		var s float32
		for _, v := range a.Data[i*a.Channels : (i+1)*a.Channels] {
			s += v
		}
		out[i] = s * scale
	}
	return out
}

const (
	formatPCM        = 0x0001
	formatFloat      = 0x0003
	formatExtensible = 0xFFFE

	maxFmtSize    = 4096    // a fmt chunk is 16, 18 or 40 bytes in practice
	maxChunks     = 4096    // chunks skipped before the data chunk
	maxSampleRate = 1 << 24 // 16.7 MHz
	readBlock     = 1 << 16
	// unknownSize is what streaming writers leave in size fields they never patch.
	unknownSize = 0xFFFFFFFF
)

// The 14 bytes that follow the 2-byte format code in a KSDATAFORMAT_SUBTYPE GUID.
var guidSuffix = []byte{0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71}

type format struct {
	tag        uint16
	channels   int
	rate       int
	blockAlign int
	bits       int // container bits per sample
	float      bool
}

// ReadFile reads the WAV file at path.
func ReadFile(path string) (*Audio, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("wav: %w", err)
	}
	defer f.Close()
	a, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return a, nil
}

// Read decodes a WAV stream. For untrusted input of unknown size, wrap r in an
// io.LimitReader: memory use is proportional to the data actually read.
func Read(r io.Reader) (*Audio, error) {
	var hdr [12]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("wav: reading RIFF header: %w", eofAsUnexpected(err))
	}
	switch string(hdr[0:4]) {
	case "RIFF":
	case "RIFX":
		return nil, errors.New("wav: big-endian RIFX files are not supported")
	case "RF64", "BW64":
		return nil, fmt.Errorf("wav: %s (64-bit RIFF) files are not supported", hdr[0:4])
	default:
		return nil, fmt.Errorf("wav: not a RIFF file (starts with %q)", hdr[0:4])
	}
	if string(hdr[8:12]) != "WAVE" {
		return nil, fmt.Errorf("wav: RIFF form type is %q, not WAVE", hdr[8:12])
	}
	// The RIFF size is ignored: writers often get it wrong, and the chunks are checked anyway.

	var fm *format
	for chunks := 0; ; chunks++ {
		if chunks >= maxChunks {
			return nil, fmt.Errorf("wav: no data chunk within the first %d chunks", maxChunks)
		}
		var ch [8]byte
		if _, err := io.ReadFull(r, ch[:]); err != nil {
			if err == io.EOF {
				if fm == nil {
					return nil, errors.New("wav: no fmt chunk")
				}
				return nil, errors.New("wav: no data chunk")
			}
			return nil, fmt.Errorf("wav: reading chunk header: %w", eofAsUnexpected(err))
		}
		id := string(ch[0:4])
		size := binary.LittleEndian.Uint32(ch[4:8])
		switch id {
		case "fmt ":
			if fm != nil {
				return nil, errors.New("wav: two fmt chunks")
			}
			if size < 16 || size > maxFmtSize {
				return nil, fmt.Errorf("wav: fmt chunk of %d bytes, want 16..%d", size, maxFmtSize)
			}
			buf := make([]byte, size)
			if _, err := io.ReadFull(r, buf); err != nil {
				return nil, fmt.Errorf("wav: reading fmt chunk: %w", eofAsUnexpected(err))
			}
			if size&1 == 1 {
				if _, err := io.ReadFull(r, make([]byte, 1)); err != nil {
					return nil, errors.New("wav: no data chunk")
				}
			}
			f, err := parseFmt(buf)
			if err != nil {
				return nil, err
			}
			fm = f
		case "data":
			if fm == nil {
				return nil, errors.New("wav: data chunk before fmt chunk")
			}
			return readData(r, fm, size)
		default:
			skip := int64(size) + int64(size&1)
			n, err := io.CopyN(io.Discard, r, skip)
			if err != nil {
				// A missing pad byte after the last chunk is tolerated by readers; here
				// we still need a data chunk after it, so any shortfall is an error.
				return nil, fmt.Errorf("wav: chunk %q declares %d bytes, only %d present: %w",
					printable(id), size, n, io.ErrUnexpectedEOF)
			}
		}
	}
}

func printable(id string) string {
	b := []byte(id)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}

func eofAsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func parseFmt(b []byte) (*format, error) {
	le := binary.LittleEndian
	f := &format{
		tag:        le.Uint16(b[0:]),
		channels:   int(le.Uint16(b[2:])),
		rate:       int(le.Uint32(b[4:])),
		blockAlign: int(le.Uint16(b[12:])),
		bits:       int(le.Uint16(b[14:])),
	}
	code := f.tag
	if f.tag == formatExtensible {
		if len(b) < 40 {
			return nil, fmt.Errorf("wav: WAVE_FORMAT_EXTENSIBLE fmt chunk of %d bytes, want 40", len(b))
		}
		if cb := le.Uint16(b[16:]); cb < 22 {
			return nil, fmt.Errorf("wav: WAVE_FORMAT_EXTENSIBLE extension of %d bytes, want 22", cb)
		}
		valid := int(le.Uint16(b[18:]))
		if valid > f.bits {
			return nil, fmt.Errorf("wav: %d valid bits in a %d-bit container", valid, f.bits)
		}
		if !bytes.Equal(b[26:40], guidSuffix) {
			return nil, fmt.Errorf("wav: WAVE_FORMAT_EXTENSIBLE subformat % x is not a standard format GUID", b[24:40])
		}
		code = le.Uint16(b[24:])
	}
	switch code {
	case formatPCM:
		if f.bits < 1 || f.bits > 32 {
			return nil, fmt.Errorf("wav: %d-bit PCM not supported (1..32 bits)", f.bits)
		}
		f.bits = (f.bits + 7) / 8 * 8 // samples sit left-justified in whole bytes
	case formatFloat:
		if f.bits != 32 && f.bits != 64 {
			return nil, fmt.Errorf("wav: %d-bit float not supported (32 or 64 bits)", f.bits)
		}
		f.float = true
	default:
		return nil, fmt.Errorf("wav: format tag %#04x (%s) not supported: want PCM, IEEE float or extensible", code, formatName(code))
	}
	if f.channels < 1 {
		return nil, errors.New("wav: fmt chunk has 0 channels")
	}
	if f.rate < 1 || f.rate > maxSampleRate {
		return nil, fmt.Errorf("wav: sample rate %d Hz out of range (1..%d)", f.rate, maxSampleRate)
	}
	if want := f.channels * f.bits / 8; f.blockAlign != want {
		return nil, fmt.Errorf("wav: block align %d, want %d for %d channels of %d bits", f.blockAlign, want, f.channels, f.bits)
	}
	return f, nil
}

func formatName(code uint16) string {
	switch code {
	case 0x0002:
		return "MS ADPCM"
	case 0x0006:
		return "A-law"
	case 0x0007:
		return "µ-law"
	case 0x0011:
		return "IMA ADPCM"
	case 0x0055:
		return "MP3"
	case 0x0000:
		return "unknown"
	}
	return "unsupported"
}

func readData(r io.Reader, f *format, size uint32) (*Audio, error) {
	a := &Audio{SampleRate: f.rate, Channels: f.channels, BitsPerSample: f.bits, Float: f.float}
	bps := f.bits / 8
	// Capacity from the declared size, bounded so a lying header cannot allocate much.
	declaredSamples := int64(size) / int64(bps)
	a.Data = make([]float32, 0, min(declaredSamples, 1<<20))
	block := readBlock / f.blockAlign * f.blockAlign
	if block == 0 {
		block = f.blockAlign
	}
	buf := make([]byte, block)
	left := int64(size)
	for left > 0 {
		want := min(int64(block), left)
		n, err := io.ReadFull(r, buf[:want])
		whole := n / f.blockAlign * f.blockAlign
		a.Data = decode(a.Data, buf[:whole], f)
		left -= int64(n)
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				// Declared size beyond the end of the stream: keep the whole frames.
				a.Truncated = size != unknownSize || n%f.blockAlign != 0
				return a, nil
			}
			return nil, fmt.Errorf("wav: reading data: %w", err)
		}
	}
	if size%uint32(f.blockAlign) != 0 {
		// A partial frame at the end of a complete chunk: dropped.
		a.Truncated = true
	}
	return a, nil
}

// decode appends the samples in b (whole frames) to dst.
func decode(dst []float32, b []byte, f *format) []float32 {
	le := binary.LittleEndian
	switch {
	case f.float && f.bits == 32:
		for i := 0; i+4 <= len(b); i += 4 {
			dst = append(dst, math.Float32frombits(le.Uint32(b[i:])))
		}
	case f.float:
		for i := 0; i+8 <= len(b); i += 8 {
			dst = append(dst, float32(math.Float64frombits(le.Uint64(b[i:]))))
		}
	case f.bits == 8:
		for _, v := range b {
			dst = append(dst, float32(int(v)-128)*(1.0/128))
		}
	case f.bits == 16:
		for i := 0; i+2 <= len(b); i += 2 {
			dst = append(dst, float32(int16(le.Uint16(b[i:])))*(1.0/32768))
		}
	case f.bits == 24:
		for i := 0; i+3 <= len(b); i += 3 {
			v := int32(uint32(b[i])<<8|uint32(b[i+1])<<16|uint32(b[i+2])<<24) >> 8
			dst = append(dst, float32(v)*(1.0/8388608))
		}
	case f.bits == 32:
		for i := 0; i+4 <= len(b); i += 4 {
			dst = append(dst, float32(float64(int32(le.Uint32(b[i:])))*(1.0/2147483648)))
		}
	}
	return dst
}

// pcm16 converts a sample in −1..1 to 16-bit PCM, clipping and rounding to nearest;
// NaN becomes 0.
func pcm16(v float32) int16 {
	x := float64(v) * 32768
	switch {
	case x >= 32767:
		return 32767
	case x <= -32768:
		return -32768
	case x != x:
		return 0
	}
	return int16(math.Round(x))
}

func checkParams(rate, channels int) error {
	if rate < 1 || rate > maxSampleRate {
		return fmt.Errorf("wav: write: sample rate %d Hz out of range (1..%d)", rate, maxSampleRate)
	}
	if channels < 1 || channels > math.MaxUint16/2 {
		return fmt.Errorf("wav: write: %d channels out of range (1..%d)", channels, math.MaxUint16/2)
	}
	return nil
}

// header returns a 44-byte canonical 16-bit PCM header for dataBytes of data.
func header(rate, channels int, dataBytes uint32) []byte {
	h := make([]byte, 44)
	le := binary.LittleEndian
	copy(h[0:], "RIFF")
	riff := uint32(unknownSize)
	if dataBytes != unknownSize {
		riff = 36 + dataBytes
	}
	le.PutUint32(h[4:], riff)
	copy(h[8:], "WAVEfmt ")
	le.PutUint32(h[16:], 16)
	le.PutUint16(h[20:], formatPCM)
	le.PutUint16(h[22:], uint16(channels))
	le.PutUint32(h[24:], uint32(rate))
	le.PutUint32(h[28:], uint32(min(uint64(rate)*uint64(channels)*2, math.MaxUint32)))
	le.PutUint16(h[32:], uint16(channels*2))
	le.PutUint16(h[34:], 16)
	copy(h[36:], "data")
	le.PutUint32(h[40:], dataBytes)
	return h
}

const maxDataBytes = math.MaxUint32 - 36 - 1 // RIFF size must fit, and not be "unknown"

// Write writes samples (interleaved, −1..1) as a 16-bit PCM WAV file; values outside the
// range are clipped.
func Write(w io.Writer, samples []float32, rate, channels int) error {
	if err := checkParams(rate, channels); err != nil {
		return err
	}
	if len(samples)%channels != 0 {
		return fmt.Errorf("wav: write: %d samples is not a whole number of %d-channel frames", len(samples), channels)
	}
	if int64(len(samples))*2 > maxDataBytes {
		return fmt.Errorf("wav: write: %d samples exceed the 4 GiB WAV limit", len(samples))
	}
	if _, err := w.Write(header(rate, channels, uint32(len(samples)*2))); err != nil {
		return fmt.Errorf("wav: write: %w", err)
	}
	buf := make([]byte, 2*min(len(samples), readBlock))
	for len(samples) > 0 {
		n := min(len(samples), readBlock)
		for i, v := range samples[:n] {
			binary.LittleEndian.PutUint16(buf[2*i:], uint16(pcm16(v)))
		}
		if _, err := w.Write(buf[:2*n]); err != nil {
			return fmt.Errorf("wav: write: %w", err)
		}
		samples = samples[n:]
	}
	return nil
}

// WriteFile writes samples as a 16-bit PCM WAV file at path.
func WriteFile(path string, samples []float32, rate, channels int) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("wav: %w", err)
	}
	if err := Write(f, samples, rate, channels); err != nil {
		f.Close()
		return fmt.Errorf("%w (file %s)", err, path)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("wav: %w", err)
	}
	return nil
}

// Writer writes a 16-bit PCM WAV stream of unknown length: the header is written first with
// the sizes marked unknown (0xFFFFFFFF, which Read and common tools accept, so an
// interrupted file stays readable), and Close patches them.
type Writer struct {
	ws        io.WriteSeeker
	start     int64
	channels  int
	dataBytes int64
	buf       []byte
	err       error
	closed    bool
}

// NewWriter writes a WAV header at ws's current position.
func NewWriter(ws io.WriteSeeker, rate, channels int) (*Writer, error) {
	if err := checkParams(rate, channels); err != nil {
		return nil, err
	}
	start, err := ws.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, fmt.Errorf("wav: writer: %w", err)
	}
	if _, err := ws.Write(header(rate, channels, unknownSize)); err != nil {
		return nil, fmt.Errorf("wav: writer: %w", err)
	}
	return &Writer{ws: ws, start: start, channels: channels}, nil
}

// Write appends samples (interleaved, whole frames, −1..1, clipped). It reuses an internal
// buffer, so steady-state writes of a fixed size do not allocate.
func (w *Writer) Write(samples []float32) error {
	if w.closed {
		return errors.New("wav: writer: write after Close")
	}
	if w.err != nil {
		return w.err
	}
	if len(samples)%w.channels != 0 {
		return fmt.Errorf("wav: writer: %d samples is not a whole number of %d-channel frames", len(samples), w.channels)
	}
	if w.dataBytes+int64(len(samples))*2 > maxDataBytes {
		w.err = errors.New("wav: writer: data exceeds the 4 GiB WAV limit")
		return w.err
	}
	if cap(w.buf) < 2*len(samples) {
		w.buf = make([]byte, 2*len(samples))
	}
	b := w.buf[:2*len(samples)]
	for i, v := range samples {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(pcm16(v)))
	}
	if _, err := w.ws.Write(b); err != nil {
		w.err = fmt.Errorf("wav: writer: %w", err)
		return w.err
	}
	w.dataBytes += int64(len(b))
	return nil
}

// Close patches the RIFF and data sizes and leaves ws positioned after the data. It does
// not close ws.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	if w.err != nil {
		return w.err
	}
	var b [4]byte
	patch := func(at int64, v uint32) error {
		if _, err := w.ws.Seek(w.start+at, io.SeekStart); err != nil {
			return err
		}
		binary.LittleEndian.PutUint32(b[:], v)
		_, err := w.ws.Write(b[:])
		return err
	}
	if err := patch(4, uint32(36+w.dataBytes)); err != nil {
		return fmt.Errorf("wav: writer: patching sizes: %w", err)
	}
	if err := patch(40, uint32(w.dataBytes)); err != nil {
		return fmt.Errorf("wav: writer: patching sizes: %w", err)
	}
	if _, err := w.ws.Seek(w.start+44+w.dataBytes, io.SeekStart); err != nil {
		return fmt.Errorf("wav: writer: %w", err)
	}
	return nil
}
