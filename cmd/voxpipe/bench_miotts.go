package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/miocodec"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/models/qwen3"
	"github.com/voxpipe/voxpipe/models/sampler"
)

// miottsBench are the figures of `voxpipe bench miotts`.
type miottsBench struct {
	Threads       int     `json:"threads"`
	Backend       string  `json:"backend"`
	CodecBackend  string  `json:"codec_backend"`
	KVCache       string  `json:"kv_cache"` // the LM's KV cache encoding: F16 or F32
	LoadMs        float64 `json:"load_ms"`
	LoadRSSMB     float64 `json:"load_rss_mb"` // resident once both models are loaded
	PrefillTokens int     `json:"prefill_tokens"`
	PrefillMs     float64 `json:"prefill_ms"` // median of 3 compiled runs
	// Decode as Generate runs it: every step is the sampler's draw from the previous logits
	// (the model's generation_config.json settings, Sampler) and the LM step on that token,
	// from the prompt's end on, over programs already compiled (a warm server's). The
	// headline DecodeTokensPerS is the mean over all DecodeSteps: DecodeSteps ÷ DecodeMs,
	// DecodeMs = Σ DecodeStepMs. DecodeTokensPerSP50 is 1000 ÷ the median step.
	DecodeSteps         int          `json:"decode_steps"`
	DecodeMs            float64      `json:"decode_ms"`
	DecodeTokensPerS    float64      `json:"decode_tokens_per_s"`
	DecodeTokensPerSP50 float64      `json:"decode_tokens_per_s_p50"`
	DecodeStepMsP50     float64      `json:"decode_step_ms_p50"`
	DecodeStepMsP95     float64      `json:"decode_step_ms_p95"`
	DecodeStepMsMax     float64      `json:"decode_step_ms_max"`
	SampleMsMean        float64      `json:"sample_ms_mean"` // the sampler's part of a step
	DecodeStepMs        []float64    `json:"decode_step_ms"`
	Sampler             samplerBench `json:"sampler"`
	SpeakerSeconds      float64      `json:"speaker_seconds"`
	SpeakerMs           float64      `json:"speaker_ms"`
	CodecTokens         int          `json:"codec_tokens"`
	CodecMs             float64      `json:"codec_ms"`
	CodecRTF            float64      `json:"codec_rtf"`
	TTFAMs              float64      `json:"ttfa_ms"`
	TTSTokens           int          `json:"tts_tokens"`
	TotalRTF            float64      `json:"total_rtf"`
	PeakRSSMB           float64      `json:"peak_rss_mb"`
	// DeviceMB / DevicePeakMB: GPU memory after load and at most (0 on the CPU).
	DeviceMB     float64 `json:"device_mb"`
	DevicePeakMB float64 `json:"device_peak_mb"`
	// Concurrent streams (--streams): the whole path of N simultaneous syntheses, their
	// decode steps batched.
	Streams []streamsBench `json:"streams,omitempty"`
}

// streamsBench are the figures of N concurrent streamed syntheses (the second of two runs,
// so programs are compiled): tokens/s is every stream's speech tokens over the wall time of
// the whole run (prefill, batched decode with sampling, codec); a stream's RTF is its wall
// time over its audio; a chunk is late when it arrives after its playout time, playout
// starting at the stream's first audio.
type streamsBench struct {
	Streams int `json:"streams"`
	// DeviceStreamMB is the GPU memory a stream added (KV caches, programs): (the most held
	// while the streams ran − before) ÷ streams; 0 on the CPU.
	DeviceStreamMB   float64 `json:"device_stream_mb,omitempty"`
	TokensPerS       float64 `json:"tokens_per_s"`
	StreamTokensPerS float64 `json:"stream_tokens_per_s_min"` // the slowest stream's tokens over its own time
	RTFMax           float64 `json:"rtf_max"`                 // the slowest stream's
	TTFAMsP50        float64 `json:"ttfa_ms_p50"`
	TTFAMsP95        float64 `json:"ttfa_ms_p95"`
	Chunks           int     `json:"chunks"`
	LateChunks       int     `json:"late_chunks"`
	MeanBatch        float64 `json:"mean_batch"`       // stream steps per decode round
	MeanCodecBatch   float64 `json:"mean_codec_batch"` // stream windows per codec run
}

// samplerBench are the sampler settings the decode figure ran with.
type samplerBench struct {
	Greedy            bool    `json:"greedy"`
	Temperature       float64 `json:"temperature"`
	TopK              int     `json:"top_k"`
	TopP              float64 `json:"top_p"`
	RepetitionPenalty float64 `json:"repetition_penalty"`
	PresencePenalty   float64 `json:"presence_penalty"`
	FrequencyPenalty  float64 `json:"frequency_penalty"`
}

func runBenchMioTTS(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench miotts", "bench miotts --model LM.gguf --codec CODEC.gguf [--threads 2] [--json]", stderr)
	model := fs.String("model", "", "MioTTS language model (GGUF)")
	codec := fs.String("codec", "", "MioCodec model (GGUF)")
	threads := fs.Int("threads", 2, "engine threads")
	backend := fs.String("backend", defaultBackend, "where the models run: "+engine.BackendUsage)
	codecBackend := fs.String("codec-backend", "", "where the codec runs (same values; empty: with the language model)")
	kvCache := fs.String("kv-cache", "auto", "the language model's KV cache: "+qwen3.KVCacheUsage)
	prefill := fs.Int("prefill-tokens", 58, "prompt length for the prefill figure")
	steps := fs.Int("steps", 100, "decode steps timed (4 s of speech at 25 tokens/s)")
	codecTokens := fs.Int("codec-tokens", 100, "tokens decoded offline for the codec figure")
	refSeconds := fs.Float64("ref-seconds", 10, "reference clip length for the speaker embedding figure")
	ttsTokens := fs.Int("tts-tokens", 100, "speech tokens of the end-to-end streamed utterance")
	profile := fs.Bool("profile", false, "print where the timed decode steps, and the offline codec decode when it runs on the same backend, spend their time, by kind of op (to stderr)")
	fuse := fs.Bool("fuse", true, fuseUsage)
	streams := fs.String("streams", "", "also run N concurrent streamed syntheses for each N in this comma-separated list (e.g. 1,2,4,8): aggregate tokens/s, per-stream RTF, TTFA, late chunks")
	codecBatch := fs.Int("codec-batch", 0, "the most stream windows one codec run decodes (1: no codec batching, for comparison; 0: the default, "+strconv.Itoa(miocodec.MaxBatch)+")")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	streamCounts, err := parseCounts("--streams", *streams, 64)
	if err != nil {
		return err
	}
	if *model == "" || *codec == "" {
		fs.Usage()
		return errors.New("--model and --codec are required (voxpipe mkmodel makes random ones at real size)")
	}
	if *prefill < 1 || *steps < 1 {
		return errors.New("--prefill-tokens and --steps must be ≥ 1")
	}
	if _, _, err := qwen3.ParseKVCache(*kvCache); err != nil {
		return fmt.Errorf("--kv-cache: %w", err)
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, format, a...) }
	be, codecBE, closeBE, err := placement(*backend, *codecBackend, "codec", *threads, stderr).Open()
	if err != nil {
		return err
	}
	defer closeBE()
	setFusion(*fuse, be, codecBE)
	prof, err := newProfiler(*profile, be, stderr)
	if err != nil {
		return err
	}
	res := miottsBench{Backend: be.Name(), CodecBackend: codecBE.Name(), Threads: *threads, PrefillTokens: *prefill, SpeakerSeconds: *refSeconds, CodecTokens: *codecTokens}
	t0 := time.Now()
	logf("loading…\n")
	tts, err := miotts.Load(*model, *codec, be, miotts.Options{CodecBackend: codecBE, KVCache: *kvCache})
	if err != nil {
		return err
	}
	tts.Codec.SetBatchLimit(*codecBatch)
	defer tts.Close()
	res.KVCache = engine.DTypeName(tts.LM.Model.KVCache())
	res.LoadMs = ms(time.Since(t0))
	res.DeviceMB, _ = deviceMB(be, codecBE)
	res.LoadRSSMB = procStatusMB("VmRSS")

	// Prefill and decode: the LM alone, on the restricted head, with random prompt ids.
	logf("prefill and decode…\n")
	lmr, err := benchLM(tts.LM, *prefill, *steps, prof)
	if err != nil {
		return err
	}
	res.PrefillMs, res.DecodeStepMs, res.SampleMsMean = lmr.prefillMs, lmr.stepMs, lmr.sampleMsMean
	res.DecodeSteps = len(lmr.stepMs)
	for _, v := range lmr.stepMs {
		res.DecodeMs += v
	}
	res.DecodeTokensPerS = float64(res.DecodeSteps) / (res.DecodeMs / 1000)
	res.DecodeStepMsP50, res.DecodeStepMsP95 = percentile(lmr.stepMs, 50), percentile(lmr.stepMs, 95)
	res.DecodeStepMsMax = slices.Max(lmr.stepMs)
	res.DecodeTokensPerSP50 = 1000 / res.DecodeStepMsP50
	c := lmr.sampler
	res.Sampler = samplerBench{Greedy: c.IsGreedy(), Temperature: c.Temperature, TopK: c.TopK, TopP: c.TopP,
		RepetitionPenalty: c.RepetitionPenalty, PresencePenalty: c.PresencePenalty, FrequencyPenalty: c.FrequencyPenalty}

	// Speaker embedding of a synthetic voiced clip (second call: programs compiled).
	logf("speaker embedding…\n")
	clip := syntheticVoice(44100, *refSeconds)
	if _, err := tts.Speaker.Embedding(clip, 44100); err != nil {
		return err
	}
	t0 = time.Now()
	emb, err := tts.Speaker.Embedding(clip, 44100)
	if err != nil {
		return err
	}
	res.SpeakerMs = ms(time.Since(t0))

	// Codec: offline decode of random tokens (second run).
	logf("codec…\n")
	rng := rand.New(rand.NewPCG(7, 7))
	toks := make([]int32, *codecTokens)
	for i := range toks {
		toks[i] = rng.Int32N(miotts.SpeechTokens)
	}
	if _, err := tts.Codec.Decode(toks, emb); err != nil {
		return err
	}
	codecProf := prof
	if codecBE != be {
		codecProf = nil // the profiler times the language model's backend
	}
	codecProf.start()
	t0 = time.Now()
	wave, err := tts.Codec.Decode(toks, emb)
	if err != nil {
		return err
	}
	res.CodecMs = ms(time.Since(t0))
	codecProf.stop(fmt.Sprintf("the offline codec decode of %d tokens", len(toks)))
	res.CodecRTF = time.Since(t0).Seconds() / (float64(len(wave)) / float64(tts.SampleRate()))

	// End to end: request → first streamed sample, and the whole utterance's RTF. The
	// random model stops at EOS whenever it draws it, so the token count is capped, not
	// forced; the run is repeated once so the figures are for compiled programs.
	logf("streamed synthesis…\n")
	req := miotts.Request{Text: "Thank you for calling. How can I help you today?", Embedding: emb,
		Gen: miotts.GenOptions{MaxNew: *ttsTokens, Seed: 11}}
	for range 2 {
		start := time.Now()
		var first time.Duration
		st, err := tts.Synthesize(context.Background(), req, func(c miotts.Chunk) error {
			if first == 0 && len(c.Samples) > 0 {
				first = time.Since(start)
			}
			return nil
		})
		if err != nil {
			return err
		}
		took := time.Since(start)
		res.TTFAMs, res.TTSTokens = ms(first), st.Tokens
		res.TotalRTF = took.Seconds() / (float64(st.Samples) / float64(tts.SampleRate()))
	}
	for _, n := range streamCounts {
		logf("%d concurrent streams…\n", n)
		var r streamsBench
		before, _ := deviceMB(be, codecBE)
		sampled := sampleDeviceMB(be, codecBE)
		for range 2 {
			if r, err = benchStreams(tts, emb, n, *ttsTokens); err != nil {
				sampled()
				return err
			}
		}
		if most := sampled(); most > 0 {
			r.DeviceStreamMB = max(0, most-before) / float64(n)
		}
		res.Streams = append(res.Streams, r)
	}
	res.PeakRSSMB = peakRSSMB()
	_, res.DevicePeakMB = deviceMB(be, codecBE)
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "MioTTS on %s, %d threads, %s KV cache (load %.0f ms, %.0f MB resident):\n", res.Backend, res.Threads, res.KVCache, res.LoadMs, res.LoadRSSMB)
	fmt.Fprintf(stdout, "  prefill %d tokens      %8.1f ms\n", res.PrefillTokens, res.PrefillMs)
	fmt.Fprintf(stdout, "  decode                 %8.1f tokens/s mean over all %d steps, sampling included (Σ %.0f ms); p50 step %.1f ms = %.1f tokens/s, p95 %.1f ms, max %.1f ms; sampling %.2f ms a step; 25 tokens/s is real time\n",
		res.DecodeTokensPerS, res.DecodeSteps, res.DecodeMs, res.DecodeStepMsP50, res.DecodeTokensPerSP50, res.DecodeStepMsP95, res.DecodeStepMsMax, res.SampleMsMean)
	sm := res.Sampler
	fmt.Fprintf(stdout, "  sampler                greedy %v, temperature %g, top_k %d, top_p %g, repetition_penalty %g (the model's generation_config.json)\n",
		sm.Greedy, sm.Temperature, sm.TopK, sm.TopP, sm.RepetitionPenalty)
	fmt.Fprintf(stdout, "  speaker embedding      %8.1f ms for %.0f s of reference\n", res.SpeakerMs, res.SpeakerSeconds)
	fmt.Fprintf(stdout, "  codec, %d tokens      %8.1f ms (RTF %.3f)\n", res.CodecTokens, res.CodecMs, res.CodecRTF)
	fmt.Fprintf(stdout, "  time to first audio    %8.1f ms; %d tokens streamed at RTF %.3f\n", res.TTFAMs, res.TTSTokens, res.TotalRTF)
	for _, r := range res.Streams {
		fmt.Fprintf(stdout, "  %2d streams at once     %8.1f tokens/s together; slowest stream %.1f tokens/s, RTF %.2f; TTFA p50 %.0f ms, p95 %.0f ms; %d of %d chunks late; mean batch %.2f (codec %.2f)\n",
			r.Streams, r.TokensPerS, r.StreamTokensPerS, r.RTFMax, r.TTFAMsP50, r.TTFAMsP95, r.LateChunks, r.Chunks, r.MeanBatch, r.MeanCodecBatch)
		if r.DeviceStreamMB > 0 {
			fmt.Fprintf(stdout, "                         %8.2f MB of GPU memory a stream\n", r.DeviceStreamMB)
		}
	}
	fmt.Fprintf(stdout, "  peak RSS               %8.0f MB\n", res.PeakRSSMB)
	if res.DevicePeakMB > 0 {
		fmt.Fprintf(stdout, "  GPU memory             %8.1f MB after load, %.1f MB at most (%s)\n", res.DeviceMB, res.DevicePeakMB, res.Backend)
	}
	return nil
}

// benchStreams runs n streamed syntheses of up to tokens speech tokens at once (different
// texts and seeds) and measures them as streamsBench describes.
func benchStreams(tts *miotts.TTS, emb []float32, n, tokens int) (streamsBench, error) {
	type result struct {
		tokens      int
		took, first time.Duration
		audio       float64 // seconds
		chunks      int
		late        int
		err         error
	}
	results := make([]result, n)
	before, codecBefore := tts.LM.BatchStats(), tts.Codec.BatchStats()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := &results[i]
			t0 := time.Now()
			var played float64 // seconds of audio before this chunk
			req := miotts.Request{Text: fmt.Sprintf("Caller %d: thank you for calling, how can I help you today?", i+1), Embedding: emb,
				Gen: miotts.GenOptions{MaxNew: tokens, Seed: uint64(100 + i)}}
			st, err := tts.Synthesize(context.Background(), req, func(c miotts.Chunk) error {
				if len(c.Samples) == 0 {
					return nil
				}
				now := time.Since(t0)
				if r.first == 0 {
					r.first = now
				}
				r.chunks++
				if now > r.first+time.Duration(played*float64(time.Second)) {
					r.late++
				}
				played += float64(len(c.Samples)) / float64(tts.SampleRate())
				return nil
			})
			r.took, r.tokens, r.err = time.Since(t0), st.Tokens, err
			r.audio = float64(st.Samples) / float64(tts.SampleRate())
		})
	}
	wg.Wait()
	wall := time.Since(start)
	after, codecAfter := tts.LM.BatchStats(), tts.Codec.BatchStats()
	b := streamsBench{Streams: n, StreamTokensPerS: math.Inf(1)}
	var ttfa []float64
	total := 0
	for _, r := range results {
		if r.err != nil {
			return b, r.err
		}
		total += r.tokens
		b.StreamTokensPerS = min(b.StreamTokensPerS, float64(r.tokens)/r.took.Seconds())
		if r.audio > 0 {
			b.RTFMax = max(b.RTFMax, r.took.Seconds()/r.audio)
		}
		ttfa = append(ttfa, ms(r.first))
		b.Chunks += r.chunks
		b.LateChunks += r.late
	}
	b.TokensPerS = float64(total) / wall.Seconds()
	b.TTFAMsP50, b.TTFAMsP95 = percentile(ttfa, 50), percentile(ttfa, 95)
	if rounds := after.Rounds - before.Rounds; rounds > 0 {
		b.MeanBatch = float64(after.Rows-before.Rows) / float64(rounds)
	}
	if runs := codecAfter.Runs - codecBefore.Runs; runs > 0 {
		b.MeanCodecBatch = float64(codecAfter.Windows-codecBefore.Windows) / float64(runs)
	}
	return b, nil
}

// lmResult are benchLM's figures.
type lmResult struct {
	prefillMs    float64        // median of 3 compiled prefills
	stepMs       []float64      // every timed decode step: sampling + LM step
	sampleMsMean float64        // the sampling part, mean
	sampler      sampler.Config // the settings the steps sampled with
}

// benchLM times a prefill of n random text tokens (median of 3 after one that compiles)
// and then decode as Generate runs it: steps times, the sampler (the model's defaults, the
// seed Generate uses when a request gives none) draws a token from the last logits over
// the history and the LM steps on it. A drawn EOS is replaced by a speech token so every
// step runs (the cost does not depend on the token). The decode steps run once untimed
// first, from the same prompt and seed, so every cache-length bucket's program is compiled
// as on a warm server; then every step of the second pass is timed.
func benchLM(lm *miotts.LM, n, steps int, prof *profiler) (lmResult, error) {
	var res lmResult
	rng := rand.New(rand.NewPCG(3, 3))
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = rng.Int32N(256) // byte-level text tokens exist in every vocabulary
	}
	sess, err := lm.Model.NewSession(n + steps + 8)
	if err != nil {
		return res, err
	}
	defer sess.Close()
	if err := sess.SetOutputRows(lm.Candidates()); err != nil {
		return res, err
	}
	var pre []float64
	var logits []float32
	for range 4 { // the first run compiles
		sess.Reset()
		t0 := time.Now()
		if logits, err = sess.Prefill(prompt); err != nil {
			return res, err
		}
		pre = append(pre, ms(time.Since(t0)))
	}
	res.prefillMs = median(pre[1:])
	res.sampler = lm.Defaults
	res.sampler.Seed = 0x6d696f747473 // Generate's seed for a request without one
	first, last := lm.SpeechID(0), lm.SpeechID(miotts.SpeechTokens-1)
	for pass := range 2 {
		if pass == 1 {
			sess.Reset()
			if logits, err = sess.Prefill(prompt); err != nil {
				return res, err
			}
		}
		smp := sampler.New(res.sampler)
		if err := smp.SetCandidates(lm.Candidates()); err != nil {
			return res, err
		}
		history := append(make([]int32, 0, n+steps), prompt...)
		var sampleSum float64
		if pass == 1 {
			prof.start()
		}
		for i := range steps {
			t0 := time.Now()
			id := smp.Sample(logits, history)
			if id < first || id > last {
				id = first + int32(i%miotts.SpeechTokens) // EOS: keep stepping on a speech token
			}
			history = append(history, id)
			t1 := time.Now()
			if logits, err = sess.Step(id); err != nil {
				return res, err
			}
			if pass == 1 {
				res.stepMs = append(res.stepMs, ms(time.Since(t0)))
				sampleSum += ms(t1.Sub(t0))
			}
		}
		res.sampleMsMean = sampleSum / float64(steps)
	}
	prof.stop("decode steps (the timed pass)")
	return res, nil
}

func median(x []float64) float64 { return percentile(x, 50) }

func percentile(x []float64, p float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Round(p/100*float64(len(s)-1))))]
}

// syntheticVoice is a voiced-speech-like test signal: a gliding pitch with harmonics,
// syllable-rate amplitude modulation and a little noise.
func syntheticVoice(rate int, seconds float64) []float32 {
	rng := rand.New(rand.NewPCG(5, 5))
	x := make([]float32, int(seconds*float64(rate)))
	phase := 0.0
	for i := range x {
		t := float64(i) / float64(rate)
		f0 := 130 + 30*math.Sin(2*math.Pi*0.7*t)
		phase += 2 * math.Pi * f0 / float64(rate)
		var v float64
		for h := 1; h <= 8; h++ {
			v += math.Sin(float64(h)*phase) / float64(h)
		}
		env := 0.5 + 0.5*math.Sin(2*math.Pi*4*t)
		x[i] = float32(0.2*env*v + 0.01*rng.NormFloat64())
	}
	return x
}

// peakRSSMB is the process's peak resident set (VmHWM), in MB; 0 where /proc is absent.
func peakRSSMB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
