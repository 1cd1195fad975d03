package dsp

import (
	"fmt"
	"math"
)

// ISTFT is a streaming inverse short-time Fourier transform with the conventions of
// torch.istft(center=True, normalized=False, onesided=True): each frame of nFFT/2+1 bins is
// inverted with a real inverse FFT (1/nFFT scaling, the imaginary parts of the DC and Nyquist
// bins ignored), multiplied by the window, overlap-added at hop spacing, and divided by the
// overlap-added squared window; the first and last nFFT/2 samples of the padded signal are
// dropped. F frames therefore give (F-1)·hop samples.
//
// Frames go in one at a time (Push) and the samples they complete come out at once: a sample
// is final when no later frame overlaps it. Flush emits the end of the signal, normalised by
// the envelope of the frames received, exactly as torch.istft does at the end. Push and
// Flush never allocate; Inverse only to grow its output.
//
// An ISTFT is not safe for concurrent use.
type ISTFT struct {
	nFFT, hop int
	window    []float64 // nFFT long (a shorter window is zero-padded in the centre)
	fft       *RealFFT
	spec      []complex128 // one frame's bins
	time      []float64    // their inverse
	acc, env  []float64    // padded positions [frames·hop, frames·hop+nFFT)
	frames    int          // frames pushed since Reset
	scratch   []float32    // Inverse's staging for one hop or the flushed tail
}

// NewISTFT makes an inverse STFT for frames of nFFT/2+1 bins at hop spacing. The window
// (torch's window argument, e.g. a periodic Hann of nFFT) may be shorter than nFFT; it is
// centred as torch does. hop must not exceed nFFT/2, so that every emitted sample is final.
func NewISTFT(nFFT, hop int, window []float32) (*ISTFT, error) {
	switch {
	case nFFT < 2 || nFFT%2 != 0:
		return nil, fmt.Errorf("istft: n_fft %d must be even and at least 2", nFFT)
	case hop < 1 || hop > nFFT/2:
		return nil, fmt.Errorf("istft: hop %d must be in [1, n_fft/2 = %d]", hop, nFFT/2)
	case len(window) == 0 || len(window) > nFFT:
		return nil, fmt.Errorf("istft: window of %d samples for n_fft %d", len(window), nFFT)
	}
	s := &ISTFT{
		nFFT:   nFFT,
		hop:    hop,
		window: make([]float64, nFFT),
		fft:    NewRealFFT(nFFT),
		spec:   make([]complex128, nFFT/2+1),
		time:   make([]float64, nFFT),
		acc:    make([]float64, nFFT),
		env:    make([]float64, nFFT),
	}
	s.scratch = make([]float32, max(hop, nFFT/2-hop))
	left := (nFFT - len(window)) / 2
	for i, w := range window {
		s.window[left+i] = float64(w)
	}
	return s, nil
}

// HannPeriodic is torch.hann_window(n) (periodic=True): 0.5 − 0.5·cos(2πi/n).
func HannPeriodic(n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(n)))
	}
	return w
}

// Bins is the number of frequency bins per frame, nFFT/2+1.
func (s *ISTFT) Bins() int { return s.nFFT/2 + 1 }

// Hop is the frame spacing in samples (and the most samples one Push emits).
func (s *ISTFT) Hop() int { return s.hop }

// FlushLen is the most samples Flush emits: nFFT/2 − hop.
func (s *ISTFT) FlushLen() int { return s.nFFT/2 - s.hop }

// Reset forgets every frame pushed so far.
func (s *ISTFT) Reset() {
	clear(s.acc)
	clear(s.env)
	s.frames = 0
}

// Push adds one frame (real and imaginary parts of Bins() bins) and writes the samples it
// completes to out (room for Hop() samples), returning how many: hop, or fewer while the
// first nFFT/2 padding samples are being dropped.
func (s *ISTFT) Push(re, im []float32, out []float32) (int, error) {
	nb := s.Bins()
	if len(re) != nb || len(im) != nb {
		return 0, fmt.Errorf("istft: frame of %d/%d bins, want %d", len(re), len(im), nb)
	}
	if len(out) < s.hop {
		return 0, fmt.Errorf("istft: output room %d < hop %d", len(out), s.hop)
	}
	n := s.nFFT
	for k := range nb {
		s.spec[k] = complex(float64(re[k]), float64(im[k]))
	}
	s.fft.Inverse(s.time, s.spec) // a real inverse: DC's and Nyquist's imaginary parts are dropped
	scale := 1 / float64(n)
	for i := range n {
		w := s.window[i]
		s.acc[i] += s.time[i] * scale * w
		s.env[i] += w * w
	}
	// Positions [f·hop, (f+1)·hop) are complete; those before nFFT/2 are centre padding.
	base := s.frames * s.hop
	emitted := 0
	for i := range s.hop {
		if base+i >= n/2 {
			out[emitted] = s.sample(i)
			emitted++
		}
	}
	copy(s.acc, s.acc[s.hop:])
	copy(s.env, s.env[s.hop:])
	clear(s.acc[n-s.hop:])
	clear(s.env[n-s.hop:])
	s.frames++
	return emitted, nil
}

func (s *ISTFT) sample(i int) float32 {
	// torch.istft refuses envelopes below 1e-11; such samples (only possible with a window
	// that has zeros where frames do not overlap) come out as silence here.
	if e := s.env[i]; e > 1e-11 {
		return float32(s.acc[i] / e)
	}
	return 0
}

// Flush writes the last samples of the signal (up to FlushLen(), fewer for very short
// inputs) to out and returns how many; the state is then reset.
func (s *ISTFT) Flush(out []float32) (int, error) {
	if s.frames == 0 {
		return 0, nil
	}
	start := s.frames * s.hop            // first position not emitted
	end := (s.frames-1)*s.hop + s.nFFT/2 // end of the trimmed signal
	from := max(start, s.nFFT/2)
	if end <= from {
		s.Reset()
		return 0, nil
	}
	if len(out) < end-from {
		return 0, fmt.Errorf("istft: flush room %d < %d", len(out), end-from)
	}
	for p := from; p < end; p++ {
		out[p-from] = s.sample(p - start)
	}
	s.Reset()
	return end - from, nil
}

// Inverse runs a whole signal: re and im are [frames, Bins()] row-major; out receives the
// (frames−1)·hop samples and is returned (grown when it is too short).
func (s *ISTFT) Inverse(re, im []float32, frames int, out []float32) ([]float32, error) {
	nb := s.Bins()
	if frames < 1 || len(re) != frames*nb || len(im) != frames*nb {
		return nil, fmt.Errorf("istft: %d/%d values for %d frames of %d bins", len(re), len(im), frames, nb)
	}
	total := (frames - 1) * s.hop
	if cap(out) < total {
		out = make([]float32, total)
	}
	out = out[:total]
	s.Reset()
	pos := 0
	for f := range frames {
		n, err := s.Push(re[f*nb:(f+1)*nb], im[f*nb:(f+1)*nb], s.scratch)
		if err != nil {
			return nil, err
		}
		pos += copy(out[pos:], s.scratch[:n])
	}
	n, err := s.Flush(s.scratch)
	if err != nil {
		return nil, err
	}
	pos += copy(out[pos:], s.scratch[:n])
	if pos != total {
		return nil, fmt.Errorf("istft: produced %d samples, want %d", pos, total)
	}
	return out, nil
}
