package conformer

import (
	"fmt"

	"github.com/voxpipe/voxpipe/dsp"
)

// FrontEnd turns 16 kHz audio into the encoder's fbank windows and offsets exactly as
// MeanVC2's run_rt.py _encode_chunk does (and audio.cpp copies):
//
//   - each input chunk is prefixed with the last SamplesCacheLen samples seen, which start
//     as SamplesCacheInit (−0.5: the first frames see a constant, i.e. the log floor);
//   - the fbank of that padded chunk is prefixed with the previous chunk's last
//     FbankCacheFrames frames (they duplicate its first frames; kept for parity), and the
//     last FbankCacheFrames frames of the concatenation are carried on;
//   - windows of Window frames are cut every Stride frames while they fit, each with the
//     ASR offset OffsetInit + OffsetStep·n (reduced by OffsetReset once it reaches it).
//
// Push buffers the audio into ChunkSamples chunks, so the windows do not depend on how the
// input is cut; Flush runs a final short chunk as the reference does at the end of a file.
// A FrontEnd is not safe for concurrent use; it does not allocate after NewFrontEnd (Chunk
// grows its buffers once for chunks longer than ChunkSamples).
type FrontEnd struct {
	s       StreamConfig
	fb      *dsp.Fbank
	bins    int
	pending []float32 // samples of the chunk being collected
	tail    []float32 // the last SamplesCacheLen samples
	padded  []float32 // tail ‖ chunk
	frames  []float32 // carried frames ‖ this chunk's frames, bins each
	nCarry  int       // frames carried from the previous chunk
	offset  int
	windows int
}

// NewFrontEnd makes a front end for cfg's fbank and streaming constants.
func NewFrontEnd(cfg Config) (*FrontEnd, error) {
	if err := cfg.validateStream(); err != nil {
		return nil, err
	}
	fb, err := dsp.NewFbank(cfg.Fbank)
	if err != nil {
		return nil, fmt.Errorf("conformer: front end: %w", err)
	}
	if cfg.InputDim != 0 && fb.Bins() != cfg.InputDim {
		return nil, fmt.Errorf("conformer: front end: %d mel bins but the encoder takes %d", fb.Bins(), cfg.InputDim)
	}
	s := cfg.Stream
	f := &FrontEnd{s: s, fb: fb, bins: fb.Bins(),
		pending: make([]float32, 0, s.ChunkSamples),
		tail:    make([]float32, s.SamplesCacheLen)}
	f.grow(s.ChunkSamples)
	f.Reset()
	return f, nil
}

// grow sizes the work buffers for chunks of n samples.
func (f *FrontEnd) grow(n int) {
	if need := f.s.SamplesCacheLen + n; cap(f.padded) < need {
		f.padded = make([]float32, 0, need)
		frames := f.s.FbankCacheFrames + f.fb.NumFrames(need)
		carried := f.frames[:f.nCarry*f.bins]
		f.frames = append(make([]float32, 0, frames*f.bins), carried...)
	}
}

// Reset starts a new stream: the initial waveform tail, no carried frames, the first offset.
func (f *FrontEnd) Reset() {
	for i := range f.tail {
		f.tail[i] = f.s.SamplesCacheInit
	}
	f.pending = f.pending[:0]
	f.nCarry, f.offset, f.windows = 0, f.s.OffsetInit, 0
}

// Bins is the number of values per fbank frame; a window holds Window()·Bins() values.
func (f *FrontEnd) Bins() int { return f.bins }

// Window is the number of fbank frames per window.
func (f *FrontEnd) Window() int { return f.s.Window }

// Offset is the ASR offset the next window will get.
func (f *FrontEnd) Offset() int { return f.offset }

// Windows is the number of windows produced since Reset.
func (f *FrontEnd) Windows() int { return f.windows }

// EmitFunc receives one window (Window·Bins values, frame-major; valid only during the
// call) and its ASR offset.
type EmitFunc func(window []float32, offset int) error

// Push adds samples and runs every chunk they complete.
func (f *FrontEnd) Push(samples []float32, emit EmitFunc) error {
	for len(samples) > 0 {
		n := min(len(samples), f.s.ChunkSamples-len(f.pending))
		f.pending = append(f.pending, samples[:n]...)
		samples = samples[n:]
		if len(f.pending) == f.s.ChunkSamples {
			_, err := f.Chunk(f.pending, emit)
			f.pending = f.pending[:0]
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// Flush runs the buffered partial chunk, if any, as the reference runs a file's last short
// chunk (it gives a window only when carried and new frames reach Window). The stream can
// go on afterwards, but its later windows are those of a reference fed that short chunk.
func (f *FrontEnd) Flush(emit EmitFunc) error {
	if len(f.pending) == 0 {
		return nil
	}
	_, err := f.Chunk(f.pending, emit)
	f.pending = f.pending[:0]
	return err
}

// Chunk runs exactly one reference chunk (_encode_chunk) on samples, whatever their length,
// bypassing Push's buffering; it returns the number of windows emitted.
func (f *FrontEnd) Chunk(samples []float32, emit EmitFunc) (int, error) {
	f.grow(len(samples))
	s, bins := &f.s, f.bins
	f.padded = append(append(f.padded[:0], f.tail...), samples...)
	copy(f.tail, f.padded[len(f.padded)-len(f.tail):])

	nNew := f.fb.NumFrames(len(f.padded))
	total := f.nCarry + nNew
	f.frames = f.frames[:total*bins]
	if _, err := f.fb.Compute(f.frames[f.nCarry*bins:], f.padded); err != nil {
		return 0, fmt.Errorf("conformer: front end: %w", err)
	}
	if s.OffsetReset > 0 && f.offset >= s.OffsetReset {
		// Keep the position relative to the cache, as run_rt does.
		f.offset = max(s.RequiredCache, f.offset-s.OffsetReset)
	}
	n := 0
	for i := 0; i+s.Window <= total; i += s.Stride {
		if emit != nil {
			if err := emit(f.frames[i*bins:(i+s.Window)*bins], f.offset); err != nil {
				return n, err
			}
		}
		f.offset += s.OffsetStep
		f.windows++
		n++
	}
	// Carry the last frames of the concatenation to the front for the next chunk.
	f.nCarry = min(s.FbankCacheFrames, total)
	copy(f.frames[:f.nCarry*bins], f.frames[(total-f.nCarry)*bins:total*bins])
	return n, nil
}
