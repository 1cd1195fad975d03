package miocodec

import (
	"slices"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/internal/parity"
)

func longCase(t *testing.T, r *parity.Run) ([]int32, []float32) {
	t.Helper()
	long, err := r.I32("chunk.long_tokens")
	if err != nil {
		t.Fatal(err)
	}
	global, _, err := r.F32("decA.global_embedding")
	if err != nil {
		t.Fatal(err)
	}
	return long, global
}

// TestStreamFrozenExact: with full-utterance GroupNorm statistics and context ≥ 96 the
// stream (crossfade on) reproduces the offline decode (MANIFEST §6b.2).
func TestStreamFrozenExact(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	full, stats, err := d.DecodeStats(long, global)
	if err != nil {
		t.Fatal(err)
	}
	got, err := streamDecode(d, long, global, StreamOptions{Core: 24, LeftContext: 96, RightContext: 96, Stats: StatsFrozen, Frozen: stats})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(full) {
		t.Fatalf("%d samples, want %d", len(got), len(full))
	}
	mr, rr := relDiff(got, full)
	t.Logf("frozen statistics, core 24, context 96, crossfade on: max rel %.3g, rms rel %.3g", mr, rr)
	if mr > 1e-4 {
		t.Errorf("max rel diff %.3g > 1e-4", mr)
	}
}

// TestStreamLive reports the running-statistics stream against the offline decode.
func TestStreamLive(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	full, err := d.Decode(long, global)
	if err != nil {
		t.Fatal(err)
	}
	for _, ctx := range []int{8, 16, 32, 48, 96} {
		for _, mode := range []StatsMode{StatsRunning, StatsPlain} {
			o := StreamOptions{LeftContext: ctx, RightContext: ctx, Stats: mode}
			s, err := d.NewStream(global, o)
			if err != nil {
				t.Fatal(err)
			}
			// Warm the programs, then time the first audio of a fresh utterance.
			if _, err := streamDecode(d, long, global, o); err != nil {
				t.Fatal(err)
			}
			var got []float32
			start := time.Now()
			var first time.Duration
			for i := range long {
				out, err := s.Push(long[i : i+1])
				if err != nil {
					t.Fatal(err)
				}
				if len(out) > 0 && first == 0 {
					first = time.Since(start)
					t.Logf("  first audio after token %d (%d samples)", i+1, len(out))
				}
				got = append(got, out...)
			}
			out, err := s.Flush()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, out...)
			if len(got) != len(full) {
				t.Fatalf("context %d: %d samples, want %d", ctx, len(got), len(full))
			}
			mr, rr := relDiff(got, full)
			name := map[StatsMode]string{StatsRunning: "running", StatsPlain: "plain"}[mode]
			t.Logf("live %-7s core %d context %3d crossfade %d: max rel %.3g, rms rel %.3g; first audio %v after its token",
				name, s.Options().Core, ctx, 2*s.half, mr, rr, first)
		}
	}
}

// TestStreamArrivalIndependent: the same tokens give the same samples whether they arrive
// one at a time, in uneven bursts or all at once.
func TestStreamArrivalIndependent(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	long = long[:100]
	all, err := streamDecode(d, long, global, StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(long)*d.Config.SamplesPerToken() {
		t.Fatalf("%d samples, want %d", len(all), len(long)*d.Config.SamplesPerToken())
	}
	s, err := d.NewStream(global, StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, burst := range [][]int{{1}, {3, 1, 17, 40, 2}} {
		var got []float32
		for i, k := 0, 0; i < len(long); k++ {
			n := min(burst[k%len(burst)], len(long)-i)
			out, err := s.Push(long[i : i+n])
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, out...)
			i += n
		}
		out, err := s.Flush()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, out...)
		if !slices.Equal(got, all) {
			mr, _ := relDiff(got, all)
			t.Errorf("bursts %v: output differs from all-at-once (max rel %.3g)", burst, mr)
		}
	}
	// Reset mid-utterance drops it: the next utterance is decoded from scratch.
	if _, err := s.Push(long[:50]); err != nil {
		t.Fatal(err)
	}
	s.Reset()
	a, _ := s.Push(long)
	got := append([]float32(nil), a...)
	b, _ := s.Flush()
	if got = append(got, b...); !slices.Equal(got, all) {
		t.Errorf("after Reset: output differs")
	}
	if _, err := s.Push([]int32{-1}); err == nil {
		t.Errorf("token -1: no error")
	}
}

// TestStreamOptions: odd settings still give one sample run of the right length, and with
// no context and no crossfade each window is an ordinary decode of its core.
func TestStreamOptions(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	toks := long[:13]
	spt := d.Config.SamplesPerToken()
	for _, o := range []StreamOptions{
		{Core: 1, LeftContext: 2, RightContext: 3, Crossfade: 10 * spt},
		{Core: 5, LeftContext: -1, RightContext: -1},
		{Core: 40},
		{Core: 4, LeftContext: 1, RightContext: -1, Stats: StatsPlain},
	} {
		got, err := streamDecode(d, toks, global, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(toks)*spt {
			t.Errorf("%+v: %d samples, want %d", o, len(got), len(toks)*spt)
		}
	}
	got, err := streamDecode(d, toks, global, StreamOptions{Core: 5, LeftContext: -1, RightContext: -1, Stats: StatsPlain})
	if err != nil {
		t.Fatal(err)
	}
	var want []float32
	for c := 0; c < len(toks); c += 5 {
		w, err := d.Decode(toks[c:min(c+5, len(toks))], global)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, w...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("context-free plain windows differ from decoding each core alone")
	}
	if _, err := d.NewStream(global[:3], StreamOptions{}); err == nil {
		t.Errorf("short global embedding: no error")
	}
	if _, err := d.NewStream(global, StreamOptions{Stats: StatsFrozen}); err == nil {
		t.Errorf("frozen mode without statistics: no error")
	}
}

// TestStreamRamp: short first windows start the audio early without changing the stitching
// (frozen statistics stay exact) or the length.
func TestStreamRamp(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	full, stats, err := d.DecodeStats(long, global)
	if err != nil {
		t.Fatal(err)
	}
	got, err := streamDecode(d, long, global, StreamOptions{Core: 24, LeftContext: 96, RightContext: 96,
		Ramp: []int{4, 8, 16}, RampContext: 96, Stats: StatsFrozen, Frozen: stats})
	if err != nil {
		t.Fatal(err)
	}
	if mr, _ := relDiff(got, full); len(got) != len(full) || mr > 1e-4 {
		t.Errorf("frozen with a 4, 8, 16 ramp: %d samples (want %d), max rel %.3g", len(got), len(full), mr)
	}
	s, err := d.NewStream(global, StreamOptions{Ramp: []int{4, 8, 16}})
	if err != nil {
		t.Fatal(err)
	}
	// Windows become final after 4+4, 12+8, 28+16, then every 24 tokens (+16 context).
	var at []int
	total := 0
	for i := range 60 {
		out, err := s.Push(long[i : i+1])
		if err != nil {
			t.Fatal(err)
		}
		if len(out) > 0 {
			at = append(at, i+1)
		}
		total += len(out)
	}
	out, err := s.Flush()
	if err != nil {
		t.Fatal(err)
	}
	total += len(out)
	if !slices.Equal(at, []int{8, 20, 44}) || total != 60*d.Config.SamplesPerToken() {
		t.Errorf("audio after tokens %v (want [8 20 44]), %d samples (want %d)", at, total, 60*d.Config.SamplesPerToken())
	}
	if _, err := d.NewStream(global, StreamOptions{Ramp: []int{4, 0}}); err == nil {
		t.Error("zero ramp core accepted")
	}
}

// TestStreamDecodedTokens: Span gives each window's decoded tokens (left context, core, right
// context), and DecodedTokens counts what the windows decoded, contexts included.
func TestStreamDecodedTokens(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, global := longCase(t, r)
	o := StreamOptions{Ramp: []int{4, 8, 16}} // default context 16 on each side
	spans := [][2]int{{0, 8}, {0, 20}, {0, 44}, {12, 68}, {36, 92}}
	for w, want := range spans {
		if first, need := o.Span(w); first != want[0] || need != want[1] {
			t.Errorf("window %d spans [%d, %d), want %v", w, first, need, want)
		}
	}
	s, err := d.NewStream(global, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Push(long[:60]); err != nil {
		t.Fatal(err)
	}
	// Windows 0-2 are whole by token 60 (8 + 20 + 44 tokens); the flush decodes window 3 up
	// to the last token, [12, 60), and window 4's core, [36, 60).
	if got := s.DecodedTokens(); got != 72 {
		t.Errorf("after 60 tokens: %d decoded, want 72", got)
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := s.DecodedTokens(); got != 72+48+24 {
		t.Errorf("after the flush: %d decoded, want %d", got, 72+48+24)
	}
}
