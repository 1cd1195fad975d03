package dsp

import (
	"math"
	"math/rand/v2"
	"testing"
)

// naiveISTFT is torch.istft(center=True) written out directly: an O(n²) real inverse DFT per
// frame, overlap-add of the windowed frames and of the squared window over the whole padded
// signal, division, and the nFFT/2 trim on both sides.
func naiveISTFT(re, im []float64, frames, nFFT, hop int, window []float64) []float64 {
	nb := nFFT/2 + 1
	total := nFFT + hop*(frames-1)
	y, env := make([]float64, total), make([]float64, total)
	for f := range frames {
		for n := range nFFT {
			v := re[f*nb] + re[f*nb+nFFT/2]*math.Cos(math.Pi*float64(n))
			for k := 1; k < nFFT/2; k++ {
				a := 2 * math.Pi * float64(k*n) / float64(nFFT)
				v += 2 * (re[f*nb+k]*math.Cos(a) - im[f*nb+k]*math.Sin(a))
			}
			v /= float64(nFFT)
			y[f*hop+n] += v * window[n]
			env[f*hop+n] += window[n] * window[n]
		}
	}
	out := make([]float64, 0, total-nFFT)
	for p := nFFT / 2; p < total-nFFT/2; p++ {
		out = append(out, y[p]/env[p])
	}
	return out
}

func randomFrames(rng *rand.Rand, frames, nb int) (re, im []float32, re64, im64 []float64) {
	for range frames * nb {
		a, b := rng.NormFloat64(), rng.NormFloat64()
		re, im = append(re, float32(a)), append(im, float32(b))
		re64, im64 = append(re64, float64(float32(a))), append(im64, float64(float32(b)))
	}
	return
}

func maxAbsDiff32(got []float32, want []float64) float64 {
	var d float64
	for i := range want {
		d = max(d, math.Abs(float64(got[i])-want[i]))
	}
	return d
}

func TestISTFTMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ nFFT, hop, win, frames int }{
		{640, 160, 640, 12}, {640, 160, 640, 14}, {640, 160, 640, 1}, {640, 160, 640, 2},
		{512, 128, 512, 9}, {24, 6, 16, 7}, {18, 9, 18, 5}, {14, 7, 14, 3},
	} {
		win := HannPeriodic(c.win)
		w64 := make([]float64, c.nFFT)
		for i, v := range win {
			w64[(c.nFFT-c.win)/2+i] = float64(v)
		}
		s, err := NewISTFT(c.nFFT, c.hop, win)
		if err != nil {
			t.Fatal(err)
		}
		re, im, re64, im64 := randomFrames(rng, c.frames, s.Bins())
		want := naiveISTFT(re64, im64, c.frames, c.nFFT, c.hop, w64)
		got, err := s.Inverse(re, im, c.frames, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != (c.frames-1)*c.hop || len(got) != len(want) {
			t.Fatalf("%+v: %d samples, want %d", c, len(got), len(want))
		}
		if d := maxAbsDiff32(got, want); d > 1e-5 {
			t.Errorf("%+v: batch max abs diff %.3g", c, d)
		}
		// Streaming, one frame at a time, gives the same samples in the same order.
		var stream []float32
		out := make([]float32, c.hop)
		for f := range c.frames {
			nb := s.Bins()
			n, err := s.Push(re[f*nb:(f+1)*nb], im[f*nb:(f+1)*nb], out)
			if err != nil {
				t.Fatal(err)
			}
			stream = append(stream, out[:n]...)
		}
		tail := make([]float32, s.FlushLen())
		n, err := s.Flush(tail)
		if err != nil {
			t.Fatal(err)
		}
		stream = append(stream, tail[:n]...)
		if len(stream) != len(want) {
			t.Fatalf("%+v: stream gave %d samples, want %d", c, len(stream), len(want))
		}
		if d := maxAbsDiff32(stream, want); d > 1e-5 {
			t.Errorf("%+v: stream max abs diff %.3g", c, d)
		}
	}
}

// TestISTFTRoundTrip inverts a centred, reflect-padded forward STFT (computed directly) and
// gets the signal back.
func TestISTFTRoundTrip(t *testing.T) {
	const nFFT, hop, n = 640, 160, 3200
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float64, n)
	for i := range x {
		x[i] = 0.3*math.Sin(float64(i)*0.05) + 0.1*rng.NormFloat64()
	}
	pad := make([]float64, n+nFFT)
	for i := range pad {
		j := i - nFFT/2
		if j < 0 {
			j = -j
		} else if j >= n {
			j = 2*(n-1) - j
		}
		pad[i] = x[j]
	}
	win := HannPeriodic(nFFT)
	frames := 1 + n/hop
	nb := nFFT/2 + 1
	re, im := make([]float32, frames*nb), make([]float32, frames*nb)
	for f := range frames {
		for k := range nb {
			var a, b float64
			for m := range nFFT {
				v := pad[f*hop+m] * float64(win[m])
				ang := -2 * math.Pi * float64(k*m) / nFFT
				a += v * math.Cos(ang)
				b += v * math.Sin(ang)
			}
			re[f*nb+k], im[f*nb+k] = float32(a), float32(b)
		}
	}
	s, err := NewISTFT(nFFT, hop, win)
	if err != nil {
		t.Fatal(err)
	}
	y, err := s.Inverse(re, im, frames, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(y) != n {
		t.Fatalf("%d samples, want %d", len(y), n)
	}
	if d := maxAbsDiff32(y, x); d > 1e-5 {
		t.Errorf("round trip max abs diff %.3g", d)
	}
}

func abs128(c complex128) float64 { return math.Hypot(real(c), imag(c)) }

func TestISTFTNoAllocs(t *testing.T) {
	s, err := NewISTFT(640, 160, HannPeriodic(640))
	if err != nil {
		t.Fatal(err)
	}
	re, im := make([]float32, s.Bins()), make([]float32, s.Bins())
	re[3], im[5] = 1, -0.5
	out := make([]float32, s.Hop())
	tail := make([]float32, s.FlushLen())
	if a := testing.AllocsPerRun(50, func() {
		for range 4 {
			if _, err := s.Push(re, im, out); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Flush(tail); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("%.0f allocations per run, want 0", a)
	}
}

func TestISTFTErrors(t *testing.T) {
	if _, err := NewISTFT(640, 400, HannPeriodic(640)); err == nil {
		t.Errorf("hop > n_fft/2: no error")
	}
	if _, err := NewISTFT(641, 160, HannPeriodic(641)); err == nil {
		t.Errorf("odd n_fft: no error")
	}
	if _, err := NewISTFT(640, 160, HannPeriodic(700)); err == nil {
		t.Errorf("window longer than n_fft: no error")
	}
	s, _ := NewISTFT(16, 4, HannPeriodic(16))
	if _, err := s.Push(make([]float32, 8), make([]float32, 9), make([]float32, 4)); err == nil {
		t.Errorf("short frame: no error")
	}
}

// BenchmarkISTFTPush: one frame of MeanVC2's vocoder (n_fft 640, hop 160) in and its hop out.
func BenchmarkISTFTPush(b *testing.B) {
	s, err := NewISTFT(640, 160, HannPeriodic(640))
	if err != nil {
		b.Fatal(err)
	}
	re, im, _, _ := randomFrames(rand.New(rand.NewPCG(3, 4)), 1, s.Bins())
	out := make([]float32, s.Hop())
	for b.Loop() {
		if _, err := s.Push(re, im, out); err != nil {
			b.Fatal(err)
		}
	}
}
