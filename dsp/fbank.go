package dsp

import (
	"fmt"
	"math"
	"math/bits"
)

// FbankConfig describes a Kaldi-compatible log mel filterbank, with the field meanings and
// defaults of torchaudio.compliance.kaldi.fbank (see KaldiFbankConfig). Only what the
// deterministic streaming front ends need is supported: snip-edges framing, no dither, no
// energy term, FFT sizes rounded up to a power of two.
type FbankConfig struct {
	SampleRate    float64 `json:"sample_frequency"`
	FrameLengthMs float64 `json:"frame_length_ms"`
	FrameShiftMs  float64 `json:"frame_shift_ms"`
	NumMelBins    int     `json:"num_mel_bins"`
	LowFreq       float64 `json:"low_freq"`
	// HighFreq ≤ 0 is an offset from the Nyquist frequency (0: Nyquist).
	HighFreq    float64 `json:"high_freq"`
	Preemphasis float64 `json:"preemphasis"`
	RemoveDC    bool    `json:"remove_dc_offset"`
	// Window is "povey", "hanning", "hamming", "rectangular" or "blackman".
	Window        string  `json:"window_type"`
	BlackmanCoeff float64 `json:"blackman_coeff"`
	// InputScale multiplies the samples first (32768 turns [-1, 1] audio into the int16
	// range Kaldi models are trained on).
	InputScale  float64 `json:"input_scale"`
	Dither      float64 `json:"dither"`
	EnergyFloor float64 `json:"energy_floor"`
	SnipEdges   bool    `json:"snip_edges"`
	UsePower    bool    `json:"use_power"`
	UseLog      bool    `json:"use_log_fbank"`
	RoundPow2   bool    `json:"round_to_power_of_two"`
}

// KaldiFbankConfig is torchaudio's kaldi.fbank with the arguments the MeanVC/MeanVC2
// front ends pass: 80 bins, 25 ms / 10 ms at 16 kHz, dither 0, energy_floor 0, and input
// scaled by 32768.
func KaldiFbankConfig() FbankConfig {
	return FbankConfig{
		SampleRate: 16000, FrameLengthMs: 25, FrameShiftMs: 10, NumMelBins: 80,
		LowFreq: 20, HighFreq: 0, Preemphasis: 0.97, RemoveDC: true, Window: "povey",
		BlackmanCoeff: 0.42, InputScale: 32768, SnipEdges: true, UsePower: true, UseLog: true,
		RoundPow2: true,
	}
}

// FbankLogFloor is the value of a log-fbank bin with no energy: ln of float32's machine
// epsilon, the floor torchaudio applies before the log.
var FbankLogFloor = float32(math.Log(fbankEps))

// fbankEps is float32's machine epsilon.
var fbankEps = float64(math.Nextafter32(1, 2) - 1)

// Fbank computes Kaldi-compatible log mel filterbank frames. It is not safe for concurrent
// use; Compute and Frame do not allocate.
type Fbank struct {
	cfg      FbankConfig
	frameLen int // samples per frame
	shift    int
	nfft     int
	window   []float64
	melLo    []int       // first FFT bin of each mel filter
	melW     [][]float64 // its weights from melLo on
	fft      *RealFFT
	buf      []float64    // one frame, zero-padded to nfft
	spec     []complex128 // the FFT's output, bins 0..nfft/2
	power    []float64
}

// NewFbank checks cfg and precomputes the window, the mel filters and the FFT tables.
func NewFbank(cfg FbankConfig) (*Fbank, error) {
	if cfg.SampleRate <= 0 || cfg.FrameLengthMs <= 0 || cfg.FrameShiftMs <= 0 || cfg.NumMelBins <= 0 {
		return nil, fmt.Errorf("fbank: sample rate %g, frame %g ms / %g ms and %d bins must be positive",
			cfg.SampleRate, cfg.FrameLengthMs, cfg.FrameShiftMs, cfg.NumMelBins)
	}
	switch {
	case cfg.Dither != 0:
		return nil, fmt.Errorf("fbank: dither %g is not supported (the front end must be deterministic)", cfg.Dither)
	case !cfg.SnipEdges:
		return nil, fmt.Errorf("fbank: only snip_edges framing is supported")
	case !cfg.RoundPow2:
		return nil, fmt.Errorf("fbank: only FFT sizes rounded to a power of two are supported")
	}
	f := &Fbank{cfg: cfg}
	f.frameLen = int(cfg.SampleRate * cfg.FrameLengthMs * 0.001)
	f.shift = int(cfg.SampleRate * cfg.FrameShiftMs * 0.001)
	if f.frameLen < 2 || f.shift < 1 {
		return nil, fmt.Errorf("fbank: frame of %d samples, shift %d", f.frameLen, f.shift)
	}
	f.nfft = 1 << bits.Len(uint(f.frameLen-1))
	var err error
	if f.window, err = fbankWindow(cfg.Window, f.frameLen, cfg.BlackmanCoeff); err != nil {
		return nil, err
	}
	if err := f.melBanks(); err != nil {
		return nil, err
	}
	f.fft = NewRealFFT(f.nfft)
	f.buf = make([]float64, f.nfft)
	f.spec = make([]complex128, f.nfft/2+1)
	f.power = make([]float64, f.nfft/2)
	return f, nil
}

// Config is the configuration the Fbank was made with.
func (f *Fbank) Config() FbankConfig { return f.cfg }

// Bins is the number of values per frame.
func (f *Fbank) Bins() int { return f.cfg.NumMelBins }

// FrameLen and Shift are the frame length and hop in samples.
func (f *Fbank) FrameLen() int { return f.frameLen }
func (f *Fbank) Shift() int    { return f.shift }

// NumFrames is how many frames n samples give (snip edges: only whole frames).
func (f *Fbank) NumFrames(n int) int {
	if n < f.frameLen {
		return 0
	}
	return 1 + (n-f.frameLen)/f.shift
}

// Compute writes NumFrames(len(samples)) frames of Bins() values each into dst and returns
// the frame count. dst must have room for them.
func (f *Fbank) Compute(dst, samples []float32) (int, error) {
	n := f.NumFrames(len(samples))
	bins := f.cfg.NumMelBins
	if len(dst) < n*bins {
		return 0, fmt.Errorf("fbank: %d values of room for %d frames of %d bins", len(dst), n, bins)
	}
	for i := range n {
		f.Frame(dst[i*bins:(i+1)*bins], samples[i*f.shift:i*f.shift+f.frameLen])
	}
	return n, nil
}

// Frame computes one frame from FrameLen() samples into dst (Bins() values).
func (f *Fbank) Frame(dst, samples []float32) {
	cfg := &f.cfg
	n := f.frameLen
	x := f.buf[:n]
	scale := cfg.InputScale
	if scale == 0 {
		scale = 1
	}
	var mean float64
	for i, s := range samples[:n] {
		x[i] = float64(s) * scale
		mean += x[i]
	}
	if cfg.RemoveDC {
		mean /= float64(n)
		for i := range x {
			x[i] -= mean
		}
	}
	if p := cfg.Preemphasis; p != 0 {
		// Backwards so each step still sees the previous raw sample; the first sample is
		// taken as its own predecessor (Kaldi replicates it).
		for i := n - 1; i > 0; i-- {
			x[i] -= p * x[i-1]
		}
		x[0] -= p * x[0]
	}
	for i := range x {
		f.buf[i] = x[i] * f.window[i]
	}
	clear(f.buf[n:])
	f.fft.Forward(f.spec, f.buf)
	for k := range f.power {
		re, im := real(f.spec[k]), imag(f.spec[k])
		p := re*re + im*im
		if !cfg.UsePower {
			p = math.Sqrt(p)
		}
		f.power[k] = p
	}
	for b := range dst[:cfg.NumMelBins] {
		var e float64
		lo := f.melLo[b]
		for j, w := range f.melW[b] {
			e += w * f.power[lo+j]
		}
		if cfg.UseLog {
			e = math.Log(max(e, fbankEps))
		}
		dst[b] = float32(e)
	}
}

// fbankWindow is torchaudio's feature window of n samples (symmetric forms, as Kaldi).
func fbankWindow(kind string, n int, blackman float64) ([]float64, error) {
	w := make([]float64, n)
	a := 2 * math.Pi / float64(n-1)
	for i := range w {
		c := math.Cos(a * float64(i))
		switch kind {
		case "povey":
			w[i] = math.Pow(0.5-0.5*c, 0.85)
		case "hanning":
			w[i] = 0.5 - 0.5*c
		case "hamming":
			w[i] = 0.54 - 0.46*c
		case "rectangular":
			w[i] = 1
		case "blackman":
			w[i] = blackman - 0.5*c + (0.5-blackman)*math.Cos(2*a*float64(i))
		default:
			return nil, fmt.Errorf("fbank: unknown window type %q", kind)
		}
	}
	return w, nil
}

func kaldiMel(hz float64) float64 { return 1127 * math.Log(1+hz/700) }

// melBanks builds Kaldi's triangular filters, equally spaced on the 1127·ln(1+f/700) scale
// between the low and high frequencies, over the FFT bins below Nyquist (the Nyquist bin
// gets no weight, as in torchaudio).
func (f *Fbank) melBanks() error {
	cfg := &f.cfg
	nyq := cfg.SampleRate / 2
	high := cfg.HighFreq
	if high <= 0 {
		high += nyq
	}
	if cfg.LowFreq < 0 || cfg.LowFreq >= nyq || high <= 0 || high > nyq || cfg.LowFreq >= high {
		return fmt.Errorf("fbank: bad frequency range [%g, %g] Hz at %g Hz", cfg.LowFreq, high, cfg.SampleRate)
	}
	mlo, mhi := kaldiMel(cfg.LowFreq), kaldiMel(high)
	delta := (mhi - mlo) / float64(cfg.NumMelBins+1)
	binHz := cfg.SampleRate / float64(f.nfft)
	nb := f.nfft / 2
	f.melLo = make([]int, cfg.NumMelBins)
	f.melW = make([][]float64, cfg.NumMelBins)
	for b := range cfg.NumMelBins {
		left := mlo + float64(b)*delta
		center := left + delta
		right := center + delta
		all := make([]float64, nb)
		lo, hi := -1, -1
		for k := range nb {
			m := kaldiMel(binHz * float64(k))
			all[k] = max(0, min((m-left)/(center-left), (right-m)/(right-center)))
			if all[k] > 0 {
				if lo < 0 {
					lo = k
				}
				hi = k
			}
		}
		// Keep only the triangle's support; a filter narrower than one FFT bin sees no
		// energy, as in Kaldi.
		var ws []float64
		if lo >= 0 {
			ws = all[lo : hi+1]
		} else {
			lo = 0
		}
		f.melLo[b], f.melW[b] = lo, ws
	}
	return nil
}
