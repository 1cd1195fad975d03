package cgo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/golden"
)

// simdLevels are the feature masks the quantised kernels are tested under: portable, AVX2
// (FMA, F16C) and everything detected (AVX-512 VNNI here).
func simdLevels() []struct {
	name string
	mask int
} {
	all := Init()
	return []struct {
		name string
		mask int
	}{{"portable", 0}, {"avx2", all &^ CPUAVX512F}, {"all", all}}
}

// encode turns W [n, k] into the bytes of dtype d and returns them with the dequantised
// values (the reference the kernels must match).
func encode(t testing.TB, w []float32, k int, d DType) ([]byte, []float32) {
	t.Helper()
	var raw []byte
	var gt gguf.DType
	var err error
	switch d {
	case Q8_0:
		raw, err = gguf.QuantizeQ8_0(w)
		gt = gguf.Q8_0
	case F16:
		raw, gt = gguf.EncodeF16(w), gguf.F16
	case Q8_0R8:
		raw, err = gguf.QuantizeQ8_0(w)
		gt = gguf.Q8_0
	}
	if err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, len(w))
	if err := gguf.Dequantize(deq, raw, gt); err != nil {
		t.Fatal(err)
	}
	if d == Q8_0R8 {
		n := int64(len(w) / k)
		r8 := make([]byte, WeightBytes(Q8_0R8, n, int64(k)))
		if err := RepackQ8_0R8(r8, raw, n, int64(k)); err != nil {
			t.Fatal(err)
		}
		raw = r8
	}
	return raw, deq
}

func cBytes(t testing.TB, b []byte) *Buffer {
	t.Helper()
	buf, err := Alloc(len(b))
	if err != nil {
		t.Fatal(err)
	}
	copy(unsafe.Slice((*byte)(buf.Ptr()), len(b)), b)
	return buf
}

func cFloats(t testing.TB, f []float32) *Buffer {
	t.Helper()
	buf, err := Alloc(4 * len(f))
	if err != nil {
		t.Fatal(err)
	}
	copy(buf.Float32s(), f)
	return buf
}

// TestLinearQ checks y = x·Wᵀ + b with W in Q8_0 and F16 against float64 products of x and
// the dequantised W, for decode (M ≤ 8: int8 dots on a quantised x for Q8_0) and prefill
// (M = 58: dequantised panels and sgemm) shapes, every SIMD level, 1 and 2 threads. Bounds:
// f32 rounding, 3e-5·Σ|x||w|; for the Q8_0 decode path also the activation rounding,
// Σ_blocks amax/254 · Σ|w| over the block.
func TestLinearQ(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 7, 32}, {1, 33, 96}, {1, 1025, 1056}, {3, 17, 160}, {8, 64, 64},
		{58, 101, 288}, {58, 515, 1024}, {1, 3072, 1024}, {9, 5, 32}, {58, 3, 2048},
		{6, 9, 64}, {13, 41, 96}, // Q8_0R8 on VNNI: rows 4+2, 8+4+1 at a time
	}
	f16Only := []struct{ m, n, k int }{{1, 9, 37}, {2, 31, 100}, {58, 45, 75}}
	rng := rand.New(rand.NewPCG(7, 1))
	defer LimitCPUFeatures(Init())
	worst := map[string]float64{}
	for _, d := range []DType{Q8_0, F16, Q8_0R8} {
		cases := shapes
		if d == F16 {
			cases = append(append([]struct{ m, n, k int }{}, shapes...), f16Only...)
		}
		for ci, c := range cases {
			w := make([]float32, c.n*c.k)
			for i := range w {
				w[i] = float32(rng.NormFloat64() / math.Sqrt(float64(c.k)))
			}
			if c.n > 2 { // an all-zero row (Q8_0 scale 0) and a row with an outlier
				clear(w[c.k : 2*c.k])
				w[2*c.k+3] = 5
			}
			x := make([]float32, c.m*c.k)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			raw, deq := encode(t, w, c.k, d)
			withBias := ci%2 == 0
			var bias []float32
			if withBias {
				bias = make([]float32, c.n)
				for i := range bias {
					bias[i] = float32(rng.NormFloat64())
				}
			}
			// Reference and bound per output.
			ref := make([]float64, c.m*c.n)
			bound := make([]float64, c.m*c.n)
			mag := make([]float64, c.m*c.n) // Σ|x||w|: the scale errors are reported against
			for i := 0; i < c.m; i++ {
				xr := x[i*c.k : (i+1)*c.k]
				for j := 0; j < c.n; j++ {
					wr := deq[j*c.k : (j+1)*c.k]
					var s, a, q float64
					for l := range wr {
						s += float64(xr[l]) * float64(wr[l])
						a += math.Abs(float64(xr[l]) * float64(wr[l]))
					}
					if d == Q8_0R8 || d == Q8_0 && c.m <= 8 { // int8 x: decode, and Q8_0R8 prefill on VNNI
						for b := 0; b < c.k; b += 32 {
							var amax, sw float64
							for l := b; l < b+32; l++ {
								amax = max(amax, math.Abs(float64(xr[l])))
								sw += math.Abs(float64(wr[l]))
							}
							q += amax / 254 * sw * 1.0001
						}
					}
					if withBias {
						s += float64(bias[j])
					}
					ref[i*c.n+j] = s
					bound[i*c.n+j] = 3e-5*a + q + 1e-6
					mag[i*c.n+j] = a
				}
			}
			xb, wb, yb := cFloats(t, x), cBytes(t, raw), cFloats(t, make([]float32, c.m*c.n))
			tensors := []Tensor{
				{Data: yb.Ptr(), DType: F32, Shape: []int64{int64(c.m), int64(c.n)}, Stride: Contiguous([]int64{int64(c.m), int64(c.n)})},
				{Data: xb.Ptr(), DType: F32, Shape: []int64{int64(c.m), int64(c.k)}, Stride: Contiguous([]int64{int64(c.m), int64(c.k)})},
				{Data: wb.Ptr(), DType: d, Shape: []int64{int64(c.n), int64(c.k)}, Stride: Contiguous([]int64{int64(c.n), int64(c.k)})},
			}
			node := Node{Op: OpLinearQ, Src: []int{1, 2}, Dst: 0}
			var bb *Buffer
			if withBias {
				bb = cFloats(t, bias)
				tensors = append(tensors, Tensor{Data: bb.Ptr(), DType: F32, Shape: []int64{int64(c.n)}, Stride: []int64{1}})
				node.Src = append(node.Src, 3)
			}
			p, err := NewPlan([]Node{node}, tensors)
			if err != nil {
				t.Fatal(err)
			}
			for _, lv := range simdLevels() {
				LimitCPUFeatures(lv.mask)
				for _, th := range []int{1, 2} {
					name := fmt.Sprintf("%s/%dx%dx%d/%s/%dthr", map[DType]string{Q8_0: "q8_0", F16: "f16", Q8_0R8: "q8_0r8"}[d], c.m, c.n, c.k, lv.name, th)
					ctx, err := NewContext(th)
					if err != nil {
						t.Fatal(err)
					}
					y := yb.Float32s()
					for i := range y {
						y[i] = float32(math.NaN())
					}
					if err := ctx.Execute(p); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					ctx.Close()
					for i, v := range y {
						e := math.Abs(float64(v) - ref[i])
						if !(e <= bound[i]) {
							t.Fatalf("%s: y[%d,%d] = %g, want %g ± %g", name, i/c.n, i%c.n, v, ref[i], bound[i])
						}
						key := fmt.Sprintf("%s M=%d", map[DType]string{Q8_0: "q8_0", F16: "f16", Q8_0R8: "q8_0r8"}[d], min(c.m, 9))
						worst[key] = max(worst[key], e/max(mag[i], 1e-6))
					}
				}
			}
			p.Free()
			xb.Free()
			wb.Free()
			yb.Free()
			bb.Free()
		}
	}
	for k, v := range worst {
		t.Logf("worst |error|/Σ|x||w| %s (M=9 stands for the prefill path): %.2e", k, v)
	}
}

// TestLinearQ8R8RowsIndependent: a Q8_0R8 product gives each x row the bits it gets alone,
// however many rows share the call (the VNNI kernels take them 8, 4, 2 or 1 at a time; other
// levels up to 8 rows, beyond which they widen panels for sgemm), on every SIMD level and
// thread count: batched decode steps rely on it to give each stream exactly what it gets
// alone.
func TestLinearQ8R8RowsIndependent(t *testing.T) {
	const n, k, rows = 37, 160, 15
	rng := rand.New(rand.NewPCG(8, 3))
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	x := make([]float32, rows*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	raw, _ := encode(t, w, k, Q8_0R8)
	wb, xb, yb := cBytes(t, raw), cFloats(t, x), cFloats(t, make([]float32, rows*n))
	defer wb.Free()
	defer xb.Free()
	defer yb.Free()
	linear := func(ctx *Context, m int) []float32 {
		p, err := NewPlan([]Node{{Op: OpLinearQ, Src: []int{1, 2}, Dst: 0}}, []Tensor{
			{Data: yb.Ptr(), DType: F32, Shape: []int64{int64(m), n}, Stride: []int64{n, 1}},
			{Data: xb.Ptr(), DType: F32, Shape: []int64{int64(m), k}, Stride: []int64{k, 1}},
			{Data: wb.Ptr(), DType: Q8_0R8, Shape: []int64{n, k}, Stride: []int64{k, 1}},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Free()
		if err := ctx.Execute(p); err != nil {
			t.Fatal(err)
		}
		return slices.Clone(yb.Float32s()[:m*n])
	}
	defer LimitCPUFeatures(Init())
	ctx1, _ := NewContext(1)
	defer ctx1.Close()
	ctx2, _ := NewContext(2)
	defer ctx2.Close()
	for _, lv := range simdLevels() {
		LimitCPUFeatures(lv.mask)
		all := linear(ctx1, rows) // every row computed together (VNNI), then each row alone
		var alone [][]float32
		for r := range rows {
			xr := xb.Float32s()
			copy(xr, x[r*k:(r+1)*k])
			alone = append(alone, linear(ctx1, 1))
		}
		copy(xb.Float32s(), x)
		for _, ctx := range []*Context{ctx1, ctx2} {
			for _, m := range []int{2, 3, 4, 5, 6, 7, 8, 9, 12, 13, rows} {
				if m > 8 && !LinearQVNNI() {
					continue // without VNNI, more than 8 rows widen W for sgemm
				}
				y := all
				if m != rows || ctx != ctx1 {
					y = linear(ctx, m)
				}
				for r := range m {
					if !equalBits(y[r*n:(r+1)*n], alone[r]) {
						t.Fatalf("%s, %d threads: row %d of %d differs from the row alone", lv.name, ctx.Threads(), r, m)
					}
				}
			}
		}
	}
}

// TestLinearQErrors: malformed nodes fail instead of reading out of bounds.
func TestLinearQErrors(t *testing.T) {
	x, _ := Alloc(4 * 64)
	w, _ := Alloc(34 * 2 * 3)
	y, _ := Alloc(4 * 8)
	defer x.Free()
	defer w.Free()
	defer y.Free()
	ctx, _ := NewContext(1)
	defer ctx.Close()
	run := func(xs, ws, ys []int64, wd DType) error {
		p, err := NewPlan([]Node{{Op: OpLinearQ, Src: []int{1, 2}, Dst: 0}}, []Tensor{
			{Data: y.Ptr(), DType: F32, Shape: ys, Stride: Contiguous(ys)},
			{Data: x.Ptr(), DType: F32, Shape: xs, Stride: Contiguous(xs)},
			{Data: w.Ptr(), DType: wd, Shape: ws, Stride: Contiguous(ws)},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Free()
		return ctx.Execute(p)
	}
	if err := run([]int64{1, 64}, []int64{3, 64}, []int64{1, 3}, Q8_0); err != nil {
		t.Fatalf("valid node failed: %v", err)
	}
	for i, c := range []struct {
		xs, ws, ys []int64
		d          DType
	}{
		{[]int64{1, 48}, []int64{3, 48}, []int64{1, 3}, Q8_0}, // K not a whole number of blocks
		{[]int64{1, 64}, []int64{3, 64}, []int64{1, 4}, Q8_0}, // N mismatch
		{[]int64{1, 32}, []int64{3, 64}, []int64{1, 3}, Q8_0}, // K mismatch
		{[]int64{1, 64}, []int64{3, 64}, []int64{1, 3}, F32},  // not a quantised weight
	} {
		if err := run(c.xs, c.ws, c.ys, c.d); err == nil {
			t.Errorf("case %d: bad node ran", i)
		}
	}
}

// TestGatherRowsQuant: gathering from Q8_0/F16 tables yields the dequantised rows exactly.
func TestGatherRowsQuant(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	const n, k = 11, 96
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	idx := []int32{4, 0, 10, 4}
	defer LimitCPUFeatures(Init())
	for _, d := range []DType{Q8_0, F16} {
		raw, deq := encode(t, w, k, d)
		wb, ib, yb := cBytes(t, raw), cBytes(t, unsafe.Slice((*byte)(unsafe.Pointer(&idx[0])), 4*len(idx))), cFloats(t, make([]float32, len(idx)*k))
		p, err := NewPlan([]Node{{Op: OpGatherRows, Src: []int{1, 2}, Dst: 0}}, []Tensor{
			{Data: yb.Ptr(), DType: F32, Shape: []int64{int64(len(idx)), k}, Stride: []int64{k, 1}},
			{Data: wb.Ptr(), DType: d, Shape: []int64{n, k}, Stride: []int64{k, 1}},
			{Data: ib.Ptr(), DType: I32, Shape: []int64{int64(len(idx))}, Stride: []int64{1}},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, _ := NewContext(1)
		for _, lv := range simdLevels() {
			LimitCPUFeatures(lv.mask)
			if err := ctx.Execute(p); err != nil {
				t.Fatal(err)
			}
			for i, r := range idx {
				for j := 0; j < k; j++ {
					if got, want := yb.Float32s()[i*k+j], deq[int(r)*k+j]; got != want {
						t.Fatalf("%d/%s: row %d col %d = %g, want %g", d, lv.name, i, j, got, want)
					}
				}
			}
		}
		ctx.Close()
		p.Free()
		wb.Free()
		ib.Free()
		yb.Free()
	}
}

// TestGoldenQuantKernels runs ggml's golden Q8_0 and F16 files through the engine's own
// dequantisers: GatherRows of every row, and Linear with an identity x (M = K > 8: the
// panel path, whose products with 1 and 0 are exact), both must reproduce ggml's dequantised
// values bit for bit. Q8_0R8 takes the same path except on VNNI, where x is quantised
// (1 → 127·(1/127)) and agreement is to 1e-6 relative.
func TestGoldenQuantKernels(t *testing.T) {
	dir := golden.Root()
	if dir == "" {
		t.Skip("golden data not available; set VOXPIPE_GOLDEN_DIR")
	}
	open := func(name string) *gguf.File {
		f, err := gguf.Open(filepath.Join(dir, "quant", name))
		if err != nil {
			t.Skipf("golden data not available (%v); set VOXPIPE_GOLDEN_DIR", err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	want := open("expected_dequant_f32.gguf")
	defer LimitCPUFeatures(Init())
	for _, c := range []struct {
		file, suffix string
		d            DType
	}{{"q8_0.gguf", "q8_0", Q8_0}, {"f16.gguf", "f16", F16}, {"q8_0.gguf", "q8_0", Q8_0R8}} {
		f := open(c.file)
		for _, name := range []string{"mat_a", "mat_b"} {
			raw, info, err := f.TensorData(name)
			if err != nil {
				t.Fatal(err)
			}
			exp, _, err := want.Float32(name + "." + c.suffix)
			if err != nil {
				t.Fatal(err)
			}
			shape := info.Shape() // [rows, cols]
			n, k := int64(shape[0]), int64(shape[1])
			wraw := raw
			if c.d == Q8_0R8 {
				wraw = make([]byte, WeightBytes(Q8_0R8, n, k))
				if err := RepackQ8_0R8(wraw, raw, n, k); err != nil {
					t.Fatal(err)
				}
			}
			wb := cBytes(t, wraw)
			eye := make([]float32, k*k)
			for i := range k {
				eye[i*k+i] = 1
			}
			xb, yb := cFloats(t, eye), cFloats(t, make([]float32, k*n))
			idx := make([]int32, n)
			for i := range idx {
				idx[i] = int32(i)
			}
			ib, gb := cBytes(t, unsafe.Slice((*byte)(unsafe.Pointer(&idx[0])), 4*len(idx))), cFloats(t, make([]float32, n*k))
			lin, err := NewPlan([]Node{{Op: OpLinearQ, Src: []int{1, 2}, Dst: 0}}, []Tensor{
				{Data: yb.Ptr(), DType: F32, Shape: []int64{k, n}, Stride: []int64{n, 1}},
				{Data: xb.Ptr(), DType: F32, Shape: []int64{k, k}, Stride: []int64{k, 1}},
				{Data: wb.Ptr(), DType: c.d, Shape: []int64{n, k}, Stride: []int64{k, 1}},
			})
			if err != nil {
				t.Fatal(err)
			}
			var gat *Plan
			if c.d != Q8_0R8 {
				if gat, err = NewPlan([]Node{{Op: OpGatherRows, Src: []int{1, 2}, Dst: 0}}, []Tensor{
					{Data: gb.Ptr(), DType: F32, Shape: []int64{n, k}, Stride: []int64{k, 1}},
					{Data: wb.Ptr(), DType: c.d, Shape: []int64{n, k}, Stride: []int64{k, 1}},
					{Data: ib.Ptr(), DType: I32, Shape: []int64{n}, Stride: []int64{1}},
				}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, _ := NewContext(2)
			for _, lv := range simdLevels() {
				LimitCPUFeatures(lv.mask)
				what := fmt.Sprintf("%s %s/%s", c.file, name, lv.name)
				if c.d == Q8_0R8 {
					what = fmt.Sprintf("q8_0r8 %s/%s", name, lv.name)
				}
				if err := ctx.Execute(lin); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				y := yb.Float32s() // y[m, j] = W[j, m]
				exact := c.d != Q8_0R8 || LimitCPUFeatures(lv.mask)&CPUAVX512F == 0
				for j := range n {
					for m := range k {
						got, w := y[m*n+j], exp[j*k+m]
						if got != w && (exact || math.Abs(float64(got-w)) > 1e-6*math.Abs(float64(w))) {
							t.Fatalf("%s: Linear(I, W)[%d, %d] = %g, ggml dequantises W[%d, %d] to %g", what, m, j, got, j, m, w)
						}
					}
				}
				if gat == nil {
					continue
				}
				if err := ctx.Execute(gat); err != nil {
					t.Fatal(err)
				}
				for i, v := range gb.Float32s() {
					if v != exp[i] {
						t.Fatalf("%s: GatherRows[%d] = %g, ggml %g", what, i, v, exp[i])
					}
				}
			}
			ctx.Close()
			lin.Free()
			if gat != nil {
				gat.Free()
			}
			for _, b := range []*Buffer{wb, xb, yb, ib, gb} {
				b.Free()
			}
		}
	}
}

// BenchmarkLinearQ times OpLinearQ on a 2-thread context at the 0.6B LM's FFN shape (K 1024,
// N 3072) for decode (M 1), batched decode of 2, 4 and 8 streams and prefill (M 58), 16 nodes
// per plan, each with its own weight so they stream from memory; GB/s counts the weight bytes.
func BenchmarkLinearQ(b *testing.B) {
	Init()
	rng := rand.New(rand.NewPCG(2, 2))
	const K, N, nodes = 1024, 3072, 16
	w := make([]float32, N*K)
	for i := range w {
		w[i] = float32(rng.NormFloat64() / 32)
	}
	for _, d := range []DType{F16, Q8_0, Q8_0R8} {
		raw, _ := encode(b, w, K, d)
		var ws []*Buffer
		for range nodes {
			ws = append(ws, cBytes(b, raw))
		}
		for _, m := range []int64{1, 2, 4, 8, 58} {
			name := fmt.Sprintf("%s/%dx%dx%d", map[DType]string{Q8_0: "q8_0", F16: "f16", Q8_0R8: "q8_0r8"}[d], m, K, N)
			b.Run(name, func(b *testing.B) {
				x, y := benchBuf(b, rng, m*K), benchBuf(b, rng, m*N)
				defer x.Free()
				defer y.Free()
				ts := []Tensor{tensorOf(x, m, K), tensorOf(y, m, N)}
				var plan []Node
				for i, wb := range ws {
					ts = append(ts, Tensor{Data: wb.Ptr(), DType: d, Shape: []int64{N, K}, Stride: []int64{K, 1}})
					plan = append(plan, Node{Op: OpLinearQ, Src: []int{0, 2 + i}, Dst: 1})
				}
				p, err := NewPlan(plan, ts)
				if err != nil {
					b.Fatal(err)
				}
				defer p.Free()
				ctx := newCtx(b, 2)
				defer ctx.Close()
				b.ResetTimer()
				for range b.N {
					if err := ctx.Execute(p); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(raw))*nodes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
		for _, wb := range ws {
			wb.Free()
		}
	}
}
