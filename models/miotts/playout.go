package miotts

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/voxpipe/voxpipe/models/miocodec"
)

// A piece's audio plays from its first chunk on, a token's worth (tokenPeriod) at a time;
// each codec window must be decoded before its audio is due. How far ahead a window is
// depends on how fast the stream's tokens come, which depends on how many streams share the
// model, and on how long the codec takes to decode it (measured: codecCost): admission asks
// the pieces speaking whether one more stream would make any of them late, and a new piece
// chooses how much of its ramp it can afford at the speed it will get.

// lateTolerance is how far behind its schedule a window may be predicted to be ready. Players
// buffer a little past the nominal schedule (`bench tts-load` counts a chunk late 200 ms
// after it); the rest of that is left for the jitter between rounds.
const lateTolerance = 120 * time.Millisecond

// playout is one speaking piece's schedule (its codec stream's windows) and progress.
type playout struct {
	o miocodec.StreamOptions
	// codec is the codec's measured wall time per decoded token (codecCost; nil or 0:
	// not measured yet): a window's audio comes out only after its decode.
	codec *codecCost

	generated atomic.Int64 // tokens generated so far
	first     atomic.Int64 // unix nanoseconds of its first audio; 0 before
}

func newPlayout(o miocodec.StreamOptions, codec *codecCost) *playout {
	return &playout{o: o, codec: codec}
}

// codecCost is a running mean of the codec's wall time per decoded token (a window's decode,
// batched with other pieces' windows, over the tokens it decodes), in nanoseconds. Pieces
// add to it concurrently; two adds at once may lose one sample, which an estimate can spare.
type codecCost struct{ ns atomic.Int64 }

// add counts one window run: d for tokens decoded tokens.
func (c *codecCost) add(d time.Duration, tokens int) {
	if tokens <= 0 {
		return
	}
	sample := int64(d) / int64(tokens)
	if old := c.ns.Load(); old > 0 {
		sample = (3*old + sample) / 4
	}
	c.ns.Store(sample)
}

// perToken is the mean; 0 before the first window (or for a nil cost).
func (c *codecCost) perToken() time.Duration {
	if c == nil {
		return 0
	}
	return time.Duration(c.ns.Load())
}

// steadyAhead is how many steady windows past the next one to decode the slack looks at:
// past the ramp a window's slack changes by a constant step (tokenPeriod − gap per token of
// core), so the nearest windows decide unless the gap exceeds a token's time, which
// admission's gap budget refuses on its own.
const steadyAhead = 2

// slack is the least time by which the piece's next windows are predicted to be ready before
// their audio is due, if from now on each of its tokens takes gap and each decoded token of a
// window the codec's measured time. Before the first audio the schedule starts when the first
// window is ready.
func (p *playout) slack(now time.Time, gap time.Duration) time.Duration {
	g := int(p.generated.Load())
	perToken := p.codec.perToken()
	ready := func(w int) time.Time {
		first, need := p.o.Span(w)
		return now.Add(time.Duration(max(need-g, 0))*gap + time.Duration(need-first)*perToken)
	}
	w := 0
	for _, need := p.o.Window(w); need <= g; _, need = p.o.Window(w) {
		w++ // decoded, or decoding now
	}
	var first time.Time
	if ns := p.first.Load(); ns != 0 {
		first = time.Unix(0, ns)
	} else {
		first = ready(0) // the first window sets the schedule
		w = max(w, 1)
	}
	least := time.Duration(1<<63 - 1)
	for last := max(w, len(p.o.Ramp)) + steadyAhead; w <= last; w++ {
		start, _ := p.o.Window(w)
		due := first.Add(time.Duration(start) * tokenPeriod)
		least = min(least, due.Sub(ready(w)))
	}
	return least
}

// onTime reports whether the piece stays within lateTolerance of its schedule at gap, its
// tokens starting delay later.
func (p *playout) onTime(now time.Time, gap, delay time.Duration) bool {
	return p.slack(now, gap)-delay >= -lateTolerance
}

// slowerGrowth are the factors by which rampFor grows a ramp's windows from its first core
// when the ramp as given would come late: the same first audio, more windows (each decodes
// its context again) growing as fast as the tokens let the audio get ahead. With ×1.15 the
// first audio comes after 12 or 20 tokens at 29-32 ms a token (4 streams on 2 cores), where
// ×1.25 at best left a whole 16-token window (32 tokens); the extra windows cost about 4 %
// of the tokens 4 sessions make together (bench tts-load, 7 alternating runs: first audio
// p50 0.56-0.99 s, median 0.71, against 0.92-1.04, median 0.95).
var slowerGrowth = []float64{1.4, 1.25, 1.15}

// maxRampWindows bounds a grown ramp: past it the steady windows follow.
const maxRampWindows = 8

// rampFor is the ramp a new piece plays that gives the earliest first audio whose schedule
// it keeps at gap a token, its tokens starting delay later: a tail of ramp, tried from the
// whole one, each tail as given or grown more slowly from its first core (slowerGrowth);
// no ramp (the first audio after a whole window) when none keeps it. skipped is how many of
// ramp's first windows the choice left out. gap 0 (nothing measured yet) keeps the whole
// ramp.
func rampFor(ramp []int, o miocodec.StreamOptions, gap, delay time.Duration, codec *codecCost) (chosen []int, skipped int) {
	if gap <= 0 {
		return ramp, 0
	}
	now := time.Now()
	keeps := func(r []int) bool {
		o.Ramp = r
		return newPlayout(o, codec).onTime(now, gap, delay)
	}
	steady := o.Core
	if steady <= 0 {
		steady = miocodec.DefaultCore
	}
	for i := range ramp {
		if keeps(ramp[i:]) {
			return ramp[i:], i
		}
		for _, g := range slowerGrowth {
			if r := grownRamp(ramp[i], g, steady); keeps(r) {
				return r, i
			}
		}
	}
	return ramp[len(ramp):], len(ramp)
}

// grownRamp is the ramp from core first, each next core g times the last (one more at
// least), up to maxRampWindows windows or the steady core.
func grownRamp(first int, g float64, steady int) []int {
	var r []int
	for c := first; c < steady && len(r) < maxRampWindows; c = max(c+1, int(math.Round(float64(c)*g))) {
		r = append(r, c)
	}
	return r
}
