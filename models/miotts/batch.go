package miotts

import (
	"fmt"
	"log/slog"
	"runtime/debug"
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

	// tokenGap[b] is the mean time between a stream's tokens while b streams generate (over
	// every stream's steps in the last gapSpan or two, gapWindow[b]; under mu; last measured
	// at gapAt[b]): the round, the stream's sampling, the codec runs that held the engine,
	// the rounds it missed. What admission predicts capacity from.
	tokenGap  [qwen3.MaxBatch + 1]time.Duration
	gapAt     [qwen3.MaxBatch + 1]time.Time
	gapWindow [qwen3.MaxBatch + 1]gapWindow

	playing map[*playout]struct{} // the pieces speaking now (under mu)

	// A joining stream's prefill holds the engine between the other streams' rounds (in
	// chunks): every speaking piece's next tokens come that much later, which the token gaps
	// admission predicts from do not show. joinCost is a running mean of the backend time of
	// prefills run while others generated (qwen3.Session.PrefillTime: their chunks, not the
	// rounds between them), aloneCost of those run alone (under mu; 0: none measured yet).
	joinCost, aloneCost time.Duration

	refusedAt time.Time // when Fits last said no (under mu)
}

// notePrefill counts a prefill's backend time; shared: other streams generated meanwhile.
func (st *stepper) notePrefill(d time.Duration, shared bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	c := &st.aloneCost
	if shared {
		c = &st.joinCost
	}
	if *c > 0 {
		d = (3**c + d) / 4
	}
	*c = d
}

// joinDelay is how much later a join is predicted to make every speaking piece's tokens:
// the measured shared prefill, else one measured alone and a quarter for the chunking (a
// 92-token MioTTS prompt on 2 cores: 175 ms of backend time in one program, 190-200 ms in
// chunks of 16), else 0. st.mu is held.
func (st *stepper) joinDelay() time.Duration {
	if st.joinCost > 0 {
		return st.joinCost
	}
	return st.aloneCost * 5 / 4
}

// demandSpan is how long after admission last refused a stream the pieces that start plan
// room for one more (rampPlan).
const demandSpan = 10 * time.Second

// rampPlan is the token gap, and the delay, a piece starting with n pieces speaking (itself
// included) chooses its ramp for. While streams wait for room (admission refused one in the
// last demandSpan), that is the gap of one stream more, after a joiner's prefill: a piece
// whose ramp needs the model to itself would refuse every stream until its ramp is over, and
// busy servers would run one stream at a time. Otherwise the gap of n streams, no delay.
func (lm *LM) rampPlan(n int) (gap, delay time.Duration) {
	st := lm.steps
	st.mu.Lock()
	defer st.mu.Unlock()
	gap, _ = st.predictGap(n)
	if st.refusedAt.IsZero() || time.Since(st.refusedAt) > demandSpan || n >= qwen3.MaxBatch {
		return gap, 0
	}
	if more, _ := st.predictGap(n + 1); more > 0 && more <= gapBudget {
		return more, st.joinDelay()
	}
	return gap, 0
}

// gapSpan is how long one window of token gaps lasts. The mean must cover whole codec
// periods: a stream's codec window holds the engine once every 24 tokens (about a second),
// and the gaps in between are short — a minimum or a short average would see only those.
const gapSpan = 2 * time.Second

// gapWindow is a mean over the last closed window of gaps and the open one.
type gapWindow struct {
	closedSum, sum time.Duration
	closedN, n     int
	opened         time.Time
}

// add counts one gap and returns the mean over both windows.
func (w *gapWindow) add(gap time.Duration, now time.Time) time.Duration {
	if w.opened.IsZero() || now.Sub(w.opened) > 2*gapSpan {
		*w = gapWindow{opened: now} // long unmeasured: start afresh
	} else if now.Sub(w.opened) >= gapSpan {
		w.closedSum, w.closedN = w.sum, w.n
		w.sum, w.n, w.opened = 0, 0, now
	}
	w.sum += gap
	w.n++
	return (w.closedSum + w.sum) / time.Duration(w.closedN+w.n)
}

// gapAge is how long a measured token gap of two streams or more counts: the machine's other
// load changes, and a count of streams measured in a busy minute must not refuse streams
// forever (a forgotten count is probed again, a stream at a time).
const gapAge = time.Minute

// BatchStats are the decode rounds run since the model was loaded and the stream steps they
// held (Rows/Rounds is the mean batch size), and the capacity admission predicts from them.
type BatchStats struct {
	Rounds, Rows int64
	Generating   int // streams generating now
	Capacity     int // streams that would decode in real time together (Fits)
}

// BatchStats reports how the decode steps were batched.
func (lm *LM) BatchStats() BatchStats {
	st := lm.steps
	st.mu.Lock()
	active := st.active
	capacity := 0
	for capacity < qwen3.MaxBatch && st.fits(capacity+1) {
		capacity++
	}
	st.mu.Unlock()
	return BatchStats{Rounds: st.rounds.Load(), Rows: st.rows.Load(), Generating: active, Capacity: capacity}
}

// Real time for MioTTS is a speech token every tokenPeriod (MioCodec's 25 Hz); admission
// keeps each stream's measured gap between tokens within gapBudget of it, a margin for what
// the measurements do not see yet (a joining stream's prefill, jitter).
const (
	tokenPeriod = 40 * time.Millisecond
	gapBudget   = tokenPeriod * 9 / 10
)

// gapGrowth is the most by which the gap is predicted to grow with one stream more than
// the most measured so far, k: at most ×1.5 (measured on 2 cores, the codec included: ×1.5
// from 1 to 2 streams, ×1.6 from 2 to 4), and no more than (k+1)/k, the growth if every
// stream's work were its own (the weights the batched step reads once make it less). A flat
// ×1.5 kept servers from ever trying a 4th stream: 3 at 25.5 ms a token predicted 38 ms for
// 4, over the budget, where 4 run at 33-35.
func gapGrowth(k int) float64 {
	return min(1.5, float64(k+1)/float64(k))
}

// Fits reports whether active+1 streams would generate in real time together: each
// stream's gap between tokens within gapBudget, and no piece speaking now predicted to fall
// behind its playout (playout.onTime) at the gap predicted for one stream more, after the
// delay the joining stream's prefill adds (joinDelay). A count of streams measured in the
// last gapAge is judged by its gap, or a larger count's lower one; one stream beyond the
// most measured is predicted from the counts measured (predictGap); further than that is
// refused until the count in between has run (capacity is probed a stream at a time). One
// stream alone always fits: there is no one to protect, and refusing it would leave nothing
// to measure.
func (lm *LM) Fits(active int) bool {
	st := lm.steps
	st.mu.Lock()
	defer st.mu.Unlock()
	ok := st.fits(active + 1)
	if !ok {
		st.refusedAt = time.Now()
	}
	return ok
}

// fits is Fits for b streams; st.mu is held.
func (st *stepper) fits(b int) bool {
	if b <= 1 || b > qwen3.MaxBatch {
		return b <= 1
	}
	gap, from := st.predictGap(b)
	if gap == 0 || gap > gapBudget || b > from+1 {
		return false
	}
	now, delay := time.Now(), st.joinDelay()
	for p := range st.playing {
		if !p.onTime(now, gap, delay) {
			return false
		}
	}
	return true
}

// mostMeasured is the largest count of streams with a fresh gap (0: none); st.mu is held.
// One stream's gap is kept however old: it refuses no one (one stream always fits), and a
// piece starting alone after a quiet spell chooses its ramp by it (rampFor).
func (st *stepper) mostMeasured() int {
	for k := 2; k < len(st.gapAt); k++ {
		if !st.gapAt[k].IsZero() && time.Since(st.gapAt[k]) > gapAge {
			st.tokenGap[k], st.gapAt[k], st.gapWindow[k] = 0, time.Time{}, gapWindow{}
		}
	}
	for k := qwen3.MaxBatch; k > 0; k-- {
		if st.tokenGap[k] > 0 {
			return k
		}
	}
	return 0
}

// predictGap is the gap between a stream's tokens while b streams generate; 0 when nothing
// is measured. from is the count of streams it was measured with. st.mu is held.
//   - Up to the most streams measured: the least gap measured with b streams or more. Gaps
//     grow with the count, so a larger count's lower gap bounds a smaller count's: the
//     higher one was taken while work its count does not show held the engine (joiners'
//     prefills, the codec tails of pieces that had stopped generating), and a count refused
//     by its own stale figure would never run to correct it (a 4-session load ran one stream
//     at a time for the last 8 s of 20 on a 2-stream gap of 44 ms, 4 streams having
//     measured 23 ms since).
//   - Beyond: the most measured count's gap, grown a stream at a time by the slope measured
//     from the fewest streams measured to the most, kept between half and all of the
//     growth gapGrowth allows (all of it when one count alone is measured).
func (st *stepper) predictGap(b int) (gap time.Duration, from int) {
	b = min(max(b, 1), qwen3.MaxBatch)
	most := st.mostMeasured()
	if most == 0 {
		return 0, 0
	}
	if b <= most {
		return st.leastGap(b, most)
	}
	gap, from = st.tokenGap[most], most
	var slope time.Duration
	sloped := false
	for j := 1; j < most; j++ {
		if st.tokenGap[j] > 0 {
			low, _ := st.leastGap(j, most)
			slope, sloped = (gap-low)/time.Duration(most-j), true
			break
		}
	}
	for k := most; k < b; k++ {
		step := time.Duration(float64(gap) * (gapGrowth(k) - 1))
		if sloped {
			step = min(step, max(slope, step/2))
		}
		gap += step
	}
	return gap, from
}

// leastGap is the least gap measured with from b to most streams, and that count (gap 0
// when none is); st.mu is held.
func (st *stepper) leastGap(b, most int) (gap time.Duration, from int) {
	for k := b; k <= most; k++ {
		if g := st.tokenGap[k]; g > 0 && (gap == 0 || g < gap) {
			gap, from = g, k
		}
	}
	return gap, from
}

// PredictGap is the gap between a stream's tokens predicted for b streams generating
// together (0: nothing measured yet).
func (lm *LM) PredictGap(b int) time.Duration {
	st := lm.steps
	st.mu.Lock()
	defer st.mu.Unlock()
	gap, _ := st.predictGap(b)
	return gap
}

// play registers a speaking piece for admission to protect; the returned func removes it.
func (st *stepper) play(p *playout) (done func()) {
	st.mu.Lock()
	if st.playing == nil {
		st.playing = map[*playout]struct{}{}
	}
	st.playing[p] = struct{}{}
	st.mu.Unlock()
	return func() {
		st.mu.Lock()
		delete(st.playing, p)
		st.mu.Unlock()
	}
}

// stepReq is one stream's step: its session and token in, the logits (or error) out.
type stepReq struct {
	sess   *qwen3.Session
	id     int32
	logits []float32
	err    error
	done   chan struct{}
	last   time.Time // when the stream's previous step came back
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

// generating is the number of streams between their prefill and their end.
func (st *stepper) generating() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.active
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
	now := time.Now()
	if !r.last.IsZero() && r.err == nil {
		st.noteGap(now.Sub(r.last))
	}
	r.last = now
	return r.logits, r.err
}

// noteGap adds one stream's time between two tokens to the figure for the streams now
// generating. Every gap counts in full — compiles and codec runs included — since the
// streams' playout pays for them all.
func (st *stepper) noteGap(gap time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	b := min(max(st.active, 1), qwen3.MaxBatch)
	now := time.Now()
	st.tokenGap[b] = st.gapWindow[b].add(gap, now)
	st.gapAt[b] = now
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
	var out [][]float32
	err := recovered("decode step", func() (err error) {
		out, err = st.model.StepBatch(ss, ids)
		return err
	})
	st.rounds.Add(1)
	st.rows.Add(int64(len(batch)))
	for i, r := range batch {
		switch {
		case err == nil:
			r.logits = out[i]
		case len(batch) == 1:
			r.err = err
		default:
			r.err = recovered("decode step", func() (err error) {
				r.logits, err = r.sess.Step(r.id)
				return err
			})
		}
		r.done <- struct{}{}
	}
}

// recovered runs fn and turns a panic into an error, logged with its stack. The stepper and
// codec goroutines run outside the request's own panic guard (stream.Guard, which models
// cannot import), and a bad step must fail its requests, not the server or the streams
// waiting on the stepper.
func recovered(what string, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			slog.Error("panic recovered: the request failed, the server goes on", "in", "miotts "+what,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("miotts: %s failed (panic: %v)", what, r)
		}
	}()
	return fn()
}
