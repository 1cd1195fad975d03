package cgo

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// f32pWeight packs W [n, k] into the F32P layout in C memory.
func f32pWeight(t testing.TB, w []float32, n, k int) *Buffer {
	t.Helper()
	packed := make([]byte, WeightBytes(F32P, int64(n), int64(k)))
	if err := RepackF32P(packed, unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*len(w)), int64(n), int64(k)); err != nil {
		t.Fatal(err)
	}
	return cBytes(t, packed)
}

// linearF32P runs y = x·Wᵀ (+ bias) on ctx through one OpLinearQ node over the packed W.
func linearF32P(t testing.TB, ctx *Context, x []float32, w *Buffer, bias []float32, m, n, k int) []float32 {
	t.Helper()
	return linearF32PGroups(t, ctx, x, w, bias, m, n, k, 0)
}

// linearF32PGroups is linearF32P with the node's row groups (IP[0]) set.
func linearF32PGroups(t testing.TB, ctx *Context, x []float32, w *Buffer, bias []float32, m, n, k, groups int) []float32 {
	t.Helper()
	return linearPanels(t, ctx, x, w, F32P, bias, m, n, k, groups)
}

// linearPanels runs one OpLinearQ node over a packed weight of type dt (F32P or F16P).
func linearPanels(t testing.TB, ctx *Context, x []float32, w *Buffer, dt DType, bias []float32, m, n, k, groups int) []float32 {
	t.Helper()
	xb, yb := cFloats(t, x), cFloats(t, make([]float32, m*n))
	defer xb.Free()
	defer yb.Free()
	for i := range yb.Float32s() {
		yb.Float32s()[i] = float32(math.NaN())
	}
	ys, xs, ws := []int64{int64(m), int64(n)}, []int64{int64(m), int64(k)}, []int64{int64(n), int64(k)}
	tensors := []Tensor{
		{Data: yb.Ptr(), DType: F32, Shape: ys, Stride: Contiguous(ys)},
		{Data: xb.Ptr(), DType: F32, Shape: xs, Stride: Contiguous(xs)},
		{Data: w.Ptr(), DType: dt, Shape: ws, Stride: Contiguous(ws)},
	}
	node := Node{Op: OpLinearQ, Src: []int{1, 2}, Dst: 0, IP: [8]int64{int64(groups)}}
	if bias != nil {
		bb := cFloats(t, bias)
		defer bb.Free()
		tensors = append(tensors, Tensor{Data: bb.Ptr(), DType: F32, Shape: []int64{int64(n)}, Stride: []int64{1}})
		node.Src = append(node.Src, 3)
	}
	p, err := NewPlan([]Node{node}, tensors)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Free()
	if err := ctx.Execute(p); err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), yb.Float32s()...)
}

// TestLinearF32P checks the packed-F32 Linear against float64 products on odd shapes (M, N,
// K not multiples of the tiles), with and without bias, on the portable, AVX2 and AVX-512
// paths, 1 and 2 threads, and both the native kernel and the OpenBLAS path for many rows.
// Bound: f32 rounding, 2e-6·K·Σ|x||w| is far looser than needed; 1e-5·Σ|x||w| + 1e-6 holds.
func TestLinearF32P(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {1, 7, 5}, {2, 33, 17}, {3, 80, 64}, {4, 1024, 512}, {5, 47, 300}, {7, 65, 129},
		{8, 32, 32}, {9, 100, 33}, {14, 514, 512}, {16, 1024, 512}, {17, 31, 1000}, {58, 130, 257},
		{150, 96, 64}, {12, 70, 45}, {29, 33, 700},
	}
	rng := rand.New(rand.NewPCG(11, 2))
	defer LimitCPUFeatures(Init())
	defer SetF32PNativeRows(SetF32PNativeRows(128))
	for ci, c := range shapes {
		w := make([]float32, c.n*c.k)
		for i := range w {
			w[i] = float32(rng.NormFloat64() / math.Sqrt(float64(c.k)))
		}
		x, bias := inputsAndBias(rng, c.m, c.n, c.k, ci%2 == 1)
		ref := make([]float64, c.m*c.n)
		bound := make([]float64, c.m*c.n)
		for i := 0; i < c.m; i++ {
			for j := 0; j < c.n; j++ {
				var s, a float64
				for l := 0; l < c.k; l++ {
					p := float64(x[i*c.k+l]) * float64(w[j*c.k+l])
					s += p
					a += math.Abs(p)
				}
				if bias != nil {
					s += float64(bias[j])
					a += math.Abs(float64(bias[j]))
				}
				ref[i*c.n+j], bound[i*c.n+j] = s, 1e-5*a+1e-6
			}
		}
		wb := f32pWeight(t, w, c.n, c.k)
		// The unpacked rows are W itself.
		if got := UnpackF32P(unsafe.Slice((*byte)(wb.Ptr()), WeightBytes(F32P, int64(c.n), int64(c.k))), int64(c.k), 0, int64(c.n)); !equalBits(got, w) {
			t.Fatalf("%dx%d: UnpackF32P does not give W back", c.n, c.k)
		}
		for _, path := range []struct {
			name string
			rows int64
		}{{"native", 1 << 30}, {"openblas", 0}} {
			SetF32PNativeRows(path.rows)
			for _, lv := range simdLevels() {
				LimitCPUFeatures(lv.mask)
				for _, th := range []int{1, 2} {
					name := fmt.Sprintf("%dx%dx%d/%s/%s/%dthr", c.m, c.n, c.k, path.name, lv.name, th)
					ctx, err := NewContext(th)
					if err != nil {
						t.Fatal(err)
					}
					y := linearF32P(t, ctx, x, wb, bias, c.m, c.n, c.k)
					ctx.Close()
					for i, v := range y {
						if e := math.Abs(float64(v) - ref[i]); !(e <= bound[i]) {
							t.Fatalf("%s: y[%d,%d] = %g, want %g ± %g", name, i/c.n, i%c.n, v, ref[i], bound[i])
						}
					}
				}
			}
		}
		wb.Free()
	}
}

// TestLinearF32PRowsIndependent: on the native kernel a row's output has the same bits
// whatever rows are computed with it (1 row alone, or as row r of 1…40), on every SIMD
// level (AVX2 and AVX-512 agree bit for bit too) and thread count: the property batched
// sessions rely on to get exactly what they get alone.
func TestLinearF32PRowsIndependent(t *testing.T) {
	const n, k = 200, 385
	rng := rand.New(rand.NewPCG(4, 9))
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	bias := make([]float32, n)
	for i := range bias {
		bias[i] = float32(rng.NormFloat64())
	}
	x := make([]float32, 40*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	wb := f32pWeight(t, w, n, k)
	defer wb.Free()
	defer LimitCPUFeatures(Init())
	defer SetF32PNativeRows(SetF32PNativeRows(128))
	all := Init()
	ctx1, _ := NewContext(1)
	defer ctx1.Close()
	ctx2, _ := NewContext(2)
	defer ctx2.Close()
	var want [][]float32 // row r alone, AVX2
	LimitCPUFeatures(all &^ CPUAVX512F)
	for r := 0; r < 40; r++ {
		want = append(want, linearF32P(t, ctx1, x[r*k:(r+1)*k], wb, bias, 1, n, k))
	}
	for _, mask := range []int{all &^ CPUAVX512F, all} {
		LimitCPUFeatures(mask)
		for _, ctx := range []*Context{ctx1, ctx2} {
			for _, m := range []int{1, 2, 3, 4, 7, 8, 9, 14, 16, 17, 40} {
				y := linearF32P(t, ctx, x[:m*k], wb, bias, m, n, k)
				for r := 0; r < m; r++ {
					if !equalBits(y[r*n:(r+1)*n], want[r]) {
						t.Fatalf("features %x, %d threads: row %d of %d differs from the row alone", mask, ctx.Threads(), r, m)
					}
				}
			}
		}
	}
}

// TestLinearF32PRowGroups: a product declared as groups of rows (sessions batched together)
// picks its kernel by one group's rows, so rows that would take the OpenBLAS path as one
// product of many rows still equal each row alone on the native kernel.
func TestLinearF32PRowGroups(t *testing.T) {
	const n, k, m = 96, 1000, 40
	rng := rand.New(rand.NewPCG(5, 9))
	w := make([]float32, n*k)
	x := make([]float32, m*k)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	wb := f32pWeight(t, w, n, k)
	defer wb.Free()
	defer SetF32PNativeRows(SetF32PNativeRows(16))
	ctx, _ := NewContext(2)
	defer ctx.Close()
	grouped := linearF32PGroups(t, ctx, x, wb, nil, m, n, k, 4) // 4 groups of 10 rows: native
	whole := linearF32P(t, ctx, x, wb, nil, m, n, k)            // 40 rows: OpenBLAS
	differs := false
	for r := range m {
		alone := linearF32P(t, ctx, x[r*k:(r+1)*k], wb, nil, 1, n, k)
		if !equalBits(grouped[r*n:(r+1)*n], alone) {
			t.Fatalf("row %d of 4 groups of 10 differs from the row alone", r)
		}
		differs = differs || !equalBits(whole[r*n:(r+1)*n], alone)
	}
	if !differs { // K = 1000 spans OpenBLAS's k blocks, which round differently
		t.Fatal("the 40-row product gave the native kernel's bits for every row: this test cannot tell the paths apart")
	}
}

// TestLinearF16P: an F16 weight in the panels (F16P) gives, bit for bit, what the F32P
// kernel gives over the same weight widened to F32 (which TestLinearF32P checks against
// float64 products): on odd shapes, with and without bias, on the portable, AVX2 and AVX-512
// paths, 1 and 2 threads, the native kernel and the OpenBLAS path, and as row groups.
func TestLinearF16P(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1, 1}, {1, 7, 5}, {2, 33, 17}, {3, 80, 64}, {4, 1024, 512}, {5, 47, 300}, {8, 32, 32},
		{9, 100, 33}, {14, 514, 320}, {16, 1024, 512}, {17, 31, 1000}, {150, 96, 64}, {12, 70, 45}, {29, 33, 700},
	}
	rng := rand.New(rand.NewPCG(12, 3))
	defer LimitCPUFeatures(Init())
	defer SetF32PNativeRows(SetF32PNativeRows(128))
	for ci, c := range shapes {
		halves := make([]byte, 2*c.n*c.k)
		wide := make([]float32, c.n*c.k) // the halves' exact values
		for i := range wide {
			h := gguf.Float32ToHalf(float32(rng.NormFloat64() / math.Sqrt(float64(c.k))))
			binary.LittleEndian.PutUint16(halves[2*i:], h)
			wide[i] = gguf.HalfToFloat32(h)
		}
		packed := make([]byte, WeightBytes(F16P, int64(c.n), int64(c.k)))
		if err := RepackF16P(packed, halves, int64(c.n), int64(c.k)); err != nil {
			t.Fatal(err)
		}
		wh, w32 := cBytes(t, packed), f32pWeight(t, wide, c.n, c.k)
		x, bias := inputsAndBias(rng, c.m, c.n, c.k, ci%2 == 1)
		for _, rows := range []int64{1 << 30, 0} { // native, OpenBLAS
			SetF32PNativeRows(rows)
			for _, lv := range simdLevels() {
				LimitCPUFeatures(lv.mask)
				for _, th := range []int{1, 2} {
					ctx, err := NewContext(th)
					if err != nil {
						t.Fatal(err)
					}
					groups := 1 // even row counts also as two groups
					if c.m%2 == 0 {
						groups = 2
					}
					got := linearPanels(t, ctx, x, wh, F16P, bias, c.m, c.n, c.k, groups)
					want := linearPanels(t, ctx, x, w32, F32P, bias, c.m, c.n, c.k, groups)
					ctx.Close()
					if !equalBits(got, want) {
						t.Fatalf("%dx%dx%d/native rows %d/%s/%dthr: F16P differs from F32P over the same values", c.m, c.n, c.k, rows, lv.name, th)
					}
				}
			}
		}
		wh.Free()
		w32.Free()
	}
	if err := RepackF16P(make([]byte, 10), make([]byte, 8), 2, 2); err == nil {
		t.Error("RepackF16P into a buffer of the wrong size: no error")
	}
}

// inputsAndBias are N(0, 1) inputs x [m, k] and, withBias, a bias [n] (else nil).
func inputsAndBias(rng *rand.Rand, m, n, k int, withBias bool) (x, bias []float32) {
	x = make([]float32, m*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	if withBias {
		bias = make([]float32, n)
		for i := range bias {
			bias[i] = float32(rng.NormFloat64())
		}
	}
	return x, bias
}

func equalBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// BenchmarkLinearF32P times the packed-F32 Linear at the MeanVC2 streaming shapes (DiT 16
// rows, vocoder 14, ASR 4) on 1 and 2 threads; GFLOP/s is reported per product. Each run of
// the plan does `copies` products, each over its own weight (one: the weight stays in cache;
// 48: ~100 MB of weights read in turn, as a model's layers read them).
func BenchmarkLinearF32P(b *testing.B) {
	for _, copies := range []int{1, 48} {
		for _, s := range []struct{ m, k, n int }{{16, 512, 1024}, {16, 1024, 512}, {14, 320, 1536}, {14, 1536, 320}, {4, 256, 2048}, {1, 512, 3072}} {
			benchF32P(b, s.m, s.k, s.n, copies)
		}
	}
}

func benchF32P(b *testing.B, m, k, n, copies int) {
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(i%7-3) * 0.01
	}
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(i%5-2) * 0.1
	}
	xb, yb := cFloats(b, x), cFloats(b, make([]float32, m*n))
	defer xb.Free()
	defer yb.Free()
	ys, xs, ws := []int64{int64(m), int64(n)}, []int64{int64(m), int64(k)}, []int64{int64(n), int64(k)}
	tensors := []Tensor{
		{Data: yb.Ptr(), DType: F32, Shape: ys, Stride: Contiguous(ys)},
		{Data: xb.Ptr(), DType: F32, Shape: xs, Stride: Contiguous(xs)},
	}
	var nodes []Node
	for range copies {
		wb := f32pWeight(b, w, n, k)
		defer wb.Free()
		tensors = append(tensors, Tensor{Data: wb.Ptr(), DType: F32P, Shape: ws, Stride: Contiguous(ws)})
		nodes = append(nodes, Node{Op: OpLinearQ, Src: []int{1, len(tensors) - 1}, Dst: 0})
	}
	p, err := NewPlan(nodes, tensors)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Free()
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprintf("%dx%dx%d/%dweights/%dthr", m, k, n, copies, th), func(b *testing.B) {
			ctx, err := NewContext(th)
			if err != nil {
				b.Fatal(err)
			}
			defer ctx.Close()
			for b.Loop() {
				if err := ctx.Execute(p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(2*float64(m*k*n*copies)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
