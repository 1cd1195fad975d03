package miotts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/qwen3"
	"github.com/voxpipe/voxpipe/models/sampler"
)

// TestConcurrentGenerateMatchesAlone: streams generating at once share batched decode steps,
// and each writes the tokens it writes alone — sampled with its own seed or greedy, joining
// while the others are mid-generation, one of them cancelled midway and one leaving early
// at its cap.
func TestConcurrentGenerateMatchesAlone(t *testing.T) {
	lm := loadGoldenLM(t)
	greedy := sampler.Config{Greedy: true, TopK: 50, TopP: 1, RepetitionPenalty: 1}
	reqs := []struct {
		text string
		opt  GenOptions
	}{
		{"Hello there.", GenOptions{Seed: 7, MaxNew: 48}},
		{"How are you today?", GenOptions{Seed: 8, MaxNew: 40}},
		{"Good morning, everyone.", GenOptions{Sampler: &greedy, MaxNew: 44}},
		{"Short.", GenOptions{Seed: 9, MaxNew: 12}}, // leaves early
	}
	gen := func(ctx context.Context, i int, started chan<- struct{}) ([]int32, error) {
		var codes []int32
		_, err := lm.Generate(ctx, reqs[i].text, reqs[i].opt, func(c int32) error {
			codes = append(codes, c)
			if len(codes) == 4 && started != nil {
				close(started) // the next stream joins while this one is generating
			}
			return nil
		})
		return codes, err
	}
	alone := make([][]int32, len(reqs))
	for i := range reqs {
		var err error
		if alone[i], err = gen(context.Background(), i, nil); err != nil {
			t.Fatal(err)
		}
	}
	before := lm.BatchStats()

	together := make([][]int32, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i := range reqs {
		started := make(chan struct{})
		wg.Go(func() { together[i], errs[i] = gen(context.Background(), i, started) })
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatalf("stream %d emitted no 4 tokens", i)
		}
	}
	// One more stream, cancelled after its third token: the others go on unchanged.
	ctx, cancel := context.WithCancel(context.Background())
	var cancelled []int32
	var cancelErr error
	wg.Go(func() {
		_, err := lm.Generate(ctx, "This one is cut off.", GenOptions{Seed: 3, MaxNew: 40}, func(c int32) error {
			if cancelled = append(cancelled, c); len(cancelled) == 3 {
				cancel()
			}
			return nil
		})
		if !errors.Is(err, ErrCanceled) {
			cancelErr = fmt.Errorf("cancelled stream: err %v, want ErrCanceled", err)
		}
	})
	wg.Wait()
	for i := range reqs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !slices.Equal(together[i], alone[i]) {
			t.Errorf("stream %d: %d tokens together differ from its %d alone\n together %v\n alone    %v", i, len(together[i]), len(alone[i]), together[i], alone[i])
		}
	}
	if cancelErr != nil {
		t.Error(cancelErr)
	}
	if len(cancelled) != 3 {
		t.Errorf("the cancelled stream emitted %d tokens after its cancel at 3", len(cancelled))
	}
	after := lm.BatchStats()
	rounds, rows := after.Rounds-before.Rounds, after.Rows-before.Rows
	t.Logf("%d decode rounds for %d stream steps: mean batch %.2f", rounds, rows, float64(rows)/float64(max(rounds, 1)))
	if rows <= rounds {
		t.Errorf("no step was batched: %d rounds for %d steps", rounds, rows)
	}
	if after.Generating != 0 {
		t.Errorf("%d streams still counted as generating", after.Generating)
	}
}

// TestFitsFromTokenGaps: admission's capacity from measured gaps between a stream's tokens
// — one stream before anything is measured, measured counts within the budget (36 ms of
// the 40 ms a token lasts) or bounded by a larger count's lower gap, one stream beyond the
// most measured when its predicted gap fits (grown by the slope measured, kept between half
// and all of ×(k+1)/k from k streams, ×1.5 at most), nothing further, and stale
// measurements forgotten.
func TestFitsFromTokenGaps(t *testing.T) {
	lm := &LM{steps: newStepper(nil)}
	check := func(what string, want []bool) {
		t.Helper()
		for active, w := range want {
			if got := lm.Fits(active); got != w {
				t.Errorf("%s: Fits(%d) = %v, want %v", what, active, got, w)
			}
		}
	}
	check("nothing measured", []bool{true, false, false})
	ms := time.Millisecond
	now := time.Now()
	for k := range lm.steps.gapAt {
		lm.steps.gapAt[k] = now // the gaps below are fresh
	}
	gap := &lm.steps.tokenGap
	gap[1] = 22 * ms
	check("1 stream at 22 ms", []bool{true, true, false}) // 2 predicted at 33 ms
	gap[2] = 37 * ms
	check("2 at 37 ms", []bool{true, false, false})
	gap[2] = 30 * ms
	check("2 at 30 ms", []bool{true, true, false}) // 3 predicted at 45 ms
	gap[1] = 50 * ms
	check("1 slowed to 50 ms", []bool{true, true, false}) // one stream alone always fits
	gap[1], gap[2], gap[3] = 10*ms, 20*ms, 26*ms
	check("3 at 26 ms", []bool{true, true, true, true, false}) // 4 predicted at 26 + 8 ms
	gap[3] = 28 * ms
	check("3 at 28 ms", []bool{true, true, true, false}) // 4 predicted at 28 + 9 ms
	gap[1], gap[2] = 20*ms, 24*ms
	// ×4/3 would predict 37.3 ms; the slope of 4 ms a stream is below half of that growth.
	check("4 ms more a stream", []bool{true, true, true, true, false}) // 4 at 28 + 4.7 ms
	gap[1], gap[2], gap[3], gap[4] = 15*ms, 44*ms, 50*ms, 23*ms
	// 2 and 3 streams measured while joiners prefilled; 4 ran at 23 ms since, which bounds
	// them, and 5 are predicted from it (at 23 + 2.9 ms).
	check("2 and 3 slower than 4", []bool{true, true, true, true, true, false})
	gap[1], gap[2], gap[3], gap[4] = 10*ms, 0, 0, 30*ms
	check("4 at 30 ms, 2 and 3 never run", []bool{true, true, true, true, false}) // judged by 4
	if c := lm.BatchStats().Capacity; c != 4 {
		t.Errorf("capacity %d, want 4", c)
	}
	if lm.Fits(qwen3.MaxBatch) {
		t.Error("more than MaxBatch streams fit")
	}
	// Old measurements are forgotten: capacity is probed again from one stream, whose gap
	// is kept (10 ms: 2 streams predicted at 15 ms).
	for k := range lm.steps.gapAt {
		lm.steps.gapAt[k] = now.Add(-2 * gapAge)
	}
	check("all measurements stale", []bool{true, true, false})
	if lm.steps.tokenGap[4] != 0 || lm.steps.tokenGap[1] != 10*ms {
		t.Errorf("stale gaps: 1 stream %v (kept), 4 streams %v (forgotten)", lm.steps.tokenGap[1], lm.steps.tokenGap[4])
	}
}

// TestTokenGapIsMean: the gap admission judges by is the mean over whole codec periods. A
// stream whose tokens come 20 ms apart except for one 200 ms codec run every 24 tokens gives
// 27.5 ms a token, not the 20 ms most gaps show; windows older than two spans drop out.
func TestTokenGapIsMean(t *testing.T) {
	var w gapWindow
	ms := time.Millisecond
	t0 := time.Now()
	var mean time.Duration
	for i := range 96 {
		gap := 20 * ms
		if i%24 == 23 {
			gap = 200 * ms
		}
		mean = w.add(gap, t0)
	}
	if mean != 27500*time.Microsecond {
		t.Errorf("mean gap %v over 4 codec periods, want 27.5ms", mean)
	}
	// A span later the window closes and a new one opens: both count.
	if got := w.add(40*ms, t0.Add(gapSpan)); got != (96*27500*time.Microsecond+40*ms)/97 {
		t.Errorf("after one span: %v", got)
	}
	// Another span later the first window drops out.
	if got := w.add(60*ms, t0.Add(2*gapSpan)); got != 50*ms {
		t.Errorf("after two spans: %v, want the last two windows' 50ms", got)
	}
	// A long pause starts afresh.
	if got := w.add(10*ms, t0.Add(10*gapSpan)); got != 10*ms {
		t.Errorf("after a pause: %v, want 10ms", got)
	}

	// Through the stepper: the estimate for the streams now generating.
	st := newStepper(nil)
	st.active = 2
	for i := range 48 {
		gap := 20 * ms
		if i%24 == 23 {
			gap = 200 * ms
		}
		st.noteGap(gap)
	}
	if st.tokenGap[2] != 27500*time.Microsecond || st.tokenGap[1] != 0 {
		t.Errorf("tokenGap[1], [2] = %v, %v; want 0 and 27.5ms", st.tokenGap[1], st.tokenGap[2])
	}
}

// BenchmarkJoinStall measures what a joining stream's prefill costs the streams already
// generating, on a real-size model (VOXPIPE_MIOTTS_MODEL, the LM alone): one stream generates, a second joins with a long prompt, and the first's
// longest gap between tokens while the second prefills is reported next to its median gap,
// with the prompt in one program and in chunks of 16 (the default).
func BenchmarkJoinStall(b *testing.B) {
	path := os.Getenv("VOXPIPE_MIOTTS_MODEL")
	if path == "" {
		b.Skip("set VOXPIPE_MIOTTS_MODEL to a MioTTS LM GGUF")
	}
	be, err := engine.NewCPU(2)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	lm, err := LoadLM(path, be)
	if err != nil {
		b.Fatal(err)
	}
	defer lm.Close()
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 6)
	for _, chunk := range []int{1 << 20, 16} {
		b.Run(fmt.Sprintf("chunk=%d", min(chunk, 9999)), func(b *testing.B) {
			defer func(c int) { prefillChunk = c }(prefillChunk)
			prefillChunk = chunk
			for range b.N {
				var times []time.Time
				joined := make(chan struct{})
				var wg sync.WaitGroup
				var joinStart, joinEnd time.Time
				wg.Go(func() {
					lm.Generate(context.Background(), "Hello there, how are you?", GenOptions{Seed: 1, MaxNew: 80}, func(int32) error {
						times = append(times, time.Now())
						if len(times) == 20 {
							close(joined)
						}
						return nil
					})
				})
				<-joined
				joinStart = time.Now()
				var first time.Time
				lm.Generate(context.Background(), long, GenOptions{Seed: 2, MaxNew: 1}, func(int32) error {
					first = time.Now()
					return nil
				})
				joinEnd = first
				wg.Wait()
				var gaps []float64
				worst := 0.0
				for i := 1; i < len(times); i++ {
					g := float64(times[i].Sub(times[i-1]).Microseconds()) / 1000
					gaps = append(gaps, g)
					if times[i].After(joinStart) && !times[i-1].After(joinEnd) {
						worst = max(worst, g)
					}
				}
				slices.Sort(gaps)
				b.ReportMetric(worst, "stall_ms")
				b.ReportMetric(gaps[len(gaps)/2], "gap_p50_ms")
				b.ReportMetric(float64(joinEnd.Sub(joinStart).Microseconds())/1000, "join_prefill_ms")
			}
		})
	}
}

// TestRecoveredTurnsAPanicIntoAnError: a panic in a decode step or the codec fails its
// request with an error naming it, and the goroutine that ran it goes on.
func TestRecoveredTurnsAPanicIntoAnError(t *testing.T) {
	err := recovered("decode step", func() error { panic("index out of range") })
	if err == nil || !strings.Contains(err.Error(), "decode step") || !strings.Contains(err.Error(), "index out of range") {
		t.Errorf("got %v", err)
	}
	want := errors.New("plain")
	if err := recovered("codec", func() error { return want }); err != want {
		t.Errorf("an error passes through: got %v", err)
	}
}
