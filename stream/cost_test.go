package stream

import (
	"math"
	"testing"
	"time"
)

// Sessions of a model voice reserve its learned cost while silent: a scheduler whose measured
// load is low still refuses the session that would saturate it once all of them speak.
func TestAdmissionByLearnedCost(t *testing.T) {
	sched := NewScheduler(2)
	defer sched.Close()
	if _, ok := sched.VoiceCost("model"); ok || !sched.Admit("model", nil) {
		t.Fatal("a voice never run has a cost, or an idle scheduler refuses it")
	}
	// One session speaks for 1.5 s: 40 ms chunks that take 10 ms each (a quarter of a worker).
	first, err := sched.NewLive(Config{IORate: 16000}, "model", &blocking{Delay: *NewDelay(16000, 640, 0), sleep: 10 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	for range 38 {
		first.Push(make([]float32, 640), time.Now())
		time.Sleep(40 * time.Millisecond)
	}
	cost, ok := sched.VoiceCost("model")
	if !ok || cost < 0.2 || cost > 0.8 {
		t.Fatalf("learned cost %.3f (known %v), want about 0.25 of a worker", cost, ok)
	}
	per := cost / 2 // of the two workers' time
	t.Logf("learned cost %.3f of a worker per second of audio: %.3f of the scheduler per session", cost, per)

	// Silent sessions of the voice: admitted until the expected load would pass the limit.
	open := []*Live{first}
	defer func() {
		for _, l := range open[1:] {
			l.Close()
		}
	}()
	for sched.Admit("model", nil) {
		if len(open) > 20 {
			t.Fatal("admitted 20 sessions of a voice that costs a quarter of a worker each")
		}
		l, err := sched.NewLive(Config{IORate: 16000}, "model", &blocking{Delay: *NewDelay(16000, 640, 0), sleep: 10 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, l)
	}
	n := float64(len(open))
	if want := n*per + per; want < SaturatedLoad || (n-1)*per+per >= SaturatedLoad {
		t.Fatalf("refused at %d open sessions of cost %.3f: expected load would be %.3f (limit %.2f)", len(open), per, want, SaturatedLoad)
	}
	st := sched.Stats()
	if math.Abs(st.ExpectedLoad-n*per) > 1e-9 || !sched.HasCapacity() {
		t.Fatalf("stats %+v with %d sessions of %.3f; the measured load alone (HasCapacity %v) would admit", st, len(open), per, sched.HasCapacity())
	}
	// A session changing to the voice makes room with its own; an unlearned voice goes by the
	// measured load; closing a session frees its share.
	if !sched.Admit("model", open[len(open)-1]) {
		t.Error("a session swapping to the voice it already runs is refused")
	}
	if !sched.Admit("other-model", nil) {
		t.Error("a voice with no learned cost is refused on an idle scheduler")
	}
	open[len(open)-1].Close()
	open = open[:len(open)-1]
	if !sched.Admit("model", nil) {
		t.Error("closing a session did not free its share")
	}
}
