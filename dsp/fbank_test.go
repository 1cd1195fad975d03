package dsp

import (
	"math"
	"math/cmplx"
	"math/rand/v2"
	"testing"
)

func sine(n int, hz, amp float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(amp * math.Sin(2*math.Pi*hz*float64(i)/16000))
	}
	return x
}

func newTestFbank(t *testing.T) *Fbank {
	t.Helper()
	f, err := NewFbank(KaldiFbankConfig())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFbankFrameCount(t *testing.T) {
	f := newTestFbank(t)
	if f.FrameLen() != 400 || f.Shift() != 160 || f.Bins() != 80 {
		t.Fatalf("frame %d, shift %d, bins %d", f.FrameLen(), f.Shift(), f.Bins())
	}
	for _, c := range []struct{ n, want int }{{0, 0}, {399, 0}, {400, 1}, {559, 1}, {560, 2}, {3280, 19}, {2800, 16}} {
		if got := f.NumFrames(c.n); got != c.want {
			t.Errorf("NumFrames(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

// TestFbankFFT compares the radix-2 FFT with a direct DFT.

// TestFbankSilence: no energy, whether zeros or a constant (DC is removed per frame), gives
// the log floor ln(float32 eps) in every bin.
func TestFbankSilence(t *testing.T) {
	f := newTestFbank(t)
	if want := float32(math.Log(math.Pow(2, -23))); FbankLogFloor != want {
		t.Fatalf("FbankLogFloor %g, want %g", FbankLogFloor, want)
	}
	for _, x := range [][]float32{make([]float32, 800), sine(800, 0, 0), constant(800, -0.5)} {
		out := make([]float32, f.NumFrames(len(x))*80)
		if _, err := f.Compute(out, x); err != nil {
			t.Fatal(err)
		}
		for i, v := range out {
			if v != FbankLogFloor {
				t.Fatalf("bin %d = %g, want the floor %g", i, v, FbankLogFloor)
			}
		}
	}
}

func constant(n int, v float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = v
	}
	return x
}

// TestFbankSinePeak: a sine's energy peaks in the mel bin whose centre is nearest to its
// frequency, and doubling the amplitude adds ln 4 there.
func TestFbankSinePeak(t *testing.T) {
	f := newTestFbank(t)
	mel := func(hz float64) float64 { return 1127 * math.Log(1+hz/700) }
	lo, hi := mel(20), mel(8000)
	delta := (hi - lo) / 81
	for _, hz := range []float64{250, 1000, 2500, 6000} {
		out := make([]float32, 80)
		f.Frame(out, sine(400, hz, 0.25))
		peak := 0
		for b, v := range out {
			if v > out[peak] {
				peak = b
			}
		}
		nearest, best := 0, math.Inf(1)
		for b := range 80 {
			if d := math.Abs(lo + float64(b+1)*delta - mel(hz)); d < best {
				nearest, best = b, d
			}
		}
		if peak != nearest && peak != nearest-1 && peak != nearest+1 {
			t.Errorf("%g Hz: peak in bin %d, centre nearest in bin %d", hz, peak, nearest)
		}
		out2 := make([]float32, 80)
		f.Frame(out2, sine(400, hz, 0.5))
		if d := float64(out2[peak] - out[peak]); math.Abs(d-math.Log(4)) > 1e-4 {
			t.Errorf("%g Hz: doubling the amplitude adds %g, want ln 4", hz, d)
		}
		if out[peak] < 10 {
			t.Errorf("%g Hz: peak log energy %g is implausibly low for a 0.25·32768 sine", hz, out[peak])
		}
	}
}

// TestFbankDirect compares a frame with a direct evaluation of Kaldi's definition: DC
// removal, pre-emphasis with the first sample replicated, Povey window, zero padding to 512,
// |DFT|², triangular mel weights evaluated per bin, log.
func TestFbankDirect(t *testing.T) {
	f := newTestFbank(t)
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 400)
	for i := range x {
		x[i] = float32(0.3*math.Sin(float64(i)*0.07) + 0.05*rng.NormFloat64() + 0.1)
	}
	got := make([]float32, 80)
	f.Frame(got, x)

	s := make([]float64, 400)
	var mean float64
	for i, v := range x {
		s[i] = float64(v) * 32768
		mean += s[i] / 400
	}
	pre := make([]float64, 400)
	for i := range s {
		prev := s[0]
		if i > 0 {
			prev = s[i-1]
		}
		w := math.Pow(0.5-0.5*math.Cos(2*math.Pi*float64(i)/399), 0.85)
		pre[i] = ((s[i] - mean) - 0.97*(prev-mean)) * w
	}
	power := make([]float64, 256)
	for k := range power {
		var c complex128
		for j, v := range pre {
			c += complex(v, 0) * cmplx.Exp(complex(0, -2*math.Pi*float64(j*k)/512))
		}
		power[k] = real(c)*real(c) + imag(c)*imag(c)
	}
	mel := func(hz float64) float64 { return 1127 * math.Log(1+hz/700) }
	lo, hi := mel(20), mel(8000)
	delta := (hi - lo) / 81
	for b := range 80 {
		l, c, r := lo+float64(b)*delta, lo+float64(b+1)*delta, lo+float64(b+2)*delta
		var e float64
		for k, p := range power {
			m := mel(float64(k) * 16000 / 512)
			if m > l && m < r {
				w := (m - l) / (c - l)
				if m > c {
					w = (r - m) / (r - c)
				}
				e += w * p
			}
		}
		want := math.Log(max(e, math.Pow(2, -23)))
		if d := math.Abs(float64(got[b]) - want); d > 1e-4*math.Abs(want)+1e-5 {
			t.Errorf("bin %d: %g, direct %g", b, got[b], want)
		}
	}
}

func TestFbankConfigErrors(t *testing.T) {
	for name, mod := range map[string]func(*FbankConfig){
		"dither":          func(c *FbankConfig) { c.Dither = 1 },
		"no snip edges":   func(c *FbankConfig) { c.SnipEdges = false },
		"window":          func(c *FbankConfig) { c.Window = "kaiser" },
		"high above nyq":  func(c *FbankConfig) { c.HighFreq = 9000 },
		"no bins":         func(c *FbankConfig) { c.NumMelBins = 0 },
		"not power of 2":  func(c *FbankConfig) { c.RoundPow2 = false },
		"low above high":  func(c *FbankConfig) { c.LowFreq = 7999; c.HighFreq = 7000 },
		"zero frame rate": func(c *FbankConfig) { c.SampleRate = 0 },
	} {
		c := KaldiFbankConfig()
		mod(&c)
		if _, err := NewFbank(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	f := newTestFbank(t)
	if _, err := f.Compute(make([]float32, 79), make([]float32, 400)); err == nil {
		t.Error("Compute without room accepted")
	}
}

func TestFbankAllocs(t *testing.T) {
	f := newTestFbank(t)
	x := sine(3280, 440, 0.3)
	out := make([]float32, 19*80)
	if n := testing.AllocsPerRun(5, func() { f.Compute(out, x) }); n != 0 {
		t.Errorf("Compute allocates %v times", n)
	}
}
