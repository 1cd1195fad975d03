package dsp

import (
	"fmt"
	"math"
	"slices"
)

// Voice is a streaming pitch shifter with formant preservation and an
// independent formant shift, built on TD-PSOLA (time-domain pitch-synchronous
// overlap-add).
//
// Signal flow, all sample-accurate and independent of how the input is cut
// into chunks:
//
//   - A causal pitch tracker runs YIN on an 8 kHz low-passed copy of the input
//     every 5 ms and decides voicing (aperiodicity threshold with hysteresis
//     plus an energy gate).
//   - Analysis marks are placed one period apart in voiced segments, each found
//     by correlating the last period with the signal around the expected next
//     one (the first mark of a voiced run sits on the waveform's largest peak),
//     and 5 ms apart in unvoiced segments. Unvoiced marks trail the input by
//     11 ms, so a voicing decision that comes a little late still catches the
//     onset.
//   - Synthesis marks are spaced by the local period divided by
//     β = 2^(pitch/12). Each takes the grain of the nearest analysis mark that
//     is no more than 2 ms ahead of it: a Hann window of about ±1 period of the
//     input, resampled by γ = 2^(formant/12) (γ > 1 compresses the grain in
//     time and moves the formants up), overlap-added and divided by the window
//     sum wherever grains overlap more than once, with a gain of 2^(|pitch|/24)
//     on voiced grains so that loudness stays about constant. Because each
//     grain keeps the spectral envelope of its period, pitch moves while the
//     formants stay put. Unvoiced grains, and all grains while the pitch shift
//     is 0, go back exactly where they came from (formant shift only).
//   - β and γ follow SetParams through a per-grain exponential glide (15 ms),
//     and the processed path is cross-faded (20 ms) with the dry input delayed
//     by the same Latency, so switching to or from pitch 0 / formant 0 is
//     seamless and the bypass output is the delayed input exactly.
//
// The output is always the input delayed by Latency() samples (30 ms at every
// rate): a grain is added 14 ms before its centre is played, it may read up to
// 14 ms of input past its mark (so grains are clamped to ±14 ms, a full two
// periods down to 71 Hz; less when the formant shift stretches them), and
// marks may lie 2 ms ahead of the synthesis mark.
//
// A Voice is not safe for concurrent use; SetParams may be called between
// Process calls.
type Voice struct {
	sr       int
	lat      int64   // algorithmic latency L, samples
	lead     int64   // a grain is added lead samples before its centre is output
	look     int64   // an analysis mark may be up to look samples after its synthesis mark
	uvLag    int64   // unvoiced marks are placed this many samples after their position
	uvHalf   float64 // unvoiced grain half-width, samples
	minPer   float64 // shortest period, samples
	maxPer   float64 // longest period, samples
	smoothTC float64 // parameter glide time constant, samples

	tgtPitch, tgtFormant float64 // requested, semitones
	curPitch, curFormant float64 // smoothed, semitones

	in     []float32 // input history ring
	inMask int64
	n      int64 // absolute index of the next input sample

	// Decimation and pitch tracking.
	dfac      int
	dphase    int // samples until the next decimated output
	lp        []float32
	gd        int64     // low-pass group delay, input samples
	dbuf      []float32 // decimated signal, linear with occasional shifts
	dbase     int64     // absolute decimated index of dbuf[0]
	dlen      int
	dkeep     int
	yin       *pitchYIN
	hop       int
	hopPhase  int
	trkVoiced bool
	trkPeriod float64 // decimated samples
	gate      float64

	// Analysis marks (ring, newest at mhead).
	marks       []voiceMark
	mhead       int
	mcount      int
	markCheckAt int64

	// Synthesis.
	s        float64 // next synthesis mark, input timeline
	sp       int64   // its integer position
	grainAt  int64   // input index at which its grain is added
	lastStep float64 // distance to the previous synthesis mark
	acc      []float32
	wacc     []float32
	accMask  int64

	mix, mixTarget, mixStep float32
}

type voiceMark struct {
	pos    int64
	voiced bool
}

const (
	voiceLatencySec = 0.030
	voiceLeadSec    = 0.014
	voiceLookSec    = 0.002
	voiceUVHalfSec  = 0.005
	voiceUVLagSec   = 0.011
	voiceXfadeSec   = 0.020
	voiceGlideSec   = 0.015
	voiceHopSec     = 0.005
	voiceYINWinSec  = 0.010
	voiceMarkCap    = 256 // power of two

	voiceMaxPitch   = 12.0
	voiceMaxFormant = 6.0

	voiceGateRMS     = 0.0015 // ≈ −56 dBFS: quieter frames are unvoiced
	voiceHoldAper    = 0.35   // aperiodicity that keeps an already voiced track voiced
	voiceMinMarkCorr = 0.5    // a weaker period match ends the voiced run
)

// NewVoice returns a Voice for sampleRate Hz (8 kHz to 96 kHz) with pitch and
// formant shift 0 (bypass).
func NewVoice(sampleRate int) (*Voice, error) {
	if sampleRate < 8000 || sampleRate > 96000 {
		return nil, fmt.Errorf("dsp: voice: sample rate %d Hz outside 8000..96000", sampleRate)
	}
	sr := float64(sampleRate)
	v := &Voice{
		sr:       sampleRate,
		lat:      int64(math.Round(voiceLatencySec * sr)),
		lead:     int64(math.Round(voiceLeadSec * sr)),
		look:     int64(math.Round(voiceLookSec * sr)),
		uvLag:    int64(math.Round(voiceUVLagSec * sr)),
		uvHalf:   math.Round(voiceUVHalfSec * sr),
		minPer:   sr / pitchMaxF0,
		maxPer:   sr / pitchMinF0,
		smoothTC: voiceGlideSec * sr,
		gate:     voiceGateRMS,
	}
	v.in = make([]float32, voicePow2(int(0.12*sr)))
	v.inMask = int64(len(v.in) - 1)
	n := voicePow2(int(0.08 * sr))
	v.acc = make([]float32, n)
	v.wacc = make([]float32, n)
	v.accMask = int64(n - 1)

	v.dfac = pitchDecimFactor(sampleRate)
	v.lp = pitchLowpass(v.dfac)
	v.gd = int64(len(v.lp)-1) / 2
	v.yin = newPitchYIN(sr/float64(v.dfac), pitchMinF0, pitchMaxF0, voiceYINWinSec)
	v.hop = int(math.Round(voiceHopSec * sr / float64(v.dfac)))
	fl := v.yin.frameLen()
	v.dkeep = 4 * fl
	v.dbuf = make([]float32, 8*fl)
	v.marks = make([]voiceMark, voiceMarkCap)
	v.mixStep = float32(1 / (voiceXfadeSec * sr))
	v.Reset()
	return v, nil
}

func voicePow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// Reset clears the stream state (history, marks, pending output) as if the
// Voice had just been created; the parameters are kept and take effect at
// once, without a glide.
func (v *Voice) Reset() {
	clear(v.in)
	clear(v.acc)
	clear(v.wacc)
	v.n = 0
	v.dphase = 0
	// The decimated history starts with one frame of silence before t=0.
	fl := v.yin.frameLen()
	clear(v.dbuf)
	v.dbase = -int64(fl)
	v.dlen = fl
	v.hopPhase = 0
	v.trkVoiced = false
	v.trkPeriod = 0
	clear(v.marks)
	v.mhead = 0
	v.mcount = 1
	v.marks[0] = voiceMark{pos: 0}
	v.markCheckAt = 0
	v.curPitch, v.curFormant = v.tgtPitch, v.tgtFormant
	v.s = 0
	v.sp = 0
	v.grainAt = v.lat - v.lead
	v.lastStep = v.uvHalf
	v.mixTarget = v.wantMix()
	v.mix = v.mixTarget
}

// SetParams sets the pitch shift and the formant shift in semitones. Pitch is
// clamped to ±12 and formant to ±6 (NaN counts as 0). With pitch 0 the
// formants follow the formant shift alone; with formant 0 the formants stay
// where they are whatever the pitch. Changes glide in over about 15 ms; moving
// to or from 0/0 cross-fades with the dry signal over 20 ms.
func (v *Voice) SetParams(pitchSemitones, formantSemitones float64) {
	v.tgtPitch = voiceClamp(pitchSemitones, voiceMaxPitch)
	v.tgtFormant = voiceClamp(formantSemitones, voiceMaxFormant)
	v.mixTarget = v.wantMix()
}

func voiceClamp(x, lim float64) float64 {
	switch {
	case math.IsNaN(x):
		return 0
	case x > lim:
		return lim
	case x < -lim:
		return -lim
	}
	return x
}

func (v *Voice) wantMix() float32 {
	if v.tgtPitch == 0 && v.tgtFormant == 0 {
		return 0
	}
	return 1
}

// Params returns the requested pitch and formant shift in semitones (after
// clamping).
func (v *Voice) Params() (pitch, formant float64) { return v.tgtPitch, v.tgtFormant }

// Latency returns the constant delay of the output relative to the input, in
// samples: output sample k corresponds to input sample k−Latency().
func (v *Voice) Latency() int { return int(v.lat) }

// Process appends len(src) output samples to dst and returns it. dst may be
// src[:0] for in-place processing. It does not allocate when dst has the
// capacity.
func (v *Voice) Process(dst, src []float32) []float32 {
	base := len(dst)
	dst = slices.Grow(dst, len(src))[:base+len(src)]
	out := dst[base:]
	for i := range src {
		x := src[i]
		out[i] = v.step(x)
	}
	return dst
}

// step consumes one input sample and returns one output sample.
func (v *Voice) step(x float32) float32 {
	n := v.n
	v.in[n&v.inMask] = x
	if v.dphase == 0 {
		v.decimate(n)
		v.dphase = v.dfac
	}
	v.dphase--
	if n >= v.markCheckAt {
		v.placeMarks(n)
	}
	for n >= v.grainAt {
		v.grain(n)
	}

	tau := n - v.lat
	i := tau & v.accMask
	wet, ws := v.acc[i], v.wacc[i]
	v.acc[i], v.wacc[i] = 0, 0
	if ws > 1 {
		wet /= ws
	}
	y := v.in[tau&v.inMask]
	if v.mix != 0 {
		y += v.mix * (wet - y)
	}
	if v.mix != v.mixTarget {
		if v.mix < v.mixTarget {
			v.mix = min(v.mix+v.mixStep, v.mixTarget)
		} else {
			v.mix = max(v.mix-v.mixStep, v.mixTarget)
		}
	}
	v.n = n + 1
	return y
}

// decimate computes the decimated sample for input index n (a multiple of
// dfac) and runs the tracker when a hop is complete.
func (v *Voice) decimate(n int64) {
	var acc float32
	for i, h := range v.lp {
		acc += h * v.in[(n-int64(i))&v.inMask]
	}
	if v.dlen == len(v.dbuf) {
		drop := v.dlen - v.dkeep
		copy(v.dbuf, v.dbuf[drop:v.dlen])
		v.dbase += int64(drop)
		v.dlen = v.dkeep
	}
	v.dbuf[v.dlen] = acc
	v.dlen++
	v.hopPhase++
	if v.hopPhase < v.hop {
		return
	}
	v.hopPhase = 0
	fl := v.yin.frameLen()
	period, aper, rms := v.yin.analyze(v.dbuf[v.dlen-fl : v.dlen])
	limit := pitchVoicedAper
	if v.trkVoiced {
		limit = voiceHoldAper
	}
	v.trkVoiced = period > 0 && rms >= v.gate && aper < limit
	if v.trkVoiced {
		v.trkPeriod = period
	}
	v.markCheckAt = n // re-evaluate mark placement with the new decision
}

func (v *Voice) pushMark(pos int64, voiced bool) {
	v.mhead = (v.mhead + 1) & (voiceMarkCap - 1)
	v.marks[v.mhead] = voiceMark{pos: pos, voiced: voiced}
	if v.mcount < voiceMarkCap {
		v.mcount++
	}
}

// uvSpacing is the spacing of unvoiced marks: the grain half-width, shortened
// when the formant shift shortens the grains, so they always overlap by half.
func (v *Voice) uvSpacing() int64 {
	g := math.Exp2(v.curFormant / 12)
	return max(1, int64(math.Round(v.uvHalf*min(1, 1/g))))
}

// decAt returns the decimated sample with absolute index k.
func (v *Voice) decAt(k int64) float32 { return v.dbuf[k-v.dbase] }

// placeMarks places every analysis mark that the input up to index n allows.
func (v *Voice) placeMarks(n int64) {
	decEnd := v.dbase + int64(v.dlen) // exclusive
	df := int64(v.dfac)
	for {
		last := v.marks[v.mhead]
		if !v.trkVoiced {
			// Unvoiced marks trail the input by uvLag, so that a voicing
			// decision reached a little late still covers the onset.
			c := last.pos + v.uvSpacing()
			if c+v.uvLag > n {
				v.markCheckAt = c + v.uvLag
				return
			}
			v.pushMark(c, false)
			continue
		}
		P := v.trkPeriod
		a0 := int64(math.Round(float64(last.pos+v.gd) / float64(df))) // last mark, decimated
		if !last.voiced {
			// Start of a voiced run: the largest peak within the next period.
			end := a0 + int64(math.Ceil(P)) + 1
			if end > decEnd {
				v.markCheckAt = (end - 1) * df
				return
			}
			bestK, bestV := a0+1, float32(-1)
			for k := max(a0+1, v.dbase); k < end; k++ {
				if a := voiceAbs32(v.decAt(k)); a > bestV {
					bestK, bestV = k, a
				}
			}
			pos := max(bestK*df-v.gd, last.pos+1)
			v.pushMark(pos, true)
			continue
		}
		// Next period: maximise the normalised correlation between the
		// period around the last mark and the signal one period later.
		lo := max(int64(math.Floor(0.8*P)), int64(v.yin.tauMin))
		hi := min(int64(math.Ceil(1.25*P)), int64(v.yin.tauMax))
		plen := max(int64(math.Round(P)), 2)
		w1 := int64(math.Round(0.75 * float64(plen)))
		w2 := plen - w1
		end := a0 + hi + w2 + 1
		if end > decEnd {
			v.markCheckAt = (end - 1) * df
			return
		}
		if a0-w1 < v.dbase || lo >= hi {
			v.pushMark(last.pos+v.uvSpacing(), false)
			continue
		}
		tau, corr := v.periodMatch(a0-w1, int(plen), lo, hi)
		if corr < voiceMinMarkCorr {
			v.pushMark(last.pos+v.uvSpacing(), false)
			continue
		}
		v.pushMark(last.pos+max(1, int64(math.Round(tau*float64(df)))), true)
	}
}

// periodMatch returns the lag in [lo, hi] (fractional) maximising the
// normalised correlation of the decimated segment [start, start+n) with its
// copy lag samples later, and that correlation.
func (v *Voice) periodMatch(start int64, n int, lo, hi int64) (float64, float64) {
	t := v.dbuf[start-v.dbase:][:n]
	e0 := pitchDot(t, t)
	if e0 <= 1e-20 {
		return float64(lo), 0
	}
	best, bestC := lo, math.Inf(-1)
	var cPrev, cBest, cNext float64
	ncorr := func(lag int64) float64 {
		s := v.dbuf[start+lag-v.dbase:][:n]
		e := pitchDot(s, s)
		if e <= 1e-20 {
			return 0
		}
		return pitchDot(t, s) / math.Sqrt(e0*e)
	}
	prev := ncorr(lo - 1)
	cur := ncorr(lo)
	for lag := lo; lag <= hi; lag++ {
		next := ncorr(lag + 1)
		if cur > bestC {
			best, bestC = lag, cur
			cPrev, cBest, cNext = prev, cur, next
		}
		prev, cur = cur, next
	}
	off := 0.0
	if best > lo && best < hi {
		off = pitchParabola(cPrev, cBest, cNext)
	}
	return float64(best) + off, bestC
}

func voiceAbs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

// voiceGlide moves cur towards tgt by the fraction a, snapping when close.
func voiceGlide(cur, tgt, a float64) float64 {
	cur += a * (tgt - cur)
	if math.Abs(tgt-cur) < 1e-4 {
		cur = tgt
	}
	return cur
}

// grain adds the grain of the synthesis mark at v.sp (the input index now
// being n) and schedules the next synthesis mark.
func (v *Voice) grain(n int64) {
	// Parameter glide, per grain.
	if v.curPitch != v.tgtPitch || v.curFormant != v.tgtFormant {
		a := 1 - math.Exp(-v.lastStep/v.smoothTC)
		v.curPitch = voiceGlide(v.curPitch, v.tgtPitch, a)
		v.curFormant = voiceGlide(v.curFormant, v.tgtFormant, a)
	}
	beta := math.Exp2(v.curPitch / 12)
	gamma := math.Exp2(v.curFormant / 12)
	p := v.sp

	// Nearest analysis mark not more than look samples ahead.
	j, ok := v.findMark(p + v.look)
	if !ok {
		v.advance(p, float64(p)+v.uvHalf)
		return
	}
	prevIdx := (j - 1) & (voiceMarkCap - 1)
	hasPrev := j != v.oldestMark()
	if m := v.marks[j]; m.pos > p && hasPrev && p-v.marks[prevIdx].pos < m.pos-p {
		j = prevIdx
		prevIdx = (j - 1) & (voiceMarkCap - 1)
		hasPrev = j != v.oldestMark()
	}
	m := v.marks[j]
	a := m.pos
	nextIdx := (j + 1) & (voiceMarkCap - 1)
	hasNext := j != v.mhead

	var per, h float64 // local analysis spacing, grain half-width (input samples)
	if m.voiced {
		switch {
		case hasNext && v.marks[nextIdx].voiced:
			per = float64(v.marks[nextIdx].pos - a)
		case hasPrev && v.marks[prevIdx].voiced:
			per = float64(a - v.marks[prevIdx].pos)
		default:
			per = v.trkPeriod * float64(v.dfac)
		}
		per = min(max(per, v.minPer), v.maxPer)
		h = per
	} else {
		per = float64(v.uvSpacing())
		if hasNext {
			per = float64(v.marks[nextIdx].pos - a)
		}
		h = v.uvHalf
	}
	// Where the mapping is the identity (unvoiced, or no pitch shift) the
	// grain goes exactly where it came from, so formant-only shifting adds
	// no time jitter; otherwise it goes on the synthesis mark.
	centre := p
	if !m.voiced || v.curPitch == 0 {
		centre = a
	}
	// The grain may read input only up to n, must not start before the output
	// sample about to be played (n-lat), and must fit the accumulator.
	now := n - v.lat
	h = min(h, float64(n-a-3), gamma*float64(centre-now), gamma*float64(now+v.accMask-1-centre))
	if h >= 1 {
		g := float32(1)
		if m.voiced {
			// Loudness: a voiced grain is about one glottal pulse, so the
			// power follows the pulse rate (∝β) before normalisation and
			// ∝1/β after dividing by the window sum when pitching up; the
			// gain √β (up) or 1/√β (down) keeps it constant.
			g = float32(math.Exp2(math.Abs(v.curPitch) / 24))
		}
		v.addGrain(a, centre, h, gamma, g)
	}

	// Next synthesis mark.
	var next float64
	switch {
	case !m.voiced:
		next = float64(a) + per // identity mapping: follow the analysis marks
	case v.curPitch == 0:
		next = float64(a) + per
	default:
		next = v.s + per/beta
	}
	minStep := 0.25 * per / max(beta, 1)
	next = max(next, v.s+minStep)
	v.advance(p, next)
}

func (v *Voice) advance(p int64, next float64) {
	v.lastStep = next - v.s
	v.s = next
	v.sp = max(int64(math.Round(next)), p+1)
	v.grainAt = v.sp + v.lat - v.lead
}

func (v *Voice) oldestMark() int {
	return (v.mhead - v.mcount + 1) & (voiceMarkCap - 1)
}

// findMark returns the ring index of the newest mark at or before pos.
func (v *Voice) findMark(pos int64) (int, bool) {
	j := v.mhead
	for k := 0; k < v.mcount; k++ {
		if v.marks[j].pos <= pos {
			return j, true
		}
		j = (j - 1) & (voiceMarkCap - 1)
	}
	return 0, false
}

// addGrain overlap-adds the Hann-windowed input around mark a, with half-width
// h input samples, resampled by gamma, scaled by gain and centred on output
// position p.
func (v *Voice) addGrain(a, p int64, h, gamma float64, gain float32) {
	ho := h / gamma
	T := int64(math.Ceil(ho)) - 1
	if T < 0 {
		return
	}
	// Window phase θ = π t / ho, advanced by rotation.
	d := math.Pi / ho
	cd, sd := math.Cos(d), math.Sin(d)
	c, s := math.Cos(-float64(T)*d), math.Sin(-float64(T)*d)
	in, acc, wacc := v.in, v.acc, v.wacc
	im, am := v.inMask, v.accMask
	if gamma == 1 {
		for t := -T; t <= T; t++ {
			w := float32(0.5 + 0.5*c)
			k := (p + t) & am
			acc[k] += gain * w * in[(a+t)&im]
			wacc[k] += w
			c, s = c*cd-s*sd, s*cd+c*sd
		}
		return
	}
	for t := -T; t <= T; t++ {
		w := float32(0.5 + 0.5*c)
		u := float64(t) * gamma
		fl := math.Floor(u)
		f := float32(u - fl)
		i := a + int64(fl)
		x0 := in[(i-1)&im]
		x1 := in[i&im]
		x2 := in[(i+1)&im]
		x3 := in[(i+2)&im]
		// Catmull-Rom cubic.
		y := x1 + 0.5*f*(x2-x0+f*(2*x0-5*x1+4*x2-x3+f*(3*(x1-x2)+x3-x0)))
		k := (p + t) & am
		acc[k] += gain * w * y
		wacc[k] += w
		c, s = c*cd-s*sd, s*cd+c*sd
	}
}
