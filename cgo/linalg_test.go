package cgo

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
)

// ---- strided test tensors in C memory ----

// view is a float32 tensor in a C buffer with arbitrary strides (a view of storage).
type view struct {
	buf    *Buffer
	shape  []int64
	stride []int64
}

// layout describes how a view is stored: order lists the dims from outermost to innermost
// in storage (nil = natural order), pad adds unused elements to a dim's extent in storage,
// bcast marks dims stored once and read with stride 0.
type layout struct {
	order []int
	pad   map[int]int64
	bcast map[int]bool
	step  int64 // spacing of the innermost stored dim (0 or 1 = dense)
}

// newView allocates storage for shape with the layout and fills it with values from fill.
func newView(t testing.TB, shape []int64, lo layout, fill func() float32) *view {
	t.Helper()
	nd := len(shape)
	order := lo.order
	if order == nil {
		order = make([]int, nd)
		for i := range order {
			order[i] = i
		}
	}
	stride := make([]int64, nd)
	st := int64(1)
	if lo.step > 1 {
		st = lo.step
	}
	for i := nd - 1; i >= 0; i-- {
		d := order[i]
		if lo.bcast[d] {
			stride[d] = 0
			continue
		}
		stride[d] = st
		st *= shape[d] + lo.pad[d]
	}
	n := st
	for _, s := range shape {
		if s == 0 {
			n = 1
		}
	}
	b, err := Alloc(int(4 * n))
	if err != nil {
		t.Fatal(err)
	}
	f := b.Float32s()
	for i := range f {
		f[i] = fill()
	}
	return &view{buf: b, shape: shape, stride: stride}
}

func (v *view) tensor() Tensor {
	return Tensor{Data: v.buf.Ptr(), DType: F32, Shape: v.shape, Stride: v.stride}
}

func (v *view) at(idx ...int64) float64 {
	off := int64(0)
	for i, x := range idx {
		off += x * v.stride[i]
	}
	return float64(v.buf.Float32s()[off])
}

func (v *view) free() { v.buf.Free() }

func numel(shape []int64) int64 {
	n := int64(1)
	for _, s := range shape {
		n *= s
	}
	return n
}

// out is a destination buffer, pre-filled with NaN so that unwritten elements show up.
func newOut(t testing.TB, shape []int64) *view {
	t.Helper()
	return newView(t, shape, layout{}, func() float32 { return float32(math.NaN()) })
}

func uniform(rng *rand.Rand) func() float32 {
	return func() float32 { return float32(rng.Float64()*2 - 1) }
}

// ---- running one node on every path ----

var ctxCache = map[int]*Context{}

func testCtx(t testing.TB, threads int) *Context {
	if c, ok := ctxCache[threads]; ok {
		return c
	}
	c := newCtx(t, threads)
	ctxCache[threads] = c
	return c
}

// runNode executes a one-node plan over the given tensors (dst is the last one).
func runNode(t testing.TB, ctx *Context, node Node, ts []Tensor) error {
	t.Helper()
	p, err := NewPlan([]Node{node}, ts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Free()
	return ctx.Execute(p)
}

// variants runs fn for portable/SIMD and 1/2 threads, filling out with NaN before each run
// so that elements a variant fails to write show up.
func variants(t *testing.T, out *view, fn func(t *testing.T, ctx *Context)) {
	t.Helper()
	defer ForcePortable(false)
	for _, portable := range []bool{true, false} {
		for _, threads := range []int{1, 2} {
			ForcePortable(portable)
			ctx := testCtx(t, threads)
			f := out.buf.Float32s()
			for i := range f {
				f[i] = float32(math.NaN())
			}
			fn(t, ctx)
			if t.Failed() {
				t.Logf("(portable=%v threads=%d)", portable, threads)
				return
			}
		}
	}
}

// compare checks got (contiguous over shape) against want, with magnitude giving the scale
// of the terms summed into each element (for the rounding allowance).
func compare(t *testing.T, what string, got *view, want, magnitude []float64) {
	t.Helper()
	g := got.buf.Float32s()
	bad := 0
	for i := range want {
		// got may be strided: walk its shape
		off, rem := int64(0), int64(i)
		for d := len(got.shape) - 1; d >= 0; d-- {
			off += rem % got.shape[d] * got.stride[d]
			rem /= got.shape[d]
		}
		gv := float64(g[off])
		tol := 1e-4*(1+math.Abs(want[i])) + 2e-6*magnitude[i]
		if !(math.Abs(gv-want[i]) <= tol) {
			if bad < 5 {
				t.Errorf("%s: element %d = %v, want %v (tol %.2g)", what, i, gv, want[i], tol)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d elements wrong", what, bad, len(want))
	}
}

// ---- matmul ----

// refMatmul: a [.., M, K], b [.., K, N] (or [.., N, K] when transB), batch broadcast from the
// right against outShape's batch dims.
func refMatmul(a, b, bias *view, transB bool, outShape []int64) (want, mag []float64) {
	nd := len(outShape)
	M, N := outShape[nd-2], outShape[nd-1]
	K := a.shape[len(a.shape)-1]
	nb := numel(outShape[:nd-2])
	want = make([]float64, nb*M*N)
	mag = make([]float64, nb*M*N)
	idxOf := func(v *view, batch []int64, r, c int64) []int64 {
		vn := len(v.shape)
		idx := make([]int64, vn)
		for d := 0; d < vn-2; d++ {
			bd := d + (nd - 2) - (vn - 2)
			if v.shape[d] != 1 {
				idx[d] = batch[bd]
			}
		}
		idx[vn-2], idx[vn-1] = r, c
		return idx
	}
	batch := make([]int64, nd-2)
	for bi := int64(0); bi < nb; bi++ {
		rem := bi
		for d := nd - 3; d >= 0; d-- {
			batch[d] = rem % outShape[d]
			rem /= outShape[d]
		}
		for m := int64(0); m < M; m++ {
			for n := int64(0); n < N; n++ {
				s, ab := 0.0, 0.0
				if bias != nil {
					s = bias.at(n)
					ab = math.Abs(s)
				}
				for k := int64(0); k < K; k++ {
					av := a.at(idxOf(a, batch, m, k)...)
					var bv float64
					if transB {
						bv = b.at(idxOf(b, batch, n, k)...)
					} else {
						bv = b.at(idxOf(b, batch, k, n)...)
					}
					s += av * bv
					ab += math.Abs(av * bv)
				}
				i := (bi*M+m)*N + n
				want[i], mag[i] = s, ab
			}
		}
	}
	return want, mag
}

type mmCase struct {
	name           string
	aShape, bShape []int64
	aLo, bLo       layout
	transB, bias   bool
	outShape       []int64
	outLo          layout // destination layout (padding only)
}

func runMatmul(t *testing.T, rng *rand.Rand, c mmCase) {
	t.Helper()
	a := newView(t, c.aShape, c.aLo, uniform(rng))
	defer a.free()
	b := newView(t, c.bShape, c.bLo, uniform(rng))
	defer b.free()
	ts := []Tensor{a.tensor(), b.tensor()}
	src := []int{0, 1}
	var bias *view
	if c.bias {
		bias = newView(t, []int64{c.outShape[len(c.outShape)-1]}, layout{}, uniform(rng))
		defer bias.free()
		ts = append(ts, bias.tensor())
		src = append(src, 2)
	}
	out := newView(t, c.outShape, c.outLo, func() float32 { return float32(math.NaN()) })
	defer out.free()
	ts = append(ts, out.tensor())
	node := Node{Op: OpMatmul, Src: src, Dst: len(ts) - 1}
	if c.transB {
		node.IP[0] = 1
	}
	want, mag := refMatmul(a, b, bias, c.transB, c.outShape)
	variants(t, out, func(t *testing.T, ctx *Context) {
		if err := runNode(t, ctx, node, ts); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		compare(t, c.name, out, want, mag)
	})
}

func TestMatmulSizes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int64{1, 3, 17, 64, 129}
	for _, M := range sizes {
		for _, N := range sizes {
			for _, K := range sizes {
				for _, transB := range []bool{false, true} {
					bShape := []int64{K, N}
					if transB {
						bShape = []int64{N, K}
					}
					runMatmul(t, rng, mmCase{
						name:   fmt.Sprintf("M%d N%d K%d transB=%v", M, N, K, transB),
						aShape: []int64{M, K}, bShape: bShape, transB: transB,
						bias: (M+N+K)%2 == 1, outShape: []int64{M, N},
					})
					if t.Failed() {
						return
					}
				}
			}
		}
	}
}

func TestMatmulViews(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	T2 := []int{1, 0}       // 2-D transposed storage
	T3 := []int{0, 2, 1}    // 3-D, last two swapped
	T4 := []int{0, 1, 3, 2} // 4-D, last two swapped
	cases := []mmCase{
		{name: "linear over batch (folds into M)", aShape: []int64{2, 3, 17, 64}, bShape: []int64{33, 64},
			transB: true, bias: true, outShape: []int64{2, 3, 17, 33}},
		{name: "linear, B not transposed", aShape: []int64{4, 9, 20}, bShape: []int64{20, 65},
			outShape: []int64{4, 9, 65}},
		{name: "A rows padded (lda > K)", aShape: []int64{5, 31, 40}, aLo: layout{pad: map[int]int64{2: 7}},
			bShape: []int64{40, 19}, outShape: []int64{5, 31, 19}},
		{name: "A transposed in memory", aShape: []int64{3, 30, 20}, aLo: layout{order: T3},
			bShape: []int64{3, 20, 25}, outShape: []int64{3, 30, 25}},
		{name: "B transposed storage of a transB weight", aShape: []int64{12, 70}, bShape: []int64{50, 70},
			bLo: layout{order: T2}, transB: true, bias: true, outShape: []int64{12, 50}},
		{name: "A inner stride 2 (packed)", aShape: []int64{2, 13, 21}, aLo: layout{step: 2},
			bShape: []int64{21, 17}, outShape: []int64{2, 13, 17}},
		{name: "B inner stride 3 (packed)", aShape: []int64{2, 13, 21}, bShape: []int64{2, 17, 21},
			bLo: layout{step: 3}, transB: true, outShape: []int64{2, 13, 17}},
		{name: "broadcast both batch dims", aShape: []int64{2, 1, 9, 33}, bShape: []int64{3, 33, 18},
			outShape: []int64{2, 3, 9, 18}},
		{name: "expanded batch (stride 0, size > 1)", aShape: []int64{4, 11, 24}, aLo: layout{bcast: map[int]bool{0: true}},
			bShape: []int64{4, 24, 29}, outShape: []int64{4, 11, 29}},
		{name: "expanded B batch, transB", aShape: []int64{3, 40, 24}, bShape: []int64{3, 29, 24},
			bLo: layout{bcast: map[int]bool{0: true}}, transB: true, outShape: []int64{3, 40, 29}},
		{name: "attention-like q kT", aShape: []int64{1, 4, 37, 16}, aLo: layout{order: []int{0, 2, 1, 3}},
			bShape: []int64{1, 4, 16, 37}, bLo: layout{order: []int{0, 2, 1, 3}}, outShape: []int64{1, 4, 37, 37}},
		{name: "both transposed 4-D", aShape: []int64{2, 2, 19, 23}, aLo: layout{order: T4},
			bShape: []int64{2, 2, 23, 21}, bLo: layout{order: T4}, outShape: []int64{2, 2, 19, 21}},
		{name: "M=1 over batch (gemv, folds)", aShape: []int64{6, 1, 64}, bShape: []int64{100, 64},
			transB: true, bias: true, outShape: []int64{6, 1, 100}},
		{name: "M=1 with padded batch rows", aShape: []int64{5, 1, 64}, aLo: layout{pad: map[int]int64{1: 2}},
			bShape: []int64{64, 70}, outShape: []int64{5, 1, 70}},
		{name: "N=1", aShape: []int64{3, 50, 64}, bShape: []int64{64, 1}, bias: true, outShape: []int64{3, 50, 1}},
		{name: "N=1 A transposed", aShape: []int64{50, 64}, aLo: layout{order: T2}, bShape: []int64{1, 64},
			transB: true, outShape: []int64{50, 1}},
		{name: "padded output rows", aShape: []int64{2, 33, 40}, bShape: []int64{40, 27}, outShape: []int64{2, 33, 27},
			outLo: layout{pad: map[int]int64{2: 5}}},
		{name: "padded output batch (no fold)", aShape: []int64{3, 33, 40}, bShape: []int64{27, 40}, transB: true,
			outShape: []int64{3, 33, 27}, outLo: layout{pad: map[int]int64{1: 2}}},
		{name: "padded output, M=1", aShape: []int64{3, 1, 40}, bShape: []int64{27, 40}, transB: true,
			outShape: []int64{3, 1, 27}, outLo: layout{pad: map[int]int64{1: 2, 2: 3}}},
		{name: "K=0 gives bias", aShape: []int64{3, 0}, bShape: []int64{0, 4}, bias: true, outShape: []int64{3, 4}},
		{name: "model shape 160x512x512", aShape: []int64{160, 512}, bShape: []int64{512, 512}, transB: true,
			bias: true, outShape: []int64{160, 512}},
		{name: "model shape 16x512x1536", aShape: []int64{1, 16, 512}, bShape: []int64{1536, 512}, transB: true,
			outShape: []int64{1, 16, 1536}},
		{name: "decode 1x1024x3072", aShape: []int64{1, 1, 1024}, bShape: []int64{3072, 1024}, transB: true,
			outShape: []int64{1, 1, 3072}},
	}
	for _, c := range cases {
		runMatmul(t, rng, c)
		if t.Failed() {
			return
		}
	}
}

func expectBadShape(t *testing.T, what string, err error) {
	t.Helper()
	var ee *ExecError
	if !errors.As(err, &ee) || ee.Code != 2 {
		t.Errorf("%s: got %v, want a bad-shape error", what, err)
	}
}

func TestMatmulBadShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ctx := testCtx(t, 2)
	mk := func(shape ...int64) *view { return newView(t, shape, layout{}, uniform(rng)) }
	try := func(what string, ip0 int64, vs ...*view) {
		ts := make([]Tensor, len(vs))
		src := make([]int, len(vs)-1)
		for i, v := range vs {
			ts[i] = v.tensor()
			if i < len(src) {
				src[i] = i
			}
			defer v.free()
		}
		n := Node{Op: OpMatmul, Src: src, Dst: len(vs) - 1}
		n.IP[0] = ip0
		expectBadShape(t, what, runNode(t, ctx, n, ts))
	}
	try("K mismatch", 0, mk(3, 4), mk(5, 6), mk(3, 6))
	try("K mismatch transB", 1, mk(3, 4), mk(6, 5), mk(3, 6))
	try("wrong dst", 0, mk(3, 4), mk(4, 6), mk(3, 7))
	try("batch mismatch", 0, mk(2, 3, 4), mk(3, 4, 6), mk(3, 3, 6))
	try("bias length", 0, mk(3, 4), mk(4, 6), mk(5), mk(3, 6))
	try("1-D A", 0, mk(4), mk(4, 6), mk(1, 6))
}

// ---- conv1d ----

type convCase struct {
	B, Cin, Cout, T, K         int64
	stride, padL, padR, dil, g int64
	xT                         bool // x stored as [B, T, C]
	bias                       bool
}

func refConv1d(x, w, bias *view, c convCase, tout int64) (want, mag []float64) {
	cig, cog := c.Cin/c.g, c.Cout/c.g
	want = make([]float64, c.B*c.Cout*tout)
	mag = make([]float64, len(want))
	for b := int64(0); b < c.B; b++ {
		for co := int64(0); co < c.Cout; co++ {
			g := co / cog
			for t := int64(0); t < tout; t++ {
				s, ab := 0.0, 0.0
				if bias != nil {
					s = bias.at(co)
					ab = math.Abs(s)
				}
				for ci := int64(0); ci < cig; ci++ {
					for k := int64(0); k < c.K; k++ {
						p := t*c.stride + k*c.dil - c.padL
						if p < 0 || p >= c.T {
							continue
						}
						v := x.at(b, g*cig+ci, p) * w.at(co, ci, k)
						s += v
						ab += math.Abs(v)
					}
				}
				i := (b*c.Cout+co)*tout + t
				want[i], mag[i] = s, ab
			}
		}
	}
	return want, mag
}

func TestConv1D(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	cases := []convCase{
		{B: 1, Cin: 16, Cout: 24, T: 37, K: 1, stride: 1, dil: 1, g: 1, bias: true},      // pointwise
		{B: 2, Cin: 16, Cout: 24, T: 37, K: 1, stride: 1, dil: 1, g: 1, xT: true},        // pointwise, x transposed
		{B: 2, Cin: 17, Cout: 9, T: 50, K: 3, stride: 1, padL: 1, padR: 1, dil: 1, g: 1}, // general
		{B: 1, Cin: 8, Cout: 16, T: 33, K: 4, stride: 2, padL: 1, padR: 2, dil: 1, g: 1, bias: true},
		{B: 2, Cin: 6, Cout: 6, T: 40, K: 5, stride: 1, padL: 6, padR: 6, dil: 3, g: 1},
		{B: 1, Cin: 8, Cout: 12, T: 29, K: 3, stride: 1, padL: 4, padR: 0, dil: 2, g: 4, bias: true}, // groups, causal
		{B: 1, Cin: 12, Cout: 8, T: 19, K: 3, stride: 3, padL: 2, padR: 2, dil: 1, g: 2, xT: true},
		{B: 1, Cin: 4, Cout: 32, T: 21, K: 2, stride: 1, padL: 0, padR: 0, dil: 1, g: 4},                     // cig=1, cog=8: gemm path
		{B: 2, Cin: 32, Cout: 32, T: 100, K: 15, stride: 1, padL: 7, padR: 7, dil: 1, g: 32, bias: true},     // depthwise
		{B: 1, Cin: 8, Cout: 8, T: 5, K: 15, stride: 1, padL: 14, padR: 0, dil: 1, g: 8},                     // depthwise, causal, T < K
		{B: 1, Cin: 8, Cout: 8, T: 45, K: 5, stride: 2, padL: 4, padR: 3, dil: 2, g: 8, bias: true},          // depthwise strided dilated
		{B: 1, Cin: 8, Cout: 16, T: 41, K: 7, stride: 1, padL: 3, padR: 3, dil: 1, g: 8},                     // depthwise multiplier 2
		{B: 2, Cin: 16, Cout: 16, T: 70, K: 9, stride: 1, padL: 4, padR: 4, dil: 1, g: 16, xT: true},         // depthwise, x transposed
		{B: 1, Cin: 256, Cout: 256, T: 64, K: 31, stride: 1, padL: 15, padR: 15, dil: 1, g: 256, bias: true}, // depthwise, parallel
		{B: 1, Cin: 24, Cout: 24, T: 14, K: 7, stride: 1, padL: 3, padR: 3, dil: 1, g: 24, bias: true},       // depthwise, a vocoder step
		{B: 2, Cin: 8, Cout: 8, T: 37, K: 7, stride: 1, padL: 6, padR: 0, dil: 2, g: 8},                      // depthwise, causal, masked tail
		{B: 1, Cin: 128, Cout: 96, T: 150, K: 3, stride: 1, padL: 1, padR: 1, dil: 1, g: 1, bias: true},      // parallel gemm
		{B: 1, Cin: 128, Cout: 96, T: 7, K: 1, stride: 1, dil: 1, g: 1, bias: true},                          // short T: split channels
		{B: 1, Cin: 64, Cout: 64, T: 500, K: 7, stride: 1, padL: 3, padR: 3, dil: 1, g: 1},                   // T blocks
	}
	for _, c := range cases {
		name := fmt.Sprintf("%+v", c)
		xlo := layout{}
		if c.xT {
			xlo.order = []int{0, 2, 1}
		}
		x := newView(t, []int64{c.B, c.Cin, c.T}, xlo, uniform(rng))
		w := newView(t, []int64{c.Cout, c.Cin / c.g, c.K}, layout{}, uniform(rng))
		tout := (c.T+c.padL+c.padR-c.dil*(c.K-1)-1)/c.stride + 1
		ts := []Tensor{x.tensor(), w.tensor()}
		src := []int{0, 1}
		var bias *view
		if c.bias {
			bias = newView(t, []int64{c.Cout}, layout{}, uniform(rng))
			ts = append(ts, bias.tensor())
			src = append(src, 2)
		}
		out := newOut(t, []int64{c.B, c.Cout, tout})
		ts = append(ts, out.tensor())
		node := Node{Op: OpConv1D, Src: src, Dst: len(ts) - 1, IP: [8]int64{c.stride, c.padL, c.padR, c.dil, c.g}}
		want, mag := refConv1d(x, w, bias, c, tout)
		variants(t, out, func(t *testing.T, ctx *Context) {
			if err := runNode(t, ctx, node, ts); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			compare(t, name, out, want, mag)
		})
		if c.g == c.Cin { // depthwise rows have an AVX-512 and an AVX2 loop: the latter too
			all := Init()
			LimitCPUFeatures(all &^ CPUAVX512F)
			variants(t, out, func(t *testing.T, ctx *Context) {
				if err := runNode(t, ctx, node, ts); err != nil {
					t.Fatalf("%s avx2: %v", name, err)
				}
				compare(t, name+" avx2", out, want, mag)
			})
			LimitCPUFeatures(all)
		}
		if c.g == 1 {
			checkPacked(t, name, node, ts, w, out, want, mag)
		}
		x.free()
		w.free()
		out.free()
		if bias != nil {
			bias.free()
		}
		if t.Failed() {
			return
		}
	}
}

// checkPacked runs a convolution node again with its kernel w (src 1, a dense view in natural
// order) packed into F32P panels as models/nn loads it, on the native kernel and on the
// OpenBLAS path, against the same reference.
func checkPacked(t *testing.T, name string, node Node, ts []Tensor, w, out *view, want, mag []float64) {
	t.Helper()
	cout := w.shape[0]
	row := numel(w.shape) / cout
	raw := w.buf.Float32s()[:cout*row]
	packed := make([]byte, WeightBytes(F32P, cout, row))
	if err := RepackF32P(packed, unsafe.Slice((*byte)(unsafe.Pointer(&raw[0])), 4*len(raw)), cout, row); err != nil {
		t.Fatal(err)
	}
	pw := cBytes(t, packed)
	defer pw.Free()
	pts := slices.Clone(ts)
	pts[1] = Tensor{Data: pw.Ptr(), DType: F32P, Shape: w.shape, Stride: Contiguous(w.shape)}
	for _, rows := range []int64{1 << 30, 0} { // the native kernel, then OpenBLAS
		old := SetF32PNativeRows(rows)
		variants(t, out, func(t *testing.T, ctx *Context) {
			if err := runNode(t, ctx, node, pts); err != nil {
				t.Fatalf("%s packed: %v", name, err)
			}
			compare(t, name+" packed", out, want, mag)
		})
		SetF32PNativeRows(old)
	}
}

func TestConv1DBadShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	ctx := testCtx(t, 1)
	x := newView(t, []int64{1, 8, 10}, layout{}, uniform(rng))
	defer x.free()
	w := newView(t, []int64{4, 4, 3}, layout{}, uniform(rng))
	defer w.free()
	out := newOut(t, []int64{1, 4, 8})
	defer out.free()
	ts := []Tensor{x.tensor(), w.tensor(), out.tensor()}
	// groups 2 fits (8/2 = 4 input channels per group); groups 1 does not.
	if err := runNode(t, ctx, Node{Op: OpConv1D, Src: []int{0, 1}, Dst: 2, IP: [8]int64{1, 0, 0, 1, 2}}, ts); err != nil {
		t.Fatalf("valid conv: %v", err)
	}
	expectBadShape(t, "Cin/groups mismatch", runNode(t, ctx, Node{Op: OpConv1D, Src: []int{0, 1}, Dst: 2, IP: [8]int64{1, 0, 0, 1, 1}}, ts))
	expectBadShape(t, "wrong output length", runNode(t, ctx, Node{Op: OpConv1D, Src: []int{0, 1}, Dst: 2, IP: [8]int64{1, 1, 0, 1, 2}}, ts))
	expectBadShape(t, "stride 0", runNode(t, ctx, Node{Op: OpConv1D, Src: []int{0, 1}, Dst: 2, IP: [8]int64{0, 0, 0, 1, 2}}, ts))
}

// ---- conv2d ----

type conv2Case struct {
	B, Cin, Cout, H, W, KH, KW int64
	sh, sw, ph, pw, dh, dw, g  int64
	bias                       bool
}

func TestConv2D(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	cases := []conv2Case{
		{B: 1, Cin: 1, Cout: 8, H: 20, W: 16, KH: 3, KW: 3, sh: 2, sw: 2, dh: 1, dw: 1, g: 1, bias: true}, // subsampling
		{B: 2, Cin: 4, Cout: 6, H: 17, W: 13, KH: 3, KW: 3, sh: 2, sw: 2, ph: 1, pw: 1, dh: 1, dw: 1, g: 1},
		{B: 1, Cin: 4, Cout: 4, H: 11, W: 9, KH: 3, KW: 2, sh: 1, sw: 2, ph: 1, pw: 0, dh: 2, dw: 1, g: 2, bias: true},
		{B: 1, Cin: 16, Cout: 16, H: 30, W: 20, KH: 3, KW: 3, sh: 2, sw: 2, dh: 1, dw: 1, g: 1, bias: true}, // parallel
		{B: 1, Cin: 3, Cout: 5, H: 1, W: 7, KH: 1, KW: 3, sh: 1, sw: 1, pw: 1, dh: 1, dw: 1, g: 1},
		{B: 2, Cin: 7, Cout: 37, H: 40, W: 30, KH: 3, KW: 2, sh: 2, sw: 2, ph: 1, pw: 1, dh: 1, dw: 2, g: 1, bias: true}, // > 128 positions
		{B: 1, Cin: 24, Cout: 33, H: 9, W: 39, KH: 3, KW: 3, sh: 2, sw: 2, dh: 1, dw: 1, g: 1, bias: true},               // the ASR's conv.2, small
		{B: 1, Cin: 2, Cout: 3, H: 12, W: 11, KH: 9, KW: 9, sh: 1, sw: 1, ph: 4, pw: 4, dh: 1, dw: 1, g: 1},              // > 64 taps a patch
	}
	for _, c := range cases {
		name := fmt.Sprintf("%+v", c)
		x := newView(t, []int64{c.B, c.Cin, c.H, c.W}, layout{}, uniform(rng))
		w := newView(t, []int64{c.Cout, c.Cin / c.g, c.KH, c.KW}, layout{}, uniform(rng))
		oh := (c.H+2*c.ph-c.dh*(c.KH-1)-1)/c.sh + 1
		ow := (c.W+2*c.pw-c.dw*(c.KW-1)-1)/c.sw + 1
		ts := []Tensor{x.tensor(), w.tensor()}
		src := []int{0, 1}
		var bias *view
		if c.bias {
			bias = newView(t, []int64{c.Cout}, layout{}, uniform(rng))
			ts = append(ts, bias.tensor())
			src = append(src, 2)
		}
		out := newOut(t, []int64{c.B, c.Cout, oh, ow})
		ts = append(ts, out.tensor())
		node := Node{Op: OpConv2D, Src: src, Dst: len(ts) - 1, IP: [8]int64{c.sh, c.sw, c.ph, c.pw, c.dh, c.dw, c.g}}
		cig, cog := c.Cin/c.g, c.Cout/c.g
		want := make([]float64, c.B*c.Cout*oh*ow)
		mag := make([]float64, len(want))
		for b := int64(0); b < c.B; b++ {
			for co := int64(0); co < c.Cout; co++ {
				g := co / cog
				for y := int64(0); y < oh; y++ {
					for xx := int64(0); xx < ow; xx++ {
						s, ab := 0.0, 0.0
						if bias != nil {
							s = bias.at(co)
							ab = math.Abs(s)
						}
						for ci := int64(0); ci < cig; ci++ {
							for kh := int64(0); kh < c.KH; kh++ {
								for kw := int64(0); kw < c.KW; kw++ {
									ih, iw := y*c.sh+kh*c.dh-c.ph, xx*c.sw+kw*c.dw-c.pw
									if ih < 0 || ih >= c.H || iw < 0 || iw >= c.W {
										continue
									}
									v := x.at(b, g*cig+ci, ih, iw) * w.at(co, ci, kh, kw)
									s += v
									ab += math.Abs(v)
								}
							}
						}
						i := ((b*c.Cout+co)*oh+y)*ow + xx
						want[i], mag[i] = s, ab
					}
				}
			}
		}
		variants(t, out, func(t *testing.T, ctx *Context) {
			if err := runNode(t, ctx, node, ts); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			compare(t, name, out, want, mag)
		})
		if c.g == 1 {
			checkPacked(t, name, node, ts, w, out, want, mag)
		}
		x.free()
		w.free()
		out.free()
		if bias != nil {
			bias.free()
		}
		if t.Failed() {
			return
		}
	}
}

// ---- conv_transpose1d ----

type convTCase struct {
	B, Cin, Cout, T, K        int64
	stride, pad, opad, dil, g int64
	bias, xT                  bool
}

func TestConvTranspose1D(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	cases := []convTCase{
		{B: 1, Cin: 8, Cout: 6, T: 10, K: 4, stride: 2, pad: 1, dil: 1, g: 1, bias: true},
		{B: 2, Cin: 6, Cout: 4, T: 7, K: 3, stride: 3, opad: 2, dil: 1, g: 2},
		{B: 1, Cin: 4, Cout: 4, T: 9, K: 5, stride: 1, pad: 2, dil: 2, g: 1, bias: true},
		{B: 1, Cin: 16, Cout: 8, T: 50, K: 16, stride: 8, pad: 4, dil: 1, g: 1, bias: true, xT: true}, // upsampler
		{B: 1, Cin: 4, Cout: 4, T: 6, K: 3, stride: 2, pad: 1, opad: 1, dil: 1, g: 4},
		{B: 1, Cin: 64, Cout: 64, T: 100, K: 8, stride: 4, pad: 2, dil: 1, g: 1, bias: true}, // parallel
		{B: 1, Cin: 3, Cout: 2, T: 1, K: 4, stride: 2, pad: 0, dil: 1, g: 1},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%+v", c)
		xlo := layout{}
		if c.xT {
			xlo.order = []int{0, 2, 1}
		}
		x := newView(t, []int64{c.B, c.Cin, c.T}, xlo, uniform(rng))
		cog, cig := c.Cout/c.g, c.Cin/c.g
		w := newView(t, []int64{c.Cin, cog, c.K}, layout{}, uniform(rng))
		tout := (c.T-1)*c.stride - 2*c.pad + c.dil*(c.K-1) + c.opad + 1
		ts := []Tensor{x.tensor(), w.tensor()}
		src := []int{0, 1}
		var bias *view
		if c.bias {
			bias = newView(t, []int64{c.Cout}, layout{}, uniform(rng))
			ts = append(ts, bias.tensor())
			src = append(src, 2)
		}
		out := newOut(t, []int64{c.B, c.Cout, tout})
		ts = append(ts, out.tensor())
		node := Node{Op: OpConvTranspose1D, Src: src, Dst: len(ts) - 1, IP: [8]int64{c.stride, c.pad, c.opad, c.dil, c.g}}
		want := make([]float64, c.B*c.Cout*tout)
		mag := make([]float64, len(want))
		for b := int64(0); b < c.B; b++ {
			for co := int64(0); co < c.Cout; co++ {
				g, col := co/cog, co%cog
				base := (b*c.Cout + co) * tout
				if bias != nil {
					for q := int64(0); q < tout; q++ {
						want[base+q] = bias.at(co)
						mag[base+q] = math.Abs(bias.at(co))
					}
				}
				for ci := g * cig; ci < (g+1)*cig; ci++ {
					for tt := int64(0); tt < c.T; tt++ {
						for k := int64(0); k < c.K; k++ {
							p := tt*c.stride + k*c.dil - c.pad
							if p < 0 || p >= tout {
								continue
							}
							v := x.at(b, ci, tt) * w.at(ci, col, k)
							want[base+p] += v
							mag[base+p] += math.Abs(v)
						}
					}
				}
			}
		}
		variants(t, out, func(t *testing.T, ctx *Context) {
			if err := runNode(t, ctx, node, ts); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			compare(t, name, out, want, mag)
		})
		x.free()
		w.free()
		out.free()
		if bias != nil {
			bias.free()
		}
		if t.Failed() {
			return
		}
	}
}

// ---- attention ----

type attnCase struct {
	name                    string
	B, H, Hk, Tq, Tk, D, Dv int64
	scale                   float32
	mask                    string // "", "full", "row" ([1, Tk] broadcast), "causal-inf" (with fully masked rows), "tail-inf" ([1, Tk]: a cache bucket's hidden tail and one hidden key)
	bias                    string // "", "full", "heads-bcast" (stride 0 over H)
	qkvTransposed           bool   // q, k, v stored as [B, T, H, D]
	kStep                   int64  // k inner stride (> 1: packed)
	outTransposed           bool   // dst stored as [B, Tq, H, Dv]
}

func runAttention(t *testing.T, rng *rand.Rand, c attnCase) {
	t.Helper()
	lo := layout{}
	if c.qkvTransposed {
		lo.order = []int{0, 2, 1, 3}
	}
	q := newView(t, []int64{c.B, c.H, c.Tq, c.D}, lo, uniform(rng))
	defer q.free()
	klo := lo
	klo.step = c.kStep
	k := newView(t, []int64{c.B, c.Hk, c.Tk, c.D}, klo, uniform(rng))
	defer k.free()
	v := newView(t, []int64{c.B, c.Hk, c.Tk, c.Dv}, lo, uniform(rng))
	defer v.free()
	ts := []Tensor{q.tensor(), k.tensor(), v.tensor()}
	node := Node{Op: OpAttention, Src: []int{0, 1, 2}, FP: [4]float32{c.scale}}

	var mask, bias *view
	maskAt := func(i, j int64) float64 { return 0 }
	biasAt := func(h, i, j int64) float64 { return 0 }
	if c.mask != "" {
		node.IP[0] = 1
		switch c.mask {
		case "full":
			mask = newView(t, []int64{c.Tq, c.Tk}, layout{}, func() float32 { return float32(rng.Float64() - 0.5) })
		case "row":
			mask = newView(t, []int64{1, c.Tk}, layout{}, func() float32 { return float32(rng.Float64() - 0.5) })
		case "tail-inf": // a decode mask over a cache bucket: the tail not yet written, and key 2
			mask = newView(t, []int64{1, c.Tk}, layout{}, func() float32 { return float32(rng.Float64() - 0.5) })
			m := mask.buf.Float32s()
			for j := int64(0); j < c.Tk; j++ {
				if j == 2 || j >= c.Tk*2/3 {
					m[j] = float32(math.Inf(-1))
				}
			}
		case "window-inf": // a sliding window: keys before it and after it hidden, and one inside
			mask = newView(t, []int64{1, c.Tk}, layout{}, func() float32 { return float32(rng.Float64() - 0.5) })
			m := mask.buf.Float32s()
			for j := int64(0); j < c.Tk; j++ {
				if j < c.Tk/3 || j == c.Tk/2 || j >= c.Tk*3/4 {
					m[j] = float32(math.Inf(-1))
				}
			}
		case "bcast-rows": // [Tq, Tk] with stride 0 over rows
			mask = newView(t, []int64{c.Tq, c.Tk}, layout{bcast: map[int]bool{0: true}}, func() float32 { return float32(rng.Float64()) })
		case "causal-inf":
			mask = newView(t, []int64{c.Tq, c.Tk}, layout{}, func() float32 { return 0 })
			m := mask.buf.Float32s()
			for i := int64(0); i < c.Tq; i++ {
				for j := int64(0); j < c.Tk; j++ {
					// row 1 fully masked; otherwise causal (aligned to the end)
					if i == 1 || j > i+c.Tk-c.Tq {
						m[i*c.Tk+j] = float32(math.Inf(-1))
					}
				}
			}
		}
		defer mask.free()
		maskAt = func(i, j int64) float64 {
			if mask.shape[0] == 1 {
				i = 0
			}
			return mask.at(i, j)
		}
		ts = append(ts, mask.tensor())
	} else {
		ts = append(ts, q.tensor()) // placeholder source 3 (unused: ip[0] = 0)
	}
	node.Src = append(node.Src, 3)
	if c.bias != "" {
		node.IP[1] = 1
		blo := layout{}
		if c.bias == "heads-bcast" {
			blo.bcast = map[int]bool{0: true}
		}
		bias = newView(t, []int64{c.H, c.Tq, c.Tk}, blo, uniform(rng))
		defer bias.free()
		biasAt = func(h, i, j int64) float64 { return bias.at(h, i, j) }
		ts = append(ts, bias.tensor())
		node.Src = append(node.Src, 4)
	}
	olo := layout{}
	if c.outTransposed {
		olo.order = []int{0, 2, 1, 3}
	}
	out := newView(t, []int64{c.B, c.H, c.Tq, c.Dv}, olo, func() float32 { return float32(math.NaN()) })
	defer out.free()
	ts = append(ts, out.tensor())
	node.Dst = len(ts) - 1

	G := c.H / c.Hk
	want := make([]float64, c.B*c.H*c.Tq*c.Dv)
	mag := make([]float64, len(want))
	logits := make([]float64, c.Tk)
	for b := int64(0); b < c.B; b++ {
		for h := int64(0); h < c.H; h++ {
			hk := h / G
			for i := int64(0); i < c.Tq; i++ {
				mx := math.Inf(-1)
				for j := int64(0); j < c.Tk; j++ {
					s := 0.0
					for d := int64(0); d < c.D; d++ {
						s += q.at(b, h, i, d) * k.at(b, hk, j, d)
					}
					s = s*float64(c.scale) + biasAt(h, i, j) + maskAt(i, j)
					logits[j] = s
					mx = math.Max(mx, s)
				}
				base := ((b*c.H+h)*c.Tq + i) * c.Dv
				if math.IsInf(mx, -1) {
					continue // all masked: zeros
				}
				sum := 0.0
				for j := range logits {
					logits[j] = math.Exp(logits[j] - mx)
					sum += logits[j]
				}
				for e := int64(0); e < c.Dv; e++ {
					o := 0.0
					for j := int64(0); j < c.Tk; j++ {
						o += logits[j] / sum * v.at(b, hk, j, e)
					}
					want[base+e] = o
					mag[base+e] = 1
				}
			}
		}
	}
	variants(t, out, func(t *testing.T, ctx *Context) {
		if err := runNode(t, ctx, node, ts); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		compare(t, c.name, out, want, mag)
	})
}

func TestAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	cases := []attnCase{
		{name: "plain", B: 1, H: 2, Hk: 2, Tq: 5, Tk: 7, D: 8, Dv: 8, scale: 0.35},
		{name: "GQA, mask with -inf rows, bias", B: 2, H: 4, Hk: 2, Tq: 3, Tk: 17, D: 16, Dv: 12, scale: 0.25,
			mask: "causal-inf", bias: "full"},
		{name: "decode GQA, row mask, head-broadcast bias", B: 1, H: 8, Hk: 2, Tq: 1, Tk: 33, D: 64, Dv: 64,
			scale: 0.125, mask: "row", bias: "heads-bcast"},
		{name: "decode GQA, per-head bias and full mask", B: 2, H: 6, Hk: 2, Tq: 1, Tk: 20, D: 16, Dv: 8,
			scale: 0.3, mask: "full", bias: "full"},
		{name: "decode MHA", B: 2, H: 3, Hk: 3, Tq: 1, Tk: 65, D: 32, Dv: 17, scale: 0.2, mask: "row"},
		{name: "decode GQA over a cache bucket (hidden tail)", B: 1, H: 16, Hk: 8, Tq: 1, Tk: 35, D: 128, Dv: 128,
			scale: 0.088, mask: "tail-inf"},
		{name: "decode GQA, 4 heads a kv head, hidden tail, bias", B: 2, H: 8, Hk: 2, Tq: 1, Tk: 13, D: 16, Dv: 24,
			scale: 0.25, mask: "tail-inf", bias: "heads-bcast"},
		{name: "decode GQA, 3 heads a kv head, sliding window, values not a multiple of 32", B: 2, H: 6, Hk: 2,
			Tq: 1, Tk: 50, D: 24, Dv: 40, scale: 0.3, mask: "window-inf", bias: "full"},
		{name: "decode GQA, strided q/k/v and out", B: 1, H: 4, Hk: 1, Tq: 1, Tk: 40, D: 24, Dv: 24, scale: 0.2,
			qkvTransposed: true, outTransposed: true},
		{name: "row mask broadcast over queries", B: 1, H: 2, Hk: 1, Tq: 4, Tk: 9, D: 8, Dv: 5, scale: 0.5, mask: "row"},
		{name: "stride-0 rows mask", B: 1, H: 2, Hk: 2, Tq: 6, Tk: 11, D: 8, Dv: 8, scale: 0.5, mask: "bcast-rows"},
		{name: "strided q/k/v ([B,T,H,D] storage), strided out", B: 2, H: 4, Hk: 2, Tq: 13, Tk: 13, D: 16, Dv: 16,
			scale: 0.25, qkvTransposed: true, outTransposed: true, mask: "full"},
		{name: "k inner stride 2 (packed)", B: 1, H: 2, Hk: 2, Tq: 9, Tk: 10, D: 8, Dv: 8, scale: 0.3, kStep: 2},
		{name: "Tq=Tk=100 D=64 causal", B: 1, H: 4, Hk: 4, Tq: 100, Tk: 100, D: 64, Dv: 64, scale: 0.125,
			mask: "causal-inf", bias: "full"},
		{name: "long keys, query blocks", B: 1, H: 1, Hk: 1, Tq: 37, Tk: 500, D: 64, Dv: 64, scale: 0.125},
		{name: "Tk=1", B: 1, H: 2, Hk: 1, Tq: 3, Tk: 1, D: 4, Dv: 3, scale: 1},
		{name: "odd sizes", B: 3, H: 6, Hk: 3, Tq: 7, Tk: 129, D: 17, Dv: 3, scale: 0.3, mask: "full", bias: "heads-bcast"},
	}
	for _, c := range cases {
		runAttention(t, rng, c)
		if t.Failed() {
			return
		}
	}
}

func TestAttentionBadShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	ctx := testCtx(t, 1)
	mk := func(shape ...int64) *view { return newView(t, shape, layout{}, uniform(rng)) }
	q, k, v := mk(1, 3, 4, 8), mk(1, 2, 5, 8), mk(1, 2, 5, 8)
	out := mk(1, 3, 4, 8)
	defer func() {
		for _, x := range []*view{q, k, v, out} {
			x.free()
		}
	}()
	ts := []Tensor{q.tensor(), k.tensor(), v.tensor(), out.tensor()}
	expectBadShape(t, "H % Hk != 0", runNode(t, ctx, Node{Op: OpAttention, Src: []int{0, 1, 2}, Dst: 3}, ts))
	ts[0] = Tensor{Data: q.buf.Ptr(), DType: F32, Shape: []int64{1, 2, 4, 8}, Stride: Contiguous([]int64{1, 2, 4, 8})}
	ts[3] = Tensor{Data: out.buf.Ptr(), DType: F32, Shape: []int64{1, 2, 4, 8}, Stride: Contiguous([]int64{1, 2, 4, 8})}
	if err := runNode(t, ctx, Node{Op: OpAttention, Src: []int{0, 1, 2}, Dst: 3}, ts); err != nil {
		t.Fatalf("valid attention: %v", err)
	}
	ts[3].Shape = []int64{1, 2, 5, 8}
	expectBadShape(t, "wrong dst", runNode(t, ctx, Node{Op: OpAttention, Src: []int{0, 1, 2}, Dst: 3}, ts))
	ts[3].Shape = []int64{1, 2, 4, 8}
	n := Node{Op: OpAttention, Src: []int{0, 1, 2, 3}, Dst: 3}
	n.IP[0] = 1 // mask [1,2,4,8] is not [Tq, Tk]
	expectBadShape(t, "bad mask", runNode(t, ctx, n, ts))
}

var _ = unsafe.Pointer(nil)
