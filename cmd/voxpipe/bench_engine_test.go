package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/cgo"
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

// The gemm table is the models' own products at real size: the rows their graphs give
// (16 DiT frames, 4 BN frames per ASR window, 14 vocoder frames, 499 WavLM frames for 10 s,
// a 58-token prompt and single decode tokens, MioCodec's 56-token window).
func TestBenchGemmShapes(t *testing.T) {
	shapes, err := modelGemmShapes()
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]map[int]bool{}
	for _, s := range shapes {
		if s.M < 1 || s.K < 1 || s.N < 1 || s.Count < 1 || s.Kind == "" || s.Unit == "" {
			t.Errorf("bad shape %+v", s)
		}
		key := s.Model + "/" + s.Part
		if rows[key] == nil {
			rows[key] = map[int]bool{}
		}
		rows[key][s.M] = true
	}
	for key, m := range map[string]int{"meanvc2/dit": 16, "meanvc2/asr": 4, "meanvc2/vocoder": 14, "meanvc2/speaker wavlm-large": 499,
		"miotts/prefill": 58, "miotts/decode": 1, "miocodec/decode": 112} {
		if !rows[key][m] {
			t.Errorf("%s has no %d-row product (rows %v)", key, m, rows[key])
		}
	}
	// Spot checks against the real dimensions: DiT ff.0 512→1024, Qwen3-0.6B gate 1024→3072.
	want := map[string][3]int{"meanvc2/dit/ff.0": {16, 512, 1024}, "miotts/decode/gate_proj, up_proj": {1, 1024, 3072},
		"miocodec/decode/decoder w1, w3": {112, 512, 1536}, "meanvc2/asr/ffn w_1 (macaron and final)": {4, 256, 2048}}
	for _, s := range shapes {
		if w, ok := want[s.Model+"/"+s.Part+"/"+s.Kind]; ok {
			if [3]int{s.M, s.K, s.N} != w {
				t.Errorf("%s %s %s: %d×%d×%d, want %v", s.Model, s.Part, s.Kind, s.M, s.K, s.N, w)
			}
			delete(want, s.Model+"/"+s.Part+"/"+s.Kind)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing products %v", want)
	}
}

// bench gemm prints ours against OpenBLAS per model shape; the figures of each row and the
// sums per part agree with the times the rows report.
func TestBenchGemm(t *testing.T) {
	stdout, stderr, code := runCmd(t, "bench", "gemm", "--model", "miotts", "--threads", "1", "--rounds", "1", "--per-call", "2", "--peak", "128", "--bandwidth-mb", "4", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Abs(b) }
	var peak, gbps float64
	parts := map[string]*gemmPart{}
	sums := map[string]*gemmPart{}
	rows := 0
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var kind struct{ Bench string }
		if err := json.Unmarshal([]byte(line), &kind); err != nil {
			t.Fatalf("%v: %q", err, line)
		}
		switch kind.Bench {
		case "gemm_peak":
			var p gemmPeak
			_ = json.Unmarshal([]byte(line), &p)
			if p.M != 128 || p.GFLOPS <= 0 || p.GFLOPS != max(p.OursGFLOPS, p.OpenBLASGFLOPS) {
				t.Errorf("peak %+v", p)
			}
			peak = p.GFLOPS
		case "memory_bandwidth":
			var b memBandwidth
			_ = json.Unmarshal([]byte(line), &b)
			if b.MB != 4 || b.Threads != 1 || b.GBps <= 0 || b.GBps1Thread <= 0 {
				t.Errorf("bandwidth %+v", b)
			}
			gbps = b.GBps
		case "gemm":
			var r gemmRow
			_ = json.Unmarshal([]byte(line), &r)
			rows++
			if r.Model != "miotts" || r.OursUs <= 0 || r.OpenBLASUs <= 0 || r.DType != "F32P" || r.PerCall < 1 || r.PerCall > 2 { // F32P: Linear weights packed as the models load them
				t.Errorf("row %+v", r)
			}
			// Each product reads one of the model's own count of distinct weights.
			if r.Copies < 1 || r.Copies != gemmCopies(r.gemmShape, false) || r.Copies > r.Count {
				t.Errorf("row %+v: %d weight copies for %d products", r, r.Copies, r.Count)
			}
			fl := 2 * float64(r.M) * float64(r.K) * float64(r.N)
			if !near(r.OursGFLOPS, fl/r.OursUs/1e3) || !near(r.OpenBLASGFLOPS, fl/r.OpenBLASUs/1e3) || !near(r.Ratio, r.OpenBLASUs/r.OursUs) {
				t.Errorf("row figures disagree with its times: %+v", r)
			}
			s := sums[r.Part]
			if s == nil {
				s = &gemmPart{}
				sums[r.Part] = s
			}
			s.Products += r.Count
			s.GFLOP += float64(r.Count) * fl / 1e9
			s.OursMs += float64(r.Count) * r.OursUs / 1e3
			s.OpenBLASMs += float64(r.Count) * r.OpenBLASUs / 1e3
			s.WeightMB += float64(r.Count) * float64(cgo.WeightBytes(cgo.F32P, int64(r.N), int64(r.K))) / 1e6
		case "gemm_part":
			var p gemmPart
			_ = json.Unmarshal([]byte(line), &p)
			parts[p.Part] = &p
		default:
			t.Errorf("unknown line %q", line)
		}
	}
	if rows != 12 || len(parts) != 2 || peak == 0 || gbps == 0 {
		t.Fatalf("%d rows, %d parts, peak %v:\n%s", rows, len(parts), peak, stdout)
	}
	for name, p := range parts {
		s := sums[name]
		if s == nil || p.Products != s.Products || !near(p.GFLOP, s.GFLOP) || !near(p.OursMs, s.OursMs) || !near(p.OpenBLASMs, s.OpenBLASMs) ||
			!near(p.OursGFLOPS, p.GFLOP/(p.OursMs/1e3)) || !near(p.PeakFraction, p.OursGFLOPS/peak) {
			t.Errorf("part %s: %+v, rows sum to %+v", name, p, s)
		}
		// The floors: the part's GFLOP at the peak, its weights (F32P panels) at the bandwidth.
		bound := "compute"
		if p.MemoryFloorMs > p.ComputeFloorMs {
			bound = "memory"
		}
		if s != nil && (!near(p.WeightMB, s.WeightMB) || !near(p.ComputeFloorMs, p.GFLOP/peak*1e3) || !near(p.MemoryFloorMs, p.WeightMB/gbps) || p.Bound != bound) {
			t.Errorf("part %s floors: %+v (weights %.3f MB)", name, p, s.WeightMB)
		}
	}

	stdout, stderr, code = runCmd(t, "bench", "gemm", "--model", "miotts", "--threads", "1", "--rounds", "1", "--per-call", "1", "--peak", "0", "--bandwidth-mb", "4", "--dtype", "q8_0")
	if code != 0 {
		t.Fatalf("q8_0: exit %d: %s", code, stderr)
	}
	for _, s := range []string{"miotts decode, per token:", "gate_proj, up_proj", "Q8_0", "OpenBLAS", "GFLOP/s", "per prompt of 58 tokens", "memory read bandwidth", "GB/s"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("text output lacks %q:\n%s", s, stdout)
		}
	}
	if _, stderr, code := runCmd(t, "bench", "gemm", "--model", "nope"); code == 0 || !strings.Contains(stderr, "unknown --model") {
		t.Errorf("unknown model: exit %d %s", code, stderr)
	}
}

// bench gemm's --model picks a model's shapes by name: meanvc2 (also a catalog name) is not
// looked up in the model cache, and bad values still fail with their own message.
func TestBenchGemmModelIsAFilter(t *testing.T) {
	var stdout, stderr strings.Builder
	err := runBenchGemm([]string{"--model", "meanvc2", "--threads", "0"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--threads must be") {
		t.Errorf("got %v, want the --threads error (not a model-cache lookup)", err)
	}
	if err := runBenchGemm([]string{"--peak", "0", "extra"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "unexpected argument") {
		t.Errorf("a positional argument: %v", err)
	}
}
