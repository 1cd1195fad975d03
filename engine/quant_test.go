package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/ggufpack"
)

// quantBuffers encodes W [n, k] as dtype and returns the encoded buffer and an F32 buffer of
// the dequantised values (the reference weight).
func quantBuffers(t *testing.T, w []float32, n, k int64, dtype DType) (q, ref *Buffer) {
	t.Helper()
	var raw []byte
	var gt gguf.DType
	switch dtype {
	case Q8_0:
		var err error
		if raw, err = gguf.QuantizeQ8_0(w); err != nil {
			t.Fatal(err)
		}
		gt = gguf.Q8_0
	case F16:
		raw, gt = gguf.EncodeF16(w), gguf.F16
	case Q8_0R8:
		var err error
		if raw, err = gguf.QuantizeQ8_0(w); err != nil {
			t.Fatal(err)
		}
		gt = gguf.Q8_0
	case Q4_K, BF16:
		gt = map[DType]gguf.DType{Q4_K: gguf.Q4_K, BF16: gguf.BF16}[dtype]
		var err error
		if raw, err = ggufpack.Encode(nil, w, gt); err != nil {
			t.Fatal(err)
		}
	}
	deq := make([]float32, len(w))
	if err := gguf.Dequantize(deq, raw, gt); err != nil {
		t.Fatal(err)
	}
	q, err := NewBufferRaw("w", dtype, raw, n, k)
	if err != nil {
		t.Fatal(err)
	}
	if q.Bytes() != int64(len(raw)) && dtype != Q8_0R8 || q.DType() != dtype {
		t.Fatalf("buffer: %d bytes dtype %v, want %d", q.Bytes(), q.DType(), len(raw))
	}
	ref, err = NewBufferFrom("w.f32", deq, n, k)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Free(); ref.Free() })
	return q, ref
}

// TestLinearQuantized runs Linear with Q8_0/F16/BF16/Q4_K weights through the CPU backend and
// compares with the F32 Linear on the dequantised weights: F16, BF16, Q4_K and the Q8_0
// prefill path to f32 rounding, the Q8_0 decode path (M ≤ 8) within its activation-rounding bound (1% of Σ|x||w|
// here; the exact bound is checked in cgo's TestLinearQ).
func TestLinearQuantized(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 2))
	type shape struct {
		lead []int64
		n, k int64
		bias bool
	}
	blocks32 := []shape{
		{[]int64{1}, 33, 96, true}, {[]int64{1}, 1025, 1056, false}, {[]int64{58}, 101, 288, true},
		{[]int64{58}, 515, 1024, false}, {[]int64{2, 3}, 17, 160, true}, {[]int64{4, 29}, 9, 64, false},
	}
	blocks256 := []shape{ // Q4_K rows are whole 256-value super-blocks
		{[]int64{1}, 33, 256, true}, {[]int64{1}, 1025, 1024, false}, {[]int64{58}, 101, 768, true},
		{[]int64{2, 3}, 17, 512, true},
	}
	for _, dtype := range []DType{Q8_0, F16, Q8_0R8, BF16, Q4_K} {
		cases := blocks32
		if dtype == Q4_K {
			cases = blocks256
		}
		for _, c := range cases {
			name := fmt.Sprintf("%s/%v/%dx%d", dtypeName(dtype), c.lead, c.n, c.k)
			w := make([]float32, c.n*c.k)
			for i := range w {
				w[i] = float32(rng.NormFloat64() / math.Sqrt(float64(c.k)))
			}
			q, ref := quantBuffers(t, w, c.n, c.k, dtype)
			bias, _ := NewBufferFrom("b", make([]float32, c.n), c.n)
			defer bias.Free()
			for i := range bias.Float32s() {
				bias.Float32s()[i] = float32(rng.NormFloat64())
			}
			build := func(wb *Buffer) *Graph {
				g := NewGraph(name)
				x := g.Input("x", F32, append(c.lead, c.k)...)
				var bp *Tensor
				if c.bias {
					b := g.Persistent(bias)
					bp = &b
				}
				g.Output("y", g.Linear(x, g.Persistent(wb), bp))
				return g
			}
			xs := make([]float32, numel(c.lead)*c.k)
			for i := range xs {
				xs[i] = float32(rng.NormFloat64())
			}
			fill := func(_ string, x []float32) { copy(x, xs) }
			m := numel(c.lead)
			got := run(t, build(q), false, 2, fill)["y"]
			want := run(t, build(ref), false, 2, fill)["y"]
			tol := 3e-5
			if dtype == Q8_0R8 || dtype == Q8_0 && m <= 8 {
				tol = 1e-2
			}
			worst := 0.0
			for i := range want {
				row, col := int64(i)/c.n, int64(i)%c.n
				var mag float64
				for l := int64(0); l < c.k; l++ {
					mag += math.Abs(float64(xs[row*c.k+l]) * float64(ref.Float32s()[col*c.k+l]))
				}
				e := math.Abs(float64(got[i]) - float64(want[i]))
				worst = max(worst, e/mag)
				if e > tol*mag+1e-5 {
					t.Fatalf("%s: y[%d] = %g, F32 reference %g (Σ|x||w| %g)", name, i, got[i], want[i], mag)
				}
			}
			t.Logf("%s: worst |error|/Σ|x||w| %.2e", name, worst)
		}
	}
}

// TestGatherRowsQuantized: an embedding lookup in a quantised table gives the dequantised rows.
func TestGatherRowsQuantized(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	const n, k = 40, 256
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	for _, dtype := range []DType{Q8_0, F16, BF16, Q4_K} {
		q, ref := quantBuffers(t, w, n, k, dtype)
		build := func(b *Buffer) *Graph {
			g := NewGraph("gather")
			idx := g.Input("idx", I32, 3)
			g.Output("y", g.GatherRows(g.Persistent(b), idx))
			return g
		}
		fill := func(name string, x []float32) {}
		idx := []int32{39, 0, 7}
		runIdx := func(b *Buffer) []float32 {
			cpu, _ := NewCPU(1)
			defer cpu.Close()
			prog, err := cpu.Compile(build(b))
			if err != nil {
				t.Fatal(err)
			}
			defer prog.Close()
			copy(prog.InputInt32("idx"), idx)
			if err := prog.Run(); err != nil {
				t.Fatal(err)
			}
			return append([]float32(nil), prog.Output("y")...)
		}
		_ = fill
		got, want := runIdx(q), runIdx(ref)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: y[%d] = %g, want %g", dtypeName(dtype), i, got[i], want[i])
			}
		}
	}
}

// TestQuantizedMisuse: a quantised weight anywhere but Linear's weight or GatherRows' table
// is a build error naming the tensor.
func TestQuantizedMisuse(t *testing.T) {
	w := make([]float32, 4*64)
	q, _ := quantBuffers(t, w, 4, 64, Q8_0)
	for name, f := range map[string]func(g *Graph, x, w Tensor){
		"Add":     func(g *Graph, x, w Tensor) { g.Output("y", g.Add(x, w)) },
		"RMSNorm": func(g *Graph, x, w Tensor) { g.Output("y", g.RMSNorm(x, &w, 1e-6)) },
		"View":    func(g *Graph, x, w Tensor) { g.Output("y", g.Linear(x, g.Reshape(w, 2, 128), nil)) },
		"Matmul":  func(g *Graph, x, w Tensor) { g.Output("y", g.Matmul(x, w)) },
		"Output":  func(g *Graph, x, w Tensor) { g.Output("y", w) },
		"Concat":  func(g *Graph, x, w Tensor) { g.Output("y", g.Concat(0, x, w)) },
		"Linear x": func(g *Graph, x, w Tensor) {
			g.Output("y", g.Linear(w, g.Persistent(q), nil))
		},
	} {
		g := NewGraph("misuse")
		x := g.Input("x", F32, 4, 64)
		f(g, x, g.Persistent(q))
		if g.Err() == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if !strings.Contains(g.Err().Error(), `"w" is a quantised weight`) {
			t.Errorf("%s: error does not name the tensor: %v", name, g.Err())
		}
		t.Logf("%s: %v", name, g.Err())
	}
	if _, err := NewBuffer("bad", Q8_0, 4, 48); err == nil {
		t.Error("Q8_0 buffer with rows of 48 values accepted")
	}
	if _, err := NewBufferRaw("bad", Q8_0, make([]byte, 33), 1, 32); err == nil {
		t.Error("33 bytes accepted for one Q8_0 block")
	}
}
