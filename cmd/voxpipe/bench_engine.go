package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// graphs the planner benchmark can plan: a model's real graph over shape-only weights, for
// seconds of its input.
var shapeGraphs = map[string]func(seconds float64) (*engine.Graph, error){
	"wavlm-large": func(s float64) (*engine.Graph, error) { return wavlm.PlannerGraph(wavlm.RealLarge(), int(s*16000)) },
}

func runBenchPlanner(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench planner", "bench planner [--graph wavlm-large] [--seconds S] [--json]", stderr)
	name := fs.String("graph", "wavlm-large", "model-shaped graph to plan")
	seconds := fs.Float64("seconds", 10, "seconds of input audio")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	build := shapeGraphs[*name]
	if build == nil {
		return fmt.Errorf("unknown graph %q (available: wavlm-large)", *name)
	}
	if *seconds <= 0 || *seconds > 600 {
		return errors.New("--seconds must be in (0, 600]")
	}
	g, err := build(*seconds)
	if err != nil {
		return err
	}
	st, err := engine.PlanStatsOf(g)
	if err != nil {
		return err
	}
	res := struct {
		Bench   string  `json:"bench"`
		Graph   string  `json:"graph"`
		Seconds float64 `json:"seconds"`
		engine.PlanStats
		Ratio float64 `json:"ratio"`
	}{"planner", *name, *seconds, st, float64(st.ArenaBytes) / float64(st.NaiveBytes)}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "%s, %.0f s: %d nodes; arena %.1f MB vs naive %.1f MB (%.1f%%); persistent %.1f MB\n",
		res.Graph, res.Seconds, st.Nodes, mb(st.ArenaBytes), mb(st.NaiveBytes), 100*res.Ratio, mb(st.PersistentBytes))
	return nil
}

func mb(b int64) float64 { return float64(b) / 1e6 }

func runBenchDispatch(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench dispatch", "bench dispatch [--nodes N] [--json]", stderr)
	nodes := fs.Int("nodes", 1000, "tiny ops in the graph")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *nodes < 1 || *nodes > 1_000_000 {
		return errors.New("--nodes must be in [1, 1000000]")
	}
	cpu, err := engine.NewCPU(1)
	if err != nil {
		return err
	}
	defer cpu.Close()
	g := engine.NewGraph("dispatch")
	x := g.Input("x", engine.F32, 4)
	for range *nodes {
		x = g.Scale(x, 1, 0)
	}
	g.Output("y", x)
	prog, err := cpu.Compile(g)
	if err != nil {
		return err
	}
	defer prog.Close()
	perRun, err := medianRun(prog, 21)
	if err != nil {
		return err
	}
	ns := float64(perRun.Nanoseconds()) / float64(*nodes)
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"bench": "dispatch", "nodes": *nodes, "ns_per_node": ns})
	}
	fmt.Fprintf(stdout, "dispatch: %d tiny nodes, %.0f ns per node (median of 21 runs)\n", *nodes, ns)
	return nil
}

// gemmShapes are matmuls the models run: M×K×N with the weight [N, K] as in nn.Linear.
var gemmShapes = [][3]int{{160, 512, 512}, {16, 512, 1536}, {1, 1024, 3072}, {500, 1024, 4096}}

func runBenchGemm(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench gemm", "bench gemm [--threads N] [--json]", stderr)
	threads := fs.Int("threads", 2, "threads for both our engine and OpenBLAS")
	asJSON := fs.Bool("json", false, "print one JSON object per shape")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	cpu, err := engine.NewCPU(*threads)
	if err != nil {
		return err
	}
	defer cpu.Close()
	for _, s := range gemmShapes {
		m, k, n := s[0], s[1], s[2]
		flops := 2 * float64(m) * float64(k) * float64(n)
		res := map[string]any{"bench": "gemm", "m": m, "k": k, "n": n, "threads": *threads}
		// One matmul per call shows the cost of a call on its own; 16 per call is how a model's
		// program runs them (a whole graph in one call).
		for _, per := range []struct {
			name string
			n    int
		}{{"per_call", 1}, {"in_plan", 16}} {
			ours, blas, err := gemmPair(cpu, *threads, m, k, n, per.n)
			if err != nil {
				return err
			}
			res["ours_gflops_"+per.name] = flops / ours.Seconds() / 1e9
			res["openblas_gflops_"+per.name] = flops / blas.Seconds() / 1e9
			res["ratio_"+per.name] = blas.Seconds() / ours.Seconds()
		}
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(stdout, "gemm %4d×%4d×%4d: one per call: ours %6.1f vs OpenBLAS %6.1f GFLOP/s (%.2f×); 16 per call: ours %6.1f vs %6.1f (%.2f×)\n",
			m, k, n, res["ours_gflops_per_call"], res["openblas_gflops_per_call"], res["ratio_per_call"],
			res["ours_gflops_in_plan"], res["openblas_gflops_in_plan"], res["ratio_in_plan"])
	}
	return nil
}

// gemmPair times x·Wᵀ through an engine program of perCall matmul nodes and through perCall
// OpenBLAS sgemms per cgo call with OpenBLAS's own threads, alternating so both see the same
// machine load; medians of 9, per matmul.
func gemmPair(cpu *engine.CPU, threads, m, k, n, perCall int) (ours, blas time.Duration, err error) {
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(i%7) * 0.01
	}
	wb, err := engine.NewBufferFrom("w", w, int64(n), int64(k))
	if err != nil {
		return 0, 0, err
	}
	defer wb.Free()
	g := engine.NewGraph("gemm")
	x := g.Input("x", engine.F32, int64(m), int64(k))
	for i := range perCall {
		g.Output(fmt.Sprint("y", i), g.Linear(x, g.Persistent(wb), nil))
	}
	prog, err := cpu.Compile(g)
	if err != nil {
		return 0, 0, err
	}
	defer prog.Close()
	blasRun, err := cgo.NewSgemmBench(m, n, k)
	if err != nil {
		return 0, 0, err
	}
	defer blasRun.Free()
	calls := max(4, int(1e9/(2*float64(m)*float64(k)*float64(n)*float64(perCall))))
	var a, b []time.Duration
	for range 9 {
		t0 := time.Now()
		for range calls {
			if err := prog.Run(); err != nil {
				return 0, 0, err
			}
		}
		a = append(a, time.Since(t0)/time.Duration(calls*perCall))
		b = append(b, blasRun.Run(threads, calls, perCall))
		// OpenBLAS's worker spins ~130 ms after a threaded call: let it sleep before ours runs.
		time.Sleep(300 * time.Millisecond)
	}
	slices.Sort(a)
	slices.Sort(b)
	return a[len(a)/2], b[len(b)/2], nil
}

// runBenchGemv times the decode-step Linear x[1, K]·Wᵀ with W [N, K] stored as F32, F16,
// Q8_0 and Q8_0R8 (Q8_0 interleaved by 8 rows, as models load it): decode is bound by the weight bytes read, so the report gives GB/s of weights.
func runBenchGemv(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench gemv", "bench gemv [--threads N] [--k K] [--n N] [--json]", stderr)
	threads := fs.Int("threads", 2, "engine threads")
	k := fs.Int("k", 1024, "input features (a multiple of 32)")
	n := fs.Int("n", 3072, "output features")
	per := fs.Int("weights", 16, "distinct weights per program (enough to overflow the caches: a model streams them from DRAM)")
	asJSON := fs.Bool("json", false, "print one JSON object per dtype")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *per < 1 || *per > 256 {
		return errors.New("--weights must be in [1, 256]")
	}
	if *k <= 0 || *k%32 != 0 || *n <= 0 || int64(*k)*int64(*n) > 1<<28 {
		return errors.New("--k must be a positive multiple of 32 and k·n at most 2^28")
	}
	cpu, err := engine.NewCPU(*threads)
	if err != nil {
		return err
	}
	defer cpu.Close()
	w := make([]float32, *n**k)
	for i := range w {
		w[i] = float32(i%13-6) * 0.01
	}
	// Linears over distinct weights in one program, so the weights come from memory as in a
	// model rather than from cache.
	for _, dt := range []struct {
		name string
		gt   gguf.DType
		et   engine.DType
	}{{"F32", gguf.F32, engine.F32}, {"F16", gguf.F16, engine.F16}, {"Q8_0", gguf.Q8_0, engine.Q8_0}, {"Q8_0R8", gguf.Q8_0, engine.Q8_0R8}} {
		var raw []byte
		switch dt.gt {
		case gguf.F32:
			raw = make([]byte, 4*len(w))
			for i, v := range w {
				binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
			}
		case gguf.F16:
			raw = gguf.EncodeF16(w)
		case gguf.Q8_0:
			if raw, err = gguf.QuantizeQ8_0(w); err != nil {
				return err
			}
		}
		g := engine.NewGraph("gemv")
		x := g.Input("x", engine.F32, 1, int64(*k))
		var bufs []*engine.Buffer
		for i := range *per {
			b, err := engine.NewBufferRaw(fmt.Sprint("w", i), dt.et, raw, int64(*n), int64(*k))
			if err != nil {
				return err
			}
			bufs = append(bufs, b)
			g.Output(fmt.Sprint("y", i), g.Linear(x, g.Persistent(b), nil))
		}
		prog, err := cpu.Compile(g)
		if err != nil {
			return err
		}
		perRun, err := medianRun(prog, 31)
		prog.Close()
		for _, b := range bufs {
			b.Free()
		}
		if err != nil {
			return err
		}
		us := float64(perRun.Nanoseconds()) / float64(*per) / 1e3
		gbs := float64(len(raw)) / (us * 1e3)
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(map[string]any{"bench": "gemv", "dtype": dt.name, "m": 1, "k": *k, "n": *n,
				"threads": *threads, "us": us, "weight_gb_per_s": gbs}); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(stdout, "gemv 1×%d×%d %-6s: %7.1f µs per Linear, %5.1f GB/s of weights (median of 31 runs of %d)\n", *k, *n, dt.name, us, gbs, *per)
	}
	return nil
}
