package meanvc2

import (
	"github.com/voxpipe/voxpipe/models/conformer"
)

// LiveSchedule is how the live path should run a stream fed piece samples at a time: with
// SpreadSteps on when that costs no latency (the 120 ms model: its second step of a window
// is not due before the next piece), and the playout delay that schedule needs
// (LiveDelay).
func (m *Model) LiveSchedule(piece int) (delay int, spread bool) {
	delay = m.LiveDelay(piece, false)
	if d := m.LiveDelay(piece, true); d <= delay {
		return d, true
	}
	return delay, false
}

// LiveDelay is the playout delay the live path needs, in samples: a stream fed piece
// samples at a time through Write (SpreadSteps set to spread), with the audio of each call handed on in order, needs
// this much audio buffered ahead of the first output so that a player taking piece samples
// per call never runs dry — were the model's compute instantaneous (what it adds on top is
// measured where it runs). It is the cost of the reference's schedule alone: content frames
// arrive a window at a time (every 80 ms for the 40 ms model, 160 ms for the 120 ms one) and
// a DiT step needs its lookahead block, so output comes in bursts.
//
// It is found by running the stream's own scheduling code on a dry stream — no model, just
// the counts — over a dozen chunks (the schedule repeats every few).
func (m *Model) LiveDelay(piece int, spread bool) int {
	if piece <= 0 {
		return 0
	}
	s, err := m.dryStream()
	if err != nil {
		return m.OutputSlack() // cannot happen for a loaded model; the whole-chunk bound
	}
	s.spread = spread
	// The first chunk is aligned differently (no carried frames, no previous BN frame) and
	// its output comes late; the live path gives its first samples up (Delay's debt) rather
	// than delay the whole stream for them. From the second chunk on the schedule repeats.
	warmup := 2 * m.Config.Runtime.ChunkSamples
	total := 12 * m.Config.Runtime.ChunkSamples
	in := make([]float32, piece)
	var out []float32
	delay := 0
	for k := 1; (k-1)*piece < total; k++ {
		before := len(out)
		if out, err = s.Write(out, in); err != nil {
			return m.OutputSlack()
		}
		if len(out) > before && (k-1)*piece >= warmup {
			// The first sample of this burst is played (k−1)·piece samples into the stream
			// when the player runs `delay` behind; it must be there by then.
			delay = max(delay, (k-1)*piece-before)
		}
	}
	return delay
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
