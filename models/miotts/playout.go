package miotts

import (
	"sync/atomic"
	"time"

	"github.com/voxpipe/voxpipe/models/miocodec"
)

// A piece's audio plays from its first chunk on, a token's worth (tokenPeriod) at a time;
// each codec window must be decoded before its audio is due. How far ahead a window is
// depends on how fast the stream's tokens come, which depends on how many streams share the
// model: admission asks the pieces speaking whether one more stream would make any of them
// late, and a new piece chooses how much of its ramp it can afford at the speed it will get.

// lateTolerance is how far behind its schedule a window may be predicted to be ready. Players
// buffer a little past the nominal schedule (`bench tts-load` counts a chunk late 200 ms
// after it); the rest of that is left for the window's decode and the jitter between rounds.
const lateTolerance = 120 * time.Millisecond

// playout is one speaking piece's schedule (its codec stream's windows) and progress.
type playout struct {
	o miocodec.StreamOptions

	generated atomic.Int64 // tokens generated so far
	first     atomic.Int64 // unix nanoseconds of its first audio; 0 before
}

func newPlayout(o miocodec.StreamOptions) *playout { return &playout{o: o} }

// steadyAhead is how many steady windows past the next one to decode the slack looks at:
// past the ramp a window's slack changes by a constant step (tokenPeriod − gap per token of
// core), so the nearest windows decide unless the gap exceeds a token's time, which
// admission's gap budget refuses on its own.
const steadyAhead = 2

// slack is the least time by which the piece's next windows are predicted to be ready before
// their audio is due, if from now on each of its tokens takes gap. Before the first audio the
// schedule starts when the first window is ready.
func (p *playout) slack(now time.Time, gap time.Duration) time.Duration {
	g := int(p.generated.Load())
	ready := func(need int) time.Time { return now.Add(time.Duration(max(need-g, 0)) * gap) }
	w := 0
	for _, need := p.o.Window(w); need <= g; _, need = p.o.Window(w) {
		w++ // decoded, or decoding now
	}
	var first time.Time
	if ns := p.first.Load(); ns != 0 {
		first = time.Unix(0, ns)
	} else {
		_, need := p.o.Window(0)
		first = ready(need) // the first window sets the schedule
		w = max(w, 1)
	}
	least := time.Duration(1<<63 - 1)
	for last := max(w, len(p.o.Ramp)) + steadyAhead; w <= last; w++ {
		start, need := p.o.Window(w)
		due := first.Add(time.Duration(start) * tokenPeriod)
		least = min(least, due.Sub(ready(need)))
	}
	return least
}

// onTime reports whether the piece stays within lateTolerance of its schedule at gap.
func (p *playout) onTime(now time.Time, gap time.Duration) bool {
	return p.slack(now, gap) >= -lateTolerance
}

// rampFor is the longest tail of ramp (the earliest first audio) whose schedule a new piece
// keeps at gap a token; no ramp (the first audio after a whole window) when none does. gap 0
// (nothing measured yet) keeps the whole ramp.
func rampFor(ramp []int, o miocodec.StreamOptions, gap time.Duration) []int {
	if gap <= 0 {
		return ramp
	}
	now := time.Now()
	for i := range ramp {
		o.Ramp = ramp[i:]
		if newPlayout(o).onTime(now, gap) {
			return ramp[i:]
		}
	}
	return ramp[len(ramp):]
}
