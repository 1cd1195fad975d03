package miotts

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

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
