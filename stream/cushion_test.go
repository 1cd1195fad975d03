package stream

import (
	"testing"
	"time"
)

// A starting session of a model voice queues what the voice's slowest step takes with the
// sessions open now: before any step was seen, its processor's slowest step alone times the
// sessions; then the slowest step seen lately, scaled to the sessions open now. A session
// holds its output until that cushion is queued.
func TestStartCushionFollowsSessions(t *testing.T) {
	sched := NewScheduler(2)
	defer sched.Close()
	const rate = 16000
	ms := func(n int) int { return n * rate / 1000 }
	newLive := func() *Live {
		// 20 ms chunks, slowest step alone 5 ms over its chunk (Cushion).
		p := &blocking{Delay: *NewDelay(rate, ms(20), 0)}
		p.Delay.info.Cushion = ms(5)
		l, err := sched.NewLive(Config{IORate: rate}, "model", p, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	first := newLive()
	if got := sched.startCushion(first, sched.modelSessions()); got != ms(5) {
		t.Errorf("one session: start cushion %d samples, want the processor's own %d", got, ms(5))
	}
	for range 3 {
		newLive()
	}
	if got, want := sched.startCushion(first, sched.modelSessions()), ms(4*25-20); got != want {
		t.Errorf("four sessions, no step seen: start cushion %d samples, want %d (4 × 25 ms − 20 ms)", got, want)
	}

	// A 50 ms step seen with the four open, in a window that has run long enough to count.
	now := time.Now()
	sched.steps.note("model", 50*time.Millisecond, now.Add(-2*time.Second), func() int { return 4 })
	sched.steps.note("model", 10*time.Millisecond, now, func() int { return 4 })
	if got, want := sched.startCushion(first, sched.modelSessions()), ms(50-20); got != want {
		t.Errorf("four sessions, a 50 ms step seen with four: start cushion %d samples, want %d", got, want)
	}
	for range 4 {
		newLive()
	}
	if got, want := sched.startCushion(first, sched.modelSessions()), ms(100-20); got != want {
		t.Errorf("eight sessions, a 50 ms step seen with four: start cushion %d samples, want %d", got, want)
	}

	// The session plays nothing until its cushion (80 ms) and a pull are queued.
	dst := make([]float32, ms(20))
	for i := range 4 {
		first.Push(make([]float32, ms(20)), time.Now())
		first.Settle(time.Second)
		if n := first.Pull(dst, time.Now()); n != 0 {
			t.Fatalf("played %d samples with %d ms queued, under the 80 ms cushion", n, 20*(i+1))
		}
	}
	for range 2 {
		first.Push(make([]float32, ms(20)), time.Now())
		first.Settle(time.Second)
	}
	if n := first.Pull(dst, time.Now()); n != len(dst) {
		t.Fatalf("played %d samples with 120 ms queued, want a whole pull", n)
	}
}

// A window's slowest step counts only once the window has run a second (a burst's first
// steps only fill buffers), and is forgotten two windows later.
func TestSlowStepsWindows(t *testing.T) {
	var v voiceSteps
	t0 := time.Now()
	one := func() int { return 1 }
	v.note("m", 40*time.Millisecond, t0, one)
	if _, ok := v.expect("m", 1, t0.Add(500*time.Millisecond)); ok {
		t.Error("a window half a second old counts")
	}
	if d, ok := v.expect("m", 2, t0.Add(1500*time.Millisecond)); !ok || d != 80*time.Millisecond {
		t.Errorf("a 40 ms step seen alone, two sessions: expect %v %v, want 80ms", d, ok)
	}
	if d, ok := v.expect("m", 1, t0.Add(slowWindow+time.Millisecond)); !ok || d != 40*time.Millisecond {
		t.Errorf("the last window's step: %v %v, want 40ms", d, ok)
	}
	if _, ok := v.expect("m", 1, t0.Add(3*slowWindow)); ok {
		t.Error("a step two windows old still counts")
	}
}

// Before any step is seen, a model's measurement of many sessions together (Shared) bounds
// the cold estimate: one session alone scales as if each added its whole step, which
// batching does not.
func TestStartCushionFromShared(t *testing.T) {
	sched := NewScheduler(2)
	defer sched.Close()
	const rate = 16000
	ms := func(n int) int { return n * rate / 1000 }
	var first *Live
	open := func(n int) {
		for range n {
			p := &blocking{Delay: *NewDelay(rate, ms(20), 0)}
			p.Delay.info.Cushion = ms(5) // 25 ms alone
			p.Delay.info.Shared = Shared{Sessions: 8, Cost: 0.1, Slowest: 80 * time.Millisecond}
			l, err := sched.NewLive(Config{IORate: rate}, "model", p, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			if first == nil {
				first = l
			}
		}
	}
	for _, tc := range []struct{ open, sessions, want int }{
		{1, 1, 25 - 20},     // alone: its own slowest step
		{2, 3, 3*25 - 20},   // few: alone × 3 is less than the 80 ms of eight
		{5, 8, 120 - 20},    // eight: as measured, with its headroom (1.5×)
		{8, 16, 2*120 - 20}, // sixteen: the eight's step, doubled
	} {
		open(tc.open)
		if got := sched.startCushion(first, sched.modelSessions()); got != ms(tc.want) {
			t.Errorf("%d sessions: start cushion %d samples, want %d (%d ms)", tc.sessions, got, ms(tc.want), tc.want)
		}
	}
}
