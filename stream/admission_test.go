package stream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAdmission(t *testing.T) {
	a := NewAdmission(2, 50*time.Millisecond)
	r1, err1 := a.Acquire(context.Background())
	r2, err2 := a.Acquire(context.Background())
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	// Full: the third waits its deadline, then is refused with a retry hint.
	start := time.Now()
	_, err := a.Acquire(context.Background())
	var busy *BusyError
	if !errors.As(err, &busy) || !errors.Is(err, ErrBusy) || busy.RetryAfter < time.Second {
		t.Fatalf("full: %v", err)
	}
	if w := time.Since(start); w < 50*time.Millisecond {
		t.Errorf("refused after %v, before the queue deadline", w)
	}
	// A waiting request gets the slot as soon as one is released.
	got := make(chan error, 1)
	go func() {
		r, err := a.Acquire(context.Background())
		if err == nil {
			r()
		}
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if s := a.Stats(); s.Active != 2 || s.Queued != 1 || s.Rejected != 1 {
		t.Errorf("stats %+v", s)
	}
	r1()
	r1() // releasing twice is harmless
	if err := <-got; err != nil {
		t.Errorf("queued request: %v", err)
	}
	// A cancelled context leaves the line at once.
	r3, _ := a.Acquire(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	r2()
	r3()
	if s := a.Stats(); s.Active != 0 || s.Queued != 0 {
		t.Errorf("after releases: %+v", s)
	}
}

// TestAdmissionFits: with a capacity check, a free slot is not enough — a request waits
// until the check lets one more stream in, and is refused busy if it never does in time.
func TestAdmissionFits(t *testing.T) {
	a := NewAdmission(8, 300*time.Millisecond)
	var capacity atomic.Int32
	capacity.Store(1)
	var asked []int
	var mu sync.Mutex
	a.SetFits(func(active int) bool {
		mu.Lock()
		asked = append(asked, active)
		mu.Unlock()
		return active < int(capacity.Load())
	})
	r1, err := a.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Slots are free but capacity is 1: the second waits, and gets in once capacity grows.
	got := make(chan error, 1)
	start := time.Now()
	go func() {
		r, err := a.Acquire(context.Background())
		if err == nil {
			defer r()
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if s := a.Stats(); s.Active != 1 || s.Queued != 1 {
		t.Errorf("while over capacity: %+v (the refused request must not hold a slot)", s)
	}
	capacity.Store(2)
	if err := <-got; err != nil {
		t.Fatalf("after capacity grew: %v", err)
	}
	if w := time.Since(start); w < 100*time.Millisecond {
		t.Errorf("admitted after %v, before capacity grew", w)
	}
	// Capacity that never grows: busy after the wait.
	capacity.Store(1)
	if _, err := a.Acquire(context.Background()); !errors.Is(err, ErrBusy) {
		t.Errorf("over capacity: %v, want busy", err)
	}
	r1()
	if s := a.Stats(); s.Active != 0 || s.Rejected != 1 {
		t.Errorf("after release: %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) == 0 || asked[0] != 0 {
		t.Errorf("capacity asked with active %v, want 0 first", asked)
	}
}

// TestAdmissionFitsFirstComeFirstServed: with a capacity check, capacity that frees up goes
// to the request that has waited longest, not to one that arrives just then.
func TestAdmissionFitsFirstComeFirstServed(t *testing.T) {
	a := NewAdmission(8, 2*time.Second)
	a.SetFits(func(active int) bool { return active < 1 })
	r1, err := a.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 2)
	wait := func(name string) {
		r, err := a.Acquire(context.Background())
		if err != nil {
			order <- name + ": " + err.Error()
			return
		}
		order <- name
		time.Sleep(50 * time.Millisecond)
		r()
	}
	go wait("first")
	for a.Stats().Queued != 1 {
		time.Sleep(time.Millisecond)
	}
	r1()             // capacity frees up…
	go wait("later") // …as a new request arrives
	if got := <-order; got != "first" {
		t.Errorf("%q was admitted first, want the request that waited", got)
	}
	if got := <-order; got != "later" {
		t.Errorf("then %q, want the later request", got)
	}
}
