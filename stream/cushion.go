package stream

import (
	"sync"
	"time"
)

// Start cushions. A session holds its start until its processor's cushion is queued: what its
// slowest step takes beyond its own duration, measured when the processor was made, alone.
// A model that batches sessions takes longer per step the more sessions share it (eight
// MeanVC2 sessions in step: 50–90 ms a step against 25 ms alone), and a session that starts
// with the cushion it had alone would leave gaps in its first second until the latency its
// late steps add covered them. So the scheduler learns each voice's slowest recent step and
// the model sessions open when it was seen, and a starting session queues what that step,
// scaled to the sessions open now, needs. Before any step of the voice was seen, the
// processor's slowest step alone stands in for it, scaled from one session — or, where that
// is more, its model's slowest step with many sessions, measured when it was loaded
// (ProcessorInfo.Shared), scaled from those and given headroom. A session that started
// before others joined gets what the cushion for the sessions open now adds to its own,
// its output stretched by that much (Session.Pull). A cushion larger than needed costs latency only
// until the session trims what no pull used (trimWindow).

// sharedHeadroom scales the slowest step of a model's load-time measurement (Shared) when it
// stands in for steps not yet seen: that ran its sessions alone on the machine, in step,
// while live ones share the cores with their network, codec and resampling work and start
// out of step. Eight MeanVC2 sessions over loopback WebRTC took their first steps 1.5-1.8×
// as long as the measurement said, and left gaps in their first second with it unscaled.
const sharedHeadroom = 1.5

// slowWindow is how long a slowest step is remembered (two windows, the last complete one
// and the current one, count).
const slowWindow = 10 * time.Second

// trustAfter is how long a window must have run before its slowest step counts: a model's
// first steps only fill its buffers, and its costly ones come a few chunks in.
const trustAfter = time.Second

// slowStep is the slowest step seen of a voice in one window, and the model sessions open
// when it was seen.
type slowStep struct {
	wall     time.Duration
	sessions int
}

// expect scales the step to n sessions: a batch of more sessions runs at most their work
// more (never less: the step was seen, and fewer sessions may still step together).
func (s slowStep) expect(n int) time.Duration {
	if s.sessions <= 0 || n <= s.sessions {
		return s.wall
	}
	return s.wall * time.Duration(n) / time.Duration(s.sessions)
}

type voiceSteps struct {
	mu    sync.Mutex
	voice map[string]*slowSteps
}

type slowSteps struct {
	at        time.Time // the current window's start
	cur, prev slowStep
}

// roll starts a new window once the current one is over.
func (w *slowSteps) roll(now time.Time) {
	switch d := now.Sub(w.at); {
	case d >= 2*slowWindow:
		w.prev, w.cur, w.at = slowStep{}, slowStep{}, now
	case d >= slowWindow:
		w.prev, w.cur, w.at = w.cur, slowStep{}, now
	}
}

// note records a step of voice that took wall; sessions counts the model sessions open now
// (called only for a step slower than the window's slowest so far, so rarely).
func (v *voiceSteps) note(voice string, wall time.Duration, now time.Time, sessions func() int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.voice == nil {
		v.voice = map[string]*slowSteps{}
	}
	w := v.voice[voice]
	if w == nil {
		w = &slowSteps{at: now}
		v.voice[voice] = w
	}
	w.roll(now)
	if wall > w.cur.wall {
		w.cur = slowStep{wall: wall, sessions: sessions()}
	}
}

// expect is the slowest step expected of voice with n model sessions open (false: none seen
// in the last two windows).
func (v *voiceSteps) expect(voice string, n int, now time.Time) (time.Duration, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	w := v.voice[voice]
	if w == nil {
		return 0, false
	}
	w.roll(now)
	cur := w.cur
	if now.Sub(w.at) < trustAfter {
		cur = slowStep{} // too early: a burst of sessions has not reached its slowest step
	}
	if cur.wall == 0 && w.prev.wall == 0 {
		return 0, false
	}
	return max(cur.expect(n), w.prev.expect(n)), true
}

// modelSessions counts the open sessions that run a model (not only built-in voices).
func (s *Scheduler) modelSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for l := range s.open {
		if !l.builtin.Load() {
			n++
		}
	}
	return n
}

// noteSlowStep records a step of l's voice for the start cushions of later sessions.
func (s *Scheduler) noteSlowStep(l *Live, wall time.Duration) {
	s.steps.note(l.sess.Voice(), wall, time.Now(), s.modelSessions)
}

// startCushion is the cushion (IO samples) l should hold ahead of its pulls with n model
// sessions open: what the slowest step expected of its voice takes beyond the duration of
// the processor's chunk. Without a step seen, the processor's own slowest step (its chunk
// plus its cushion) stands for one session, or its Shared measurement for its sessions,
// whichever predicts less.
func (s *Scheduler) startCushion(l *Live, n int) int {
	info := l.sess.Info()
	rate := float64(info.SampleRate)
	chunk := time.Duration(float64(info.ChunkSize) / rate * float64(time.Second))
	slow, ok := s.steps.expect(l.sess.Voice(), n, time.Now())
	if !ok {
		alone := chunk + time.Duration(float64(info.Cushion)/rate*float64(time.Second))
		slow = slowStep{wall: alone, sessions: 1}.expect(n)
		if sh := info.Shared; sh.Sessions > 0 && sh.Slowest > 0 {
			slow = min(slow, slowStep{wall: time.Duration(float64(sh.Slowest) * sharedHeadroom), sessions: sh.Sessions}.expect(n))
		}
	}
	return max(int((slow-chunk).Seconds()*float64(l.sess.cfg.IORate)), 0)
}
