package miotts

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/voxpipe/voxpipe/models/qwen3"
)

// Continuous batching of decode steps. Each Generate call keeps its own loop (prompt, sampler,
// emit, cancel); only the model step is shared: the streams that are generating hand their
// next token to the stepper, which runs them as one qwen3.StepBatch — the weights read once
// for all of them — and hands each its logits. A stream joins after its prefill and leaves
// when it stops, at any step.

// gatherWait is how long a round waits, after its first request, for the other generating
// streams to ask for their step (they sample and emit in between, well under a millisecond;
// one whose reader is slow is left for the next round).
const gatherWait = 2 * time.Millisecond

// stepper collects the generating streams' decode steps into batches.
type stepper struct {
	model *qwen3.Model

	mu      sync.Mutex
	active  int        // streams between their prefill and their end
	pending []*stepReq // steps asked for this round
	running bool       // the round loop is alive
	wake    chan struct{}

	rounds, rows atomic.Int64 // batched steps run, and the stream steps in them
}

// BatchStats are the decode rounds run since the model was loaded and the stream steps they
// held: Rows/Rounds is the mean batch size.
type BatchStats struct {
	Rounds, Rows int64
	Generating   int // streams generating now
}

// BatchStats reports how the decode steps were batched.
func (lm *LM) BatchStats() BatchStats {
	st := lm.steps
	st.mu.Lock()
	active := st.active
	st.mu.Unlock()
	return BatchStats{Rounds: st.rounds.Load(), Rows: st.rows.Load(), Generating: active}
}

// stepReq is one stream's step: its session and token in, the logits (or error) out.
type stepReq struct {
	sess   *qwen3.Session
	id     int32
	logits []float32
	err    error
	done   chan struct{}
}

func newStepper(m *qwen3.Model) *stepper {
	return &stepper{model: m, wake: make(chan struct{}, 1)}
}

func (st *stepper) poke() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// join registers a stream that will ask for steps; leave is its end.
func (st *stepper) join() {
	st.mu.Lock()
	st.active++
	if !st.running {
		st.running = true
		go st.loop()
	}
	st.mu.Unlock()
	st.poke()
}

func (st *stepper) leave() {
	st.mu.Lock()
	st.active--
	st.mu.Unlock()
	st.poke() // a round waiting for this stream need not
}

// step feeds id to sess in the next round and returns its logits (owned by the session).
// r is the stream's own request, reused across its steps.
func (st *stepper) step(r *stepReq, sess *qwen3.Session, id int32) ([]float32, error) {
	r.sess, r.id, r.logits, r.err = sess, id, nil, nil
	st.mu.Lock()
	st.pending = append(st.pending, r)
	st.mu.Unlock()
	st.poke()
	<-r.done
	return r.logits, r.err
}

// loop runs rounds while streams are generating.
func (st *stepper) loop() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		st.mu.Lock()
		for len(st.pending) == 0 {
			if st.active <= 0 {
				st.running = false
				st.mu.Unlock()
				return
			}
			st.mu.Unlock()
			<-st.wake
			st.mu.Lock()
		}
		// Wait until every generating stream has asked (or gatherWait has passed).
		deadline := time.Now().Add(gatherWait)
		for len(st.pending) < min(st.active, qwen3.MaxBatch) {
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			st.mu.Unlock()
			timer.Reset(left)
			select {
			case <-st.wake:
			case <-timer.C:
			}
			st.mu.Lock()
		}
		n := min(len(st.pending), qwen3.MaxBatch)
		batch := append([]*stepReq(nil), st.pending[:n]...)
		st.pending = append(st.pending[:0], st.pending[n:]...)
		st.mu.Unlock()
		st.run(batch)
	}
}

// run steps one batch and answers its requests. A batch that fails as a whole is retried
// one stream at a time, so each gets its own result.
func (st *stepper) run(batch []*stepReq) {
	ss := make([]*qwen3.Session, len(batch))
	ids := make([]int32, len(batch))
	for i, r := range batch {
		ss[i], ids[i] = r.sess, r.id
	}
	out, err := st.model.StepBatch(ss, ids)
	st.rounds.Add(1)
	st.rows.Add(int64(len(batch)))
	for i, r := range batch {
		switch {
		case err == nil:
			r.logits = out[i]
		case len(batch) == 1:
			r.err = err
		default:
			r.logits, r.err = r.sess.Step(r.id)
		}
		r.done <- struct{}{}
	}
}
