package stream

import (
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Scheduler owns model work: live sessions submit their due chunks, and a fixed set of
// workers runs them, so no network clock ever waits on a model. A session is queued at most
// once at a time, so the queue is bounded by the number of sessions. A worker takes one
// session's work at a time; there are more workers than cores so that many sessions' steps
// reach a model at once, and a model that batches (MeanVC2) runs them together.
type Scheduler struct {
	mu     sync.Mutex
	cond   *sync.Cond
	queue  []*Live
	closed bool
	wg     sync.WaitGroup

	workers int
	cores   int                // what the load is a fraction of (see load)
	live    atomic.Int64       // open Live sessions
	open    map[*Live]struct{} // the same, under mu, for the expected load
	costs   voiceCosts
	steps   voiceSteps // the slowest recent steps, for start cushions
	// Load accounting: busy holds the step time (ns) not yet credited to a window; running
	// holds each worker's step start (Unix ns, 0 when idle); mark is the last window's end.
	// A step is credited piecewise, so one longer than a window still counts in each.
	busy    atomic.Int64
	running []atomic.Int64
	mark    atomic.Int64
	window  struct {
		sync.Mutex
		at   time.Time
		load float64
	}
}

// ConcurrentSteps is the default number of workers: the most sessions whose steps reach the
// models at once (at least one per CPU).
const ConcurrentSteps = 16

// NewScheduler starts workers goroutines, whose load is counted against as many cores; ≤ 0:
// max(ConcurrentSteps, CPUs) workers against one core per CPU.
func NewScheduler(workers int) *Scheduler {
	cores := workers
	if workers <= 0 {
		cores = runtime.GOMAXPROCS(0)
		workers = max(ConcurrentSteps, cores)
	}
	s := &Scheduler{workers: workers, cores: cores, running: make([]atomic.Int64, workers), open: map[*Live]struct{}{}}
	s.cond = sync.NewCond(&s.mu)
	s.window.at = time.Now()
	s.mark.Store(s.window.at.UnixNano())
	for i := range workers {
		s.wg.Add(1)
		go s.work(&s.running[i])
	}
	return s
}

// Close stops the workers after the steps now running; queued work is dropped.
func (s *Scheduler) Close() {
	s.mu.Lock()
	s.closed = true
	s.queue = nil
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wg.Wait()
}

// SchedulerStats describe the load on a scheduler.
type SchedulerStats struct {
	Workers  int
	Cores    int
	Sessions int
	Queued   int
	// Load is the time spent in steps over the last second or so, as a fraction of the
	// cores' time (1 = as much step time as the cores have). Steps waiting on a shared model
	// count while they wait, and a model's own threads are not seen: it is an estimate.
	Load float64
	// ExpectedLoad is the load the open sessions would make if all of them spoke, from
	// their voices' learned costs (see Admit).
	ExpectedLoad float64
}

// Stats reports the scheduler's load.
func (s *Scheduler) Stats() SchedulerStats {
	s.mu.Lock()
	q := len(s.queue)
	s.mu.Unlock()
	return SchedulerStats{Workers: s.workers, Cores: s.cores, Sessions: int(s.live.Load()), Queued: q, Load: s.load(), ExpectedLoad: s.expectedLoad(nil)}
}

// SaturatedLoad is the load (SchedulerStats.Load) from which HasCapacity says no.
const SaturatedLoad = 0.85

// HasCapacity reports whether another real-time session fits: the workers are not already
// close to saturated. Admission asks it before a session with a model voice starts.
func (s *Scheduler) HasCapacity() bool { return s.load() < SaturatedLoad }

// load is the busy fraction, refreshed at most once a second.
func (s *Scheduler) load() float64 {
	w := &s.window
	w.Lock()
	defer w.Unlock()
	now := time.Now()
	if d := now.Sub(w.at); d >= time.Second {
		end := now.UnixNano()
		busy := s.busy.Swap(0)
		mark := s.mark.Swap(end)
		for i := range s.running {
			if start := s.running[i].Load(); start != 0 {
				busy += end - max(start, mark) // the running step's part in this window
			}
		}
		w.load = float64(busy) / float64(d) / float64(s.cores)
		w.at = now
	}
	return w.load
}

// submit queues l's next step; false when one is already queued or running (it, or the
// one after it, takes whatever arrived since).
func (s *Scheduler) submit(l *Live) bool {
	if !l.queued.CompareAndSwap(false, true) {
		return false
	}
	s.mu.Lock()
	if !s.closed {
		s.queue = append(s.queue, l)
		s.cond.Signal()
	}
	s.mu.Unlock()
	return true
}

func (s *Scheduler) work(running *atomic.Int64) {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		if s.closed {
			s.mu.Unlock()
			return
		}
		l := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.mu.Unlock()
		start := time.Now().UnixNano()
		running.Store(start)
		cost := l.step()
		running.Store(0)
		// What no window credited yet: load credits a running step's wall time, and the
		// step costs less where its processors were overcharged (see Metered).
		s.busy.Add(int64(cost) - max(s.mark.Load()-start, 0))
		// Cleared after the step, so a push during it re-queues the session here rather
		// than have a second worker wait on it.
		l.queued.Store(false)
		select { // wake a clock waiting in Settle
		case l.settled <- struct{}{}:
		default:
		}
		if l.due() {
			s.submit(l)
		}
	}
}

// Live is a Session run for a real-time stream: the media clock pushes input and pulls
// output and never waits for the processor; the Scheduler's workers run the chunks. Voice
// swaps are queued and applied by the worker before its next chunk, so they return at once.
type Live struct {
	sess  *Session
	sched *Scheduler
	log   *slog.Logger

	queued  atomic.Bool      // a step is queued or running
	work    sync.Mutex       // held while a step runs: one step of a session at a time
	settled chan struct{}    // signalled after each step
	timer   *time.Timer      // Settle's, reused: the clock does not allocate per frame
	recent  [16]atomic.Int64 // durations (ns) of the last steps that ran chunks, for Settle
	builtin atomic.Bool      // every processor in use is built in: Push runs the step itself
	playing atomic.Bool      // output has begun: the start cushion is settled
	stepN   atomic.Uint64

	costCompute, costAudio time.Duration // the cost window (noteCost), the step's own

	inMu   sync.Mutex // guards the fields below
	inbox  []float32  // input noted but not yet processed
	limit  int        // inbox bound: older input is dropped beyond it
	swaps  []swapReq
	inUse  []Processor // what the worker may still run (current, fading, queued swaps)
	closed bool
	spare  []float32
}

type swapReq struct {
	name string
	proc Processor
}

// maxInbox bounds the input waiting for a worker: a processor slower than real time loses
// old input rather than memory.
const maxInbox = 2 * time.Second

// NewLive makes a Session (see NewSession) run by s. Processing errors are logged to log.
func (s *Scheduler) NewLive(cfg Config, name string, proc Processor, log *slog.Logger) (*Live, error) {
	sess, err := NewSession(cfg, name, proc)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	l := &Live{sess: sess, sched: s, log: log, limit: int(maxInbox.Seconds() * float64(sess.cfg.IORate)),
		settled: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	l.timer.Stop()
	l.inUse = []Processor{proc}
	l.builtin.Store(isBuiltin(proc))
	s.live.Add(1)
	s.mu.Lock()
	s.open[l] = struct{}{}
	s.mu.Unlock()
	return l, nil
}

// Push queues input that arrived at time at for a worker (which resamples it and runs the
// chunks it completes) and reports whether it started a step — see Settle. It never waits
// for a model: only the built-in voices (DSP, passthrough) are run in the call itself.
func (l *Live) Push(in []float32, at time.Time) bool {
	l.sess.note(len(in), at)
	l.inMu.Lock()
	if l.closed {
		l.inMu.Unlock()
		return false
	}
	l.inbox = append(l.inbox, in...)
	drop := len(l.inbox) - l.limit
	if drop > 0 {
		l.inbox = l.inbox[:copy(l.inbox, l.inbox[drop:])]
	}
	l.inMu.Unlock()
	if drop > 0 {
		l.sess.skipInput(drop)
		l.sess.mu.Lock()
		l.sess.stats.DroppedChunks++
		l.sess.stats.Dropped += l.sess.samplesToDuration(drop)
		l.sess.mu.Unlock()
	}
	// The built-in voices cost a fraction of a millisecond a frame: they run right here,
	// as long as no worker holds the session (a model step still finishing after a swap).
	if l.builtin.Load() && l.work.TryLock() {
		l.stepLocked()
		l.work.Unlock()
		return false
	}
	return l.sched.submit(l)
}

func (l *Live) noteStep(d time.Duration) {
	if !l.builtin.Load() {
		l.sched.noteSlowStep(l, d)
	}
	l.recent[(l.stepN.Add(1)-1)%uint64(len(l.recent))].Store(int64(d)) // slots fill from 0
	var slowest time.Duration
	for i := range l.recent {
		slowest = max(slowest, time.Duration(l.recent[i].Load()))
	}
	l.sess.mu.Lock()
	l.sess.slowStep = int(slowest.Seconds() * float64(l.sess.cfg.IORate))
	l.sess.mu.Unlock()
}

// Settle waits for the step that Push started when the session's chunks typically (the
// median of the last 16 steps that ran one) take less than limit: a cheap voice's output
// (and a small model's) is then ready in the same tick, so the clock adds no frame of
// latency. A session whose chunks take longer (a model step) is not waited for at all —
// its output is played when it is ready — so the wait is bounded by limit whatever the
// model does. Only the clock calls it.
func (l *Live) Settle(limit time.Duration) {
	select { // a signal from an earlier step
	case <-l.settled:
	default:
	}
	if !l.queued.Load() {
		return
	}
	var recent [len(Live{}.recent)]time.Duration
	n := int(min(l.stepN.Load(), uint64(len(recent)))) // steps seen so far, up to 16
	for i := range n {
		recent[i] = time.Duration(l.recent[i].Load())
	}
	slices.Sort(recent[:n])
	if n > 0 && recent[n/2] > limit {
		return
	}
	l.timer.Reset(limit)
	select {
	case <-l.settled:
		l.timer.Stop() // Go ≥ 1.23 timers: no stale tick is delivered after Stop
	case <-l.timer.C:
	}
}

// due reports whether input or a swap waits. (Input is processed as it comes, not a chunk
// at a time: the resampler's look-ahead would otherwise hold every chunk back a whole chunk.)
func (l *Live) due() bool {
	l.inMu.Lock()
	defer l.inMu.Unlock()
	return !l.closed && (len(l.inbox) > 0 || len(l.swaps) > 0)
}

// Swap queues a voice change (see Session.Swap); the worker applies it before the next
// chunk, so it returns at once whatever the current processor is doing.
func (l *Live) Swap(name string, proc Processor) {
	l.inMu.Lock()
	l.swaps = append(l.swaps, swapReq{name, proc})
	l.inUse = append(l.inUse, proc)
	l.builtin.Store(false) // the worker applies swaps, and decides again
	l.inMu.Unlock()
	l.sched.submit(l)
}

// Tune runs fn (a parameter change) while no step of this session runs: processors are
// driven by one goroutine at a time.
func (l *Live) Tune(fn func() error) error {
	l.work.Lock()
	defer l.work.Unlock()
	return fn()
}

// InUse lists the processors the worker may still run; any other processor the session
// was given is done with and may be closed.
func (l *Live) InUse() []Processor {
	l.inMu.Lock()
	defer l.inMu.Unlock()
	return append([]Processor(nil), l.inUse...)
}

// step runs on a worker: apply queued swaps, then process the input that waits.
// It returns what the step cost: its wall time less its processors' overcharge (Metered).
func (l *Live) step() time.Duration {
	l.work.Lock()
	defer l.work.Unlock()
	t0 := time.Now()
	over := l.stepLocked()
	return max(time.Since(t0)-over, 0)
}

// stepLocked is step with l.work held. It returns the processors' overcharge in the step.
func (l *Live) stepLocked() (over time.Duration) {
	l.inMu.Lock()
	if l.closed {
		l.inMu.Unlock()
		return 0
	}
	swaps := l.swaps
	l.swaps = nil
	in := l.inbox
	l.inbox = l.spare[:0]
	l.inMu.Unlock()
	for _, sw := range swaps {
		if err := l.sess.Swap(sw.name, sw.proc); err != nil {
			l.log.Warn("voice swap failed", "voice", sw.name, "err", err)
		}
	}
	if len(in) > 0 {
		cur, fading := l.sess.running()
		over = -overcharge(cur, fading)
		t0 := time.Now()
		chunks := 0
		err := Guard(l.log, "voice processing", func() (err error) { chunks, err = l.sess.process(in); return err })
		if err != nil {
			l.log.Warn("processing failed", "err", err)
		}
		wall := time.Since(t0)
		over += overcharge(cur, fading)
		if chunks > 0 {
			l.noteStep(wall) // the wall time: Settle is about when output is ready
		}
		if !l.builtin.Load() {
			l.noteCost(max(wall-over, 0), len(in))
		}
	}
	l.inMu.Lock()
	l.spare = in[:0]
	l.inUse = l.inUse[:0]
	l.inUse = append(l.inUse, l.sess.proc)
	if f := l.sess.fade; f != nil {
		l.inUse = append(l.inUse, f.old)
	}
	for _, sw := range l.swaps {
		l.inUse = append(l.inUse, sw.proc)
	}
	l.builtin.Store(len(l.swaps) == 0 && !slices.ContainsFunc(l.inUse, func(p Processor) bool { return !isBuiltin(p) }))
	l.inMu.Unlock()
	return over
}

// overcharge is the sum of the Metered processors' overcharge (nil ones count nothing).
func overcharge(procs ...Processor) time.Duration {
	var sum time.Duration
	for _, p := range procs {
		if m, ok := p.(Metered); ok {
			sum += m.Overcharge()
		}
	}
	return sum
}

// isBuiltin reports whether p is one of the embedded voices (the DSP voice, passthrough):
// no model, well under a millisecond a frame. Only these run on the clock that pushes.
func isBuiltin(p Processor) bool {
	switch p.(type) {
	case *DSPVoice, *Delay:
		return true
	}
	return false
}

// Pull fills dst with the next output (silence where too little is ready) and returns how
// many samples were real audio; it never waits for processing.
// A model session's cushion follows the slowest step expected of its voice with the model
// sessions open now (startCushion): before output begins, its start waits for it; after,
// the output is stretched when sessions join and that grows.
func (l *Live) Pull(dst []float32, now time.Time) int {
	if !l.builtin.Load() {
		n := l.sched.modelSessions()
		l.sess.setStartCushion(l.sched.startCushion(l, n), n)
	}
	if l.playing.Load() {
		return l.sess.Pull(dst, now)
	}
	n := l.sess.Pull(dst, now)
	l.playing.Store(n > 0)
	return n
}

// NoteQueueAge: see Session.NoteQueueAge.
func (l *Live) NoteQueueAge(now time.Time) { l.sess.NoteQueueAge(now) }

// Stats: see Session.Stats.
func (l *Live) Stats() Stats { return l.sess.Stats() }

// Info is the installed processor's info (a queued swap shows once applied).
func (l *Live) Info() ProcessorInfo { return l.sess.Info() }

// AlgorithmicLatency: see Session.AlgorithmicLatency.
func (l *Live) AlgorithmicLatency() time.Duration { return l.sess.AlgorithmicLatency() }

// Close stops the session's processing: a running step finishes, nothing more is run, and
// InUse becomes empty.
func (l *Live) Close() {
	l.inMu.Lock()
	already := l.closed
	l.closed = true
	l.inMu.Unlock()
	if already {
		return
	}
	l.work.Lock() // wait for a step that is running
	l.inMu.Lock()
	l.inUse, l.swaps, l.inbox = nil, nil, nil
	l.inMu.Unlock()
	l.work.Unlock()
	l.sched.live.Add(-1)
	l.sched.mu.Lock()
	delete(l.sched.open, l)
	l.sched.mu.Unlock()
}
