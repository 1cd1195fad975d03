package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// kvCacheCase is a decode or prefill step over persistent caches [Hk, maxT, D]: new rows are
// scattered at run-time positions, then attention reads the cache's first L positions.
type kvCacheCase struct {
	name             string
	H, Hk, Tq, D, Dv int64
	maxT, L, writeAt int64 // rows [writeAt, writeAt+Tq) are written; [0, L) are read
	mask             bool  // causal over [0, L): query i sees positions ≤ writeAt+i
	threads          int
}

// TestF16KVCacheAttention writes F16 caches with ScatterRows and reads them with Attention,
// on the decode kernel's shapes (Tq 1, several query heads per kv head, head sizes a multiple
// of 8) and on the general path (prefill, one query head per kv head,
// odd head sizes), at 1 and 2 threads. The cache must hold the rows rounded as Go's encoder
// rounds them, and the output must be bit for bit the output of the same graph over F32
// caches holding those rounded values: widening a half is exact, so the kernels do the same
// arithmetic. The F32 output is checked against the float64 reference as well.
func TestF16KVCacheAttention(t *testing.T) {
	cases := []kvCacheCase{
		{name: "decode GQA", H: 16, Hk: 8, Tq: 1, D: 128, Dv: 128, maxT: 40, L: 32, writeAt: 20, mask: true},
		{name: "decode GQA 2 threads", H: 8, Hk: 2, Tq: 1, D: 64, Dv: 32, maxT: 300, L: 264, writeAt: 250, mask: true, threads: 2},
		{name: "decode odd D", H: 4, Hk: 2, Tq: 1, D: 17, Dv: 9, maxT: 16, L: 16, writeAt: 15, mask: true},
		{name: "decode MHA", H: 3, Hk: 3, Tq: 1, D: 16, Dv: 16, maxT: 12, L: 8, writeAt: 3, mask: true},
		{name: "prefill causal", H: 4, Hk: 2, Tq: 7, D: 24, Dv: 24, maxT: 20, L: 16, writeAt: 0, mask: true, threads: 2},
		{name: "prefill no mask, odd", H: 2, Hk: 1, Tq: 5, D: 13, Dv: 7, maxT: 9, L: 9, writeAt: 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { testF16KVCache(t, c) })
	}
}

func testF16KVCache(t *testing.T, c kvCacheCase) {
	rng := rand.New(rand.NewPCG(uint64(c.maxT), uint64(c.D)))
	randn := func(n int64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	q := randn(c.H * c.Tq * c.D)
	// The cache before the step (positions other than the new ones), and the new rows.
	oldK, oldV := randn(c.Hk*c.maxT*c.D), randn(c.Hk*c.maxT*c.Dv)
	newK, newV := randn(c.Hk*c.Tq*c.D), randn(c.Hk*c.Tq*c.Dv)
	pos := make([]int32, c.Tq)
	for i := range pos {
		pos[i] = int32(c.writeAt) + int32(i)
	}
	var mask []float32
	if c.mask {
		mask = make([]float32, c.Tq*c.L)
		for i := range c.Tq {
			for j := range c.L {
				if j > c.writeAt+i {
					mask[i*c.L+j] = float32(math.Inf(-1))
				}
			}
		}
	}
	threads := max(c.threads, 1)

	// run builds the step over caches of dtype (filled with the given old values) and
	// returns the attention output and the caches after it.
	run := func(dtype DType, oldK, oldV, newK, newV []float32) (out, k, v []float32) {
		caches := make([]*Buffer, 2)
		for i, old := range [][]float32{oldK, oldV} {
			d := []int64{c.D, c.Dv}[i]
			b, err := NewBufferRaw(fmt.Sprintf("kv%d", i), dtype, encode(dtype, old), c.Hk, c.maxT, d)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Free()
			caches[i] = b
		}
		g := NewGraph("kv-" + dtypeName(dtype))
		qt := g.Input("q", F32, 1, c.H, c.Tq, c.D)
		p := g.Input("pos", I32, c.Tq)
		views := make([]Tensor, 2)
		for i, name := range []string{"k", "v"} {
			d := []int64{c.D, c.Dv}[i]
			cb := g.Persistent(caches[i])
			g.ScatterRows(cb, g.Input(name, F32, c.Hk, c.Tq, d), p)
			views[i] = g.Slice(g.Reshape(cb, 1, c.Hk, c.maxT, d), 2, 0, c.L)
		}
		var mp *Tensor
		if c.mask {
			m := g.Input("mask", F32, c.Tq, c.L)
			mp = &m
		}
		g.Output("out", g.Attention(qt, views[0], views[1], mp, nil, 0))
		got := run(t, g, false, threads, func(name string, x []float32) {
			if name == "pos" { // an int32 input: its memory seen as floats
				for i, p := range pos {
					x[i] = math.Float32frombits(uint32(p))
				}
				return
			}
			copy(x, map[string][]float32{"q": q, "k": newK, "v": newV, "mask": mask}[name])
		})
		k, err := caches[0].Values()
		if err != nil {
			t.Fatal(err)
		}
		v, err = caches[1].Values()
		if err != nil {
			t.Fatal(err)
		}
		return got["out"], slices.Clone(k), slices.Clone(v)
	}

	out16, k16, v16 := run(F16, oldK, oldV, newK, newV)
	rk, rv := roundHalf(oldK), roundHalf(oldV)
	out32, k32, v32 := run(F32, rk, rv, roundHalf(newK), roundHalf(newV))
	if !slices.Equal(k16, k32) || !slices.Equal(v16, v32) {
		t.Fatalf("F16 caches after the scatter differ from the rows rounded by Go's encoder")
	}
	for i := range out16 {
		if math.Float32bits(out16[i]) != math.Float32bits(out32[i]) {
			t.Fatalf("output[%d] over the F16 cache %v, over the F32 cache of the same values %v", i, out16[i], out32[i])
		}
	}
	// And the F32 graph against the float64 reference over the first L positions.
	head := func(cache []float32, d int64) []float32 {
		var x []float32
		for h := range c.Hk {
			x = append(x, cache[h*c.maxT*d:(h*c.maxT+c.L)*d]...)
		}
		return x
	}
	m := func(i, j int) float64 { return 0 }
	if c.mask {
		m = func(i, j int) float64 { return float64(mask[i*int(c.L)+j]) }
	}
	want := refAttention(q, head(k32, c.D), head(v32, c.Dv), 1, int(c.H), int(c.Hk), int(c.Tq), int(c.L), int(c.D), int(c.Dv),
		float64(float32(1/math.Sqrt(float64(c.D)))), m, func(h, i, j int) float64 { return 0 })
	near(t, c.name, out32, want)
}

// roundHalf is x rounded to binary16 and back by Go's encoder.
func roundHalf(x []float32) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = gguf.HalfToFloat32(gguf.Float32ToHalf(v))
	}
	return y
}

// encode is x as the little-endian bytes of an F32 or F16 buffer.
func encode(dtype DType, x []float32) []byte {
	var b []byte
	for _, v := range x {
		if dtype == F16 {
			b = binary.LittleEndian.AppendUint16(b, gguf.Float32ToHalf(v))
		} else {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b
}

// TestF16CacheMisuse: an F16 tensor goes only where a cache is read or written; elsewhere
// the graph says so.
func TestF16CacheMisuse(t *testing.T) {
	b, err := NewBuffer("cache", F16, 2, 8, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	for name, build := range map[string]func(g *Graph){
		"unary on a view": func(g *Graph) { g.Scale(g.Slice(g.Persistent(b), 1, 0, 4), 2, 0) },
		"matmul":          func(g *Graph) { g.Matmul(g.Persistent(b), g.Input("x", F32, 2, 4, 3)) },
		"linear over a view": func(g *Graph) {
			g.Linear(g.Input("x", F32, 1, 4), g.Slice(g.Reshape(g.Persistent(b), 16, 4), 0, 0, 8), nil)
		},
		"gather from a view": func(g *Graph) {
			g.GatherRows(g.Slice(g.Reshape(g.Persistent(b), 16, 4), 0, 0, 8), g.Input("i", I32, 2))
		},
		"scatter of F16 rows": func(g *Graph) {
			g.ScatterRows(g.Persistent(b), g.Slice(g.Persistent(b), 1, 0, 2), g.Input("i", I32, 2))
		},
		"attention query": func(g *Graph) {
			x := g.Reshape(g.Persistent(b), 1, 2, 8, 4)
			g.Attention(x, x, x, nil, nil, 0)
		},
	} {
		g := NewGraph(name)
		build(g)
		if g.Err() == nil || !strings.Contains(g.Err().Error(), "F16") {
			t.Errorf("%s: error %v, want one naming the F16 tensor", name, g.Err())
		}
	}
}
