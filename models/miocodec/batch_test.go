package miocodec

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/vulkantest"
)

// speakers are n distinct global embeddings made from the golden one.
func speakers(global []float32, n int) [][]float32 {
	out := make([][]float32, n)
	for s := range out {
		out[s] = make([]float32, len(global))
		for i, v := range global {
			out[s][i] = v * (1 - 0.15*float32(s)) * float32(1-2*((i+s)%2*(s%2)))
		}
	}
	return out
}

// runningIO is a stream's running-statistics state after some committed tokens (made-up
// sums, different per stream).
func runningIO(d *Decoder, s int) *runIO {
	io := &runIO{committed: 24 * (s + 1)}
	for i := range d.NumGroupNorms() {
		G := d.groupsOf(i)
		a := make([]float64, 2*G)
		for j := range G {
			a[j] = float64(io.committed) * 0.01 * float64(j-s)
			a[G+j] = float64(io.committed) * (1 + 0.1*float64(j+s))
		}
		io.acc = append(io.acc, a)
		io.commit = append(io.commit, nil)
	}
	return io
}

// checkBatchedWindows runs windows of several streams (distinct tokens, speakers and
// running statistics) as one program and each alone, and compares the samples and the
// statistics each commits: bit for bit when exact, else within tol (relative to the peak).
func checkBatchedWindows(t *testing.T, d *Decoder, long []int32, global []float32, sizes []int, exact bool, tol float64) {
	t.Helper()
	const n = 56
	globals := speakers(global, 4)
	for _, mode := range []gnMode{gnPlain, gnRunning} {
		pl := plan{n: n, frames: n * d.Config.WaveUpsample, gn: mode}
		if mode == gnRunning {
			pl.newFrom, pl.coreEnd = 16, 40
		}
		for _, B := range sizes {
			alone := make([]*window, B)
			batch := make([]*window, B)
			for s := range B {
				toks := long[s*20 : s*20+n]
				a := window{tokens: toks, global: globals[s], io: runningIO(d, s)}
				var err error
				if a.wave, err = d.run(pl, a.tokens, a.global, a.io, nil); err != nil {
					t.Fatal(err)
				}
				alone[s] = &a
				batch[s] = &window{tokens: toks, global: globals[s], io: runningIO(d, s)}
			}
			if err := d.runWindows(pl, batch); err != nil {
				t.Fatal(err)
			}
			for s := range B {
				what := fmt.Sprintf("stats mode %d, stream %d of %d", mode, s, B)
				compare(t, what+": samples", batch[s].wave, alone[s].wave, exact, tol)
				if mode == gnRunning {
					for i := range batch[s].io.commit {
						if !slices.Equal(batch[s].io.commit[i], alone[s].io.commit[i]) && exact {
							t.Errorf("%s: GroupNorm %d commits other sums", what, i)
						}
					}
				}
			}
		}
	}
}

func compare(t *testing.T, what string, got, want []float32, exact bool, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d samples, want %d", what, len(got), len(want))
	}
	if exact {
		if !slices.Equal(got, want) {
			mr, _ := relDiff(got, want)
			t.Errorf("%s differ from the stream alone (max rel %.3g)", what, mr)
		}
		return
	}
	if mr, _ := relDiff(got, want); mr > tol {
		t.Errorf("%s: max rel %.3g from the stream alone > %.3g", what, mr, tol)
	}
}

// TestBatchedWindowsMatchAlone: on the CPU a batched decode gives each stream exactly what
// it gets alone, in plain and running statistics modes.
func TestBatchedWindowsMatchAlone(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	checkBatchedWindows(t, d, long, global, []int{2, 3}, true, 0)
}

// TestBatchedWindowsVulkan: the batched program on Vulkan, against each stream alone there
// (within float32 rounding: the shaders' reductions are not bound to one order).
func TestBatchedWindowsVulkan(t *testing.T) {
	vulkantest.Require(t)
	be, err := engine.NewVulkan(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close) // after the decoder's cleanup
	r, d := loadTestDecoderOn(t, be)
	long, global := longCase(t, r)
	checkBatchedWindows(t, d, long, global, []int{3}, false, 1e-5)
}

// TestStreamsBatched: streams decoding at once share runs through the decoder's queue, and
// each one's audio is bit for bit its audio decoded alone.
func TestStreamsBatched(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	const streams = 4
	globals := speakers(global, streams)
	toks := make([][]int32, streams)
	want := make([][]float32, streams)
	for s := range streams {
		toks[s] = long[s*7 : s*7+100]
		var err error
		if want[s], err = streamDecode(d, toks[s], globals[s], StreamOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := d.BatchStats()
	// Hold the decoder while the streams start, so that the first windows queue together.
	d.mu.Lock()
	got := make([][]float32, streams)
	errs := make([]error, streams)
	var wg sync.WaitGroup
	for s := range streams {
		wg.Go(func() {
			st, err := d.NewStream(globals[s], StreamOptions{})
			if err != nil {
				errs[s] = err
				return
			}
			for i := range toks[s] { // a token at a time, as the language model emits them
				out, err := st.Push(toks[s][i : i+1])
				if err != nil {
					errs[s] = err
					return
				}
				got[s] = append(got[s], out...)
			}
			out, err := st.Flush()
			errs[s] = err
			got[s] = append(got[s], out...)
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for d.queue.Pending() < streams-1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	d.mu.Unlock()
	wg.Wait()
	for s := range streams {
		if errs[s] != nil {
			t.Fatal(errs[s])
		}
		compare(t, fmt.Sprintf("stream %d", s), got[s], want[s], true, 0)
	}
	st := d.BatchStats()
	runs, windows := st.Runs-before.Runs, st.Windows-before.Windows
	t.Logf("%d windows in %d runs", windows, runs)
	if windows <= runs {
		t.Errorf("no run decoded more than one window (%d windows in %d runs)", windows, runs)
	}
}

// TestBatchFailureIsolated: a batch that fails runs again a window at a time, and only the
// bad window fails.
func TestBatchFailureIsolated(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	pl := d.tokenPlan(40)
	good := &window{pl: pl, tokens: long[:40], global: global}
	bad := &window{pl: pl, tokens: append([]int32{-5}, long[1:40]...), global: global}
	d.runQueued([]*window{good, bad})
	if good.err != nil || len(good.wave) != 40*d.Config.SamplesPerToken() {
		t.Errorf("good window: %v, %d samples", good.err, len(good.wave))
	}
	if bad.err == nil {
		t.Error("bad window: no error")
	}
}

// BenchmarkWindowsBatched times B streams' steady windows (56 tokens, running statistics)
// of a real-size decoder (VOXPIPE_MIOCODEC_MODEL: `voxpipe mkmodel --family miocodec`)
// decoded as one program and one at a time, after checking that both give the same
// samples. ms/window is the time over B; what batching saves is the weights read once and
// the per-op overhead paid once for all B.
func BenchmarkWindowsBatched(b *testing.B) {
	path := os.Getenv("VOXPIPE_MIOCODEC_MODEL")
	if path == "" {
		b.Skip("set VOXPIPE_MIOCODEC_MODEL to a real-size MioCodec file (voxpipe mkmodel --family miocodec)")
	}
	be, err := engine.NewCPU(2)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	m, err := gguf.OpenModel(path)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	d, err := LoadDecoder(m, be)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	n := DefaultCore + 2*DefaultContext
	pl := plan{n: n, frames: n * d.Config.WaveUpsample, gn: gnRunning, newFrom: DefaultContext, coreEnd: DefaultContext + DefaultCore}
	rng := rand.New(rand.NewPCG(3, 4))
	global := make([]float32, d.CondDim)
	for i := range global {
		global[i] = rng.Float32()*2 - 1
	}
	globals := speakers(global, MaxBatch)
	for _, B := range []int{1, 2, 4, 8} {
		ws := make([]*window, B)
		for s := range ws {
			toks := make([]int32, n)
			for i := range toks {
				toks[i] = int32(rng.IntN(d.fsq.size()))
			}
			ws[s] = &window{tokens: toks, global: globals[s], io: runningIO(d, s)}
		}
		batched := func() error {
			for _, w := range ws {
				w.wave = w.wave[:0]
			}
			return d.runWindows(pl, ws)
		}
		alone := func() error {
			for _, w := range ws {
				w.wave = w.wave[:0]
				if err := d.runWindows(pl, []*window{w}); err != nil {
					return err
				}
			}
			return nil
		}
		if err := alone(); err != nil {
			b.Fatal(err)
		}
		want := make([][]float32, B)
		for s, w := range ws {
			want[s] = slices.Clone(w.wave)
		}
		if err := batched(); err != nil {
			b.Fatal(err)
		}
		for s, w := range ws {
			if !slices.Equal(w.wave, want[s]) {
				mr, _ := relDiff(w.wave, want[s])
				b.Fatalf("B=%d: stream %d's samples differ batched (max rel %.3g)", B, s, mr)
			}
		}
		for _, run := range []struct {
			name string
			fn   func() error
		}{{"batched", batched}, {"alone", alone}} {
			if B == 1 && run.name == "alone" {
				continue
			}
			b.Run(fmt.Sprintf("B=%d/%s", B, run.name), func(b *testing.B) {
				for range b.N {
					if err := run.fn(); err != nil {
						b.Fatal(err)
					}
				}
				per := float64(b.Elapsed().Microseconds()) / 1000 / float64(b.N)
				b.ReportMetric(per/float64(B), "ms/window")
			})
		}
	}
}

// TestWarm: Warm compiles the steady window's program for each batch size up to the stream
// count, once, and those are the programs the streams' batched runs then use.
func TestWarm(t *testing.T) {
	_, d := loadTestDecoder(t)
	o := StreamOptions{Ramp: []int{4, 8}}
	s, err := d.NewStream(make([]float32, d.CondDim), o)
	if err != nil {
		t.Fatal(err)
	}
	before := d.cache.Len()
	if err := s.Warm(5); err != nil {
		t.Fatal(err)
	}
	if got := d.cache.Len() - before; got != 3 { // batches of 1, 2 and 4
		t.Errorf("Warm for 5 streams compiled %d programs, want 3", got)
	}
	if err := s.Warm(4); err != nil {
		t.Fatal(err)
	}
	if got := d.cache.Len() - before; got != 3 {
		t.Errorf("a second Warm compiled again (%d programs)", got)
	}
	pl, _, _, _, _ := s.windowPlan(5, 1000) // a steady window
	for _, b := range []int{1, 2, 4} {
		pl.batch = b
		if _, err := d.cache.Get(pl.key(), func() (*engine.Graph, error) { return nil, errors.New("not compiled") }); err != nil {
			t.Errorf("no warm program for a batch of %d steady windows: %v", b, err)
		}
	}
	if got := d.cache.Len() - before; got != 3 {
		t.Errorf("the steady windows' programs were not the warm ones (%d programs)", got)
	}
}
