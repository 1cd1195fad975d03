// Package audioout turns synthesized float audio into the byte formats clients ask for:
// 16-bit little-endian PCM, G.711 μ-law, Ogg Opus, MP3 and FLAC, at any of the usual sample rates,
// resampling from the synthesizer's rate as the audio streams.
package audioout

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"gopkg.in/hraban/opus.v2"

	"github.com/voxpipe/voxpipe/dsp"
)

// Encodings a client may ask for.
const (
	PCM   = "pcm_s16le"
	MuLaw = "mulaw"
	Opus  = "opus" // an Ogg Opus stream: concatenate the chunks to get a playable .ogg/.opus file
	WAV   = "wav"  // PCM with a streaming WAV header first (sizes set to "unknown")
	MP3   = "mp3"  // MPEG layer III frames, mono, 64 kbps CBR (libmp3lame)
	FLAC  = "flac" // lossless, mono 16-bit, a stream of unknown length
)

// Rates a client may ask for.
var Rates = []int{8000, 16000, 22050, 24000, 44100, 48000}

var opusRates = []int{8000, 12000, 16000, 24000, 48000}

// Format is an output encoding and sample rate.
type Format struct {
	Encoding   string `json:"encoding"`
	SampleRate int    `json:"sample_rate"`
}

// Validate checks the format, filling defaults: PCM, and 24 kHz (8 kHz for μ-law, 48 kHz
// for Opus).
func (f *Format) Validate() error {
	if f.Encoding == "" {
		f.Encoding = PCM
	}
	if f.SampleRate == 0 {
		switch f.Encoding {
		case MuLaw:
			f.SampleRate = 8000
		case Opus:
			f.SampleRate = 48000
		default:
			f.SampleRate = 24000
		}
	}
	switch f.Encoding {
	case PCM, MuLaw, WAV, FLAC:
		if !slices.Contains(Rates, f.SampleRate) {
			return fmt.Errorf("sample_rate %d: use one of %v", f.SampleRate, Rates)
		}
	case Opus:
		if !slices.Contains(opusRates, f.SampleRate) {
			return fmt.Errorf("sample_rate %d is not an Opus rate: use one of %v", f.SampleRate, opusRates)
		}
	case MP3:
		if !slices.Contains(mp3Rates, f.SampleRate) {
			return fmt.Errorf("sample_rate %d is not an MP3 rate: use one of %v", f.SampleRate, mp3Rates)
		}
	default:
		return fmt.Errorf("encoding %q: use %s, %s, %s, %s, %s or %s", f.Encoding, PCM, MuLaw, Opus, WAV, MP3, FLAC)
	}
	return nil
}

// ContentType is the MIME type of the encoded stream.
func (f Format) ContentType() string {
	switch f.Encoding {
	case MuLaw:
		return fmt.Sprintf("audio/basic;rate=%d", f.SampleRate)
	case Opus:
		return "audio/ogg; codecs=opus"
	case WAV:
		return "audio/wav"
	case MP3:
		return "audio/mpeg"
	case FLAC:
		return "audio/flac"
	}
	return fmt.Sprintf("audio/L16;rate=%d;channels=1;endianness=little-endian", f.SampleRate)
}

// Encoder converts audio at the source rate to the format, chunk by chunk.
type Encoder struct {
	f       Format
	rs      *dsp.Resampler // nil when the rates match
	buf     []float32
	opus    *opus.Encoder
	ogg     *oggWriter
	pending []float32 // Opus: samples waiting for a full 20 ms frame
	mp3     *mp3Encoder
	flac    *flacEncoder
	started bool
}

// NewEncoder makes an encoder from audio at srcRate to f (validated).
func NewEncoder(f Format, srcRate int) (*Encoder, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	e := &Encoder{f: f}
	if srcRate != f.SampleRate {
		rs, err := dsp.NewResampler(srcRate, f.SampleRate)
		if err != nil {
			return nil, err
		}
		e.rs = rs
	}
	if f.Encoding == Opus {
		enc, err := opus.NewEncoder(f.SampleRate, 1, opus.AppVoIP)
		if err != nil {
			return nil, fmt.Errorf("opus encoder: %w", err)
		}
		if err := enc.SetBitrate(32000); err != nil {
			return nil, fmt.Errorf("opus encoder: %w", err)
		}
		e.opus = enc
		e.ogg = newOggWriter(f.SampleRate)
	}
	if f.Encoding == MP3 {
		m, err := newMP3Encoder(f.SampleRate, 64)
		if err != nil {
			return nil, err
		}
		e.mp3 = m
	}
	if f.Encoding == FLAC {
		e.flac = newFLACEncoder(f.SampleRate)
	}
	return e, nil
}

// Format is the encoder's output format.
func (e *Encoder) Format() Format { return e.f }

// Close frees the codec's C memory now (an MP3 encoder holds hundreds of KB of it that the
// garbage collector cannot see); a stream cancelled before its Flush would otherwise keep it
// until a finalizer runs. The encoder is not used after Close.
func (e *Encoder) Close() {
	if e.mp3 != nil {
		e.mp3.close()
	}
}

// Encode appends the encoding of src (at the source rate) to dst. Resampling and Opus
// framing hold a little audio back until Flush.
func (e *Encoder) Encode(dst []byte, src []float32) ([]byte, error) {
	x := src
	if e.rs != nil {
		e.buf = e.rs.Process(e.buf[:0], src)
		x = e.buf
	}
	return e.encode(dst, x, false)
}

// Flush appends everything held back and ends the stream (Opus: the end-of-stream page).
func (e *Encoder) Flush(dst []byte) ([]byte, error) {
	var x []float32
	if e.rs != nil {
		e.buf = e.rs.Flush(e.buf[:0])
		x = e.buf
	}
	return e.encode(dst, x, true)
}

// EncodeClip encodes a whole mono clip x at srcRate in format f (a file's bytes).
func EncodeClip(f Format, srcRate int, x []float32) ([]byte, error) {
	e, err := NewEncoder(f, srcRate)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	out, err := e.Encode(nil, x)
	if err != nil {
		return nil, err
	}
	return e.Flush(out)
}

func (e *Encoder) encode(dst []byte, x []float32, last bool) ([]byte, error) {
	if !e.started {
		e.started = true
		switch e.f.Encoding {
		case WAV:
			dst = appendWAVHeader(dst, e.f.SampleRate)
		case Opus:
			dst = e.ogg.header(dst)
		}
	}
	switch e.f.Encoding {
	case PCM, WAV:
		for _, v := range x {
			dst = binary.LittleEndian.AppendUint16(dst, uint16(toInt16(v)))
		}
	case MuLaw:
		for _, v := range x {
			dst = append(dst, linearToMuLaw(toInt16(v)))
		}
	case Opus:
		return e.encodeOpus(dst, x, last)
	case MP3:
		return e.mp3.encode(dst, x, last)
	case FLAC:
		return e.flac.encode(dst, x, last), nil
	}
	return dst, nil
}

func (e *Encoder) encodeOpus(dst []byte, x []float32, last bool) ([]byte, error) {
	frame := e.f.SampleRate / 50
	e.pending = append(e.pending, x...)
	if last && len(e.pending)%frame != 0 {
		e.pending = append(e.pending, make([]float32, frame-len(e.pending)%frame)...)
	}
	var pkt [1500]byte
	for len(e.pending) >= frame {
		n, err := e.opus.EncodeFloat32(e.pending[:frame], pkt[:])
		if err != nil {
			return dst, fmt.Errorf("opus encode: %w", err)
		}
		e.pending = e.pending[frame:]
		dst = e.ogg.packet(dst, pkt[:n], frame, last && len(e.pending) < frame)
	}
	if last && !e.ogg.ended {
		dst = e.ogg.packet(dst, nil, 0, true)
	}
	return dst, nil
}

func toInt16(v float32) int16 {
	s := math.Round(float64(v) * 32767)
	return int16(max(-32768, min(32767, s)))
}

// linearToMuLaw is G.711 μ-law: add the bias, find the segment (the top set bit), keep
// four mantissa bits below it, invert everything.
func linearToMuLaw(s int16) byte {
	const bias, clip = 0x84, 32635
	x, sign := int(s), 0
	if x < 0 {
		x, sign = -x, 0x80
	}
	x = min(x, clip) + bias
	exp := 7
	for mask := 0x4000; x&mask == 0 && exp > 0; mask >>= 1 {
		exp--
	}
	mant := (x >> (exp + 3)) & 0x0F
	return ^byte(sign | exp<<4 | mant)
}

// MuLawToLinear decodes one μ-law byte (for tests and clients written in Go).
func MuLawToLinear(u byte) int16 {
	u = ^u
	exp := int(u>>4) & 7
	mant := int(u & 0x0F)
	x := ((mant << 3) + 0x84) << exp
	x -= 0x84
	if u&0x80 != 0 {
		return int16(-x)
	}
	return int16(x)
}

// appendWAVHeader writes a mono 16-bit WAV header with the sizes set to 0xFFFFFFFF, which
// players read as "until the end of the stream".
func appendWAVHeader(dst []byte, rate int) []byte {
	le := binary.LittleEndian
	dst = append(dst, "RIFF"...)
	dst = le.AppendUint32(dst, 0xFFFFFFFF)
	dst = append(dst, "WAVEfmt "...)
	dst = le.AppendUint32(dst, 16)
	dst = le.AppendUint16(dst, 1) // PCM
	dst = le.AppendUint16(dst, 1) // mono
	dst = le.AppendUint32(dst, uint32(rate))
	dst = le.AppendUint32(dst, uint32(rate*2))
	dst = le.AppendUint16(dst, 2)
	dst = le.AppendUint16(dst, 16)
	dst = append(dst, "data"...)
	return le.AppendUint32(dst, 0xFFFFFFFF)
}
