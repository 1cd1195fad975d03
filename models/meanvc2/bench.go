package meanvc2

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/engine"
)

// BenchResult is a streaming benchmark: compute time per 160 ms chunk on synthetic speech.
type BenchResult struct {
	Variant   string  `json:"variant"`    // Runtime.Model: 120ms or 40ms
	Seconds   float64 `json:"seconds"`    // audio per stream
	Streams   int     `json:"streams"`    // run concurrently
	Chunks    int     `json:"chunks"`     // timed chunks, all streams
	ChunkMs   float64 `json:"chunk_ms"`   // audio per chunk
	RTFMedian float64 `json:"rtf_median"` // median chunk ÷ chunk: hides the chunks with two DiT steps
	RTFP95    float64 `json:"rtf_p95"`
	// RTFTotal is the whole path's cost per stream: (Σ Process over every chunk + Flush) ÷ the
	// audio streamed (Chunks/Streams × ChunkMs).
	RTFTotal  float64 `json:"rtf_total"`
	ChunkP50  float64 `json:"chunk_ms_p50"` // compute per chunk
	ChunkP90  float64 `json:"chunk_ms_p90"`
	ChunkMax  float64 `json:"chunk_ms_max"`
	FlushMs   float64 `json:"flush_ms"`   // end of input (last steps and the vocoder tail), per stream
	WarmupMs  float64 `json:"warmup_ms"`  // first chunk of the first stream, compiling its programs
	SessionMB float64 `json:"session_mb"` // one more stream's state (Stream.SessionBytes)
	LatencyMs float64 `json:"latency_ms"` // algorithmic (Stream.Latency)
	SlackMs   float64 `json:"slack_ms"`   // output buffering a fixed-rate player needs (OutputSlack)
	// LiveMs is the live path's algorithmic latency at 20 ms pieces: Latency + the playout
	// delay of its schedule (LiveSchedule) + the piece being filled.
	LiveMs float64 `json:"live_latency_ms"`
	// ChunkTimesMs is every timed Process call, stream by stream in order, and FlushTimesMs
	// each stream's Flush: the figures RTFTotal and the quantiles are computed from.
	ChunkTimesMs []float64 `json:"chunk_times_ms"`
	FlushTimesMs []float64 `json:"flush_times_ms"`
}

// BenchStream converts seconds of synthetic speech through streams of m in 160 ms chunks and
// times every Process call. streams ≤ 1 runs one stream; more run concurrently, each on its
// own goroutine, sharing the weights (the backend's thread count is fixed when m is loaded).
// The target voice is the GTM of a fixed pseudo-random embedding: the compute does not
// depend on the voice.
func BenchStream(m *Model, seconds float64, streams int) (BenchResult, error) {
	streams = max(streams, 1)
	c := m.Config
	piece := c.Runtime.SampleRate / 50
	live, _ := m.LiveSchedule(piece)
	res := BenchResult{Variant: c.Runtime.Model, Seconds: seconds, Streams: streams, LatencyMs: m.ms(m.Latency()), SlackMs: m.ms(m.OutputSlack()),
		LiveMs: m.ms(m.Latency() + live + piece)}
	n := c.Runtime.ChunkSamples
	res.ChunkMs = m.ms(n)
	chunks := int(seconds * float64(c.Runtime.SampleRate) / float64(n))
	if chunks < 1 {
		return res, fmt.Errorf("meanvc2: bench: %.2f s is less than one %d-sample chunk", seconds, n)
	}
	spk := make([]float32, c.SpkDim)
	for i := range spk {
		spk[i] = float32(math.Sin(float64(i)*1.7)) * 0.5
	}
	target, err := m.Timbre(spk)
	if err != nil {
		return res, err
	}
	in := SyntheticSpeech(chunks*n, c.Runtime.SampleRate, 1)

	ss := make([]*Stream, streams)
	defer func() {
		for _, s := range ss {
			if s != nil {
				s.Close()
			}
		}
	}()
	for i := range ss {
		if ss[i], err = m.NewStream(target); err != nil {
			return res, err
		}
		// Compile the programs outside the timed loop.
		t0 := time.Now()
		if _, err := ss[i].Process(nil, in[:n]); err != nil {
			return res, err
		}
		if i == 0 {
			res.WarmupMs = msSince(t0)
		}
		ss[i].Reset()
	}
	sb, err := ss[0].SessionBytes()
	if err != nil {
		return res, err
	}
	res.SessionMB = float64(sb) / (1 << 20)

	times := make([][]float64, streams)
	flush := make([]float64, streams)
	errs := make([]error, streams)
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]float32, 0, 2*n)
			for k := range chunks {
				t0 := time.Now()
				var err error
				if out, err = s.Process(out[:0], in[k*n:(k+1)*n]); err != nil {
					errs[i] = err
					return
				}
				times[i] = append(times[i], msSince(t0))
			}
			t0 := time.Now()
			if _, err := s.Flush(out[:0]); err != nil {
				errs[i] = err
				return
			}
			flush[i] = msSince(t0)
		}()
	}
	wg.Wait()
	var all []float64
	total := 0.0
	for i := range ss {
		if errs[i] != nil {
			return res, errs[i]
		}
		all = append(all, times[i]...)
		res.ChunkTimesMs = append(res.ChunkTimesMs, times[i]...)
		res.FlushTimesMs = append(res.FlushTimesMs, flush[i])
		res.FlushMs += flush[i] / float64(streams)
		total += flush[i]
		for _, t := range times[i] {
			total += t
		}
	}
	res.RTFTotal = total / float64(streams) / (float64(chunks) * res.ChunkMs)
	slices.Sort(all)
	res.Chunks = len(all)
	res.ChunkP50, res.ChunkP90, res.ChunkMax = quantile(all, 0.5), quantile(all, 0.9), all[len(all)-1]
	res.RTFMedian, res.RTFP95 = res.ChunkP50/res.ChunkMs, quantile(all, 0.95)/res.ChunkMs
	return res, nil
}

// SpeakerResult is the cost of embedding one reference clip.
type SpeakerResult struct {
	Seconds float64 `json:"seconds"`  // clip length
	Frames  int     `json:"frames"`   // WavLM frames
	FirstMs float64 `json:"first_ms"` // including compiling the programs for this length
	Ms      float64 `json:"ms"`       // again, compiled (the embedding cache bypassed)
	GTMMs   float64 `json:"gtm_ms"`   // the timbre memory from the embedding
}

// BenchSpeaker times the speaker path (WavLM, ECAPA, then the GTM) on seconds of synthetic
// speech at 16 kHz.
func BenchSpeaker(m *Model, seconds float64) (SpeakerResult, error) {
	sr := m.Config.Runtime.SampleRate
	clip := SyntheticSpeech(int(seconds*float64(sr)), sr, 2)
	res := SpeakerResult{Seconds: seconds, Frames: m.WavLM.Config.Frames(len(clip))}
	if err := CheckReference(clip, sr); err != nil {
		return res, err
	}
	t0 := time.Now()
	if _, err := m.embed(clip, sr); err != nil {
		return res, err
	}
	res.FirstMs = msSince(t0)
	t0 = time.Now()
	spk, err := m.embed(clip, sr)
	if err != nil {
		return res, err
	}
	res.Ms = msSince(t0)
	t0 = time.Now()
	if _, err := m.Timbre(spk); err != nil {
		return res, err
	}
	res.GTMMs = msSince(t0)
	return res, nil
}

// WavLMPlanStats is the memory plan of the speaker WavLM for a clip of samples at 16 kHz (all
// the hidden states the ECAPA head mixes): the arena shared by liveness against the naive sum
// of the intermediates. It compiles (and caches) that program.
func (m *Model) WavLMPlanStats(samples int) (engine.PlanStats, error) {
	m.speakerExec.Lock()
	st, err := m.WavLM.ProgramStats(samples, m.layers)
	m.speakerExec.Unlock()
	if err != nil {
		return st, fmt.Errorf("meanvc2: %w", err)
	}
	return st, nil
}

// SyntheticSpeech is n samples of a deterministic voiced-speech-like signal at rate Hz: a
// glottal-like pulse train with a gliding f0 through three resonances, under a syllable-rate
// envelope, peak about 0.5. seed varies the f0 contour. For benchmarks and tests.
func SyntheticSpeech(n, rate int, seed int) []float32 {
	out := make([]float32, n)
	fs := float64(rate)
	type res struct{ f, bw float64 }
	formants := []res{{700, 130}, {1220, 70}, {2600, 160}}
	// Two-pole resonators in cascade.
	var y1, y2 [3]float64
	phase := 0.0
	var peak float64
	for i := range out {
		t := float64(i) / fs
		f0 := 110 + 25*math.Sin(2*math.Pi*(0.7+0.2*float64(seed))*t) + 10*float64(seed%3)
		phase += f0 / fs
		x := 0.0
		if phase >= 1 {
			phase -= 1
			x = 1
		}
		for k, fm := range formants {
			f := fm.f * (1 + 0.15*math.Sin(2*math.Pi*(0.9+0.3*float64(k))*t+float64(seed)))
			r := math.Exp(-math.Pi * fm.bw / fs)
			a1, a2 := 2*r*math.Cos(2*math.Pi*f/fs), -r*r
			y := (1-r)*x + a1*y1[k] + a2*y2[k]
			y2[k], y1[k] = y1[k], y
			x = y
		}
		env := 0.5 + 0.5*math.Sin(2*math.Pi*4*t-math.Pi/2)
		v := x * env
		out[i] = float32(v)
		peak = max(peak, math.Abs(v))
	}
	if peak > 0 {
		for i := range out {
			out[i] = float32(float64(out[i]) * 0.5 / peak)
		}
	}
	return out
}

func (m *Model) ms(samples int) float64 {
	return 1000 * float64(samples) / float64(m.Config.Runtime.SampleRate)
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// quantile of sorted values (nearest rank).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
