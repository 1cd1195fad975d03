package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/internal/vulkantest"
)

// bench meanvc2 runs on the tiny golden models (120 ms and 40 ms) and reports every figure,
// the variant and the whole-path rtf_total among them, as JSON and as text.
func TestBenchMeanVC2Golden(t *testing.T) {
	model := filepath.Join(inspectGoldenDir(t), "meanvc2", "model.gguf")
	if _, err := os.Stat(model); err != nil {
		t.Skipf("golden model not available: %v", err)
	}
	args := []string{"bench", "meanvc2", "--model", model, "--threads", "1", "--seconds", "1", "--ref-seconds", "1", "--sessions", "2"}
	stdout, stderr, code := runCmd(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	if res["variant"] != "120ms" {
		t.Errorf("variant %v", res["variant"])
	}
	fields := []string{"rtf_median", "rtf_p95", "rtf_total", "live_latency_ms", "chunk_p50_ms", "chunk_p90_ms", "chunk_max_ms", "speaker_ms", "speaker_peak_mb", "arena_mb", "naive_mb",
		"session_mb", "peak_rss_mb", "algorithmic_latency_ms", "max_realtime_sessions"}
	for _, f := range fields {
		v, ok := res[f].(float64)
		if !ok {
			t.Errorf("%s missing: %s", f, stdout)
			continue
		}
		// A loaded machine may keep no session real time: that count is a measurement, and
		// only its presence is checked.
		if v < 0 || v == 0 && f != "speaker_peak_mb" && f != "max_realtime_sessions" {
			t.Errorf("%s = %v", f, v)
		}
	}
	if a, n := res["arena_mb"].(float64), res["naive_mb"].(float64); a > n {
		t.Errorf("arena %v MB above the naive %v MB", a, n)
	}
	if lv, _ := res["sessions"].([]any); len(lv) == 0 {
		t.Errorf("no session levels: %s", stdout)
	}

	checkRTFTotal(t, res)

	stdout, stderr, code = runCmd(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, f := range append(fields, "variant 120ms") {
		if !strings.Contains(stdout, f) {
			t.Errorf("text output lacks %s:\n%s", f, stdout)
		}
	}

	if _, stderr, code := runCmd(t, "bench", "meanvc2"); code == 0 || !strings.Contains(stderr, "--model is required") {
		t.Errorf("no model: exit %d, %q", code, stderr)
	}

	// The 40 ms + 40 ms model reports its variant and the same figures.
	model40 := filepath.Join(inspectGoldenDir(t), "meanvc2_40ms", "model.gguf")
	if _, err := os.Stat(model40); err != nil {
		t.Skipf("40 ms golden model not available: %v", err)
	}
	stdout, stderr, code = runCmd(t, "bench", "meanvc2", "--model", model40, "--threads", "1", "--seconds", "1", "--ref-seconds", "1", "--json")
	if code != 0 {
		t.Fatalf("40 ms model: exit %d: %s", code, stderr)
	}
	res = nil
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	if res["variant"] != "40ms" {
		t.Errorf("40 ms model: variant %v", res["variant"])
	}
	for _, f := range []string{"rtf_total", "rtf_median", "chunk_p50_ms", "chunk_p90_ms", "chunk_max_ms", "algorithmic_latency_ms", "live_latency_ms"} {
		if v, _ := res[f].(float64); v <= 0 {
			t.Errorf("40 ms model: %s = %v", f, res[f])
		}
	}
	checkRTFTotal(t, res)
}

// checkRTFTotal recomputes the whole-path figures of a bench meanvc2 JSON object from the
// per-chunk times it recorded: rtf_total = (Σ chunk_times_ms + flush_ms) ÷ the audio of
// chunks × chunk_ms, and the chunk quantiles are those of the same times.
func checkRTFTotal(t *testing.T, res map[string]any) {
	t.Helper()
	raw, _ := res["chunk_times_ms"].([]any)
	chunks, _ := res["chunks"].(float64)
	if len(raw) == 0 || float64(len(raw)) != chunks {
		t.Fatalf("%d chunk times for %v chunks", len(raw), res["chunks"])
	}
	times := make([]float64, len(raw))
	var sum float64
	for i, v := range raw {
		times[i], _ = v.(float64)
		if times[i] < 0 {
			t.Errorf("chunk %d took %v ms", i, v)
		}
		sum += times[i]
	}
	chunkMs, flush := res["chunk_ms"].(float64), res["flush_ms"].(float64)
	audio := chunks * chunkMs / 1000
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(b), 1e-12) }
	if got, _ := res["audio_seconds"].(float64); !near(got, audio) {
		t.Errorf("audio_seconds %v, want %v chunks × %v ms = %v s", got, chunks, chunkMs, audio)
	}
	if got, _ := res["process_ms"].(float64); !near(got, sum) {
		t.Errorf("process_ms %v, want Σ chunk_times_ms = %v", got, sum)
	}
	want := (sum + flush) / (audio * 1000)
	if got := res["rtf_total"].(float64); !near(got, want) || got <= 0 {
		t.Errorf("rtf_total %v, want (Σ chunk times %v + flush %v ms) ÷ %v s = %v", got, sum, flush, audio, want)
	}
	slices.Sort(times)
	for _, q := range []struct {
		field string
		q     float64
	}{{"chunk_p50_ms", 0.5}, {"chunk_p90_ms", 0.9}, {"chunk_max_ms", 1}} {
		if got := res[q.field].(float64); got != nearestRank(times, q.q) {
			t.Errorf("%s %v, want %v from the recorded times", q.field, got, nearestRank(times, q.q))
		}
	}
}

// The benches run on Vulkan (lavapipe in CI: its speed is a CPU's, so only that they run and
// report the device's memory and per-op device times is checked), with a part kept on the CPU.
func TestBenchOnVulkan(t *testing.T) {
	vulkantest.Require(t)
	model := golden.Path(t, "meanvc2", "model.gguf")
	stdout, stderr, code := runCmd(t, "bench", "meanvc2", "--model", model, "--seconds", "1", "--ref-seconds", "1",
		"--backend", "vulkan", "--vocoder-backend", "cpu", "--sessions", "1,2", "--profile", "--json")
	if code != 0 {
		t.Fatalf("bench meanvc2 on Vulkan: exit %d: %s", code, stderr)
	}
	var vc meanvc2Bench
	if err := json.Unmarshal([]byte(stdout), &vc); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	if !strings.HasPrefix(vc.Backend, "vulkan:") || !strings.HasPrefix(vc.VocoderBackend, "cpu") || vc.DeviceMB <= 0 || vc.DevicePeakMB < vc.DeviceMB || !(vc.RTFTotal > 0) {
		t.Errorf("backend %q, vocoder %q, device %v MB (peak %v), rtf_total %v", vc.Backend, vc.VocoderBackend, vc.DeviceMB, vc.DevicePeakMB, vc.RTFTotal)
	}
	if len(vc.Sessions) != 2 {
		t.Errorf("session levels %+v", vc.Sessions)
	}
	if !strings.Contains(stderr, "profile of") || !strings.Contains(stderr, "Matmul") {
		t.Errorf("no device profile on stderr:\n%s", stderr)
	}

	lm, codec := golden.Path(t, "miotts", "model.gguf"), golden.Path(t, "miocodec", "model.gguf")
	stdout, stderr, code = runCmd(t, "bench", "miotts", "--model", lm, "--codec", codec, "--prefill-tokens", "8", "--steps", "10",
		"--codec-tokens", "8", "--ref-seconds", "3", "--tts-tokens", "8", "--streams", "2", "--backend", "vulkan", "--codec-backend", "cpu", "--json")
	if code != 0 {
		t.Fatalf("bench miotts on Vulkan: exit %d: %s", code, stderr)
	}
	var tts miottsBench
	if err := json.Unmarshal([]byte(stdout), &tts); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	if !strings.HasPrefix(tts.Backend, "vulkan:") || !strings.HasPrefix(tts.CodecBackend, "cpu") || tts.DeviceMB <= 0 || !(tts.DecodeTokensPerS > 0) {
		t.Errorf("backend %q, codec %q, device %v MB, %v tokens/s", tts.Backend, tts.CodecBackend, tts.DeviceMB, tts.DecodeTokensPerS)
	}
	if len(tts.Streams) != 1 || tts.Streams[0].DeviceStreamMB <= 0 {
		t.Errorf("stream levels %+v: no GPU memory per stream", tts.Streams)
	}
}
