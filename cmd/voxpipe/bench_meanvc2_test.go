package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bench meanvc2 runs on the tiny golden model and reports every figure, as JSON and as text.
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
	fields := []string{"rtf_median", "rtf_p95", "chunk_p90_ms", "speaker_ms", "speaker_peak_mb", "arena_mb", "naive_mb",
		"session_mb", "peak_rss_mb", "algorithmic_latency_ms", "max_realtime_sessions"}
	for _, f := range fields {
		v, ok := res[f].(float64)
		if !ok {
			t.Errorf("%s missing: %s", f, stdout)
			continue
		}
		if v <= 0 && f != "speaker_peak_mb" {
			t.Errorf("%s = %v", f, v)
		}
	}
	if a, n := res["arena_mb"].(float64), res["naive_mb"].(float64); a > n {
		t.Errorf("arena %v MB above the naive %v MB", a, n)
	}
	if lv, _ := res["sessions"].([]any); len(lv) == 0 {
		t.Errorf("no session levels: %s", stdout)
	}

	stdout, stderr, code = runCmd(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, f := range fields {
		if !strings.Contains(stdout, f) {
			t.Errorf("text output lacks %s:\n%s", f, stdout)
		}
	}
	if _, stderr, code := runCmd(t, "bench", "meanvc2"); code == 0 || !strings.Contains(stderr, "--model is required") {
		t.Errorf("no model: exit %d, %q", code, stderr)
	}
}
