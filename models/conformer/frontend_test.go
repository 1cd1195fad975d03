package conformer

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/voxpipe/voxpipe/dsp"
)

// voiced is a test signal in [-0.5, 0.5]: a few harmonics with a slow envelope and noise.
func voiced(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, n)
	for i := range x {
		t := float64(i) / 16000
		env := 0.5 + 0.5*math.Sin(2*math.Pi*3*t)
		v := 0.0
		for h := 1; h <= 5; h++ {
			v += math.Sin(2*math.Pi*140*float64(h)*t) / float64(h)
		}
		x[i] = float32(0.2*env*v + 0.01*rng.NormFloat64())
	}
	return x
}

type window struct {
	frames []float32
	offset int
}

// feed pushes x in pieces of the given sizes (cycled) and flushes.
func feed(t *testing.T, fe *FrontEnd, x []float32, sizes ...int) []window {
	t.Helper()
	var out []window
	emit := func(w []float32, off int) error {
		out = append(out, window{slices.Clone(w), off})
		return nil
	}
	for i := 0; len(x) > 0; i++ {
		n := min(sizes[i%len(sizes)], len(x))
		if err := fe.Push(x[:n], emit); err != nil {
			t.Fatal(err)
		}
		x = x[n:]
	}
	if err := fe.Flush(emit); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFrontEndChunkSizes: the windows and offsets do not depend on how the audio is cut.
func TestFrontEndChunkSizes(t *testing.T) {
	fe, err := NewFrontEnd(RealConfig())
	if err != nil {
		t.Fatal(err)
	}
	x := voiced(2560*6+1000, 1)
	want := feed(t, fe, x, 2560)
	if len(want) != 6 {
		t.Fatalf("%d windows from 6 chunks and a 1000-sample tail, want 6", len(want))
	}
	for w, win := range want {
		if win.offset != 8+4*w || len(win.frames) != 19*80 {
			t.Fatalf("window %d: offset %d, %d values", w, win.offset, len(win.frames))
		}
	}
	for _, sizes := range [][]int{{320}, {1}, {777, 5000, 3}, {len(x)}} {
		fe.Reset()
		got := feed(t, fe, x, sizes...)
		if len(got) != len(want) {
			t.Fatalf("pieces %v: %d windows, want %d", sizes, len(got), len(want))
		}
		for w := range got {
			if got[w].offset != want[w].offset || !slices.Equal(got[w].frames, want[w].frames) {
				t.Fatalf("pieces %v: window %d differs", sizes, w)
			}
		}
	}
}

// TestFrontEndWindows checks the reference framing: the first window starts on the −0.5
// waveform tail (three frames of it alone: the log floor), later windows repeat the carried
// frames, a short last chunk gives a window only when carry + its frames reach 19.
func TestFrontEndWindows(t *testing.T) {
	cfg := RealConfig()
	fe, err := NewFrontEnd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := dsp.NewFbank(cfg.Fbank)
	if err != nil {
		t.Fatal(err)
	}
	x := voiced(2560*2, 2)
	ws := feed(t, fe, x, 2560)
	if len(ws) != 2 {
		t.Fatalf("%d windows", len(ws))
	}
	for i, v := range ws[0].frames[:3*80] {
		if v != dsp.FbankLogFloor {
			t.Fatalf("first window value %d = %g, want the log floor %g", i, v, dsp.FbankLogFloor)
		}
	}
	// The whole stream on one grid: tail ‖ audio, frame m at sample 160·m.
	full := append(slices.Repeat([]float32{-0.5}, 720), x...)
	all := make([]float32, fb.NumFrames(len(full))*80)
	if _, err := fb.Compute(all, full); err != nil {
		t.Fatal(err)
	}
	frame := func(m int) []float32 { return all[m*80 : (m+1)*80] }
	for f := range 19 {
		if !slices.Equal(ws[0].frames[f*80:(f+1)*80], frame(f)) {
			t.Fatalf("window 0 frame %d is not stream frame %d", f, f)
		}
	}
	// Window 1 = frames 16,17,18 (carried) then 16..31 (the new chunk's first 16).
	for f := range 19 {
		m := 16 + f
		if f >= 3 {
			m = 16 + f - 3
		}
		if !slices.Equal(ws[1].frames[f*80:(f+1)*80], frame(m)) {
			t.Fatalf("window 1 frame %d is not stream frame %d", f, m)
		}
	}
	// Short last chunks: 2080 samples give 16 frames, with the 3 carried exactly a window.
	for _, tc := range []struct{ tail, windows int }{{2079, 0}, {2080, 1}} {
		fe.Reset()
		got := feed(t, fe, voiced(2560+tc.tail, 3), 2560)
		if len(got) != 1+tc.windows {
			t.Errorf("chunk + %d-sample tail: %d windows, want %d", tc.tail, len(got), 1+tc.windows)
		}
	}
}

func TestFrontEndOffsetReset(t *testing.T) {
	cfg := RealConfig()
	cfg.Stream.OffsetReset = 20
	fe, err := NewFrontEnd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, w := range feed(t, fe, voiced(2560*7, 4), 2560) {
		got = append(got, w.offset)
	}
	// Reset before a chunk once the offset reached 20: max(8, 20−20) = 8.
	if want := []int{8, 12, 16, 8, 12, 16, 8}; !slices.Equal(got, want) {
		t.Errorf("offsets %v, want %v", got, want)
	}
}

func TestFrontEndAllocs(t *testing.T) {
	fe, err := NewFrontEnd(RealConfig())
	if err != nil {
		t.Fatal(err)
	}
	x := voiced(2560, 5)
	emit := func([]float32, int) error { return nil }
	if n := testing.AllocsPerRun(10, func() { fe.Push(x[:320], emit) }); n != 0 {
		t.Errorf("Push allocates %v times", n)
	}
}

// TestFrontEndEarlyWindows: Push emits a window as soon as the samples under its last frame
// have arrived — mid-chunk — and the windows equal those of whole chunks, for both MeanVC2
// front ends.
func TestFrontEndEarlyWindows(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream StreamConfig
		// chunk-local sample counts after which each window of chunk 0 / of later chunks exists
		first, later []int
	}{
		{"120ms", Stream120ms(), []int{2560}, []int{2080}},
		{"40ms", Stream40ms(), []int{1280, 2560}, []int{800, 2080}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := RealConfig()
			cfg.Stream = tc.stream
			x := voiced(2560*4, 6)
			whole, err := NewFrontEnd(cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := feed(t, whole, x, 2560)
			fe, err := NewFrontEnd(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var got []window
			var at []int // samples pushed when each window came
			pushed := 0
			emit := func(w []float32, off int) error {
				got = append(got, window{slices.Clone(w), off})
				at = append(at, pushed)
				return nil
			}
			for _, v := range x {
				pushed++
				if err := fe.Push([]float32{v}, emit); err != nil {
					t.Fatal(err)
				}
			}
			if len(got) != len(want) {
				t.Fatalf("%d windows sample by sample, %d by whole chunks", len(got), len(want))
			}
			for i := range got {
				if got[i].offset != want[i].offset || !slices.Equal(got[i].frames, want[i].frames) {
					t.Fatalf("window %d differs from the whole-chunk one", i)
				}
			}
			per := len(tc.later)
			for i, n := range at {
				chunk, w := 0, i
				if i >= len(tc.first) {
					chunk, w = 1+(i-len(tc.first))/per, (i-len(tc.first))%per
				}
				want := tc.first[w]
				if chunk > 0 {
					want = tc.later[w]
				}
				if n != 2560*chunk+want {
					t.Errorf("window %d (chunk %d, #%d) came after %d samples, want %d", i, chunk, w, n, 2560*chunk+want)
				}
			}
		})
	}
}
