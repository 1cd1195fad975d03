package stream

import (
	"context"
	"errors"
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
