package meanvc2

import (
	"fmt"
	"time"

	"github.com/voxpipe/voxpipe/models/conformer"
)

// LiveSchedule is how the live path should run a stream fed piece samples at a time: with
// SpreadSteps on when that costs no latency (the 120 ms model: its second step of a window
// is not due before the next piece), and the playout delay that schedule needs
// (liveDelay). It is worked out once per piece size and kept: every live stream of the
// model asks.
func (m *Model) LiveSchedule(piece int) (delay int, spread bool) {
	s := m.liveSchedule(piece)
	return s.delay, s.spread
}

// WarmLive runs four chunks of silence through s, piece samples at a time as a live session
// feeds it, and resets it. It returns how far the slowest piece after the first chunk (whose
// compiling does not recur) ran past its own duration, in samples: the start cushion the
// stream needs alone. Only the model's first stream per piece size runs it: that compiles
// the programs for every cache length a stream sees (the KV caches reach their caps by the
// third chunk), and the answer is kept, so later streams start at once instead of spending
// four chunks of compute while the model's other sessions play.
func (s *Stream) WarmLive(piece int) (int, error) {
	m := s.m
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	if c, ok := m.cushion[piece]; ok {
		return c, nil
	}
	silence := make([]float32, piece)
	var slowest time.Duration
	for k := range 4 * s.ChunkSize() / piece {
		t0 := time.Now()
		if _, err := s.Write(nil, silence); err != nil {
			return 0, fmt.Errorf("meanvc2: live warm-up: %w", err)
		}
		if k*piece >= s.ChunkSize() {
			slowest = max(slowest, time.Since(t0))
		}
	}
	s.Reset()
	c := max(int(slowest.Seconds()*float64(s.SampleRate())-float64(piece)), 0)
	if m.cushion == nil {
		m.cushion = map[int]int{}
	}
	m.cushion[piece] = c
	return c, nil
}

// schedule is LiveSchedule's answer for one piece size.
type schedule struct {
	delay, given int
	spread       bool
}

func (m *Model) liveSchedule(piece int) schedule {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	if s, ok := m.live[piece]; ok {
		return s
	}
	s := schedule{}
	s.delay, s.given = m.liveRun(piece, false)
	if d, g := m.liveRun(piece, true); d <= s.delay {
		s = schedule{delay: d, given: g, spread: true}
	}
	if m.live == nil {
		m.live = map[int]schedule{}
	}
	m.live[piece] = s
	return s
}

// liveDelay is the playout delay the live path needs, in samples: a stream fed piece
// samples at a time through Write (SpreadSteps set to spread), with the audio of each call
// handed on in order, needs this much audio buffered ahead of the first output so that a
// player taking piece samples per call never runs dry — were the model's compute
// instantaneous (what it adds on top is measured where it runs). It is the cost of the
// reference's schedule alone: content frames arrive a window at a time (every 80 ms for the
// 40 ms model, 160 ms for the 120 ms one) and a DiT step needs its lookahead block, so
// output comes in bursts.
//
// It is found by running the stream's own scheduling code on a dry stream — no model, just
// the counts — over a dozen chunks (the schedule repeats every few). The first chunk is
// aligned differently (no carried frames, no previous BN frame) and its output comes later;
// the delay is the steady schedule's, and LiveGivenUp counts what the first chunk loses.
func (m *Model) liveDelay(piece int, spread bool) int {
	delay, _ := m.liveRun(piece, spread)
	return delay
}

// LiveGivenUp is the number of output samples at the start of a live stream (LiveSchedule's
// schedule, piece samples a call) that come after their turn to be played and are given up
// for silence: the first chunk's, which the steady schedule's delay does not cover.
func (m *Model) LiveGivenUp(piece int) int { return m.liveSchedule(piece).given }

// liveRun runs the dry schedule: the delay from the second chunk on, and how many output
// samples, with that delay, come after their turn (output sample j is handed out by call
// ⌊(j+delay)/piece⌋+1).
func (m *Model) liveRun(piece int, spread bool) (delay, given int) {
	if piece <= 0 {
		return 0, 0
	}
	rt := m.Config.Runtime
	warmup, total := 2*rt.ChunkSamples, 12*rt.ChunkSamples
	in := make([]float32, piece)
	var ready []int // output length after each call
	s, err := m.dryStream()
	if err != nil {
		return m.OutputSlack(), 0 // cannot happen for a loaded model; the whole-chunk bound
	}
	s.spread = spread
	var out []float32
	for k := 1; (k-1)*piece < total; k++ {
		before := len(out)
		if out, err = s.Write(out, in); err != nil {
			return m.OutputSlack(), 0
		}
		ready = append(ready, len(out))
		if len(out) > before && (k-1)*piece >= warmup {
			// The first sample of this burst is handed out (k−1)·piece samples into the
			// stream when the player runs `delay` behind; it must be there by then.
			delay = max(delay, (k-1)*piece-before)
		}
	}
	prev := 0
	for k, n := range ready { // call k+1 produced samples [prev, n)
		for j := prev; j < n; j++ {
			if (j+delay)/piece+1 < k+1 {
				given++
			}
		}
		prev = n
	}
	return delay, given
}

// dryStream is a Stream that runs only the scheduling: ASR windows give zero BN frames and
// DiT steps append as many zero samples as the vocoder would emit.
func (m *Model) dryStream() (*Stream, error) {
	fe, err := conformer.NewFrontEnd(m.ASR.Config)
	if err != nil {
		return nil, err
	}
	return &Stream{m: m, fe: fe, cond: m.Config.NewCondBuffer(), dry: true,
		bnPerWin: conformer.OutFrames(m.ASR.Config.Stream.Window),
		adapter:  condAdapter{dim: m.Config.BNDim, points: m.Config.Runtime.VCChunkFrames}}, nil
}

// dryEmit is what the vocoder emits for one step in a dry stream: a decode of the overlap
// frames and the step's chunk, less the held-back crossfade tail.
func (s *Stream) dryEmit() int {
	v := s.m.Vocoder.Config
	frames := s.dryPrev + s.m.Config.ChunkSize
	s.dryPrev = min(v.Overlap, frames)
	return (frames-1)*v.Hop - v.WavOverlap
}
