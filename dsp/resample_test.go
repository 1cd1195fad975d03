package dsp

import (
	"fmt"
	"github.com/voxpipe/voxpipe/internal/golden"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// goldenDir is the golden folder (see internal/golden).
func goldenDir(testing.TB) string { return golden.Root() }

// streamChunks runs r over src in random chunk sizes (including empty ones) and flushes.
func streamChunks(r *Resampler, src []float32, rng *rand.Rand, maxChunk int) []float32 {
	var out []float32
	for len(src) > 0 {
		k := rng.Intn(maxChunk + 1)
		if rng.Intn(8) == 0 {
			k = rng.Intn(3) // tiny chunks, including empty
		}
		k = min(k, len(src))
		out = r.Process(out, src[:k])
		src = src[k:]
	}
	return r.Flush(out)
}

func maxAbsDiff(a, b []float32) (float64, int) {
	worst, at := 0.0, -1
	for i := range a {
		if d := math.Abs(float64(a[i]) - float64(b[i])); d > worst || at < 0 {
			worst, at = d, i
		}
	}
	return worst, at
}

func TestResampleTorchaudioGolden(t *testing.T) {
	path := filepath.Join(goldenDir(t), "resample", "cases.gguf")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("golden data not available (%v); set VOXPIPE_GOLDEN_DIR to the shared golden folder", err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^r(\d+)_(\d+)\.input$`)
	cases := 0
	for _, ti := range f.Tensors {
		m := re.FindStringSubmatch(ti.Name)
		if m == nil {
			continue
		}
		cases++
		from, _ := strconv.Atoi(m[1])
		to, _ := strconv.Atoi(m[2])
		name := strings.TrimSuffix(ti.Name, ".input")
		t.Run(name, func(t *testing.T) {
			in, _, err := f.Float32(name + ".input")
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := f.Float32(name + ".output")
			if err != nil {
				t.Fatal(err)
			}
			got, err := ResampleTorchaudio(in, from, to)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("one-shot: %d samples, want %d", len(got), len(want))
			}
			d, at := maxAbsDiff(got, want)
			t.Logf("%d→%d: %d → %d samples, max |diff| %.2e at %d", from, to, len(in), len(got), d, at)
			if d > 2e-5 {
				t.Errorf("one-shot: max |diff| %.3g at %d (got %v want %v) exceeds 2e-5", d, at, got[at], want[at])
			}
			r, err := NewTorchaudioResampler(from, to, 6, 0.99)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewSource(int64(from*31 + to)))
			for trial := 0; trial < 3; trial++ {
				streamed := streamChunks(r, in, rng, []int{7, 480, 5000}[trial])
				if len(streamed) != len(want) {
					t.Fatalf("streamed: %d samples, want %d", len(streamed), len(want))
				}
				if d, at := maxAbsDiff(streamed, got); d != 0 {
					t.Errorf("streamed (max chunk %d) differs from one-shot by %g at %d", []int{7, 480, 5000}[trial], d, at)
				}
			}
		})
	}
	if cases != 8 {
		t.Errorf("found %d golden cases, want 8", cases)
	}
}

// fitTone fits y[n] ≈ a·sin(w·n) + b·cos(w·n) over y by least squares (w in radians per
// sample) and returns the amplitude and the phase relative to sin.
func fitTone(y []float32, w float64) (amp, phase float64) {
	var ss, sc, cc, ys, yc float64
	for n, v := range y {
		s, c := math.Sincos(w * float64(n))
		ss += s * s
		sc += s * c
		cc += c * c
		ys += float64(v) * s
		yc += float64(v) * c
	}
	det := ss*cc - sc*sc
	a := (ys*cc - yc*sc) / det
	b := (yc*ss - ys*sc) / det
	return math.Hypot(a, b), math.Atan2(b, a)
}

func tone(n int, freq, rate, amp float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(amp * math.Sin(2*math.Pi*freq*float64(i)/float64(rate)))
	}
	return x
}

func rms(x []float32) float64 {
	s := 0.0
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s / float64(len(x)))
}

var hqPairs = [][2]int{
	{48000, 16000}, {16000, 48000}, {48000, 44100}, {44100, 48000}, {48000, 24000},
	{24000, 48000}, {48000, 8000}, {8000, 48000}, {44100, 16000}, {16000, 24000},
}

func TestResampleHQPassband(t *testing.T) {
	for _, p := range hqPairs {
		from, to := p[0], p[1]
		nyq := float64(min(from, to)) / 2
		worst, worstF, worstPhase := 0.0, 0.0, 0.0
		for i := 0; i <= 40; i++ {
			freq := 20 + (0.9*nyq-20)*float64(i)/40
			in := tone(from/2, freq, float64(from), 0.5) // 0.5 s
			out, err := Resample(in, from, to)
			if err != nil {
				t.Fatal(err)
			}
			// Fit away from the edges (the filter sees zero padding there).
			edge := to / 50
			seg := out[edge : len(out)-edge]
			w := 2 * math.Pi * freq / float64(to)
			amp, phase := fitTone(seg, w)
			// The segment starts at output index edge: shift the phase back to index 0.
			phase = math.Remainder(phase-w*float64(edge), 2*math.Pi)
			gain := 20 * math.Log10(amp/0.5)
			if math.Abs(gain) > math.Abs(worst) {
				worst, worstF = gain, freq
			}
			worstPhase = max(worstPhase, math.Abs(phase))
		}
		t.Logf("%5d→%5d: passband to %.0f Hz: worst gain %+.5f dB at %.0f Hz, worst phase %.2e rad", from, to, 0.9*nyq, worst, worstF, worstPhase)
		if math.Abs(worst) > 0.1 {
			t.Errorf("%d→%d: passband gain %+.4f dB at %.0f Hz exceeds ±0.1 dB", from, to, worst, worstF)
		}
		if worstPhase > 1e-3 {
			t.Errorf("%d→%d: phase error %.3g rad: output is not aligned to input time n·from/to", from, to, worstPhase)
		}
	}
}

// TestResampleHQStopband checks that tones at or above the lower rate's Nyquist frequency
// are rejected by ≥ 80 dB: for downsampling they would alias into the output, for
// upsampling they are the images of in-band tones.
func TestResampleHQStopband(t *testing.T) {
	check := func(from, to int) {
		t.Helper()
		nyqOut := float64(to) / 2
		nyqIn := float64(from) / 2
		worst, worstF := -math.MaxFloat64, 0.0
		if to < from {
			// Tones between the output Nyquist and the input Nyquist.
			for i := 0; i <= 60; i++ {
				freq := nyqOut*1.002 + (nyqIn*0.998-nyqOut*1.002)*float64(i)/60
				in := tone(from/4, freq, float64(from), 0.5)
				out, err := Resample(in, from, to)
				if err != nil {
					t.Fatal(err)
				}
				edge := to / 50
				db := 20 * math.Log10(rms(out[edge:len(out)-edge])/rms(in))
				if db > worst {
					worst, worstF = db, freq
				}
			}
		} else {
			// In-band tones: whatever is left after removing the tone is imaging.
			for i := 0; i <= 40; i++ {
				freq := 50 + (nyqIn*0.998-50)*float64(i)/40
				in := tone(from/4, freq, float64(from), 0.5)
				out, err := Resample(in, from, to)
				if err != nil {
					t.Fatal(err)
				}
				edge := to / 50
				seg := out[edge : len(out)-edge]
				w := 2 * math.Pi * freq / float64(to)
				amp, phase := fitTone(seg, w)
				res := make([]float32, len(seg))
				for n := range seg {
					res[n] = seg[n] - float32(amp*math.Sin(w*float64(n)+phase))
				}
				db := 20 * math.Log10(rms(res)/rms(in))
				if db > worst {
					worst, worstF = db, freq
				}
			}
		}
		t.Logf("%5d→%5d: worst stopband leak %.1f dB (tone %.0f Hz)", from, to, worst, worstF)
		if worst > -80 {
			t.Errorf("%d→%d: stopband leak %.1f dB for a %.0f Hz tone, want ≤ −80 dB", from, to, worst, worstF)
		}
	}
	check(48000, 16000)
	check(48000, 44100)
	check(48000, 8000)
	check(44100, 16000)
	check(16000, 48000)
	check(44100, 48000)
}

func TestResampleLengths(t *testing.T) {
	pairs := append([][2]int{{22050, 16000}, {16000, 22050}, {3, 7}, {7, 3}, {1, 10000}, {10000, 1}}, hqPairs...)
	rng := rand.New(rand.NewSource(1))
	for _, p := range pairs {
		g := gcd(p[0], p[1])
		f, to := p[0]/g, p[1]/g
		hq, err := NewResampler(p[0], p[1])
		if err != nil {
			t.Fatal(err)
		}
		ta, err := NewTorchaudioResampler(p[0], p[1], 6, 0.99)
		if err != nil {
			t.Fatal(err)
		}
		lengths := []int{0, 1, 2, 3, f - 1, f, f + 1, 2*f + 1}
		maxLen := 5000
		if max(f, to) >= 1000 {
			maxLen = 30 // extreme ratios: each input or output sample costs ~100k taps
		} else {
			lengths = append(lengths, 1000)
		}
		for i := 0; i < 20; i++ {
			lengths = append(lengths, rng.Intn(maxLen))
		}
		for _, n := range lengths {
			if n < 0 {
				continue
			}
			want := (n*to + f - 1) / f
			src := make([]float32, n)
			for _, r := range []*Resampler{hq, ta} {
				out := r.Flush(r.Process(nil, src))
				if len(out) != want || r.OutputLen(n) != want {
					t.Errorf("%d→%d: %d samples in, %d out (OutputLen %d), want %d", p[0], p[1], n, len(out), r.OutputLen(n), want)
				}
			}
		}
	}
}

func TestResampleStreaming(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	src := make([]float32, 30000)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 0.3)
	}
	for _, p := range append([][2]int{{22050, 16000}, {3, 7}}, hqPairs...) {
		for _, hq := range []bool{true, false} {
			var r *Resampler
			var err error
			if hq {
				r, err = NewResampler(p[0], p[1])
			} else {
				r, err = NewTorchaudioResampler(p[0], p[1], 6, 0.99)
			}
			if err != nil {
				t.Fatal(err)
			}
			oneShot := r.Flush(r.Process(nil, src))
			for trial, maxChunk := range []int{1, 13, 480, 9000, 40000} {
				got := streamChunks(r, src, rng, maxChunk)
				if len(got) != len(oneShot) {
					t.Fatalf("%v hq=%v trial %d: %d samples, want %d", p, hq, trial, len(got), len(oneShot))
				}
				if d, at := maxAbsDiff(got, oneShot); d != 0 {
					t.Fatalf("%v hq=%v max chunk %d: differs from one-shot by %g at %d", p, hq, maxChunk, d, at)
				}
			}
			// Reset in the middle of a stream starts over.
			r.Process(nil, src[:1234])
			r.Reset()
			if got := r.Flush(r.Process(nil, src)); len(got) != len(oneShot) || got[len(got)/2] != oneShot[len(got)/2] {
				t.Fatalf("%v hq=%v: Reset did not start a new stream", p, hq)
			}
		}
	}
}

// TestResampleLookahead checks that Process emits every output whose input is complete:
// after N input samples, all outputs n with n·from/to + LookaheadInput ≤ N−1 are out, and
// none whose time is at or beyond N.
func TestResampleLookahead(t *testing.T) {
	for _, p := range append([][2]int{{22050, 16000}}, hqPairs...) {
		for _, hq := range []bool{true, false} {
			var r *Resampler
			if hq {
				r, _ = NewResampler(p[0], p[1])
			} else {
				r, _ = NewTorchaudioResampler(p[0], p[1], 6, 0.99)
			}
			from, to := p[0], p[1]
			la := r.LookaheadInput()
			var out []float32
			x := make([]float32, 1)
			for N := 1; N <= 3000; N++ {
				out = r.Process(out, x)
				// Outputs with time τ = n·from/to ≤ N−1−la.
				minOut := 0
				if N-1-la >= 0 {
					minOut = (N-1-la)*to/from + 1
				}
				maxOut := (N*to + from - 1) / from // outputs with τ < N
				if len(out) < minOut || len(out) > maxOut {
					t.Fatalf("%d→%d hq=%v lookahead %d: after %d inputs %d outputs, want %d..%d", from, to, hq, la, N, len(out), minOut, maxOut)
				}
			}
			latency := float64(la) / float64(from) * 1000
			t.Logf("%5d→%5d hq=%-5v lookahead %4d input samples (%.2f ms)", from, to, hq, la, latency)
			if hq && latency > 7 {
				t.Errorf("%d→%d: lookahead %.2f ms is too long", from, to, latency)
			}
			r.Reset()
		}
	}
}

func TestResampleRoundTrip(t *testing.T) {
	in := tone(16000, 1000, 16000, 0.8)
	up, err := Resample(in, 16000, 48000)
	if err != nil {
		t.Fatal(err)
	}
	down, err := Resample(up, 48000, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if len(down) != len(in) {
		t.Fatalf("round trip length %d, want %d", len(down), len(in))
	}
	edge := 400
	var errE, sigE float64
	for i := edge; i < len(in)-edge; i++ {
		d := float64(down[i]) - float64(in[i])
		errE += d * d
		sigE += float64(in[i]) * float64(in[i])
	}
	snr := 10 * math.Log10(sigE/errE)
	t.Logf("16k→48k→16k 1 kHz tone: SNR %.1f dB", snr)
	if snr < 80 {
		t.Errorf("round trip SNR %.1f dB, want ≥ 80 dB", snr)
	}
	// 48k upsampled tone is the 1 kHz tone at 48k.
	ref := tone(48000, 1000, 48000, 0.8)
	if d, at := maxAbsDiff(up[1200:len(up)-1200], ref[1200:len(up)-1200]); d > 1e-3 {
		t.Errorf("upsampled tone differs from a 48 kHz tone by %g at %d", d, at+1200)
	}
}

func TestResampleImpulseAlignment(t *testing.T) {
	// An impulse at input index m peaks at output index m·to/from (zero phase).
	for _, p := range [][2]int{{48000, 16000}, {16000, 48000}, {24000, 48000}} {
		for _, hq := range []bool{true, false} {
			in := make([]float32, 3000)
			in[1500] = 1
			var out []float32
			if hq {
				out, _ = Resample(in, p[0], p[1])
			} else {
				out, _ = ResampleTorchaudio(in, p[0], p[1])
			}
			peak := 0
			for i := range out {
				if out[i] > out[peak] {
					peak = i
				}
			}
			if want := 1500 * p[1] / p[0]; peak != want {
				t.Errorf("%v hq=%v: impulse peak at %d, want %d", p, hq, peak, want)
			}
		}
	}
}

func TestResampleIdentityAndErrors(t *testing.T) {
	in := []float32{1, -2, 3}
	out, err := Resample(in, 16000, 16000)
	if err != nil || fmt.Sprint(out) != fmt.Sprint(in) {
		t.Fatalf("identity: %v %v", out, err)
	}
	out[0] = 9
	if in[0] != 1 {
		t.Fatal("identity output aliases the input")
	}
	r, _ := NewResampler(44100, 44100)
	if r.LookaheadInput() != 0 || r.OutputLen(7) != 7 {
		t.Error("identity lookahead/length")
	}
	if f, to := r.Rates(); f != 44100 || to != 44100 {
		t.Error("Rates")
	}
	if r, _ := NewResampler(48000, 16000); func() bool { f, to := r.Rates(); return f != 48000 || to != 16000 }() {
		t.Error("Rates should return the rates as given")
	}
	for _, c := range []struct {
		from, to int
		want     string
	}{
		{0, 16000, "must be positive"},
		{16000, -1, "must be positive"},
		{10007, 10009, "too complex"},
		{1, 20000, "too complex"},
	} {
		if _, err := NewResampler(c.from, c.to); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewResampler(%d, %d): error %v, want %q", c.from, c.to, err, c.want)
		}
		if _, err := Resample(in, c.from, c.to); err == nil {
			t.Errorf("Resample(%d, %d) should fail", c.from, c.to)
		}
	}
	if _, err := NewTorchaudioResampler(48000, 16000, 0, 0.99); err == nil {
		t.Error("lowpass width 0 should fail")
	}
	if _, err := NewTorchaudioResampler(48000, 16000, 6, 1.5); err == nil {
		t.Error("rolloff 1.5 should fail")
	}
	if _, err := NewTorchaudioResampler(48000, 16000, 6, math.NaN()); err == nil {
		t.Error("rolloff NaN should fail")
	}
}

// TestResampleConcurrent runs resamplers that share a cached kernel table in parallel
// (meaningful under -race).
func TestResampleConcurrent(t *testing.T) {
	in := tone(24000, 440, 48000, 0.5)
	want, _ := Resample(in, 48000, 16000)
	done := make(chan []float32)
	for g := 0; g < 4; g++ {
		go func() {
			r, err := NewResampler(48000, 16000)
			if err != nil {
				done <- nil
				return
			}
			done <- streamChunks(r, in, rand.New(rand.NewSource(int64(g))), 700)
		}()
	}
	for g := 0; g < 4; g++ {
		got := <-done
		if d, _ := maxAbsDiff(got, want); len(got) != len(want) || d != 0 {
			t.Errorf("goroutine result differs (len %d, diff %g)", len(got), d)
		}
	}
}

func TestResampleNoAllocs(t *testing.T) {
	for _, p := range hqPairs {
		r, _ := NewResampler(p[0], p[1])
		src := tone(960, 440, float64(p[0]), 0.5)
		dst := make([]float32, 0, 4096)
		allocs := testing.AllocsPerRun(200, func() {
			dst = r.Process(dst[:0], src)
		})
		if allocs != 0 {
			t.Errorf("%v: Process allocates %.1f times per call", p, allocs)
		}
	}
}

func benchmarkResample(b *testing.B, from, to int) {
	r, err := NewResampler(from, to)
	if err != nil {
		b.Fatal(err)
	}
	chunk := from / 50 // 20 ms
	src := tone(chunk, 440, float64(from), 0.5)
	dst := make([]float32, 0, r.OutputLen(chunk)+8)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst = r.Process(dst[:0], src)
	}
	sec := b.Elapsed().Seconds()
	inPerSec := float64(b.N) * float64(chunk) / sec
	b.ReportMetric(inPerSec, "in-samples/s")
	b.ReportMetric(inPerSec*float64(to)/float64(from), "out-samples/s")
	b.ReportMetric(inPerSec/float64(from), "x-realtime")
}

func BenchmarkResample48kTo16k(b *testing.B)  { benchmarkResample(b, 48000, 16000) }
func BenchmarkResample16kTo48k(b *testing.B)  { benchmarkResample(b, 16000, 48000) }
func BenchmarkResample48kTo44k1(b *testing.B) { benchmarkResample(b, 48000, 44100) }

func BenchmarkNewResampler48kTo44k1(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := NewResampler(48000, 44100); err != nil {
			b.Fatal(err)
		}
	}
}
