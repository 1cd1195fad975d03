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
// Push emits each window as soon as the samples its frames cover have arrived, before the
// chunk that holds it is complete: an fbank frame depends only on its own samples, so the
// windows and offsets are those of whole chunks, however the input is cut. Flush ends a
// final short chunk as the reference does at the end of a file. A FrontEnd is not safe for
// concurrent use; it does not allocate after NewFrontEnd (Chunk grows its buffers once for
// chunks longer than ChunkSamples).
type FrontEnd struct {
	s      StreamConfig
	fb     *dsp.Fbank
	bins   int
	tail   []float32 // the last SamplesCacheLen samples before the open chunk
	padded []float32 // tail ‖ the open chunk's samples so far
	frames []float32 // carried frames ‖ the open chunk's frames, bins each
	nCarry int       // frames carried from the previous chunk
	open   bool      // a chunk has begun (padded holds it)
	done   int       // frames of the open chunk computed
	cut    int       // windows of the open chunk emitted

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
	f := &FrontEnd{s: s, fb: fb, bins: fb.Bins(), tail: make([]float32, s.SamplesCacheLen)}
	f.grow(s.ChunkSamples)
	f.Reset()
	return f, nil
}

// grow sizes the work buffers for chunks of n samples (between chunks only).
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
	f.padded = f.padded[:0]
	f.open, f.done, f.cut = false, 0, 0
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

// Pending is the number of samples of the chunk being collected by Push.
func (f *FrontEnd) Pending() int {
	if !f.open {
		return 0
	}
	return len(f.padded) - len(f.tail)
}

// ChunkWindows is the number of windows the chunk being collected has emitted so far.
func (f *FrontEnd) ChunkWindows() int { return f.cut }

// WindowsIn is the number of windows the next chunk gives if it holds n samples.
func (f *FrontEnd) WindowsIn(n int) int {
	total := f.nCarry + f.fb.NumFrames(f.s.SamplesCacheLen+n)
	if total < f.s.Window {
		return 0
	}
	return (total-f.s.Window)/f.s.Stride + 1
}

// EmitFunc receives one window (Window·Bins values, frame-major; valid only during the
// call) and its ASR offset.
type EmitFunc func(window []float32, offset int) error

// Push adds samples, emitting every window they complete.
func (f *FrontEnd) Push(samples []float32, emit EmitFunc) error {
	for len(samples) > 0 {
		if !f.open {
			f.begin()
		}
		n := min(len(samples), f.s.ChunkSamples-f.Pending())
		f.padded = append(f.padded, samples[:n]...)
		samples = samples[n:]
		if err := f.advance(emit); err != nil {
			return err
		}
		if f.Pending() == f.s.ChunkSamples {
			f.finish()
		}
	}
	return nil
}

// Flush ends the chunk being collected, if any, as the reference ends a file's last short
// chunk: its windows are those its frames and the carried ones fill (Push has emitted
// them). The stream can go on afterwards, but its later windows are those of a reference
// fed that short chunk.
func (f *FrontEnd) Flush(emit EmitFunc) error {
	if !f.open {
		return nil
	}
	err := f.advance(emit)
	f.finish()
	return err
}

// Chunk runs exactly one reference chunk (_encode_chunk) on samples, whatever their length,
// and returns the number of windows emitted. It may not be mixed with a chunk Push has begun.
func (f *FrontEnd) Chunk(samples []float32, emit EmitFunc) (int, error) {
	if f.open {
		return 0, fmt.Errorf("conformer: front end: Chunk while Push holds %d samples of a chunk", f.Pending())
	}
	f.grow(len(samples))
	f.begin()
	f.padded = append(f.padded, samples...)
	err := f.advance(emit)
	n := f.cut
	f.finish()
	return n, err
}

// begin opens a chunk.
func (f *FrontEnd) begin() {
	f.padded = append(f.padded[:0], f.tail...)
	f.open, f.done, f.cut = true, 0, 0
	if f.s.OffsetReset > 0 && f.offset >= f.s.OffsetReset {
		// Keep the position relative to the cache, as run_rt does.
		f.offset = max(f.s.RequiredCache, f.offset-f.s.OffsetReset)
	}
}

// advance computes the open chunk's frames its samples now cover and emits the windows
// they complete.
func (f *FrontEnd) advance(emit EmitFunc) error {
	s, bins := &f.s, f.bins
	if avail := f.fb.NumFrames(len(f.padded)); avail > f.done {
		f.frames = f.frames[:(f.nCarry+avail)*bins]
		if _, err := f.fb.Compute(f.frames[(f.nCarry+f.done)*bins:], f.padded[f.done*f.fb.Shift():]); err != nil {
			return fmt.Errorf("conformer: front end: %w", err)
		}
		f.done = avail
	}
	total := f.nCarry + f.done
	for i := f.cut * s.Stride; i+s.Window <= total; i += s.Stride {
		if emit != nil {
			if err := emit(f.frames[i*bins:(i+s.Window)*bins], f.offset); err != nil {
				return err
			}
		}
		f.offset += s.OffsetStep
		f.windows++
		f.cut++
	}
	return nil
}

// finish closes the open chunk: the waveform tail and the last frames carry on.
func (f *FrontEnd) finish() {
	copy(f.tail, f.padded[len(f.padded)-len(f.tail):])
	total := f.nCarry + f.done
	f.nCarry = min(f.s.FbankCacheFrames, total)
	copy(f.frames[:f.nCarry*f.bins], f.frames[(total-f.nCarry)*f.bins:total*f.bins])
	f.frames = f.frames[:f.nCarry*f.bins]
	f.padded = f.padded[:0]
	f.open, f.done, f.cut = false, 0, 0
}
