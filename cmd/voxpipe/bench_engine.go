package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine"
)

// graphs the planner benchmark can plan.
var shapeGraphs = map[string]func(seconds float64) *engine.Graph{
	"wavlm-large": engine.WavLMLargeShape,
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
	st, err := engine.PlanStatsOf(build(*seconds))
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
		ours, blas, err := gemmPair(cpu, *threads, m, k, n)
		if err != nil {
			return err
		}
		flops := 2 * float64(m) * float64(k) * float64(n)
		res := map[string]any{"bench": "gemm", "m": m, "k": k, "n": n, "threads": *threads,
			"ours_gflops": flops / ours.Seconds() / 1e9, "openblas_gflops": flops / blas.Seconds() / 1e9,
			"ratio": blas.Seconds() / ours.Seconds()}
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(stdout, "gemm %4d×%4d×%4d: ours %6.1f GFLOP/s, OpenBLAS %6.1f GFLOP/s (%.2f×)\n",
			m, k, n, res["ours_gflops"], res["openblas_gflops"], res["ratio"])
	}
	return nil
}

// gemmPair times one x·Wᵀ through an engine program and through OpenBLAS called directly
// with its own threads, alternating so both see the same machine load; medians of 9.
func gemmPair(cpu *engine.CPU, threads, m, k, n int) (ours, blas time.Duration, err error) {
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
	g.Output("y", g.Linear(x, g.Persistent(wb), nil))
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
	calls := max(4, int(1e9/(2*float64(m)*float64(k)*float64(n))))
	var a, b []time.Duration
	for range 9 {
		t0 := time.Now()
		for range calls {
			if err := prog.Run(); err != nil {
				return 0, 0, err
			}
		}
		a = append(a, time.Since(t0)/time.Duration(calls))
		b = append(b, blasRun.Run(threads, calls))
		// OpenBLAS's worker spins ~130 ms after a threaded call: let it sleep before ours runs.
		time.Sleep(300 * time.Millisecond)
	}
	slices.Sort(a)
	slices.Sort(b)
	return a[len(a)/2], b[len(b)/2], nil
}
