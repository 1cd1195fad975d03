package stream

import (
	"math"
	"sync/atomic"
	"testing"
	"time"
)

// Sessions of a model voice reserve its learned cost while silent: a scheduler whose measured
// load is low still refuses the session that would saturate it once all of them speak.
func TestAdmissionByLearnedCost(t *testing.T) {
	sched := NewScheduler(2)
	defer sched.Close()
	if _, ok := sched.VoiceCost("model"); ok || !sched.Admit("model", nil, nil) {
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
	for sched.Admit("model", nil, nil) {
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
	if !sched.Admit("model", open[len(open)-1], nil) {
		t.Error("a session swapping to the voice it already runs is refused")
	}
	if !sched.Admit("other-model", nil, nil) {
		t.Error("a voice with no learned cost is refused on an idle scheduler")
	}
	open[len(open)-1].Close()
	open = open[:len(open)-1]
	if !sched.Admit("model", nil, nil) {
		t.Error("closing a session did not free its share")
	}
}

// waiting is a processor whose calls wait (sleep) mostly on other streams' work: it reports
// all but own of each call as overcharge (Metered), as a batching model does.
type waiting struct {
	blocking
	own        time.Duration
	overcharge atomic.Int64
}

func (w *waiting) Process(out, in []float32) ([]float32, error) {
	t0 := time.Now()
	out, err := w.blocking.Process(out, in)
	w.overcharge.Add(int64(time.Since(t0) - w.own))
	return out, err
}

func (w *waiting) Overcharge() time.Duration { return time.Duration(w.overcharge.Load()) }

// A step's wait on other streams' work is not its cost: the learned cost and the measured
// load count only what a Metered processor says its own work took.
func TestMeteredCostLeavesOutWaiting(t *testing.T) {
	sched := NewScheduler(1)
	defer sched.Close()
	// 40 ms chunks whose calls take 30 ms, 5 ms of it their own work.
	w := &waiting{blocking: blocking{Delay: *NewDelay(16000, 640, 0), sleep: 30 * time.Millisecond}, own: 5 * time.Millisecond}
	l, err := sched.NewLive(Config{IORate: 16000}, "batched", w, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pushSteadily(sched, l, 640, 40*time.Millisecond)
	cost, ok := sched.VoiceCost("batched")
	// Own work is 5 ms per 40 ms chunk (0.125); the wall time would say 0.75.
	if !ok || cost < 0.08 || cost > 0.4 {
		t.Errorf("learned cost %.3f (known %v), want about 0.125 (the wall time would give 0.75)", cost, ok)
	}
	if st := sched.Stats(); st.Load > 0.5 {
		t.Errorf("measured load %.3f, want about 0.125 (the wall time would give 0.75)", st.Load)
	}
}

// Before a voice's cost is learned, its sessions count what their processors' model measured
// (ProcessorInfo.Shared): a burst of silent sessions on a fresh server is not all admitted.
func TestAdmissionByProcessorCost(t *testing.T) {
	sched := NewScheduler(2)
	defer sched.Close()
	proc := func() Processor {
		p := &blocking{Delay: *NewDelay(16000, 320, 0)}
		p.Delay.info.Shared.Cost = 0.4 // core seconds per second: 0.2 of the two workers
		return p
	}
	var open []*Live
	defer func() {
		for _, l := range open {
			l.Close()
		}
	}()
	for {
		p := proc()
		if !sched.Admit("model", nil, p) {
			break
		}
		if len(open) > 10 {
			t.Fatal("admitted 10 sessions that cost 0.2 of the workers each")
		}
		l, err := sched.NewLive(Config{IORate: 16000}, "model", p, nil)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, l)
	}
	// 4 × 0.2 = 0.8 < 0.85: a fifth would make 1.0.
	if len(open) != 4 {
		t.Errorf("admitted %d silent sessions of cost 0.2 each, want 4 (limit %.2f)", len(open), SaturatedLoad)
	}
	if st := sched.Stats(); math.Abs(st.ExpectedLoad-0.8) > 1e-9 {
		t.Errorf("expected load %.3f, want 0.8", st.ExpectedLoad)
	}
	// A session swapping voices makes room with its own cost; no processor, no known cost:
	// admitted on the measured load.
	if !sched.Admit("model", open[0], proc()) {
		t.Error("a session swapping to the voice it runs is refused")
	}
	if !sched.Admit("other", nil, nil) {
		t.Error("a voice of unknown cost is refused on an idle scheduler")
	}

	// On a machine too slow for the voice, one session costs more than the limit: it is not
	// admitted, but a session already running it may change to a voice that costs no more.
	for _, l := range open {
		l.Close()
	}
	open = nil
	heavy := func() Processor {
		p := &blocking{Delay: *NewDelay(16000, 320, 0)}
		p.Delay.info.Shared.Cost = 2 // the whole of both workers
		return p
	}
	if sched.Admit("heavy", nil, heavy()) {
		t.Error("a session that alone saturates the workers is admitted")
	}
	l, err := sched.NewLive(Config{IORate: 16000}, "heavy", heavy(), nil)
	if err != nil {
		t.Fatal(err)
	}
	open = append(open, l)
	if !sched.Admit("heavy", l, heavy()) {
		t.Error("a session may not change to a voice that costs what its own does")
	}
}
