package stream

import (
	"fmt"
	"sync"
	"time"
)

// Admission by expected cost. The measured load only sees sessions that are speaking now: a
// room full of sessions admitted while silent would saturate the workers once they all speak.
// So the scheduler learns each voice's cost — compute time per second of audio, measured on
// its own workers by the sessions that ran it (a batching model's share: Metered) — and
// reserves that much for every open session of the voice, speaking or not. A voice not
// measured yet counts what its model measured when it was loaded (ProcessorInfo.Shared) if
// it did, and otherwise is admitted on the measured load alone; its sessions measure it.

// costWindow is the audio over which a session measures its voice's cost before reporting it.
const costWindow = time.Second

// voiceCosts holds the learned cost of each voice: an exponential average of the windows its
// sessions reported, so that it follows the machine (other load, thermal limits) over about
// ten windows.
type voiceCosts struct {
	mu   sync.Mutex
	cost map[string]float64 // compute seconds per audio second, on one worker
}

func (c *voiceCosts) note(voice string, compute, audio time.Duration) {
	if audio <= 0 {
		return
	}
	x := compute.Seconds() / audio.Seconds()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cost == nil {
		c.cost = map[string]float64{}
	}
	if old, ok := c.cost[voice]; ok {
		x = old + 0.2*(x-old)
	}
	c.cost[voice] = x
}

func (c *voiceCosts) get(voice string) (float64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	x, ok := c.cost[voice]
	return x, ok
}

// VoiceCost is the learned compute per second of audio of a voice on one worker (0, false
// before any session of it has run a window).
func (s *Scheduler) VoiceCost(voice string) (float64, bool) { return s.costs.get(voice) }

// costOf is what a second of audio of voice costs a worker: its learned cost, or before it
// is learned, what its processor's model measured (ProcessorInfo.Shared; 0 if unknown).
func (s *Scheduler) costOf(voice string, info ProcessorInfo) float64 {
	if c, ok := s.costs.get(voice); ok {
		return c
	}
	return info.Shared.Cost
}

// expectedLoad is the load the open sessions but except would put on the workers if all of
// them spoke: the sum of their costs (costOf), over the workers. Built-in voices run on the
// clocks, not the workers, and count nothing.
func (s *Scheduler) expectedLoad(except *Live) float64 {
	s.mu.Lock()
	open := make([]*Live, 0, len(s.open))
	for l := range s.open {
		if l != except {
			open = append(open, l)
		}
	}
	s.mu.Unlock()
	var sum float64
	for _, l := range open {
		if !l.builtin.Load() {
			sum += s.costOf(l.sess.Voice(), l.sess.Info())
		}
	}
	return sum / float64(s.cores)
}

// Admit reports whether a session of voice, run by p, fits: with its cost (costOf) added to
// what the open sessions are expected to need (or to the measured load, if that is higher),
// the workers stay under SaturatedLoad. replacing, if not nil, is an open session that is to
// change to voice: its own current cost is left out, and a change that costs no more is
// always admitted. p may be nil (the voice's processor is not made yet); a voice of unknown
// cost is admitted while the workers are not already near saturation (HasCapacity).
func (s *Scheduler) Admit(voice string, replacing *Live, p Processor) bool {
	var info ProcessorInfo
	if p != nil {
		info = p.Info()
	}
	cost := s.costOf(voice, info)
	measured := s.load()
	if replacing != nil && !replacing.builtin.Load() {
		own := s.costOf(replacing.sess.Voice(), replacing.sess.Info())
		if own > 0 && cost <= own {
			return true // adds nothing (on a slow machine one session may cost more than the limit)
		}
		measured -= own / float64(s.cores) // at most its share of what was measured
	}
	load := max(s.expectedLoad(replacing), measured)
	return load+cost/float64(s.cores) < SaturatedLoad
}

// noteCost adds one step to the session's cost window and reports a full window to the
// scheduler. Called by the worker that ran the step.
func (l *Live) noteCost(compute time.Duration, samples int) {
	l.costCompute += compute
	l.costAudio += l.sess.samplesToDuration(samples)
	if l.costAudio >= costWindow {
		l.sched.costs.note(l.sess.Voice(), l.costCompute, l.costAudio)
		l.costCompute, l.costAudio = 0, 0
	}
}

// NoRoom is the error for a voice Admit refused: ErrBusy, with what the client may do.
func NoRoom(voice string) error {
	return fmt.Errorf("the model workers have no room for another %q session (%w): try again later or use another voice", voice, ErrBusy)
}
