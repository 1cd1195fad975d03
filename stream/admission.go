package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ErrBusy is returned (wrapped in a *BusyError) when a model has no free stream slot within
// the queue deadline.
var ErrBusy = errors.New("server busy")

// BusyError says how long a client should wait before retrying.
type BusyError struct {
	RetryAfter time.Duration
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("%v: the model has no room for another stream now (all its slots in use, or one more would not keep real time), retry in %v", ErrBusy, e.RetryAfter.Round(time.Second))
}

func (e *BusyError) Unwrap() error { return ErrBusy }

// Admission bounds the concurrent streams of one model so that admitted streams keep real
// time: beyond Slots, requests wait in line up to MaxWait and are then refused, rather than
// all streams slowing down together. The line is first come, first served.
type Admission struct {
	slots   chan struct{}
	maxWait time.Duration

	mu       sync.Mutex
	fits     func(active int) bool // SetFits; nil: a free slot is enough
	line     []*byte               // the waiting requests, first first
	avgHold  time.Duration         // moving average of how long a stream holds its slot
	rejected int64
}

// NewAdmission allows slots concurrent streams and a wait of maxWait for a free one.
func NewAdmission(slots int, maxWait time.Duration) *Admission {
	return &Admission{slots: make(chan struct{}, max(1, slots)), maxWait: maxWait, avgHold: 5 * time.Second}
}

// SetFits makes a free slot not enough: a request also needs fits(active) — would one
// more stream, with active already running, keep real time (a model's measured capacity).
// Slots stay the cap. A request refused waits in line as for a full slot.
func (a *Admission) SetFits(fits func(active int) bool) {
	a.mu.Lock()
	a.fits = fits
	a.mu.Unlock()
}

// take takes a free slot if the capacity check lets it; a.mu is held.
func (a *Admission) take() bool {
	select {
	case a.slots <- struct{}{}:
	default:
		return false
	}
	if a.fits != nil && !a.fits(len(a.slots)-1) {
		<-a.slots
		return false
	}
	return true
}

// capacityPoll is how often the first request in line asks the capacity check again:
// capacity frees up as streams end or steps get cheaper, with no event to wait on.
const capacityPoll = 20 * time.Millisecond

// Acquire waits for a slot; release must be called exactly once when the stream ends.
// It fails with a *BusyError after MaxWait, or with ctx's error.
func (a *Admission) Acquire(ctx context.Context) (release func(), err error) {
	me := new(byte) // this request's place in line
	a.mu.Lock()
	if len(a.line) == 0 && a.take() { // nobody waits: no need to queue
		a.mu.Unlock()
		return a.releaser(), nil
	}
	a.line = append(a.line, me)
	noCheck := a.fits == nil
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.line = slices.DeleteFunc(a.line, func(p *byte) bool { return p == me })
		if errors.Is(err, ErrBusy) {
			a.rejected++
		}
		a.mu.Unlock()
	}()
	t := time.NewTimer(a.maxWait)
	defer t.Stop()
	// Without a capacity check, wait on the slots themselves (a channel serves its blocked
	// senders in order); with one, the first in line asks again every capacityPoll.
	var slot chan struct{}
	var poll <-chan time.Time
	if noCheck {
		slot = a.slots
	} else {
		tick := time.NewTicker(capacityPoll)
		defer tick.Stop()
		poll = tick.C
	}
	for {
		select {
		case slot <- struct{}{}:
			return a.releaser(), nil
		case <-poll:
			a.mu.Lock()
			ok := a.line[0] == me && a.take()
			a.mu.Unlock()
			if ok {
				return a.releaser(), nil
			}
		case <-t.C:
			return nil, &BusyError{RetryAfter: a.retryAfter()}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (a *Admission) releaser() func() {
	start := time.Now()
	var once sync.Once
	return func() {
		once.Do(func() {
			<-a.slots
			a.mu.Lock()
			a.avgHold = (7*a.avgHold + time.Since(start)) / 8
			a.mu.Unlock()
		})
	}
}

// retryAfter estimates when a slot frees up: a typical stream's remaining time, at least 1 s.
func (a *Admission) retryAfter() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return max(time.Second, (a.avgHold / 2).Round(time.Second))
}

// AdmissionStats are the current load of an Admission.
type AdmissionStats struct {
	Slots, Active, Queued int
	Rejected              int64
}

// Stats reports slots in use, waiting requests and refusals so far.
func (a *Admission) Stats() AdmissionStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return AdmissionStats{Slots: cap(a.slots), Active: len(a.slots), Queued: len(a.line), Rejected: a.rejected}
}
