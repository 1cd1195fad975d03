package dsp

import (
	"math"
	"math/rand"
	"path/filepath"
	"testing"
)

// vtShiftCases are the pitch shifts checked on synthetic voices.
var vtShiftCases = []float64{-7, -4, 4, 7, 12}

func TestVoiceNewVoiceRates(t *testing.T) {
	for _, sr := range []int{0, 7999, 96001, -1} {
		if _, err := NewVoice(sr); err == nil {
			t.Errorf("NewVoice(%d): want error", sr)
		}
	}
	for _, sr := range []int{8000, 16000, 22050, 24000, 32000, 44100, 48000, 96000} {
		v, err := NewVoice(sr)
		if err != nil {
			t.Fatalf("NewVoice(%d): %v", sr, err)
		}
		ms := 1000 * float64(v.Latency()) / float64(sr)
		if ms > 40 || ms < 5 {
			t.Errorf("sr=%d: latency %d samples = %.1f ms, want ≤ 40 ms", sr, v.Latency(), ms)
		}
		if sr == 24000 {
			t.Logf("latency at 24 kHz: %d samples = %.1f ms", v.Latency(), ms)
		}
	}
}

func TestVoiceParamsClamp(t *testing.T) {
	v, err := NewVoice(24000)
	if err != nil {
		t.Fatal(err)
	}
	if p, f := v.Params(); p != 0 || f != 0 {
		t.Fatalf("initial params %v %v, want 0 0", p, f)
	}
	for _, c := range []struct{ p, f, wp, wf float64 }{
		{3.5, -2, 3.5, -2},
		{20, 9, 12, 6},
		{-20, -9, -12, -6},
		{math.NaN(), math.Inf(1), 0, 6},
	} {
		v.SetParams(c.p, c.f)
		if p, f := v.Params(); p != c.wp || f != c.wf {
			t.Errorf("SetParams(%v, %v): Params() = %v %v, want %v %v", c.p, c.f, p, f, c.wp, c.wf)
		}
	}
}

// TestVoiceBypass: with pitch 0 and formant 0 the output is the input delayed
// by exactly Latency() samples, at every supported rate.
func TestVoiceBypass(t *testing.T) {
	for _, sr := range []int{16000, 24000, 48000} {
		x := vtVoiced(sr, 140, 1.0, 0.5, vtDefaultFormants)
		rng := rand.New(rand.NewSource(1))
		for i := range x {
			x[i] += 0.05 * float32(rng.NormFloat64())
		}
		v, err := NewVoice(sr)
		if err != nil {
			t.Fatal(err)
		}
		y := v.Process(nil, x)
		L := v.Latency()
		if len(y) != len(x) {
			t.Fatalf("sr=%d: output length %d, want %d", sr, len(y), len(x))
		}
		var maxErr float64
		for k := range y {
			want := float32(0)
			if k >= L {
				want = x[k-L]
			}
			maxErr = math.Max(maxErr, math.Abs(float64(y[k]-want)))
		}
		if maxErr > 1e-7 {
			t.Errorf("sr=%d: bypass max error %g, want ≤ 1e-7", sr, maxErr)
		}
	}
}

// TestVoiceBypassAfterProcessing: returning to 0/0 after processing
// cross-fades back to the exact delayed input.
func TestVoiceBypassAfterProcessing(t *testing.T) {
	const sr = 24000
	x := vtVoiced(sr, 130, 1.5, 0.3, vtDefaultFormants)
	v, err := NewVoice(sr)
	if err != nil {
		t.Fatal(err)
	}
	v.SetParams(5, 2)
	y := v.Process(nil, x[:sr/2])
	v.SetParams(0, 0)
	y = v.Process(y, x[sr/2:])
	L := v.Latency()
	settle := sr/2 + L + sr/10 // 100 ms after the switch reaches the output
	var maxErr float64
	for k := settle; k < len(y); k++ {
		maxErr = math.Max(maxErr, math.Abs(float64(y[k]-x[k-L])))
	}
	if maxErr != 0 {
		t.Errorf("after switching back to bypass: max error %g, want 0", maxErr)
	}
}

// TestVoiceChunkIndependence: the output does not depend on how the input is
// cut into chunks (bitwise), including a parameter change at a fixed sample.
func TestVoiceChunkIndependence(t *testing.T) {
	x, sr := vtReadWAV(t, filepath.Join("..", "testdata", "speech_en_48k.wav"))
	const change = 70000
	run := func(chunks func() int) []float32 {
		v, err := NewVoice(sr)
		if err != nil {
			t.Fatal(err)
		}
		v.SetParams(5, 2)
		var y []float32
		for pos := 0; pos < len(x); {
			n := min(chunks(), len(x)-pos)
			if pos < change && pos+n > change {
				n = change - pos
			}
			before := len(y)
			y = v.Process(y, x[pos:pos+n])
			if len(y)-before != n {
				t.Fatalf("Process appended %d samples for %d input samples", len(y)-before, n)
			}
			pos += n
			if pos == change {
				v.SetParams(-4, -3)
			}
		}
		return y
	}
	ref := run(func() int { return len(x) })
	rng := rand.New(rand.NewSource(7))
	for trial := 0; trial < 3; trial++ {
		y := run(func() int {
			switch rng.Intn(4) {
			case 0:
				return rng.Intn(3) // including empty chunks
			case 1:
				return 1 + rng.Intn(64)
			default:
				return 1 + rng.Intn(2000)
			}
		})
		if len(y) != len(ref) {
			t.Fatalf("trial %d: length %d, want %d", trial, len(y), len(ref))
		}
		for i := range y {
			if y[i] != ref[i] {
				t.Fatalf("trial %d: sample %d differs: %g vs %g", trial, i, y[i], ref[i])
			}
		}
	}
}

// TestVoiceInPlace: dst may be src[:0].
func TestVoiceInPlace(t *testing.T) {
	const sr = 24000
	x := vtVoiced(sr, 150, 0.5, 0.3, vtDefaultFormants)
	ref, _ := vtProcess(t, sr, 4, 1, x)
	v, _ := NewVoice(sr)
	v.SetParams(4, 1)
	buf := append([]float32(nil), x...)
	for pos := 0; pos < len(buf); pos += 480 {
		c := buf[pos:min(pos+480, len(buf))]
		v.Process(c[:0], c)
	}
	for i := range buf {
		if buf[i] != ref[i] {
			t.Fatalf("in-place sample %d: %g, want %g", i, buf[i], ref[i])
		}
	}
}

func TestVoiceNoAllocs(t *testing.T) {
	const sr = 24000
	x := vtVoiced(sr, 150, 1, 0.3, vtDefaultFormants)
	v, _ := NewVoice(sr)
	v.SetParams(7, 3)
	out := make([]float32, 0, 480)
	pos := 0
	allocs := testing.AllocsPerRun(200, func() {
		if pos+480 > len(x) {
			pos = 0
		}
		out = v.Process(out[:0], x[pos:pos+480])
		pos += 480
	})
	if allocs != 0 {
		t.Errorf("Process allocates %.1f times per call", allocs)
	}
}

// TestVoicePitchShiftSynthetic: the median F0 of the output of a synthetic
// voice (pulse train through formant resonators, with vibrato) is
// F0·2^(s/12) within ±0.3 semitone.
func TestVoicePitchShiftSynthetic(t *testing.T) {
	for _, sr := range []int{24000, 48000} {
		for _, f0 := range []float64{110, 150, 220} {
			x := vtVoiced(sr, f0, 1.5, 0.3, vtDefaultFormants)
			in := MedianF0(x, sr)
			if math.Abs(vtSemitones(in/f0)) > 0.1 {
				t.Fatalf("sr=%d f0=%g: input measured %.2f Hz", sr, f0, in)
			}
			for _, s := range vtShiftCases {
				y, v := vtProcess(t, sr, s, 0, x)
				// Skip the start-up (latency plus 100 ms).
				out := MedianF0(y[v.Latency()+sr/10:], sr)
				got := vtSemitones(out / f0)
				if math.Abs(got-s) > 0.3 || out == 0 {
					t.Errorf("sr=%d f0=%g shift %+g: output F0 %.2f Hz = %+.3f st, want %+g ± 0.3", sr, f0, s, out, got, s)
				}
				// Loudness stays about constant.
				db := 20 * math.Log10(vtRMS(y[v.Latency()+sr/10:])/vtRMS(x[sr/10:]))
				if math.Abs(db) > 3 {
					t.Errorf("sr=%d f0=%g shift %+g: level changed by %.1f dB", sr, f0, s, db)
				}
			}
		}
	}
}

// TestVoiceOtherRates: the shifter works across the supported rates (8–96 kHz).
func TestVoiceOtherRates(t *testing.T) {
	for _, sr := range []int{8000, 16000, 22050, 32000, 44100, 96000} {
		x := vtVoiced(sr, 130, 1.2, 0.3, vtDefaultFormants)
		for _, s := range []float64{-5, 6} {
			y, v := vtProcess(t, sr, s, 0, x)
			out := MedianF0(y[v.Latency()+sr/10:], sr)
			if got := vtSemitones(out / 130); math.Abs(got-s) > 0.3 {
				t.Errorf("sr=%d shift %+g: got %+.3f st", sr, s, got)
			}
		}
	}
}

// TestVoiceFormants: the spectral envelope (long-term LPC) stays put under a
// pitch shift, and moves by ~2^(f/12) under a formant shift.
func TestVoiceFormants(t *testing.T) {
	for _, sr := range []int{24000, 48000} {
		for _, f0 := range []float64{110, 150, 220} {
			x := vtVoiced(sr, f0, 1.5, 0.3, vtDefaultFormants)
			for _, c := range []struct{ pitch, formant, tol float64 }{
				{5, 0, 50},
				{-5, 0, 50},
				{12, 0, 50},
				{0, 4, 80},
				{5, 4, 80},
				{0, -4, 80},
			} {
				y, v := vtProcess(t, sr, c.pitch, c.formant, x)
				L := v.Latency()
				cents := vtEnvelopeShift(x[sr/10:len(x)-L], y[L+sr/10:], sr)
				if math.Abs(cents-100*c.formant) > c.tol {
					t.Errorf("sr=%d f0=%g pitch %+g formant %+g: envelope moved %+.0f cents, want %+.0f ± %.0f",
						sr, f0, c.pitch, c.formant, cents, 100*c.formant, c.tol)
				}
				// The formant shift leaves the pitch alone.
				if got := vtSemitones(MedianF0(y[L+sr/10:], sr) / f0); math.Abs(got-c.pitch) > 0.3 {
					t.Errorf("sr=%d f0=%g pitch %+g formant %+g: F0 moved %+.3f st", sr, f0, c.pitch, c.formant, got)
				}
			}
		}
	}
	// Sanity check of the measure: plain resampling (speeding the tape up by
	// 5 semitones) moves the envelope by 500 cents.
	const sr = 24000
	x := vtVoiced(sr, 150, 1.5, 0.3, vtDefaultFormants)
	k := math.Exp2(5.0 / 12)
	fast := make([]float32, int(float64(len(x))/k))
	for i := range fast {
		u := float64(i) * k
		j := int(u)
		f := float32(u - float64(j))
		fast[i] = x[j]*(1-f) + x[min(j+1, len(x)-1)]*f
	}
	if c := vtEnvelopeShift(x, fast, sr); math.Abs(c-500) > 50 {
		t.Errorf("measure check: resampled signal envelope moved %+.0f cents, want +500", c)
	}
}

// TestVoiceSpeech: on real (espeak-ng) speech, +4 semitones moves the median
// F0 by 4 ± 0.3 semitones, at 48 kHz and at 24 kHz.
func TestVoiceSpeech(t *testing.T) {
	x48, sr := vtReadWAV(t, filepath.Join("..", "testdata", "speech_en_48k.wav"))
	if sr != 48000 {
		t.Fatalf("speech fixture at %d Hz, want 48000", sr)
	}
	x24 := make([]float32, len(x48)/2)
	for i := range x24 {
		x24[i] = 0.5 * (x48[2*i] + x48[2*i+1])
	}
	for _, c := range []struct {
		sr int
		x  []float32
	}{{48000, x48}, {24000, x24}} {
		in := MedianF0(c.x, c.sr)
		if in < 60 || in > 200 {
			t.Fatalf("sr=%d: input median F0 %.1f Hz implausible", c.sr, in)
		}
		for _, s := range []float64{4, -4} {
			y, v := vtProcess(t, c.sr, s, 0, c.x)
			y = y[v.Latency():]
			out := MedianF0(y, c.sr)
			got := vtSemitones(out / in)
			t.Logf("sr=%d shift %+g: median F0 %.2f → %.2f Hz (%+.3f st)", c.sr, s, in, out, got)
			if s == 4 && math.Abs(got-s) > 0.3 {
				t.Errorf("sr=%d shift %+g: median F0 moved %+.3f st, want %+g ± 0.3", c.sr, s, got, s)
			}
			// Frame by frame, where both are voiced, the shift is tight.
			fi := EstimateF0(c.x, c.sr, 0.01)
			fo := EstimateF0(y, c.sr, 0.01)
			var r []float64
			for i := range fi {
				if i < len(fo) && fi[i] > 0 && fo[i] > 0 {
					r = append(r, vtSemitones(fo[i]/fi[i]))
				}
			}
			med := vtMedian(r)
			t.Logf("sr=%d shift %+g: per-frame median shift %+.3f st over %d frames voiced in both", c.sr, s, med, len(r))
			if len(r) < 50 || math.Abs(med-s) > 0.2 {
				t.Errorf("sr=%d shift %+g: per-frame median shift %+.3f st over %d frames, want %+g ± 0.2", c.sr, s, med, len(r), s)
			}
			db := 20 * math.Log10(vtRMS(y)/vtRMS(c.x))
			if math.Abs(db) > 3 {
				t.Errorf("sr=%d shift %+g: level changed by %.1f dB", c.sr, s, db)
			}
		}
	}
}

func vtMedian(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return 0.5 * (s[len(s)/2-1] + s[len(s)/2])
}

// vtHF is the second difference of y, a high-pass that leaves little of a
// voice but all of a click.
func vtHF(y []float32) []float64 {
	out := make([]float64, len(y))
	for i := 2; i < len(y); i++ {
		out[i] = math.Abs(float64(y[i]) - 2*float64(y[i-1]) + float64(y[i-2]))
	}
	return out
}

func vtMaxAbs(x []float64) float64 {
	var m float64
	for _, v := range x {
		m = math.Max(m, v)
	}
	return m
}

// TestVoiceNoClicks changes the parameters mid-stream and checks that the
// high-frequency content around each change stays within the range of the
// steady parts, i.e. that there is no click.
func TestVoiceNoClicks(t *testing.T) {
	const sr = 24000
	const seg = sr // one second per setting
	type step struct{ pitch, formant float64 }
	cases := []struct {
		name  string
		steps []step
	}{
		{"0→+7→−5", []step{{0, 0}, {7, 0}, {-5, 0}}},
		{"bypass↔processed", []step{{0, 0}, {4, 0}, {0, 0}}},
		{"formant", []step{{3, 0}, {3, 5}, {-6, -4}}},
		{"bypass↔formant", []step{{0, 0}, {0, 6}, {0, 0}}},
		{"large jumps", []step{{-12, -6}, {12, 6}, {0, 0}}},
	}
	for _, sig := range []struct {
		name string
		x    []float32
	}{
		{"voice150", vtVoiced(sr, 150, 3, 0.2, vtDefaultFormants)},
		{"voice105", vtVoiced(sr, 105, 3, 0.2, []vtFormant{{500, 80}, {1500, 120}, {2700, 150}})},
		{"tone220", vtSine(sr, 220, 3, 0.5)},
	} {
		for _, c := range cases {
			v, err := NewVoice(sr)
			if err != nil {
				t.Fatal(err)
			}
			var y []float32
			for i, st := range c.steps {
				v.SetParams(st.pitch, st.formant)
				// 20 ms chunks, as the server feeds it.
				for pos := i * seg; pos < (i+1)*seg; pos += sr / 50 {
					y = v.Process(y, sig.x[pos:pos+sr/50])
				}
			}
			hf := vtHF(y)
			L := v.Latency()
			// steady[i]: the HF maximum of setting i, from 200 ms after it
			// reaches the output to the next change.
			steady := make([]float64, len(c.steps))
			for i := range c.steps {
				lo, hi := i*seg+L+sr/5, (i+1)*seg
				if i == len(c.steps)-1 {
					hi = len(y)
				}
				steady[i] = vtMaxAbs(hf[lo:hi])
			}
			// Around each change (from the change to 200 ms after it reaches
			// the output) against the steady parts on either side.
			for i := 1; i < len(c.steps); i++ {
				trans := vtMaxAbs(hf[i*seg : i*seg+L+sr/5])
				ref := math.Max(steady[i-1], steady[i])
				ratio := trans / ref
				t.Logf("%s %s change %d: steady HF max %.4f, around the change %.4f (×%.2f)", sig.name, c.name, i, ref, trans, ratio)
				if ratio > 1.5 {
					t.Errorf("%s %s change %d: high-frequency peak around the change is %.2f× the steady maximum (click)", sig.name, c.name, i, ratio)
				}
			}
			// The metric would catch a click: a 0.05 step at the change.
			clicked := append([]float32(nil), y...)
			for k := seg + L + 100; k < len(clicked); k++ {
				clicked[k] += 0.05
			}
			ref := math.Max(steady[0], steady[1])
			if r := vtMaxAbs(vtHF(clicked)[seg : seg+L+sr/5]); r <= 1.5*ref {
				t.Errorf("%s %s: metric self-check: a 0.05 step gives %.4f, not above 1.5×%.4f", sig.name, c.name, r, ref)
			}
		}
	}
}

func benchmarkVoice(b *testing.B, sr int) {
	x := vtVoiced(sr, 130, 2, 0.3, vtDefaultFormants)
	v, err := NewVoice(sr)
	if err != nil {
		b.Fatal(err)
	}
	v.SetParams(4, 0)
	chunk := sr / 50 // 20 ms
	out := make([]float32, 0, chunk)
	b.ReportAllocs()
	b.ResetTimer()
	pos := 0
	for i := 0; i < b.N; i++ {
		if pos+chunk > len(x) {
			pos = 0
		}
		out = v.Process(out[:0], x[pos:pos+chunk])
		pos += chunk
	}
	sec := b.Elapsed().Seconds() / float64(b.N) // per 20 ms of audio
	b.ReportMetric(sec/0.020*100, "%core/stream")
	b.ReportMetric(0.020/sec, "x-realtime")
}

func BenchmarkVoice24k(b *testing.B) { benchmarkVoice(b, 24000) }
func BenchmarkVoice48k(b *testing.B) { benchmarkVoice(b, 48000) }

// TestVoiceReset: after Reset the Voice behaves like a new one whose
// parameters were already in place (Reset skips the glide).
func TestVoiceReset(t *testing.T) {
	const sr = 24000
	x := vtVoiced(sr, 140, 1, 0.3, vtDefaultFormants)
	fresh, _ := NewVoice(sr)
	fresh.SetParams(6, -2)
	fresh.Reset()
	ref := fresh.Process(nil, x)
	v, _ := NewVoice(sr)
	v.SetParams(-3, 4)
	v.Process(nil, vtVoiced(sr, 200, 0.7, 0, vtDefaultFormants))
	v.SetParams(6, -2)
	v.Reset()
	y := v.Process(nil, x)
	for i := range y {
		if y[i] != ref[i] {
			t.Fatalf("after Reset sample %d: %g, want %g", i, y[i], ref[i])
		}
	}
}

// TestVoiceStress feeds speech, noise, silence, a loud square wave and
// random parameter changes for a while: the output stays finite and bounded.
func TestVoiceStress(t *testing.T) {
	speech, _ := vtReadWAV(t, filepath.Join("..", "testdata", "speech_en_48k.wav"))
	rng := rand.New(rand.NewSource(11))
	for _, sr := range []int{16000, 48000} {
		v, err := NewVoice(sr)
		if err != nil {
			t.Fatal(err)
		}
		var peakIn, peakOut float64
		buf := make([]float32, 0, sr)
		for seg := 0; seg < 120; seg++ { // 12 s in 100 ms segments
			src := make([]float32, sr/10)
			switch rng.Intn(5) {
			case 0:
				off := rng.Intn(len(speech) - len(src))
				copy(src, speech[off:])
			case 1:
				for i := range src {
					src[i] = 0.3 * float32(rng.NormFloat64())
				}
			case 2: // silence
			case 3:
				f := 60 + 600*rng.Float64()
				for i := range src {
					if math.Sin(2*math.Pi*f*float64(i)/float64(sr)) >= 0 {
						src[i] = 0.9
					} else {
						src[i] = -0.9
					}
				}
			case 4:
				copy(src, vtVoiced(sr, 60+400*rng.Float64(), 0.1, 2, vtDefaultFormants))
			}
			v.SetParams(rng.Float64()*30-15, rng.Float64()*16-8)
			for pos := 0; pos < len(src); {
				n := min(1+rng.Intn(700), len(src)-pos)
				buf = v.Process(buf[:0], src[pos:pos+n])
				for _, y := range buf {
					if math.IsNaN(float64(y)) || math.IsInf(float64(y), 0) {
						t.Fatalf("sr=%d: non-finite output", sr)
					}
					peakOut = math.Max(peakOut, math.Abs(float64(y)))
				}
				pos += n
			}
			for _, s := range src {
				peakIn = math.Max(peakIn, math.Abs(float64(s)))
			}
		}
		t.Logf("sr=%d: input peak %.2f, output peak %.2f", sr, peakIn, peakOut)
		if peakOut > 2.5*peakIn {
			t.Errorf("sr=%d: output peak %.2f for input peak %.2f", sr, peakOut, peakIn)
		}
	}
}

// TestVoiceIdentityMapping: with no pitch shift the grains go back where they
// came from, so a negligible formant shift (processed path fully on) gives
// nearly the delayed input, on speech with its voiced/unvoiced switching.
func TestVoiceIdentityMapping(t *testing.T) {
	x, sr := vtReadWAV(t, filepath.Join("..", "testdata", "speech_en_48k.wav"))
	y, v := vtProcess(t, sr, 0, 0.001, x)
	L := v.Latency()
	var se, sx float64
	for k := L; k < len(y); k++ {
		d := float64(y[k] - x[k-L])
		se += d * d
		sx += float64(x[k-L]) * float64(x[k-L])
	}
	snr := 10 * math.Log10(sx/se)
	t.Logf("processed path at pitch 0, formant 0.001: SNR %.1f dB against the delayed input", snr)
	if snr < 30 {
		t.Errorf("identity-mapped processed path SNR %.1f dB, want ≥ 30", snr)
	}
}
