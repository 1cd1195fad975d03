package voice

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/stream"
)

// MeanVC2Processor makes a MeanVC2 stream into the target voice t a stream.Processor for
// the live path: it takes 20 ms pieces, the length of an Opus frame, and runs the model
// through Stream.Write, so each ASR window, DiT step and vocoder output happens as soon as
// its input exists rather than once per 160 ms chunk.
//
// The stream emits in bursts (a DiT step's worth at a time), while a Processor gives back
// exactly what it took. The adapter keeps a FIFO primed with Model.LiveSchedule's samples of
// silence — what the model's schedule needs buffered, computed from that schedule — so every
// call can hand out a whole piece; Info reports the latency as the model's alignment
// (Stream.Latency) plus that priming, so every output sample stays mapped to its input
// sample. The slower first chunk's output is partly given up (see take) rather than
// delaying the whole stream for it.
func MeanVC2Processor(m *meanvc2.Model, t meanvc2.Timbre) (stream.Processor, error) {
	if m == nil {
		return nil, errors.New("meanvc2 processor: no model")
	}
	s, err := m.NewStream(t)
	if err != nil {
		return nil, err
	}
	info, spread := meanVC2Live(m)
	s.SpreadSteps(spread) // one DiT step per piece where that costs no latency
	if info.Cushion, err = s.WarmLive(info.ChunkSize); err != nil {
		s.Close()
		return nil, err
	}
	p := &meanvc2Proc{s: s, info: info, prime: info.Latency - m.Latency()}
	piece := info.ChunkSize
	p.fifo = make([]float32, p.prime, p.prime+2*s.ChunkSize()) // room for the largest burst
	p.clean = make([]float32, piece)
	return p, nil
}

// MeanVC2Shared measures how live sessions of m run together, their steps batched: that
// many (MeanVC2Processor in a stream.Session at ioRate, resampling included) convert
// silence together, paced in 20 ms pieces as a media clock feeds them. Over three chunks
// after their first, it takes their own cost (wall time less overcharge, in core seconds;
// see stream.Metered) per second of audio, and the slowest step. The scheduler admits and
// starts sessions by it (ProcessorInfo.Shared) until it has learned the voice from real
// ones. Opening that many streams also compiles the batch programs up to their number,
// which live sessions would otherwise wait for. It takes about 0.7 s.
func MeanVC2Shared(m *meanvc2.Model, sessions, ioRate int) (stream.Shared, error) {
	var sh stream.Shared
	if sessions < 1 || ioRate <= 0 {
		return sh, fmt.Errorf("meanvc2 cost: %d sessions at %d Hz", sessions, ioRate)
	}
	t, err := m.Timbre(make([]float32, m.Config.SpkDim))
	if err != nil {
		return sh, fmt.Errorf("meanvc2 cost: %w", err)
	}
	procs := make([]stream.Processor, sessions)
	defer func() {
		for _, p := range procs {
			if p != nil {
				stream.CloseProcessor(p)
			}
		}
	}()
	sess := make([]*stream.Session, sessions)
	for i := range procs {
		if procs[i], err = MeanVC2Processor(m, t); err != nil {
			return sh, fmt.Errorf("meanvc2 cost: %w", err)
		}
		if sess[i], err = stream.NewSession(stream.Config{IORate: ioRate}, "cost", procs[i]); err != nil {
			return sh, fmt.Errorf("meanvc2 cost: %w", err)
		}
	}
	const piece = 20 * time.Millisecond
	chunk := time.Duration(m.Config.Runtime.ChunkSamples) * time.Second / time.Duration(m.Config.Runtime.SampleRate)
	pieces := int(chunk / piece)
	own, slowest := make([]time.Duration, sessions), make([]time.Duration, sessions)
	errs := make([]error, sessions)
	start := time.Now()
	var wg sync.WaitGroup
	for i, se := range sess {
		metered := procs[i].(stream.Metered)
		wg.Go(func() {
			silence := make([]float32, ioRate/50)
			out := make([]float32, len(silence))
			for k := range 4 * pieces {
				time.Sleep(time.Until(start.Add(time.Duration(k) * piece)))
				t0, over := time.Now(), metered.Overcharge()
				if err := se.Push(silence, t0); err != nil {
					errs[i] = err
					return
				}
				if k >= pieces { // the first chunk only fills buffers
					wall := time.Since(t0)
					own[i] += wall - (metered.Overcharge() - over)
					slowest[i] = max(slowest[i], wall)
				}
				se.Pull(out, time.Now())
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return sh, fmt.Errorf("meanvc2 cost: %w", err)
	}
	var sum time.Duration
	for _, d := range own {
		sum += d
	}
	audio := time.Duration(3*pieces) * piece
	sh = stream.Shared{Sessions: sessions, Cost: sum.Seconds() / float64(sessions) / audio.Seconds(), Slowest: slices.Max(slowest)}
	return sh, nil
}

// MeanVC2Info is the ProcessorInfo of m's live processors (whatever their target voice):
// 20 ms pieces at the model's rate, and latency the model's alignment plus the playout delay
// of its live schedule.
func MeanVC2Info(m *meanvc2.Model) stream.ProcessorInfo {
	info, _ := meanVC2Live(m)
	return info
}

func meanVC2Live(m *meanvc2.Model) (stream.ProcessorInfo, bool) {
	rate := m.Config.Runtime.SampleRate
	piece := rate / 50
	prime, spread := m.LiveSchedule(piece)
	return stream.ProcessorInfo{SampleRate: rate, ChunkSize: piece, Latency: m.Latency() + prime}, spread
}

// MeanVC2Reference is MeanVC2Processor on the reference path, for offline conversion: whole
// 160 ms chunks go through Stream.Process as the reference implementation runs them (its
// handling of a last short chunk included), with a FIFO primed with Model.OutputSlack — the
// most that path's output falls behind, the first chunk included, so nothing is given up.
func MeanVC2Reference(m *meanvc2.Model, t meanvc2.Timbre) (stream.Processor, error) {
	if m == nil {
		return nil, errors.New("meanvc2 processor: no model")
	}
	s, err := m.NewStream(t)
	if err != nil {
		return nil, err
	}
	p := &meanvc2Proc{s: s, whole: true, prime: m.OutputSlack()}
	p.info = stream.ProcessorInfo{SampleRate: s.SampleRate(), ChunkSize: s.ChunkSize(), Latency: s.Latency() + p.prime}
	p.fifo = make([]float32, p.prime, p.prime+4*s.ChunkSize()) // room for the largest burst
	p.clean = make([]float32, s.ChunkSize())
	return p, nil
}

type meanvc2Proc struct {
	s     *meanvc2.Stream
	whole bool // reference path: whole chunks through Process
	info  stream.ProcessorInfo
	prime int
	fifo  []float32 // converted audio not handed out yet (starts with prime zeros)
	debt  int       // zeros handed out for missing output, to be skipped when it comes
	clean []float32 // scratch for input with non-finite samples zeroed
}

func (p *meanvc2Proc) Info() stream.ProcessorInfo { return p.info }

// Overcharge makes the processor stream.Metered: its calls wait for, and run, other
// sessions' rows of the model's batches.
func (p *meanvc2Proc) Overcharge() time.Duration { return p.s.Overcharge() }

// Process converts one piece and appends exactly ChunkSize samples.
func (p *meanvc2Proc) Process(out, in []float32) ([]float32, error) {
	if len(in) != p.info.ChunkSize {
		return out, fmt.Errorf("meanvc2 processor: %d samples, want a chunk of %d", len(in), p.info.ChunkSize)
	}
	in = p.finite(in)
	n := len(p.fifo)
	var err error
	if p.whole {
		p.fifo, err = p.s.Process(p.fifo, in)
	} else {
		p.fifo, err = p.s.Write(p.fifo, in)
	}
	if err != nil {
		return out, err
	}
	p.payDebt(n)
	return p.take(out, p.info.ChunkSize), nil
}

// finite returns in, or a copy with NaN/Inf samples zeroed: the stream refuses such input
// (one would poison its caches), and a live session is better served by a moment of silence
// than by a chunk with no output, which would shift the rest of the stream.
func (p *meanvc2Proc) finite(in []float32) []float32 {
	for i, v := range in {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			c := append(p.clean[:0], in...)
			for j := i; j < len(c); j++ {
				if f := float64(c[j]); math.IsNaN(f) || math.IsInf(f, 0) {
					c[j] = 0
				}
			}
			return c
		}
	}
	return in
}

// payDebt drops newly converted samples (from index n on) that stand for zeros already
// handed out, so the output stays aligned after an underflow.
func (p *meanvc2Proc) payDebt(n int) {
	k := min(p.debt, len(p.fifo)-n)
	if k > 0 {
		p.fifo = append(p.fifo[:n], p.fifo[n+k:]...)
		p.debt -= k
	}
}

// take moves up to n samples from the FIFO to out, padding with silence (owed to the FIFO)
// if it holds fewer. With the priming that happens only in the first chunk, whose output
// comes later than the steady schedule's: the samples that missed their turn are dropped
// when they come (payDebt), keeping the output aligned.
func (p *meanvc2Proc) take(out []float32, n int) []float32 {
	k := min(n, len(p.fifo))
	out = append(out, p.fifo[:k]...)
	p.fifo = p.fifo[:copy(p.fifo, p.fifo[k:])]
	for range n - k {
		out = append(out, 0)
	}
	p.debt += n - k
	return out
}

// Flush appends everything still held back (the FIFO and the stream's tail) and starts over.
func (p *meanvc2Proc) Flush(out []float32) ([]float32, error) {
	n := len(p.fifo)
	var err error
	p.fifo, err = p.s.Flush(p.fifo) // the stream resets itself after a flush
	if err == nil {
		p.payDebt(n)
		out = append(out, p.fifo...)
	}
	p.restart()
	return out, err
}

// Reset returns to the state after construction.
func (p *meanvc2Proc) Reset() {
	p.s.Reset()
	p.restart()
}

func (p *meanvc2Proc) restart() {
	p.fifo = p.fifo[:p.prime]
	clear(p.fifo)
	p.debt = 0
}

// Close frees the stream's caches; the processor may not be used afterwards.
func (p *meanvc2Proc) Close() { p.s.Close() }
