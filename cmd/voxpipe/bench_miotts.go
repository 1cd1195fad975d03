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
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/models/sampler"
)

// miottsBench are the figures of `voxpipe bench miotts`.
type miottsBench struct {
	Threads          int     `json:"threads"`
	LoadMs           float64 `json:"load_ms"`
	LoadRSSMB        float64 `json:"load_rss_mb"` // resident once both models are loaded
	PrefillTokens    int     `json:"prefill_tokens"`
	PrefillMs        float64 `json:"prefill_ms"`
	DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	DecodeStepMsP50  float64 `json:"decode_step_ms_p50"`
	DecodeStepMsP95  float64 `json:"decode_step_ms_p95"`
	SpeakerSeconds   float64 `json:"speaker_seconds"`
	SpeakerMs        float64 `json:"speaker_ms"`
	CodecTokens      int     `json:"codec_tokens"`
	CodecMs          float64 `json:"codec_ms"`
	CodecRTF         float64 `json:"codec_rtf"`
	TTFAMs           float64 `json:"ttfa_ms"`
	TTSTokens        int     `json:"tts_tokens"`
	TotalRTF         float64 `json:"total_rtf"`
	PeakRSSMB        float64 `json:"peak_rss_mb"`
}

func runBenchMioTTS(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench miotts", "bench miotts --model LM.gguf --codec CODEC.gguf [--threads 2] [--json]", stderr)
	model := fs.String("model", "", "MioTTS language model (GGUF)")
	codec := fs.String("codec", "", "MioCodec model (GGUF)")
	threads := fs.Int("threads", 2, "engine threads")
	prefill := fs.Int("prefill-tokens", 58, "prompt length for the prefill figure")
	steps := fs.Int("steps", 48, "decode steps timed")
	codecTokens := fs.Int("codec-tokens", 100, "tokens decoded offline for the codec figure")
	refSeconds := fs.Float64("ref-seconds", 10, "reference clip length for the speaker embedding figure")
	ttsTokens := fs.Int("tts-tokens", 100, "speech tokens of the end-to-end streamed utterance")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *model == "" || *codec == "" {
		fs.Usage()
		return errors.New("--model and --codec are required (voxpipe mkmodel makes random ones at real size)")
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, format, a...) }
	be, err := engine.NewCPU(*threads)
	if err != nil {
		return err
	}
	defer be.Close()
	res := miottsBench{Threads: *threads, PrefillTokens: *prefill, SpeakerSeconds: *refSeconds, CodecTokens: *codecTokens}
	t0 := time.Now()
	logf("loading…\n")
	tts, err := miotts.Load(*model, *codec, be, miotts.Options{})
	if err != nil {
		return err
	}
	defer tts.Close()
	res.LoadMs = ms(time.Since(t0))
	res.LoadRSSMB = procStatusMB("VmRSS")

	// Prefill and decode: the LM alone, on the restricted head, with random prompt ids.
	logf("prefill and decode…\n")
	if res.PrefillMs, res.DecodeStepMsP50, res.DecodeStepMsP95, err = benchLM(tts.LM, *prefill, *steps); err != nil {
		return err
	}
	res.DecodeTokensPerS = 1000 / res.DecodeStepMsP50

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
	t0 = time.Now()
	wave, err := tts.Codec.Decode(toks, emb)
	if err != nil {
		return err
	}
	res.CodecMs = ms(time.Since(t0))
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
	res.PeakRSSMB = peakRSSMB()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "MioTTS on %d threads (load %.0f ms, %.0f MB resident):\n", res.Threads, res.LoadMs, res.LoadRSSMB)
	fmt.Fprintf(stdout, "  prefill %d tokens      %8.1f ms\n", res.PrefillTokens, res.PrefillMs)
	fmt.Fprintf(stdout, "  decode                 %8.1f tokens/s (step p50 %.1f ms, p95 %.1f ms; 25 tokens/s is real time)\n", res.DecodeTokensPerS, res.DecodeStepMsP50, res.DecodeStepMsP95)
	fmt.Fprintf(stdout, "  speaker embedding      %8.1f ms for %.0f s of reference\n", res.SpeakerMs, res.SpeakerSeconds)
	fmt.Fprintf(stdout, "  codec, %d tokens      %8.1f ms (RTF %.3f)\n", res.CodecTokens, res.CodecMs, res.CodecRTF)
	fmt.Fprintf(stdout, "  time to first audio    %8.1f ms; %d tokens streamed at RTF %.3f\n", res.TTFAMs, res.TTSTokens, res.TotalRTF)
	fmt.Fprintf(stdout, "  peak RSS               %8.0f MB\n", res.PeakRSSMB)
	return nil
}

// benchLM times a prefill of n random text tokens (median of 3) and single decode steps
// (p50/p95 over steps, after 4 warm-up steps).
func benchLM(lm *miotts.LM, n, steps int) (prefillMs, stepP50, stepP95 float64, err error) {
	rng := rand.New(rand.NewPCG(3, 3))
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = rng.Int32N(256) // byte-level text tokens exist in every vocabulary
	}
	sess, err := lm.Model.NewSession(n + steps + 8)
	if err != nil {
		return 0, 0, 0, err
	}
	defer sess.Close()
	if err := sess.SetOutputRows(lm.Candidates()); err != nil {
		return 0, 0, 0, err
	}
	var pre []float64
	for range 4 { // the first run compiles
		sess.Reset()
		t0 := time.Now()
		if _, err := sess.Prefill(prompt); err != nil {
			return 0, 0, 0, err
		}
		pre = append(pre, ms(time.Since(t0)))
	}
	smp := sampler.New(lm.Defaults)
	if err := smp.SetCandidates(lm.Candidates()); err != nil {
		return 0, 0, 0, err
	}
	id := lm.SpeechID(0)
	var st []float64
	for i := range steps + 4 {
		t0 := time.Now()
		logits, err := sess.Step(id)
		if err != nil {
			return 0, 0, 0, err
		}
		id = lm.Candidates()[rng.IntN(len(logits)-1)] // any speech token: the speed does not depend on it
		if i >= 4 {
			st = append(st, ms(time.Since(t0)))
		}
	}
	return median(pre[1:]), percentile(st, 50), percentile(st, 95), nil
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
