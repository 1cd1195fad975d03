package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine/gguf"
)

// fusionGraph builds, from seed, Linears (weights encoded as dtype) and LayerNorms followed
// by the chains fuseEpilogues folds — an activation, a gate and residual, a parameterised
// unary after a strided operand, AdaLN's modulation, SwiGLU — and by chains it must leave:
// a Linear read twice, a Linear that is also an output, and a Linear whose input a later
// node overwrites before its chain ends. Each build has fresh persistent buffers (one run
// writes one), filled alike.
func fusionGraph(t *testing.T, seed uint64, dtype DType, lead []int64, n, k int64) (*Graph, map[string][]float32, map[string][]int32) {
	rng := rand.New(rand.NewPCG(seed, 5))
	randn := func(size int64, scale float64) []float32 {
		x := make([]float32, size)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * scale)
		}
		return x
	}
	g := NewGraph("fusion")
	in := map[string][]float32{}
	input := func(name string, shape ...int64) Tensor {
		in[name] = randn(numel(shape), 1)
		return g.Input(name, F32, shape...)
	}
	persistent := func(b *Buffer, err error) Tensor {
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Free)
		return g.Persistent(b)
	}
	weight := func(name string) Tensor {
		w := randn(n*k, 0.3)
		var raw []byte
		switch dtype {
		case Q8_0, Q8_0R8:
			var err error
			if raw, err = gguf.QuantizeQ8_0(w); err != nil {
				t.Fatal(err)
			}
		case F16, F16P:
			raw = gguf.EncodeF16(w)
		default:
			raw = make([]byte, 0, 4*len(w))
			for _, v := range w {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
			}
		}
		return persistent(NewBufferRaw(name, dtype, raw, n, k))
	}
	bias := func(name string) *Tensor {
		b := persistent(NewBufferFrom(name, randn(n, 0.5), n))
		return &b
	}
	rows := int64(1)
	for _, d := range lead {
		rows *= d
	}
	xShape := append(append([]int64{}, lead...), k)
	yShape := append(append([]int64{}, lead...), n)
	x := input("x", xShape...)
	res := input("res", yShape...)
	gate := input("gate", 1, n)
	mods := input("mods", rows, 6*n) // per-row modulation, read through strided slices
	part := func(i int64) Tensor { return g.Reshape(g.Contiguous(g.Slice(mods, 1, i*n, (i+1)*n)), yShape...) }
	strided := g.Slice(mods, 1, 2*n, 3*n) // [rows, n], rows 6n apart

	g.Output("act", g.GELU(g.Linear(x, weight("w1"), bias("b1")), false))
	// The residual adds a leading dim: the Linear's output is read through a view.
	g.Output("grouped", g.Add(g.Linear(x, weight("w0"), nil), input("res1", append([]int64{1}, yShape...)...)))
	g.Output("gated", g.Add(res, g.Mul(gate, g.Linear(x, weight("w2"), nil))))
	flat := g.Reshape(g.Linear(x, weight("w3"), bias("b3")), rows, n)
	g.Output("scaled", g.Scale(g.Sub(flat, strided), 0.5, -1))
	h := input("h", yShape...)
	g.Output("modulated", g.Add(g.Mul(g.LayerNorm(h, nil, nil, 1e-6), g.Scale(part(1), 1, 1)), part(0)))
	g.Output("swiglu", g.Mul(g.SiLU(g.Linear(x, weight("wg"), nil)), g.Linear(x, weight("wu"), nil)))
	// Not folded: a Linear with two readers, and one that is an output as well.
	twice := g.Linear(x, weight("w4"), nil)
	g.Output("twice.a", g.GELU(twice, true))
	g.Output("twice.b", g.Add(twice, res))
	shown := g.Linear(x, weight("w5"), nil)
	g.Output("shown", shown)
	g.Output("shown.act", g.Tanh(shown))
	// Not folded: the table the Linear reads is rewritten before the chain's end.
	table := persistent(NewBufferFrom("table", randn(4*k, 1), 4, k))
	early := g.Linear(table, weight("w6"), nil)
	g.ScatterRows(table, input("row", 1, k), g.Input("idx", I32, 1))
	g.Output("early", g.SiLU(early))
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	return g, in, map[string][]int32{"idx": {2}}
}

// fusionProgram compiles g on a CPU backend of threads, with or without fusion; closing
// frees both.
func fusionProgram(tb testing.TB, g *Graph, threads int, fuse bool) (prog Program, closing func()) {
	tb.Helper()
	cpu, err := NewCPU(threads)
	if err != nil {
		tb.Fatal(err)
	}
	cpu.SetFusion(fuse)
	if prog, err = cpu.Compile(g); err != nil {
		cpu.Close()
		tb.Fatal(err)
	}
	return prog, func() { prog.Close(); cpu.Close() }
}

// fusionRun compiles g with or without fusion and runs it once.
func fusionRun(t *testing.T, g *Graph, in map[string][]float32, ints map[string][]int32, threads int, fuse bool) (map[string][]float32, int) {
	t.Helper()
	prog, closing := fusionProgram(t, g, threads, fuse)
	defer closing()
	for name, x := range in {
		copy(prog.Input(name), x)
	}
	for name, v := range ints {
		copy(prog.InputInt32(name), v)
	}
	if err := prog.Run(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for name := range g.outputs {
		out[name] = append([]float32(nil), prog.Output(name)...)
	}
	return out, prog.Stats().Nodes
}

// TestFusedEpiloguesEqualUnfused: every weight encoding, odd shapes (a Linear's decode and
// prefill paths), 1 and 2 threads and each SIMD level give the unfused graph's bits, with
// exactly the foldable nodes gone.
func TestFusedEpiloguesEqualUnfused(t *testing.T) {
	full := cgo.Init()
	levels := []struct {
		name     string
		mask     int
		portable bool
	}{{"native", full, false}, {"avx2", full &^ cgo.CPUAVX512F, false}, {"portable", full, true}}
	defer func() { cgo.LimitCPUFeatures(full); cgo.ForcePortable(false) }()
	shapes := []struct {
		lead []int64
		n, k int64
	}{{[]int64{1}, 33, 64}, {[]int64{16}, 70, 96}, {[]int64{2, 7}, 37, 160}, {[]int64{150}, 45, 64}}
	for _, lv := range levels {
		cgo.LimitCPUFeatures(lv.mask)
		cgo.ForcePortable(lv.portable)
		for _, dtype := range []DType{F32P, F16P, Q8_0, Q8_0R8, F16} {
			for si, sh := range shapes {
				for _, threads := range []int{1, 2} {
					seed := uint64(100*si + threads)
					g, in, ints := fusionGraph(t, seed, dtype, sh.lead, sh.n, sh.k)
					want, unfusedNodes := fusionRun(t, g, in, ints, threads, false)
					g, in, ints = fusionGraph(t, seed, dtype, sh.lead, sh.n, sh.k)
					got, fusedNodes := fusionRun(t, g, in, ints, threads, true)
					// act 1, grouped 1, gated 2, scaled 2, modulated 2, swiglu 2
					if unfusedNodes-fusedNodes != 10 {
						t.Fatalf("%s %s %v threads %d: %d nodes fused to %d, want 10 fewer", lv.name, dtypeName(dtype), sh, threads,
							unfusedNodes, fusedNodes)
					}
					for name, w := range want {
						for i, v := range got[name] {
							if math.Float32bits(v) != math.Float32bits(w[i]) {
								t.Fatalf("%s %s %v threads %d: %s[%d] fused %v, unfused %v", lv.name, dtypeName(dtype), sh, threads,
									name, i, v, w[i])
							}
						}
					}
				}
			}
		}
	}
}

// BenchmarkFusedBlock times a DiT feed-forward block at MeanVC2's sizes (16 rows, 512 → 1024
// → 512, F32 packed weights: AdaLN modulation, GELU, gate and residual) with and without
// the epilogues, on 1 and 2 threads; nodes/op is the program's node count.
func BenchmarkFusedBlock(b *testing.B) {
	const rows, dim, ff = 16, 512, 1024
	rng := rand.New(rand.NewPCG(1, 2))
	randn := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 0.1)
		}
		return x
	}
	packed := func(name string, n, k int64) *Buffer {
		raw := make([]byte, 0, 4*n*k)
		for _, v := range randn(int(n * k)) {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
		}
		w, err := NewBufferRaw(name, F32P, raw, n, k)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(w.Free)
		return w
	}
	w1, w2 := packed("w1", ff, dim), packed("w2", dim, ff)
	g := NewGraph("ff")
	h := g.Input("h", F32, rows, dim)
	mod := g.Input("mod", F32, rows, 3*dim)
	part := func(i int64) Tensor { return g.Slice(mod, 1, i*dim, (i+1)*dim) }
	n := g.Add(g.Mul(g.LayerNorm(h, nil, nil, 1e-6), g.Scale(part(1), 1, 1)), part(0))
	f := g.Linear(g.GELU(g.Linear(n, g.Persistent(w1), nil), true), g.Persistent(w2), nil)
	g.Output("h", g.Add(h, g.Mul(part(2), f)))
	for _, threads := range []int{1, 2} {
		for _, fuse := range []bool{true, false} {
			b.Run(fmt.Sprintf("threads=%d/fuse=%v", threads, fuse), func(b *testing.B) {
				prog, closing := fusionProgram(b, g, threads, fuse)
				defer closing()
				copy(prog.Input("h"), randn(rows*dim))
				copy(prog.Input("mod"), randn(rows*3*dim))
				b.ResetTimer()
				for range b.N {
					if err := prog.Run(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(prog.Stats().Nodes), "nodes/op")
			})
		}
	}
}

// TestFusedRandomGraphsEqualUnfused: random DAGs of packed Linears, LayerNorms and
// elementwise ops (values read by several nodes, broadcast rows, outputs in chains) give the
// same bits fused and unfused, and the fused ones lose nodes.
func TestFusedRandomGraphsEqualUnfused(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 8))
	folded := 0
	for trial := range 40 {
		seed := rng.Uint64()
		build := func() (*Graph, map[string][]float32) {
			r := rand.New(rand.NewPCG(seed, 1))
			d := int64(8 + r.IntN(40))
			randn := func(n int64) []float32 {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(r.NormFloat64() * 0.3)
				}
				return x
			}
			raw := make([]byte, 0, 4*d*d)
			for _, v := range randn(d * d) {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
			}
			w, err := NewBufferRaw("w", F32P, raw, d, d)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Free)
			g := NewGraph("random")
			in := map[string][]float32{"x": randn(5 * d), "row": randn(d)}
			x, row := g.Input("x", F32, 5, d), g.Input("row", F32, 1, d)
			live := []Tensor{x}
			for i := range 30 {
				a, b := live[r.IntN(len(live))], live[r.IntN(len(live))]
				var v Tensor
				switch r.IntN(9) {
				case 0, 1:
					v = g.Linear(a, g.Persistent(w), nil)
				case 2:
					v = g.LayerNorm(a, nil, nil, 1e-5)
				case 3:
					v = g.Add(a, b)
				case 4:
					v = g.Mul(row, a)
				case 5:
					v = g.Sub(b, a)
				case 6:
					v = g.GELU(a, r.IntN(2) == 0)
				case 7:
					v = g.Scale(a, 0.5, 0.25)
				case 8:
					v = g.Reshape(g.Tanh(g.Reshape(a, 1, 5, d)), 5, d)
				}
				live = append(live, v)
				if len(live) > 5 {
					live = live[1:]
				}
				if r.IntN(8) == 0 {
					g.Output(fmt.Sprintf("o%d", i), v)
				}
			}
			g.Output("final", live[len(live)-1])
			return g, in
		}
		g, in := build()
		want, unfused := fusionRun(t, g, in, nil, 2, false)
		g, in = build()
		got, fused := fusionRun(t, g, in, nil, 2, true)
		folded += unfused - fused
		for name, w := range want {
			for i, v := range got[name] {
				if math.Float32bits(v) != math.Float32bits(w[i]) && !(v != v && w[i] != w[i]) {
					t.Fatalf("trial %d: %s[%d] fused %v, unfused %v", trial, name, i, v, w[i])
				}
			}
		}
	}
	if folded == 0 {
		t.Fatal("no node folded in 40 random graphs")
	}
	t.Logf("%d nodes folded over 40 graphs", folded)
}
