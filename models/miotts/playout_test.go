package miotts

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/models/miocodec"
)

// TestPlayoutSlack: a piece's predicted slack from its windows (default 24-token cores, 16
// tokens of context) and its progress.
func TestPlayoutSlack(t *testing.T) {
	ms := time.Millisecond
	now := time.Now()
	p := newPlayout(miocodec.StreamOptions{Core: 24}, nil)
	// No ramp, nothing generated: the first audio when 40 tokens are in; the second window
	// needs 64, and its audio is due 24 token periods (960 ms) after the first.
	if got, want := p.slack(now, 30*ms), 960*ms-24*30*ms; got != want {
		t.Errorf("slack at 30 ms a token: %v, want %v", got, want)
	}
	// First audio out 500 ms ago with 50 tokens generated: the next window (need 64) is
	// ready in 14 gaps, due 460 ms from now.
	p.generated.Store(50)
	p.first.Store(now.Add(-500 * ms).UnixNano())
	if got, want := p.slack(now, 20*ms), 460*ms-14*20*ms; got != want {
		t.Errorf("slack mid-stream: %v, want %v", got, want)
	}
	if !p.onTime(now, 20*ms, 0) || p.onTime(now, 50*ms, 0) {
		t.Error("onTime disagrees with the slack")
	}

	// The default ramp: its second window (core 6 from token 4, right context 6) needs 16
	// tokens and plays 4 token periods after the first audio, which comes at token 8.
	r := newPlayout(miocodec.StreamOptions{Ramp: DefaultRamp}, nil)
	if got, want := r.slack(now, 10*ms), 4*40*ms-8*10*ms; got > want {
		t.Errorf("ramp slack %v, want at most %v", got, want)
	}
	if s := r.slack(now, 5*ms); s <= 0 {
		t.Errorf("the ramp at 5 ms a token (8× real time) is late: %v", s)
	}
}

// TestPlayoutCodecCost: a window's audio comes out after its decode, so the codec's measured
// cost per decoded token moves each window's readiness (and the first audio, which sets the
// schedule) later by its tokens' worth; a slow codec makes a new piece start later in its ramp.
func TestPlayoutCodecCost(t *testing.T) {
	ms := time.Millisecond
	now := time.Now()
	var c codecCost
	c.add(20*ms, 10) // 2 ms a token
	c.add(0, 0)      // no window: not counted
	if got := c.perToken(); got != 2*ms {
		t.Fatalf("cost %v a token, want 2ms", got)
	}
	c.add(6*ms, 1) // the mean moves a quarter of the way: (3·2 + 6) / 4
	if got := c.perToken(); got != 3*ms {
		t.Fatalf("cost %v a token, want 3ms", got)
	}
	c.ns.Store(int64(2 * ms))
	// No ramp, nothing generated, 30 ms a token: the first window decodes tokens [0, 40) and
	// its audio comes 40·30 + 40·2 ms from now; the second decodes [8, 64), ready 64·30 +
	// 56·2 ms from now, due 24 token periods after the first audio.
	p := newPlayout(miocodec.StreamOptions{Core: 24}, &c)
	want := (40*30+40*2)*ms + 24*tokenPeriod - (64*30+56*2)*ms
	if got := p.slack(now, 30*ms); got != want {
		t.Errorf("slack with the codec's cost %v, want %v", got, want)
	}
	if free := newPlayout(miocodec.StreamOptions{Core: 24}, nil).slack(now, 30*ms); free-want != 16*2*ms {
		t.Errorf("the cost took %v off the slack, want the 16 more tokens of the second window's decode (32ms)", free-want)
	}
	// At 25 ms a token the default ramp comes late. A free codec keeps its first audio after
	// 4 tokens with windows growing 1.4 times a window; at 2 ms a decoded token (the real
	// codec on 2 cores measures 1.5-2.5) they must grow 1.25 times.
	o := miocodec.StreamOptions{}
	if got, _ := rampFor(DefaultRamp, o, 25*ms, 0, nil); !slices.Equal(got, grownRamp(4, 1.4, 24)) {
		t.Fatalf("free codec at 25 ms a token: ramp %v, want %v", got, grownRamp(4, 1.4, 24))
	}
	got, skipped := rampFor(DefaultRamp, o, 25*ms, 0, &c)
	if !slices.Equal(got, grownRamp(4, 1.25, 24)) || skipped != 0 {
		t.Errorf("2 ms a decoded token at 25 ms a token: ramp %v (%d skipped), want %v", got, skipped, grownRamp(4, 1.25, 24))
	}
	o.Ramp = got
	if !newPlayout(o, &c).onTime(now, 22*ms, 0) {
		t.Error("the chosen ramp is late")
	}
}

// TestRampFor: a lone fast stream keeps the whole ramp; slower ones grow their windows more
// slowly, then start later in it, and at near real time the first audio waits for a whole
// window. The first audio never comes earlier for a slower stream, and every choice keeps its
// schedule.
func TestRampFor(t *testing.T) {
	ms := time.Millisecond
	o := miocodec.StreamOptions{}
	if got, _ := rampFor(DefaultRamp, o, 0, 0, nil); !slices.Equal(got, DefaultRamp) {
		t.Errorf("nothing measured: %v", got)
	}
	if got, _ := rampFor(DefaultRamp, o, 10*ms, 0, nil); !slices.Equal(got, DefaultRamp) {
		t.Errorf("10 ms a token: %v, want the whole ramp", got)
	}
	if got, skipped := rampFor(DefaultRamp, o, 38*ms, 0, nil); len(got) != 0 || skipped != len(DefaultRamp) {
		t.Errorf("38 ms a token: %v (%d skipped), want no ramp", got, skipped)
	}
	first := func(r []int) int { // tokens of core before the first audio
		if len(r) == 0 {
			return miocodec.DefaultCore
		}
		return r[0]
	}
	prev := 0
	for gap := 10 * ms; gap <= 38*ms; gap += 2 * ms {
		got, _ := rampFor(DefaultRamp, o, gap, 0, nil)
		if first(got) < prev {
			t.Errorf("%v a token: ramp %v starts earlier than at a shorter gap", gap, got)
		}
		prev = first(got)
		if len(got) > maxRampWindows {
			t.Errorf("%v a token: ramp %v of more than %d windows", gap, got, maxRampWindows)
		}
		o.Ramp = got
		if !newPlayout(o, nil).onTime(time.Now(), gap, 0) && len(got) > 0 {
			t.Errorf("%v a token: the chosen ramp %v is late", gap, got)
		}
	}
}

// TestGrownRamp: cores grow by the factor (one token at least) up to the steady core, within
// maxRampWindows windows.
func TestGrownRamp(t *testing.T) {
	for _, c := range []struct {
		first int
		g     float64
		want  []int
	}{
		{4, 1.4, []int{4, 6, 8, 11, 15, 21}},
		{4, 1.25, []int{4, 5, 6, 8, 10, 13, 16, 20}},
		{16, 1.4, []int{16, 22}},
		{24, 1.4, nil},
		{1, 1.01, []int{1, 2, 3, 4, 5, 6, 7, 8}},
	} {
		if got := grownRamp(c.first, c.g, 24); !slices.Equal(got, c.want) {
			t.Errorf("grownRamp(%d, %v, 24) = %v, want %v", c.first, c.g, got, c.want)
		}
	}
}

// lmWithGaps is an LM (no model) whose stepper has measured, just now, the given token gaps
// for 1, 2, … streams.
func lmWithGaps(gaps ...time.Duration) (*LM, time.Time) {
	lm, now := &LM{steps: newStepper(nil)}, time.Now()
	for i, g := range gaps {
		lm.steps.tokenGap[i+1], lm.steps.gapAt[i+1] = g, now
	}
	return lm, now
}

// playRamping makes a piece speaking on lm that is just past its first audio (at now) in the
// default ramp; done ends it.
func playRamping(lm *LM, now time.Time) (p *playout, done func()) {
	p = newPlayout(miocodec.StreamOptions{Ramp: DefaultRamp}, nil)
	p.generated.Store(8)
	p.first.Store(now.UnixNano())
	return p, lm.steps.play(p)
}

// TestFitsProtectsPlayout: a measured gap within the budget still refuses a stream while a
// piece speaking now would fall behind its playout at the gap one more stream brings.
func TestFitsProtectsPlayout(t *testing.T) {
	ms := time.Millisecond
	lm, now := lmWithGaps(12*ms, 30*ms)
	if !lm.Fits(1) {
		t.Fatal("2 streams at 30 ms do not fit with no piece speaking")
	}
	// At 30 ms a token its next windows come late.
	p, done := playRamping(lm, now)
	if lm.Fits(1) {
		t.Error("a second stream fits while the first piece's ramp needs it alone")
	}
	if c := lm.BatchStats().Capacity; c != 1 {
		t.Errorf("capacity %d while the ramp runs, want 1", c)
	}
	// Well into its steady windows, 100 tokens in the 2 s since its first audio (its next
	// window, from token 84, plays 1.36 s from now), it can share.
	p.generated.Store(100)
	p.first.Store(now.Add(-2 * time.Second).UnixNano())
	if !lm.Fits(1) {
		t.Errorf("a piece with lead (slack %v) still refuses a second stream", p.slack(time.Now(), 30*ms))
	}
	done()
	p.generated.Store(8)
	p.first.Store(now.UnixNano())
	if !lm.Fits(1) {
		t.Error("a piece that ended still refuses streams")
	}
}

// TestFitsCountsTheJoinersPrefill: a joining stream's prefill delays every speaking piece by
// its backend time, so a piece whose lead covers the slower tokens but not that delay refuses
// the join; the delay is the mean prefill measured beside other streams, else one measured
// alone and a quarter (the chunks' overhead).
func TestFitsCountsTheJoinersPrefill(t *testing.T) {
	ms := time.Millisecond
	lm, now := lmWithGaps(12*ms, 30*ms)
	p := newPlayout(miocodec.StreamOptions{Ramp: DefaultRamp}, nil)
	p.generated.Store(100)
	p.first.Store(now.Add(-2 * time.Second).UnixNano())
	defer lm.steps.play(p)()
	lead := p.slack(time.Now(), 30*ms) + lateTolerance // what the piece can lose
	if lead <= 100*ms {
		t.Fatalf("the piece's lead %v leaves no room for the test", lead)
	}
	if !lm.Fits(1) {
		t.Fatal("no prefill measured: a piece with lead refuses a second stream")
	}
	lm.steps.notePrefill(lead*4/5+20*ms, false) // alone: counts a quarter more
	if d := lm.steps.joinDelay(); d != (lead*4/5+20*ms)*5/4 || lm.Fits(1) {
		t.Errorf("a join delaying the piece by %v (its lead %v) fits", lm.steps.joinDelay(), lead)
	}
	lm.steps.notePrefill(lead-50*ms, true) // measured beside other streams: replaces the estimate
	if d := lm.steps.joinDelay(); d != lead-50*ms || !lm.Fits(1) {
		t.Errorf("join delay %v (want %v), fits %v with lead %v", d, lead-50*ms, lm.Fits(1), lead)
	}
	lm.steps.notePrefill(lead+350*ms, true) // a running mean: (3·old + new) / 4
	if d, want := lm.steps.joinDelay(), (3*(lead-50*ms)+lead+350*ms)/4; d != want || lm.Fits(1) {
		t.Errorf("join delay %v (want %v), fits %v with lead %v", d, want, lm.Fits(1), lead)
	}
}

// TestRampPlanLeavesRoomWhileStreamsWait: once admission has refused a stream, a piece that
// starts plans its ramp for one stream more and a joiner's prefill, so that its ramp does not
// keep the waiting stream out; without a refusal in demandSpan it plans for the streams there
// are.
func TestRampPlanLeavesRoomWhileStreamsWait(t *testing.T) {
	ms := time.Millisecond
	lm, now := lmWithGaps(12*ms, 30*ms)
	lm.steps.notePrefill(200*ms, true)
	if gap, delay := lm.rampPlan(1); gap != 12*ms || delay != 0 {
		t.Errorf("nobody waiting: plan %v after %v, want 12ms after 0s", gap, delay)
	}
	_, done := playRamping(lm, now)
	if lm.Fits(1) {
		t.Fatal("a second stream fits while a piece's whole ramp needs the model alone")
	}
	done()
	gap, delay := lm.rampPlan(1)
	if gap != 30*ms || delay != 200*ms {
		t.Fatalf("a stream refused: plan %v after %v, want 30ms after 200ms", gap, delay)
	}
	o := miocodec.StreamOptions{}
	o.Ramp, _ = rampFor(DefaultRamp, o, gap, delay, nil)
	if len(o.Ramp) == len(DefaultRamp) {
		t.Errorf("planned with room for a join, the piece kept the whole ramp %v", o.Ramp)
	}
	defer lm.steps.play(newPlayout(o, nil))()
	if !lm.Fits(1) {
		t.Errorf("a piece that planned its ramp %v for a join refuses it", o.Ramp)
	}
	lm.steps.mu.Lock()
	lm.steps.refusedAt = time.Now().Add(-demandSpan - time.Second)
	lm.steps.mu.Unlock()
	if gap, delay := lm.rampPlan(1); gap != 12*ms || delay != 0 {
		t.Errorf("the last refusal long ago: plan %v after %v, want 12ms after 0s", gap, delay)
	}
}

// TestSynthesizeRampFollowsMeasuredGap: a piece that will get a token every 34 ms (measured
// for one stream) skips the ramp windows it could not keep: its first audio is the 16-token
// window, and its audio is the codec stream's with that ramp.
func TestSynthesizeRampFollowsMeasuredGap(t *testing.T) {
	tts, clip, rate := loadGoldenTTS(t)
	st := tts.LM.steps
	st.mu.Lock()
	st.tokenGap[1], st.gapAt[1] = 34*time.Millisecond, time.Now()
	st.mu.Unlock()
	tts.codec.ns.Store(0) // the tiny codec's cost, measured by earlier syntheses, is left out
	want, _ := rampFor(DefaultRamp, miocodec.StreamOptions{}, 34*time.Millisecond, 0, nil)
	if len(want) == 0 || want[0] != 16 {
		t.Fatalf("ramp at 34 ms a token %v, want one from the 16-token window", want)
	}
	req := Request{Text: "Hello there, streaming world.", Clip: clip, Rate: rate, Gen: GenOptions{Seed: 3, MaxNew: 60}}
	var chunks [][]float32
	stats, err := tts.Synthesize(context.Background(), req, func(c Chunk) error {
		if len(c.Samples) > 0 {
			chunks = append(chunks, slices.Clone(c.Samples))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if stats.RampSkipped != len(DefaultRamp)-1 {
		t.Errorf("%d ramp windows skipped, want %d", stats.RampSkipped, len(DefaultRamp)-1)
	}
	spt := tts.Codec.Config.SamplesPerToken()
	// The first chunk is the 16-token core less the crossfade held back for the seam (the
	// whole ramp's would be at most 4 tokens).
	if stats.Tokens < 56 || len(chunks) < 2 || len(chunks[0]) <= 15*spt || len(chunks[0]) > 16*spt {
		t.Fatalf("%d tokens; first chunk of %d samples, want 15 to 16 tokens' (%d a token)", stats.Tokens, len(chunks[0]), spt)
	}
	_, _, once := streamAtOnce(t, tts, req, want)
	if !slices.Equal(once, slices.Concat(chunks...)) {
		t.Error("the streamed audio differs from the codec stream with the chosen ramp")
	}
}
