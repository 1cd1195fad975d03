package dsp

import (
	"math"
	"sort"
)

// Pitch analysis shared by the streaming Voice and the offline EstimateF0.
//
// The signal is low-passed and decimated to about 8 kHz, and the YIN
// cumulative-mean-normalised difference function is evaluated over lags
// covering 70–500 Hz. The first dip under a threshold (or the global minimum)
// is refined by parabolic interpolation; its depth is the aperiodicity used for
// the voicing decision, together with an energy gate.

const (
	pitchMinF0      = 70.0   // lowest F0 the streaming tracker follows, Hz
	pitchMaxF0      = 500.0  // highest F0 the streaming tracker follows, Hz
	estimateMinF0   = 50.0   // lowest F0 EstimateF0 reports, Hz
	estimateMaxF0   = 800.0  // highest F0 EstimateF0 reports, Hz
	pitchTargetRate = 8000.0 // analysis rate after decimation, Hz

	// pitchDipThreshold is YIN's absolute threshold: the first lag whose
	// normalised difference falls below it is taken as the period.
	pitchDipThreshold = 0.15
	// pitchVoicedAper is the largest aperiodicity (normalised difference at
	// the chosen lag) for a voiced frame.
	pitchVoicedAper = 0.25
)

// pitchDecimFactor returns the integer factor that brings sampleRate closest
// to the 8 kHz analysis rate (at least 1).
func pitchDecimFactor(sampleRate int) int {
	d := int(math.Round(float64(sampleRate) / pitchTargetRate))
	if d < 1 {
		d = 1
	}
	return d
}

// pitchLowpass designs the anti-alias filter for decimation by d: an odd-length,
// linear-phase, Hamming-windowed sinc with unit DC gain. Its group delay is
// (len-1)/2 input samples. For d == 1 it is the identity.
func pitchLowpass(d int) []float32 {
	if d <= 1 {
		return []float32{1}
	}
	n := 12*d + 1
	fc := 0.36 / float64(d) // cutoff, cycles per input sample (≈2.9 kHz at an 8 kHz analysis rate)
	h := make([]float64, n)
	mid := float64(n-1) / 2
	var sum float64
	for i := range h {
		t := float64(i) - mid
		s := 2 * fc
		if t != 0 {
			s = math.Sin(2*math.Pi*fc*t) / (math.Pi * t)
		}
		w := 0.54 - 0.46*math.Cos(2*math.Pi*float64(i)/float64(n-1))
		h[i] = s * w
		sum += h[i]
	}
	out := make([]float32, n)
	for i := range h {
		out[i] = float32(h[i] / sum)
	}
	return out
}

// pitchYIN holds the lag range and scratch space of one YIN analyser.
type pitchYIN struct {
	tauMin, tauMax int // lag range in analysis samples
	win            int // integration window in analysis samples
	diff           []float64
	cmnd           []float64
}

// newPitchYIN returns an analyser at rate Hz for F0 in [fmin, fmax] whose
// integration window is win seconds.
func newPitchYIN(rate, fmin, fmax, win float64) *pitchYIN {
	y := &pitchYIN{
		tauMin: int(math.Floor(rate / fmax)),
		tauMax: int(math.Ceil(rate/fmin)) + 1,
		win:    int(math.Round(win * rate)),
	}
	if y.tauMin < 2 {
		y.tauMin = 2
	}
	y.diff = make([]float64, y.tauMax+2)
	y.cmnd = make([]float64, y.tauMax+2)
	return y
}

// frameLen is the number of analysis samples one frame reads.
func (y *pitchYIN) frameLen() int { return y.win + y.tauMax + 1 }

// analyze runs YIN on x (len >= frameLen()). It returns the period in
// analysis samples (fractional), the aperiodicity at that lag (0 = perfectly
// periodic, ~1 = noise), and the RMS of the integration window.
func (y *pitchYIN) analyze(x []float32) (period, aper, rms float64) {
	w := y.win
	x = x[:y.frameLen()]
	// Energy of the window at lag 0 and a running energy of the shifted
	// window, so d(τ) = e0 + eτ − 2 r(τ).
	var e0 float64
	for _, v := range x[:w] {
		e0 += float64(v) * float64(v)
	}
	rms = math.Sqrt(e0 / float64(w))
	if e0 <= 1e-20 {
		return 0, 1, rms
	}
	et := e0
	y.diff[0] = 0
	for tau := 1; tau <= y.tauMax; tau++ {
		a, b := float64(x[tau-1]), float64(x[tau-1+w])
		et += b*b - a*a
		s := x[tau : tau+w]
		r := pitchDot(x[:w], s)
		d := e0 + et - 2*r
		if d < 0 {
			d = 0
		}
		y.diff[tau] = d
	}
	// Cumulative-mean normalisation.
	y.cmnd[0] = 1
	var cum float64
	for tau := 1; tau <= y.tauMax; tau++ {
		cum += y.diff[tau]
		if cum <= 0 {
			y.cmnd[tau] = 1
			continue
		}
		y.cmnd[tau] = y.diff[tau] * float64(tau) / cum
	}
	// First dip under the threshold, followed to its local minimum;
	// otherwise the global minimum.
	best := -1
	for tau := y.tauMin; tau < y.tauMax; tau++ {
		if y.cmnd[tau] < pitchDipThreshold {
			for tau+1 < y.tauMax && y.cmnd[tau+1] < y.cmnd[tau] {
				tau++
			}
			best = tau
			break
		}
	}
	if best < 0 {
		best = y.tauMin
		for tau := y.tauMin + 1; tau < y.tauMax; tau++ {
			if y.cmnd[tau] < y.cmnd[best] {
				best = tau
			}
		}
	}
	aper = y.cmnd[best]
	period = float64(best)
	if best > 1 && best < y.tauMax {
		period += pitchParabola(y.cmnd[best-1], y.cmnd[best], y.cmnd[best+1])
	}
	return period, aper, rms
}

// pitchDot is a plain dot product, unrolled for instruction-level parallelism.
func pitchDot(a, b []float32) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return float64(s0) + float64(s1) + float64(s2) + float64(s3)
}

// pitchParabola returns the offset in (-0.5, 0.5) of the extremum of the
// parabola through (-1, a), (0, b), (1, c).
func pitchParabola(a, b, c float64) float64 {
	den := a - 2*b + c
	if den == 0 {
		return 0
	}
	off := 0.5 * (a - c) / den
	if off > 0.5 {
		off = 0.5
	} else if off < -0.5 {
		off = -0.5
	}
	return off
}

// pitchDecimate low-passes x with lp and keeps every d-th sample, with the
// filter's group delay removed: out[k] describes x around sample k*d.
// Samples outside x are taken as zero.
func pitchDecimate(x []float32, d int, lp []float32) []float32 {
	n := (len(x) + d - 1) / d
	out := make([]float32, n)
	gd := (len(lp) - 1) / 2
	for k := range out {
		c := k*d + gd // newest input sample under the filter
		var acc float32
		for i, h := range lp {
			j := c - i
			if j >= 0 && j < len(x) {
				acc += h * x[j]
			}
		}
		out[k] = acc
	}
	return out
}

// EstimateF0 returns per-frame F0 in Hz (0 for unvoiced frames) over frames of
// hop seconds. Frame i is centred on sample round(i*hop*sampleRate) and reads
// about 30 ms of signal around it (zero outside x); there are
// ceil(len(x)/(hop*sampleRate)) frames. The lag found on the 8 kHz analysis
// signal is refined on the full-rate signal, so clean voiced input is measured
// to well under 0.1 semitone. A frame is voiced when it is periodic enough and
// no more than 40 dB below the loudest frame.
func EstimateF0(x []float32, sampleRate int, hop float64) []float64 {
	if sampleRate <= 0 || hop <= 0 || len(x) == 0 {
		return nil
	}
	sr := float64(sampleRate)
	hopS := hop * sr
	if hopS < 1 {
		hopS = 1
	}
	nf := int(math.Ceil(float64(len(x)) / hopS))
	d := pitchDecimFactor(sampleRate)
	lp := pitchLowpass(d)
	dec := pitchDecimate(x, d, lp)
	yin := newPitchYIN(sr/float64(d), estimateMinF0, estimateMaxF0, 1/estimateMinF0)
	fl := yin.frameLen()
	frame := make([]float32, fl)

	f0 := make([]float64, nf)
	aper := make([]float64, nf)
	rms := make([]float64, nf)
	var maxRMS float64
	for i := 0; i < nf; i++ {
		c := int(math.Round(float64(i) * hopS / float64(d))) // centre in analysis samples
		start := c - fl/2
		for j := range frame {
			k := start + j
			if k >= 0 && k < len(dec) {
				frame[j] = dec[k]
			} else {
				frame[j] = 0
			}
		}
		p, a, r := yin.analyze(frame)
		rms[i], aper[i] = r, a
		if r > maxRMS {
			maxRMS = r
		}
		if p <= 0 {
			continue
		}
		// Refine on the full-rate signal around the coarse lag.
		centre := int(math.Round(float64(i) * hopS))
		f0[i] = sr / pitchRefineLag(x, centre, yin.win*d, p*float64(d), d+1)
	}
	gate := math.Max(maxRMS*0.01, 1e-5)
	for i := range f0 {
		if aper[i] >= pitchVoicedAper || rms[i] < gate || f0[i] < estimateMinF0*0.95 || f0[i] > estimateMaxF0*1.05 {
			f0[i] = 0
		}
	}
	return f0
}

// pitchRefineLag minimises the squared difference between a window of w
// samples of x and its copy shifted by lags within ±span of the coarse lag,
// for the window centred (with its shifted copy) on centre, and returns the
// parabolically interpolated best lag.
func pitchRefineLag(x []float32, centre, w int, coarse float64, span int) float64 {
	lo := int(math.Floor(coarse)) - span
	hi := int(math.Ceil(coarse)) + span
	if lo < 2 {
		lo = 2
	}
	at := func(k int) float64 {
		if k < 0 || k >= len(x) {
			return 0
		}
		return float64(x[k])
	}
	start := centre - (w+int(math.Round(coarse)))/2
	diff := func(tau int) float64 {
		var s float64
		for j := 0; j < w; j++ {
			e := at(start+j) - at(start+j+tau)
			s += e * e
		}
		return s
	}
	best, bestD := -1, math.Inf(1)
	var vals [64]float64
	if hi-lo+1 > len(vals) {
		return coarse
	}
	for tau := lo; tau <= hi; tau++ {
		v := diff(tau)
		vals[tau-lo] = v
		if v < bestD {
			best, bestD = tau, v
		}
	}
	if best <= lo || best >= hi {
		return coarse
	}
	i := best - lo
	return float64(best) + pitchParabola(vals[i-1], vals[i], vals[i+1])
}

// MedianF0 returns the median F0 of the voiced frames (0 if none), using
// EstimateF0 with a 10 ms hop.
func MedianF0(x []float32, sampleRate int) float64 {
	f := EstimateF0(x, sampleRate, 0.01)
	v := make([]float64, 0, len(f))
	for _, f0 := range f {
		if f0 > 0 {
			v = append(v, f0)
		}
	}
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return 0.5 * (v[len(v)/2-1] + v[len(v)/2])
}
