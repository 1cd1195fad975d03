package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/models/miotts"
)

// bench miotts on the tiny golden models: the decode figure is the mean over every timed
// step (sampling included) with the model's own sampler settings, and it, its p50 and the
// step total agree with the per-step times the bench recorded.
func TestBenchMioTTSGolden(t *testing.T) {
	model, codec := golden.Path(t, "miotts", "model.gguf"), golden.Path(t, "miocodec", "model.gguf")
	args := []string{"bench", "miotts", "--model", model, "--codec", codec, "--threads", "1", "--prefill-tokens", "8", "--steps", "70",
		"--codec-tokens", "8", "--ref-seconds", "3", "--tts-tokens", "8"}
	stdout, stderr, code := runCmd(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res miottsBench
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	// 70 steps from position 8 cross a 64-position cache bucket: that program is compiled
	// in the untimed pass, so no timed step is a compilation.
	if res.DecodeSteps != 70 || len(res.DecodeStepMs) != 70 || res.PrefillTokens != 8 {
		t.Fatalf("%d steps, %d step times, %d prefill tokens", res.DecodeSteps, len(res.DecodeStepMs), res.PrefillTokens)
	}
	for name, v := range map[string]float64{"prefill_ms": res.PrefillMs, "decode_ms": res.DecodeMs, "decode_tokens_per_s": res.DecodeTokensPerS,
		"decode_tokens_per_s_p50": res.DecodeTokensPerSP50, "decode_step_ms_p50": res.DecodeStepMsP50, "sample_ms_mean": res.SampleMsMean} {
		if !(v > 0) || math.IsInf(v, 0) {
			t.Errorf("%s = %v", name, v)
		}
	}
	var sum float64
	for _, v := range res.DecodeStepMs {
		sum += v
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Abs(b) }
	if !near(res.DecodeMs, sum) {
		t.Errorf("decode_ms %v, want Σ decode_step_ms = %v", res.DecodeMs, sum)
	}
	if want := float64(len(res.DecodeStepMs)) / (sum / 1000); !near(res.DecodeTokensPerS, want) {
		t.Errorf("decode_tokens_per_s %v, want steps ÷ Σ step time = %v", res.DecodeTokensPerS, want)
	}
	if want := 1000 / percentile(res.DecodeStepMs, 50); !near(res.DecodeTokensPerSP50, want) || res.DecodeStepMsMax != slices.Max(res.DecodeStepMs) {
		t.Errorf("p50 %v tokens/s (want %v), max %v ms", res.DecodeTokensPerSP50, want, res.DecodeStepMsMax)
	}
	if res.SampleMsMean >= res.DecodeMs/float64(res.DecodeSteps) {
		t.Errorf("sampling %v ms a step is not a part of the mean step %v ms", res.SampleMsMean, res.DecodeMs/float64(res.DecodeSteps))
	}

	// The sampler settings are the model's generation_config.json ones, as Generate uses them.
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	lm, err := miotts.LoadLM(model, be)
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	d := lm.Defaults
	if want := (samplerBench{Greedy: d.IsGreedy(), Temperature: d.Temperature, TopK: d.TopK, TopP: d.TopP, RepetitionPenalty: d.RepetitionPenalty,
		PresencePenalty: d.PresencePenalty, FrequencyPenalty: d.FrequencyPenalty}); res.Sampler != want || res.Sampler.Greedy {
		t.Errorf("sampler %+v, want the model's %+v (sampling, not greedy)", res.Sampler, want)
	}

	stdout, stderr, code = runCmd(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, s := range []string{"prefill 8 tokens", "tokens/s mean over all 70 steps, sampling included", "p50 step", fmt.Sprintf("temperature %g, top_k %d", d.Temperature, d.TopK)} {
		if !strings.Contains(stdout, s) {
			t.Errorf("text output lacks %q:\n%s", s, stdout)
		}
	}
}
