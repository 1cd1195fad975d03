package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// `bench planner` plans WavLM-Large's real graph (built by models/wavlm over shape-only
// weights) and rejects what it cannot plan.
func TestBenchPlanner(t *testing.T) {
	stdout, stderr, code := runCmd(t, "bench", "planner", "--seconds", "5", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		Graph      string  `json:"graph"`
		Nodes      int     `json:"nodes"`
		ArenaBytes int64   `json:"arena_bytes"`
		NaiveBytes int64   `json:"naive_bytes"`
		Ratio      float64 `json:"ratio"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	if res.Graph != "wavlm-large" || res.Nodes == 0 || res.ArenaBytes <= 0 || res.ArenaBytes > res.NaiveBytes || res.Ratio > 0.25 {
		t.Errorf("plan %+v", res)
	}
	if _, stderr, code := runCmd(t, "bench", "planner", "--seconds", "0.001"); code == 0 || !strings.Contains(stderr, "too short") {
		t.Errorf("no frame: exit %d %s", code, stderr)
	}
	if _, stderr, code := runCmd(t, "bench", "planner", "--graph", "nope"); code == 0 || !strings.Contains(stderr, "unknown graph") {
		t.Errorf("unknown graph: exit %d %s", code, stderr)
	}
}
