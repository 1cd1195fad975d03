package cgo

// Tests of the elementwise kernels (UNARY, BINARY, SNAKE_BETA) against float64 references,
// plus the small harness shared by data_test.go and norm_test.go (names start with "el").
// Every case runs with the portable and the SIMD paths and with 1 and 2 threads.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// ---- harness ----

// elMem owns the C buffers of one test.
type elMem struct {
	t    testing.TB
	bufs []*Buffer
}

func elNewMem(t testing.TB) *elMem {
	m := &elMem{t: t}
	t.Cleanup(func() {
		for _, b := range m.bufs {
			b.Free()
		}
	})
	return m
}

// elArr is a (possibly strided) view of C memory holding 4-byte elements.
type elArr struct {
	buf    *Buffer
	off    int64
	shape  []int64
	stride []int64
	dtype  DType
}

func (m *elMem) arr(dtype DType, shape ...int64) elArr {
	n := int64(1)
	for _, s := range shape {
		n *= s
	}
	b, err := Alloc(int(n) * 4)
	if err != nil {
		m.t.Fatal(err)
	}
	m.bufs = append(m.bufs, b)
	return elArr{buf: b, shape: append([]int64(nil), shape...), stride: Contiguous(shape), dtype: dtype}
}

func (m *elMem) f32(shape ...int64) elArr { return m.arr(F32, shape...) }
func (m *elMem) i32(shape ...int64) elArr { return m.arr(I32, shape...) }

// randn returns a contiguous f32 array of normal(mean, std) values.
func (m *elMem) randn(r *rand.Rand, mean, std float64, shape ...int64) elArr {
	a := m.f32(shape...)
	a.fill(func() float64 { return mean + std*r.NormFloat64() })
	return a
}

func (a elArr) tensor() Tensor {
	return Tensor{Data: unsafe.Add(a.buf.Ptr(), a.off*4), DType: a.dtype, Shape: a.shape, Stride: a.stride}
}

func (a elArr) numel() int64 {
	n := int64(1)
	for _, s := range a.shape {
		n *= s
	}
	return n
}

func (a elArr) pos(idx []int64) int64 {
	p := a.off
	for i, v := range idx {
		p += v * a.stride[i]
	}
	return p
}

func (a elArr) at(idx []int64) float64 {
	if a.dtype == I32 {
		return float64(a.buf.Int32s()[a.pos(idx)])
	}
	return float64(a.buf.Float32s()[a.pos(idx)])
}

func (a elArr) set(idx []int64, v float64) {
	if a.dtype == I32 {
		a.buf.Int32s()[a.pos(idx)] = int32(v)
		return
	}
	a.buf.Float32s()[a.pos(idx)] = float32(v)
}

// fill sets every element of the view, in row-major order, to gen().
func (a elArr) fill(gen func() float64) {
	elForEach(a.shape, func(idx []int64) { a.set(idx, gen()) })
}

// values returns the view's elements in row-major order.
func (a elArr) values() []float64 {
	out := make([]float64, 0, a.numel())
	elForEach(a.shape, func(idx []int64) { out = append(out, a.at(idx)) })
	return out
}

func (a elArr) setValues(v []float64) {
	i := 0
	elForEach(a.shape, func(idx []int64) { a.set(idx, v[i]); i++ })
}

func (a elArr) permute(perm ...int) elArr {
	b := a
	b.shape = make([]int64, len(perm))
	b.stride = make([]int64, len(perm))
	for i, p := range perm {
		b.shape[i], b.stride[i] = a.shape[p], a.stride[p]
	}
	return b
}

// slice keeps [start, start+n*step) with the given step along dim.
func (a elArr) slice(dim int, start, n, step int64) elArr {
	b := a
	b.shape = append([]int64(nil), a.shape...)
	b.stride = append([]int64(nil), a.stride...)
	b.off += start * a.stride[dim]
	b.shape[dim] = n
	b.stride[dim] *= step
	return b
}

// expand broadcasts a size-1 dim to n (stride 0).
func (a elArr) expand(dim int, n int64) elArr {
	b := a
	b.shape = append([]int64(nil), a.shape...)
	b.stride = append([]int64(nil), a.stride...)
	b.shape[dim], b.stride[dim] = n, 0
	return b
}

// reshape reinterprets a contiguous view.
func (a elArr) reshape(shape ...int64) elArr {
	b := a
	b.shape = append([]int64(nil), shape...)
	b.stride = Contiguous(shape)
	return b
}

func elForEach(shape []int64, fn func(idx []int64)) {
	for _, s := range shape {
		if s == 0 {
			return
		}
	}
	idx := make([]int64, len(shape))
	for {
		fn(idx)
		k := len(shape) - 1
		for ; k >= 0; k-- {
			idx[k]++
			if idx[k] < shape[k] {
				break
			}
			idx[k] = 0
		}
		if k < 0 {
			return
		}
	}
}

// elOp is one node's operation and parameters.
type elOp struct {
	op Op
	ip [8]int64
	fp [4]float32
}

type elCfg struct {
	portable bool
	threads  int
	avx2     bool // AVX-512 turned off: the AVX2 kernels on a machine that has both
}

func (c elCfg) String() string {
	p := "simd"
	if c.portable {
		p = "portable"
	} else if c.avx2 {
		p = "avx2"
	}
	return fmt.Sprintf("%s/%dthr", p, c.threads)
}

var elCfgs = []elCfg{{true, 1, false}, {true, 2, false}, {false, 1, false}, {false, 2, false}, {false, 2, true}}

// use sets the kernels c runs (portable, or SIMD with or without AVX-512).
func (c elCfg) use() {
	all := Init()
	if c.avx2 {
		LimitCPUFeatures(all &^ CPUAVX512F)
	} else {
		LimitCPUFeatures(all)
	}
	ForcePortable(c.portable)
}

func elPlan(t testing.TB, o elOp, dst elArr, srcs []elArr) *Plan {
	t.Helper()
	tensors := []Tensor{dst.tensor()}
	node := Node{Op: o.op, Dst: 0, IP: o.ip, FP: o.fp}
	for i, s := range srcs {
		tensors = append(tensors, s.tensor())
		node.Src = append(node.Src, i+1)
	}
	p, err := NewPlan([]Node{node}, tensors)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// elExec runs the node under every configuration: reset() restores inputs (and may poison
// the output), then check(cfg) inspects the result. The output is poisoned with NaN (or
// 0x7fc00000 for int32) before each run unless it aliases an input.
func elExec(t *testing.T, o elOp, dst elArr, srcs []elArr, reset func(), check func(cfg string)) {
	t.Helper()
	p := elPlan(t, o, dst, srcs)
	defer p.Free()
	defer ForcePortable(false)
	defer LimitCPUFeatures(Init())
	aliased := false
	for _, s := range srcs {
		aliased = aliased || s.buf == dst.buf
	}
	for _, c := range elCfgs {
		c.use()
		ctx, err := NewContext(c.threads)
		if err != nil {
			t.Fatal(err)
		}
		if reset != nil {
			reset()
		}
		if !aliased {
			dst.fill(func() float64 { return math.NaN() })
		}
		err = ctx.Execute(p)
		ctx.Close()
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		check(c.String())
		if t.Failed() {
			return
		}
	}
}

// elExecErr expects the node to fail with the given code under every configuration.
func elExecErr(t *testing.T, o elOp, dst elArr, srcs []elArr, code int) {
	t.Helper()
	p := elPlan(t, o, dst, srcs)
	defer p.Free()
	defer ForcePortable(false)
	defer LimitCPUFeatures(Init())
	for _, c := range elCfgs {
		c.use()
		ctx, err := NewContext(c.threads)
		if err != nil {
			t.Fatal(err)
		}
		err = ctx.Execute(p)
		ctx.Close()
		var e *ExecError
		if !errors.As(err, &e) || e.Code != code || e.Node != 0 {
			t.Fatalf("%s: got %v, want error code %d", c, err, code)
		}
	}
}

// elClose reports whether got matches want within atol + rtol*|want| (NaN matches NaN,
// infinities must be equal).
func elClose(got, want, rtol, atol float64) bool {
	if math.IsNaN(want) || math.IsNaN(got) {
		return math.IsNaN(want) && math.IsNaN(got)
	}
	if math.IsInf(want, 0) || math.IsInf(got, 0) {
		return got == want
	}
	return math.Abs(got-want) <= atol+rtol*math.Abs(want)
}

// elCheck compares a view's values (row-major) with want.
func elCheck(t *testing.T, what string, got elArr, want []float64, rtol, atol float64) {
	t.Helper()
	g := got.values()
	if len(g) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(g), len(want))
	}
	bad := 0
	for i := range g {
		if !elClose(g[i], want[i], rtol, atol) {
			if bad < 5 {
				t.Errorf("%s: [%d] = %.9g, want %.9g (diff %.3g)", what, i, g[i], want[i], g[i]-want[i])
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d values off", what, bad, len(g))
	}
}

// elCheckTol compares with a per-element absolute tolerance tol[i].
func elCheckTol(t *testing.T, what string, got elArr, want, tol []float64) {
	t.Helper()
	g := got.values()
	bad := 0
	for i := range g {
		if !elClose(g[i], want[i], 0, tol[i]) {
			if bad < 5 {
				t.Errorf("%s: [%d] = %.9g, want %.9g (diff %.3g, tol %.3g)", what, i, g[i], want[i], g[i]-want[i], tol[i])
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d values off", what, bad, len(g))
	}
}

// elCheckExact requires bit-for-bit equal values (as float64 conversions; NaN == NaN).
func elCheckExact(t *testing.T, what string, got elArr, want []float64) {
	t.Helper()
	elCheck(t, what, got, want, 0, 0)
}

func elRand() *rand.Rand { return rand.New(rand.NewPCG(0x5eed, 0xe1e)) }

// ---- UNARY ----

func unaryRef(f int, x, p0, p1 float64) float64 {
	switch f {
	case UNeg:
		return -x
	case UExp:
		return math.Exp(x)
	case ULog:
		return math.Log(x)
	case USin:
		return math.Sin(x)
	case UCos:
		return math.Cos(x)
	case USqrt:
		return math.Sqrt(x)
	case UTanh:
		return math.Tanh(x)
	case USigmoid:
		return 1 / (1 + math.Exp(-x))
	case UReLU:
		if x < 0 {
			return 0
		}
		return x
	case USiLU:
		return x / (1 + math.Exp(-x))
	case UGELUErf:
		return 0.5 * x * math.Erfc(-x/math.Sqrt2)
	case UGELUTanh: // 0.5 x (1 + tanh(u)) = x sigmoid(2u), without cancellation
		return x / (1 + math.Exp(-2*math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	case UAbs:
		return math.Abs(x)
	case UClamp:
		return math.Min(math.Max(x, p0), p1)
	case UScale:
		return p0*x + p1
	case USquare:
		return x * x
	case URecip:
		return 1 / x
	}
	panic("unary")
}

var unaryNames = []string{"neg", "exp", "log", "sin", "cos", "sqrt", "tanh", "sigmoid", "relu", "silu",
	"gelu_erf", "gelu_tanh", "abs", "clamp", "scale", "square", "recip"}

// unaryInput draws an input in the function's useful domain.
func unaryInput(f int, r *rand.Rand) float64 {
	switch f {
	case ULog, USqrt:
		return math.Exp(r.Float64()*20 - 10)
	case URecip:
		v := math.Exp(r.Float64()*10 - 5)
		if r.IntN(2) == 0 {
			v = -v
		}
		return v
	case UExp:
		return r.Float64()*170 - 85
	case USin, UCos:
		return r.Float64()*20 - 10
	default:
		return r.NormFloat64() * 4
	}
}

// unaryTols is the per-element absolute tolerance: unaryTol's, and for GELU(tanh) a relative
// bound that grows with |2u| = |2 sqrt(2/pi) (x + 0.044715 x^3)| in the negative tail, where
// the float rounding of the exponent's argument dominates (inherent to float evaluation).
func unaryTols(f int, xs, want []float64) []float64 {
	rt, at := unaryTol(f)
	tol := make([]float64, len(xs))
	for i, x := range xs {
		r := rt
		if f == UGELUTanh {
			r += 2e-7 * math.Abs(2*math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x))
		}
		tol[i] = at + r*math.Abs(want[i])
	}
	return tol
}

// Tolerances (relative, absolute) per function. Our vector exp is within 3 ulp; tanh,
// sigmoid, SiLU, GELU(tanh) within 5e-7 relative; GELU(erf) within 1e-6 relative (absolute
// 1e-30 in the far negative tail, where the input's own rounding dominates); libm paths
// within a few ulp.
func unaryTol(f int) (float64, float64) {
	switch f {
	case UNeg, UReLU, UAbs, UClamp, USquare, URecip, USqrt:
		return 1e-7, 0
	case UScale: // the SIMD path rounds once (FMA), the portable path twice
		return 1e-6, 4e-6
	case USin, UCos:
		return 1e-6, 1e-7
	case UGELUErf, UGELUTanh:
		return 2e-6, 1e-30
	default:
		return 1e-6, 1e-37
	}
}

func TestUnary(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	special := []float64{0, math.Copysign(0, -1), 1, -1, 1e-8, -1e-8, 0.5, -0.5, 10, -10, 30, -30, 88, -88,
		100, -100, math.Inf(1), math.Inf(-1), math.NaN()}
	for f := 0; f < len(unaryNames); f++ {
		for _, n := range []int64{1, 3, 17, 63, 129, 1000, 70001} {
			x := m.f32(n)
			var xin []float64
			for i := int64(0); i < n; i++ {
				xin = append(xin, unaryInput(f, r))
			}
			if n == 129 {
				copy(xin, special)
			}
			x.setValues(xin)
			p0, p1 := float32(-0.75), float32(1.5)
			if f == UScale {
				p0, p1 = 1.7, -0.3
			}
			want := make([]float64, n)
			for i, v := range xin {
				want[i] = float64(float32(unaryRef(f, float64(float32(v)), float64(p0), float64(p1))))
			}
			tol := unaryTols(f, x.values(), want)
			o := elOp{op: OpUnary, ip: [8]int64{int64(f)}, fp: [4]float32{p0, p1}}
			y := m.f32(n)
			name := fmt.Sprintf("%s n=%d", unaryNames[f], n)
			elExec(t, o, y, []elArr{x}, nil, func(cfg string) { elCheckTol(t, name+" "+cfg, y, want, tol) })
			// in place
			elExec(t, o, x, []elArr{x}, func() { x.setValues(xin) }, func(cfg string) {
				elCheckTol(t, name+" in-place "+cfg, x, want, tol)
			})
		}
	}
}

// TestUnaryAccuracy sweeps the transcendental functions densely over their ranges.
func TestUnaryAccuracy(t *testing.T) {
	m := elNewMem(t)
	const n = 200001
	cases := []struct {
		f      int
		lo, hi float64
	}{
		{UExp, -103, 88.7}, {UTanh, -12, 12}, {USigmoid, -90, 90}, {USiLU, -90, 90},
		{UGELUErf, -14, 14}, {UGELUTanh, -14, 14}, {UTanh, -0.01, 0.01}, {UGELUErf, -2, 2},
	}
	for _, c := range cases {
		x := m.f32(n)
		y := m.f32(n)
		xs := make([]float64, n)
		want := make([]float64, n)
		for i := range xs {
			xs[i] = float64(float32(c.lo + (c.hi-c.lo)*float64(i)/(n-1)))
			want[i] = float64(float32(unaryRef(c.f, xs[i], 0, 0)))
		}
		x.setValues(xs)
		tol := unaryTols(c.f, xs, want)
		if c.f == UExp {
			for i := range tol {
				tol[i] += 1e-44 // denormal results
			}
		}
		name := fmt.Sprintf("%s sweep [%g, %g]", unaryNames[c.f], c.lo, c.hi)
		elExec(t, elOp{op: OpUnary, ip: [8]int64{int64(c.f)}}, y, []elArr{x}, nil, func(cfg string) {
			elCheckTol(t, name+" "+cfg, y, want, tol)
		})
	}
}

func TestUnaryErrors(t *testing.T) {
	m := elNewMem(t)
	x, y := m.f32(4, 5), m.f32(5, 4)
	elExecErr(t, elOp{op: OpUnary}, y, []elArr{x}, 2)
	elExecErr(t, elOp{op: OpUnary}, m.f32(20), []elArr{x.permute(1, 0)}, 2) // not contiguous
	elExecErr(t, elOp{op: OpUnary, ip: [8]int64{URecip + 1}}, m.f32(4, 5), []elArr{x}, 1)
}

// ---- BINARY ----

func binaryRef(op int, a, b float64) float64 {
	switch op {
	case BAdd:
		return float64(float32(a) + float32(b))
	case BSub:
		return float64(float32(a) - float32(b))
	case BMul:
		return float64(float32(a) * float32(b))
	case BDiv:
		return float64(float32(a) / float32(b))
	case BMax:
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.NaN()
		}
		return math.Max(a, b)
	case BMin:
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.NaN()
		}
		return math.Min(a, b)
	}
	panic("binary")
}

// elBroadcastAt reads view a at output index idx with numpy broadcasting (right-aligned).
func elBroadcastAt(a elArr, idx []int64) float64 {
	off := len(idx) - len(a.shape)
	ai := make([]int64, len(a.shape))
	for i := range ai {
		if a.shape[i] != 1 {
			ai[i] = idx[off+i]
		}
	}
	return a.at(ai)
}

func TestBinary(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	type tc struct {
		name string
		out  []int64
		a, b func() elArr
	}
	rn := func(shape ...int64) func() elArr {
		return func() elArr { return m.randn(r, 0, 2, shape...) }
	}
	out := []int64{3, 5, 17, 7}
	cases := []tc{
		{"same", []int64{17, 63}, rn(17, 63), rn(17, 63)},
		{"same-long", []int64{70001}, rn(70001), rn(70001)},
		{"scalar-b", []int64{3, 129}, rn(3, 129), rn()},
		{"scalar-b1", []int64{3, 129}, rn(3, 129), rn(1)},
		{"scalar-a", []int64{3, 129}, rn(), rn(3, 129)},
		{"row", []int64{63, 129}, rn(63, 129), rn(129)},
		{"row-a", []int64{63, 129}, rn(129), rn(63, 129)},
		{"col", []int64{63, 129}, rn(63, 129), rn(63, 1)},
		{"col-a", []int64{63, 17}, rn(63, 1), rn(63, 17)},
		{"outer", []int64{17, 63}, rn(17, 1), rn(1, 63)},
		{"5d", []int64{2, 3, 1, 5, 3}, rn(2, 1, 1, 5, 1), rn(3, 1, 1, 3)},
		{"1", []int64{1}, rn(1), rn(1)},
		{"empty", []int64{0, 5}, rn(0, 5), rn(5)},
	}
	for d := range out { // size 1 in each position, for a and for b
		sh := append([]int64(nil), out...)
		sh[d] = 1
		cases = append(cases, tc{fmt.Sprintf("b-bcast%d", d), out, rn(out...), rn(sh...)})
		cases = append(cases, tc{fmt.Sprintf("a-bcast%d", d), out, rn(sh...), rn(out...)})
	}
	cases = append(cases,
		tc{"b-fewer-dims", out, rn(out...), rn(17, 7)},
		tc{"permuted-a", []int64{17, 5, 63}, func() elArr { return m.randn(r, 0, 1, 63, 17, 5).permute(1, 2, 0) }, rn(17, 5, 63)},
		tc{"permuted-both", []int64{17, 5, 63}, func() elArr { return m.randn(r, 0, 1, 63, 17, 5).permute(1, 2, 0) },
			func() elArr { return m.randn(r, 0, 1, 5, 63, 17).permute(2, 0, 1) }},
		tc{"sliced", []int64{9, 20}, func() elArr { return m.randn(r, 0, 1, 19, 41).slice(0, 1, 9, 2).slice(1, 0, 20, 2) }, rn(20)},
		tc{"expanded", []int64{4, 33}, rn(4, 33), func() elArr { return m.randn(r, 0, 1, 1, 33).expand(0, 4) }},
		tc{"expanded-last", []int64{4, 33}, rn(4, 33), func() elArr { return m.randn(r, 0, 1, 4, 1).expand(1, 33) }},
	)
	for _, c := range cases {
		a, b := c.a(), c.b()
		// sprinkle NaNs for max/min propagation
		if a.numel() > 10 {
			av := a.values()
			av[3] = math.NaN()
			a.setValues(av)
			bv := b.values()
			if len(bv) > 7 {
				bv[7] = math.NaN()
				b.setValues(bv)
			}
		}
		for op := BAdd; op <= BMin; op++ {
			y := m.f32(c.out...)
			var want []float64
			elForEach(c.out, func(idx []int64) {
				want = append(want, binaryRef(op, elBroadcastAt(a, idx), elBroadcastAt(b, idx)))
			})
			name := fmt.Sprintf("%s op=%d", c.name, op)
			elExec(t, elOp{op: OpBinary, ip: [8]int64{int64(op)}}, y, []elArr{a, b}, nil, func(cfg string) {
				elCheck(t, name+" "+cfg, y, want, 0, 0)
			})
		}
	}
}

func TestBinaryInPlace(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, bshape := range [][]int64{{17, 63}, {63}, {17, 1}, {}} {
		a := m.f32(17, 63)
		av := m.randn(r, 0, 1, 17, 63).values()
		b := m.randn(r, 0, 1, bshape...)
		var want []float64
		a.setValues(av)
		elForEach(a.shape, func(idx []int64) { want = append(want, binaryRef(BMul, a.at(idx), elBroadcastAt(b, idx))) })
		elExec(t, elOp{op: OpBinary, ip: [8]int64{BMul}}, a, []elArr{a, b}, func() { a.setValues(av) }, func(cfg string) {
			elCheck(t, fmt.Sprintf("in-place b=%v %s", bshape, cfg), a, want, 0, 0)
		})
	}
}

func TestBinaryErrors(t *testing.T) {
	m := elNewMem(t)
	elExecErr(t, elOp{op: OpBinary}, m.f32(3, 4), []elArr{m.f32(3, 4), m.f32(3)}, 2)
	elExecErr(t, elOp{op: OpBinary}, m.f32(3, 4), []elArr{m.f32(3, 4), m.f32(2, 4)}, 2)
	elExecErr(t, elOp{op: OpBinary}, m.f32(3, 4), []elArr{m.f32(3, 5), m.f32(4)}, 2)
	elExecErr(t, elOp{op: OpBinary}, m.f32(4, 3).permute(1, 0), []elArr{m.f32(3, 4), m.f32(4)}, 2) // dst not contiguous
	elExecErr(t, elOp{op: OpBinary}, m.f32(3, 4), []elArr{m.f32(3, 4), m.i32(4)}, 2)
	elExecErr(t, elOp{op: OpBinary, ip: [8]int64{BMin + 1}}, m.f32(3, 4), []elArr{m.f32(3, 4), m.f32(4)}, 1)
}

// ---- SNAKE_BETA ----

func TestSnakeBeta(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, sh := range [][]int64{{1, 1, 1}, {2, 5, 129}, {1, 3, 9000}, {3, 17, 63}} {
		B, C, T := sh[0], sh[1], sh[2]
		x := m.randn(r, 0, 3, B, C, T)
		alpha := m.randn(r, 0, 1, C)
		beta := m.randn(r, 0, 1, C)
		if T == 129 { // large arguments take the libm fallback lanes; NaN passes through
			xv := x.values()
			xv[5], xv[6], xv[20] = 3e5, -1e6, math.NaN()
			x.setValues(xv)
		}
		var want []float64
		elForEach(x.shape, func(idx []int64) {
			xv := x.at(idx)
			a := float64(float32(math.Exp(alpha.at(idx[1:2]))))
			ib := 1 / (math.Exp(beta.at(idx[1:2])) + 1e-9)
			s := math.Sin(float64(float32(a * xv)))
			want = append(want, xv+ib*s*s)
		})
		y := m.f32(sh...)
		elExec(t, elOp{op: OpSnakeBeta}, y, []elArr{x, alpha, beta}, nil, func(cfg string) {
			// sin^2 within 1e-6 absolute for |a x| < 1e5; the factor 1/b within float rounding
			elCheck(t, fmt.Sprintf("snake %v %s", sh, cfg), y, want, 2e-6, 2e-6)
		})
	}
	elExecErr(t, elOp{op: OpSnakeBeta}, m.f32(2, 3, 4), []elArr{m.f32(2, 3, 4), m.f32(4), m.f32(3)}, 2)
}
