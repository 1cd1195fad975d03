package engine

import (
	"fmt"
	"math"
	"slices"

	"github.com/voxpipe/voxpipe/cgo"
)

func normAxis(axis, rank int) (int, bool) {
	if axis < 0 {
		axis += rank
	}
	return axis, axis >= 0 && axis < rank
}

// isContiguous: ti's elements are laid out in row-major order, as the kernels' check has it
// (the stride of a size-1 dim, which Expand sets to 0, does not matter).
func isContiguous(ti *tensorInfo) bool {
	want := int64(1)
	for d := len(ti.shape) - 1; d >= 0; d-- {
		if ti.shape[d] != 1 && ti.stride[d] != want {
			return false
		}
		want *= ti.shape[d]
	}
	return true
}

// Contiguous returns t itself when it is laid out row-major, else a contiguous copy.
func (g *Graph) Contiguous(t Tensor) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if isContiguous(t.info()) {
		return t
	}
	return g.copyOf(t)
}

func (g *Graph) copyOf(t Tensor) Tensor {
	ti := t.info()
	return g.addNode(cgo.OpCopy, slices.Clone(ti.shape), ti.dtype, []Tensor{t}, [8]int64{}, [4]float32{})
}

// ---- views ----

// Reshape gives t a new shape with the same number of elements (one dim may be -1). It is a
// view when t is contiguous, else a copy first.
func (g *Graph) Reshape(t Tensor, shape ...int64) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	n := numel(t.info().shape)
	shape = slices.Clone(shape)
	infer := -1
	known := int64(1)
	for i, d := range shape {
		if d == -1 && infer < 0 {
			infer = i
		} else {
			known *= d
		}
	}
	if infer >= 0 && known > 0 && n%known == 0 {
		shape[infer] = n / known
	}
	if !validShape(shape) || numel(shape) != n {
		return g.fail("Reshape", fmt.Sprintf("cannot reshape %d elements to %v", n, shape), t)
	}
	t = g.Contiguous(t)
	return g.view(t, shape, cgo.Contiguous(shape), 0)
}

// Permute reorders the axes (a view).
func (g *Graph) Permute(t Tensor, axes ...int) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	ti := t.info()
	if len(axes) != len(ti.shape) {
		return g.fail("Permute", fmt.Sprintf("%d axes for rank %d", len(axes), len(ti.shape)), t)
	}
	seen := make([]bool, len(axes))
	shape, stride := make([]int64, len(axes)), make([]int64, len(axes))
	for i, a := range axes {
		a, ok := normAxis(a, len(axes))
		if !ok || seen[a] {
			return g.fail("Permute", fmt.Sprintf("axes %v are not a permutation", axes), t)
		}
		seen[a] = true
		shape[i], stride[i] = ti.shape[a], ti.stride[a]
	}
	return g.view(t, shape, stride, 0)
}

// Transpose swaps two axes (a view).
func (g *Graph) Transpose(t Tensor, a, b int) Tensor {
	axes := make([]int, t.Rank())
	for i := range axes {
		axes[i] = i
	}
	a, okA := normAxis(a, len(axes))
	b, okB := normAxis(b, len(axes))
	if !okA || !okB {
		return g.fail("Transpose", fmt.Sprintf("axes %d, %d out of range", a, b), t)
	}
	axes[a], axes[b] = axes[b], axes[a]
	return g.Permute(t, axes...)
}

// Slice keeps [start, end) of an axis (a view). Negative indices count from the end.
func (g *Graph) Slice(t Tensor, axis int, start, end int64) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	ti := t.info()
	ax, ok := normAxis(axis, len(ti.shape))
	if !ok {
		return g.fail("Slice", fmt.Sprintf("axis %d out of range", axis), t)
	}
	n := ti.shape[ax]
	if start < 0 {
		start += n
	}
	if end < 0 {
		end += n
	}
	if start < 0 || end > n || start >= end {
		return g.fail("Slice", fmt.Sprintf("range [%d, %d) of axis %d (size %d)", start, end, ax, n), t)
	}
	if start == 0 && end == n {
		return t // the whole axis: no view (which would make later ops copy what they could read)
	}
	shape := slices.Clone(ti.shape)
	shape[ax] = end - start
	return g.view(t, shape, slices.Clone(ti.stride), start*ti.stride[ax])
}

// Expand broadcasts size-1 axes to the given shape (a view with stride 0); leading axes may be
// added. -1 keeps an axis.
func (g *Graph) Expand(t Tensor, shape ...int64) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	ti := t.info()
	if len(shape) < len(ti.shape) {
		return g.fail("Expand", fmt.Sprintf("to fewer dims %v", shape), t)
	}
	pad := len(shape) - len(ti.shape)
	out, stride := make([]int64, len(shape)), make([]int64, len(shape))
	for i := range shape {
		src, st := int64(1), int64(0)
		if i >= pad {
			src, st = ti.shape[i-pad], ti.stride[i-pad]
		}
		want := shape[i]
		if want == -1 {
			want = src
		}
		switch {
		case want == src:
			out[i], stride[i] = src, st
		case src == 1:
			out[i], stride[i] = want, 0
		default:
			return g.fail("Expand", fmt.Sprintf("cannot expand axis %d of size %d to %d", i, src, want), t)
		}
	}
	if !validShape(out) {
		return g.fail("Expand", fmt.Sprintf("invalid shape %v", out), t)
	}
	return g.view(t, out, stride, 0)
}

// Repeat is Expand made contiguous.
func (g *Graph) Repeat(t Tensor, shape ...int64) Tensor { return g.copyOf(g.Expand(t, shape...)) }

// ---- elementwise ----

func (g *Graph) unary(name string, t Tensor, fn int, a, b float32) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if t.DType() != F32 {
		return g.fail(name, "needs float32", t)
	}
	t = g.Contiguous(t)
	out := g.addNode(cgo.OpUnary, t.Shape(), F32, []Tensor{t}, [8]int64{int64(fn)}, [4]float32{a, b})
	g.nodes[len(g.nodes)-1].alias = true
	return out
}

// Elementwise functions.
func (g *Graph) Neg(t Tensor) Tensor     { return g.unary("Neg", t, cgo.UNeg, 0, 0) }
func (g *Graph) Exp(t Tensor) Tensor     { return g.unary("Exp", t, cgo.UExp, 0, 0) }
func (g *Graph) Log(t Tensor) Tensor     { return g.unary("Log", t, cgo.ULog, 0, 0) }
func (g *Graph) Sin(t Tensor) Tensor     { return g.unary("Sin", t, cgo.USin, 0, 0) }
func (g *Graph) Cos(t Tensor) Tensor     { return g.unary("Cos", t, cgo.UCos, 0, 0) }
func (g *Graph) Sqrt(t Tensor) Tensor    { return g.unary("Sqrt", t, cgo.USqrt, 0, 0) }
func (g *Graph) Tanh(t Tensor) Tensor    { return g.unary("Tanh", t, cgo.UTanh, 0, 0) }
func (g *Graph) Sigmoid(t Tensor) Tensor { return g.unary("Sigmoid", t, cgo.USigmoid, 0, 0) }
func (g *Graph) ReLU(t Tensor) Tensor    { return g.unary("ReLU", t, cgo.UReLU, 0, 0) }
func (g *Graph) SiLU(t Tensor) Tensor    { return g.unary("SiLU", t, cgo.USiLU, 0, 0) }
func (g *Graph) Abs(t Tensor) Tensor     { return g.unary("Abs", t, cgo.UAbs, 0, 0) }
func (g *Graph) Square(t Tensor) Tensor  { return g.unary("Square", t, cgo.USquare, 0, 0) }
func (g *Graph) Recip(t Tensor) Tensor   { return g.unary("Recip", t, cgo.URecip, 0, 0) }

// GELU is the erf form, or the tanh approximation when approx is true.
func (g *Graph) GELU(t Tensor, approx bool) Tensor {
	if approx {
		return g.unary("GELU", t, cgo.UGELUTanh, 0, 0)
	}
	return g.unary("GELU", t, cgo.UGELUErf, 0, 0)
}

// Clamp limits t to [lo, hi].
func (g *Graph) Clamp(t Tensor, lo, hi float32) Tensor {
	return g.unary("Clamp", t, cgo.UClamp, lo, hi)
}

// Scale computes a*t + b.
func (g *Graph) Scale(t Tensor, a, b float32) Tensor { return g.unary("Scale", t, cgo.UScale, a, b) }

// broadcastShape is NumPy/PyTorch broadcasting of two shapes.
func broadcastShape(a, b []int64) ([]int64, bool) {
	n := max(len(a), len(b))
	out := make([]int64, n)
	for i := range n {
		da, db := int64(1), int64(1)
		if j := i - (n - len(a)); j >= 0 {
			da = a[j]
		}
		if j := i - (n - len(b)); j >= 0 {
			db = b[j]
		}
		switch {
		case da == db, db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, false
		}
	}
	return out, true
}

func (g *Graph) binary(name string, a, b Tensor, fn int) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if !g.owns(a, b) {
		return g.fail(name, "tensors from another graph", a, b)
	}
	if a.DType() != F32 || b.DType() != F32 {
		return g.fail(name, "needs float32", a, b)
	}
	shape, ok := broadcastShape(a.info().shape, b.info().shape)
	if !ok {
		return g.fail(name, "shapes do not broadcast", a, b)
	}
	ea, eb := g.Expand(a, shape...), g.Expand(b, shape...)
	out := g.addNode(cgo.OpBinary, shape, F32, []Tensor{ea, eb}, [8]int64{int64(fn)}, [4]float32{})
	g.nodes[len(g.nodes)-1].alias = slices.Equal(a.info().shape, shape) && isContiguous(a.info())
	return out
}

// Add, Sub, Mul, Div, Maximum, Minimum with broadcasting.
func (g *Graph) Add(a, b Tensor) Tensor     { return g.binary("Add", a, b, cgo.BAdd) }
func (g *Graph) Sub(a, b Tensor) Tensor     { return g.binary("Sub", a, b, cgo.BSub) }
func (g *Graph) Mul(a, b Tensor) Tensor     { return g.binary("Mul", a, b, cgo.BMul) }
func (g *Graph) Div(a, b Tensor) Tensor     { return g.binary("Div", a, b, cgo.BDiv) }
func (g *Graph) Maximum(a, b Tensor) Tensor { return g.binary("Maximum", a, b, cgo.BMax) }
func (g *Graph) Minimum(a, b Tensor) Tensor { return g.binary("Minimum", a, b, cgo.BMin) }

// WeightedSum computes Σ w[i]·ts[i] (e.g. ECAPA's learned mix of WavLM layers).
func (g *Graph) WeightedSum(ts []Tensor, w []float32) Tensor {
	if len(ts) == 0 || len(ts) != len(w) {
		return g.fail("WeightedSum", fmt.Sprintf("%d tensors, %d weights", len(ts), len(w)))
	}
	acc := g.Scale(ts[0], w[0], 0)
	for i := 1; i < len(ts); i++ {
		acc = g.Add(acc, g.Scale(ts[i], w[i], 0))
	}
	return acc
}

// GLU splits axis in halves a, b and returns a·sigmoid(b).
func (g *Graph) GLU(t Tensor, axis int) Tensor {
	ax, ok := normAxis(axis, t.Rank())
	if !ok || t.Dim(ax)%2 != 0 {
		return g.fail("GLU", fmt.Sprintf("axis %d must exist and be even", axis), t)
	}
	h := t.Dim(ax) / 2
	return g.Mul(g.Slice(t, ax, 0, h), g.Sigmoid(g.Slice(t, ax, h, 2*h)))
}

// SnakeBeta applies x + 1/(exp(beta)+ε)·sin²(exp(alpha)·x) per channel of [B, C, T].
func (g *Graph) SnakeBeta(x, alpha, beta Tensor) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if x.Rank() != 3 || numel(alpha.info().shape) != x.Dim(1) || numel(beta.info().shape) != x.Dim(1) {
		return g.fail("SnakeBeta", "want x [B, C, T] and alpha, beta of C values", x, alpha, beta)
	}
	return g.addNode(cgo.OpSnakeBeta, x.Shape(), F32, []Tensor{g.Contiguous(x), g.Contiguous(alpha), g.Contiguous(beta)}, [8]int64{}, [4]float32{})
}

// ---- normalisation ----

func (g *Graph) lastDimAffine(name string, x Tensor, params ...*Tensor) bool {
	for _, p := range params {
		if p != nil && numel(p.info().shape) != x.Dim(-1) {
			g.fail(name, fmt.Sprintf("parameter of %d values for last dim %d", numel(p.info().shape), x.Dim(-1)), x, *p)
			return false
		}
	}
	return true
}

func srcs(x Tensor, opt ...*Tensor) []Tensor {
	out := []Tensor{x}
	for _, p := range opt {
		if p == nil {
			break
		}
		out = append(out, *p)
	}
	return out
}

// LayerNorm normalises over the last axis; weight and bias may be nil.
func (g *Graph) LayerNorm(x Tensor, weight, bias *Tensor, eps float32) Tensor {
	if g.err != nil || !g.lastDimAffine("LayerNorm", x, weight, bias) {
		return g.dummy()
	}
	if weight == nil && bias != nil {
		return g.fail("LayerNorm", "bias without weight", x)
	}
	s := srcs(g.Contiguous(x), weight, bias)
	return g.addNode(cgo.OpLayerNorm, x.Shape(), F32, s, [8]int64{}, [4]float32{eps})
}

// RMSNorm normalises by the root mean square over the last axis; weight may be nil.
func (g *Graph) RMSNorm(x Tensor, weight *Tensor, eps float32) Tensor {
	if g.err != nil || !g.lastDimAffine("RMSNorm", x, weight) {
		return g.dummy()
	}
	return g.addNode(cgo.OpRMSNorm, x.Shape(), F32, srcs(g.Contiguous(x), weight), [8]int64{}, [4]float32{eps})
}

// GroupNorm normalises [B, C, ...] over groups of channels; InstanceNorm is groups = C.
func (g *Graph) GroupNorm(x Tensor, groups int, weight, bias *Tensor, eps float32) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if x.Rank() < 2 || groups <= 0 || x.Dim(1)%int64(groups) != 0 {
		return g.fail("GroupNorm", fmt.Sprintf("%d groups for channels of [B, C, ...]", groups), x)
	}
	if weight == nil && bias != nil {
		return g.fail("GroupNorm", "bias without weight", x)
	}
	for _, p := range []*Tensor{weight, bias} {
		if p != nil && numel(p.info().shape) != x.Dim(1) {
			return g.fail("GroupNorm", "affine parameters must have C values", x, *p)
		}
	}
	return g.addNode(cgo.OpGroupNorm, x.Shape(), F32, srcs(g.Contiguous(x), weight, bias), [8]int64{int64(groups)}, [4]float32{eps})
}

// ChannelAffine computes x·scale[c] + shift[c] over [B, C, ...] (inference batch norm, folded).
func (g *Graph) ChannelAffine(x, scale, shift Tensor) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if x.Rank() < 2 || numel(scale.info().shape) != x.Dim(1) || numel(shift.info().shape) != x.Dim(1) {
		return g.fail("ChannelAffine", "scale and shift need C values for [B, C, ...]", x, scale, shift)
	}
	return g.addNode(cgo.OpChannelAffine, x.Shape(), F32, []Tensor{g.Contiguous(x), g.Contiguous(scale), g.Contiguous(shift)}, [8]int64{}, [4]float32{})
}

// Softmax over the last axis of x·scale plus an optional additive mask that broadcasts to x.
func (g *Graph) Softmax(x Tensor, mask *Tensor, scale float32) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	s := []Tensor{g.Contiguous(x)}
	if mask != nil {
		if _, ok := broadcastShape(x.info().shape, mask.info().shape); !ok || mask.Rank() > x.Rank() {
			return g.fail("Softmax", "mask does not broadcast to the input", x, *mask)
		}
		s = append(s, g.Expand(*mask, x.Shape()...))
	}
	return g.addNode(cgo.OpSoftmax, x.Shape(), F32, s, [8]int64{}, [4]float32{scale})
}

// ---- reductions ----

func (g *Graph) reduce(name string, x Tensor, axis, fn int) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	ax, ok := normAxis(axis, x.Rank())
	if !ok {
		return g.fail(name, fmt.Sprintf("axis %d out of range", axis), x)
	}
	shape := x.Shape()
	shape[ax] = 1
	return g.addNode(cgo.OpReduce, shape, F32, []Tensor{g.Contiguous(x)}, [8]int64{int64(ax), int64(fn)}, [4]float32{})
}

// Sum, Mean, Max and Var (population) over one axis, kept with size 1.
func (g *Graph) Sum(x Tensor, axis int) Tensor  { return g.reduce("Sum", x, axis, cgo.RSum) }
func (g *Graph) Mean(x Tensor, axis int) Tensor { return g.reduce("Mean", x, axis, cgo.RMean) }
func (g *Graph) Max(x Tensor, axis int) Tensor  { return g.reduce("Max", x, axis, cgo.RMax) }
func (g *Graph) Var(x Tensor, axis int) Tensor  { return g.reduce("Var", x, axis, cgo.RVar) }

// Cumsum is the running sum along an axis.
func (g *Graph) Cumsum(x Tensor, axis int) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	ax, ok := normAxis(axis, x.Rank())
	if !ok {
		return g.fail("Cumsum", fmt.Sprintf("axis %d out of range", axis), x)
	}
	return g.addNode(cgo.OpCumsum, x.Shape(), F32, []Tensor{g.Contiguous(x)}, [8]int64{int64(ax)}, [4]float32{})
}

// ---- data movement ----

// Concat joins tensors along an axis (up to 8 at once; more are joined in steps).
func (g *Graph) Concat(axis int, ts ...Tensor) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if len(ts) == 0 {
		return g.fail("Concat", "no tensors")
	}
	if len(ts) == 1 {
		return ts[0]
	}
	if len(ts) > cgo.MaxSrc {
		return g.Concat(axis, g.Concat(axis, ts[:cgo.MaxSrc]...), g.Concat(axis, ts[cgo.MaxSrc:]...))
	}
	ax, ok := normAxis(axis, ts[0].Rank())
	if !ok {
		return g.fail("Concat", fmt.Sprintf("axis %d out of range", axis), ts...)
	}
	shape := ts[0].Shape()
	shape[ax] = 0
	for _, t := range ts {
		if t.Rank() != len(shape) || t.DType() != ts[0].DType() {
			return g.fail("Concat", "ranks or dtypes differ", ts...)
		}
		for d := range shape {
			if d != ax && t.Dim(d) != shape[d] {
				return g.fail("Concat", fmt.Sprintf("axis %d differs", d), ts...)
			}
		}
		shape[ax] += t.Dim(ax)
	}
	// The sources as they are: the kernels copy from any strides.
	return g.addNode(cgo.OpConcat, shape, ts[0].DType(), ts, [8]int64{int64(ax)}, [4]float32{})
}

// Pad modes.
const (
	PadConstant  = 0
	PadReflect   = 1
	PadReplicate = 2
)

// Pad adds before and after samples on an axis: constant value, reflect or replicate.
func (g *Graph) Pad(x Tensor, axis int, before, after int64, mode int, value float32) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	ax, ok := normAxis(axis, x.Rank())
	if !ok || before < 0 || after < 0 || mode < PadConstant || mode > PadReplicate {
		return g.fail("Pad", fmt.Sprintf("axis %d, pad %d/%d, mode %d", axis, before, after, mode), x)
	}
	if mode == PadReflect && (before >= x.Dim(ax) || after >= x.Dim(ax)) {
		return g.fail("Pad", fmt.Sprintf("reflect pad %d/%d needs more than %d samples", before, after, x.Dim(ax)), x)
	}
	if before == 0 && after == 0 {
		return x
	}
	shape := x.Shape()
	shape[ax] += before + after
	return g.addNode(cgo.OpPad, shape, x.DType(), []Tensor{g.Contiguous(x)}, [8]int64{int64(ax), before, after, int64(mode)}, [4]float32{value})
}

// GatherRows picks rows of table [N, D] by int32 indices [M] → [M, D].
func (g *Graph) GatherRows(table, idx Tensor) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if table.Rank() != 2 || idx.Rank() != 1 || idx.DType() != I32 {
		return g.fail("GatherRows", "want table [N, D] and int32 indices [M]", table, idx)
	}
	dt := table.DType()
	if IsQuantized(dt) {
		if dt == Q8_0R8 || dt == F32P || dt == F16P {
			return g.fail("GatherRows", "a "+dtypeName(dt)+" weight is interleaved for Linear; gather from a row-major table", table, idx)
		}
		if ti := table.info(); ti.kind != kindPersistent || ti.view {
			return g.fail("GatherRows", fmt.Sprintf("a %s table must be a persistent buffer, not a view of one", dtypeName(dt)), table, idx)
		}
		dt = F32 // rows come out dequantised
	}
	return g.addNode(cgo.OpGatherRows, []int64{idx.Dim(0), table.Dim(1)}, dt, []Tensor{g.Contiguous(table), g.Contiguous(idx)}, [8]int64{}, [4]float32{})
}

// InterpLinear resamples the last axis to n points (PyTorch linear, align_corners=False).
func (g *Graph) InterpLinear(x Tensor, n int64) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if n <= 0 {
		return g.fail("InterpLinear", fmt.Sprintf("to %d points", n), x)
	}
	shape := x.Shape()
	shape[len(shape)-1] = n
	return g.addNode(cgo.OpInterpLinear, shape, F32, []Tensor{g.Contiguous(x)}, [8]int64{}, [4]float32{})
}

// Assign copies src into a persistent buffer's view (a cache or streaming state update).
func (g *Graph) Assign(dst, src Tensor) {
	if g.err != nil {
		return
	}
	di := dst.info()
	if IsQuantized(di.dtype) || IsQuantized(src.DType()) {
		g.fail("Assign", quantMisuse(di), dst, src)
		return
	}
	if di.kind != kindPersistent || !slices.Equal(di.shape, src.info().shape) || di.dtype != src.DType() {
		g.fail("Assign", "destination must be a persistent buffer (or a view of one) of the same shape and dtype", dst, src)
		return
	}
	if !isContiguous(di) {
		g.fail("Assign", "destination view must be contiguous", dst, src)
		return
	}
	g.nodes = append(g.nodes, node{op: cgo.OpCopy, src: []int{src.id}, dst: dst.id, label: g.label})
}

// ScatterRows writes rows [..., M, D] into a persistent table [..., N, D] at the int32 row
// indices idx [M] (a KV-cache update at positions given at run time, so one program serves
// every position).
func (g *Graph) ScatterRows(table, rows, idx Tensor) {
	if g.err != nil {
		return
	}
	ti, ri := table.info(), rows.info()
	if (IsQuantized(ti.dtype) && ti.dtype != F16) || IsQuantized(ri.dtype) {
		g.fail("ScatterRows", quantMisuse(ti), table, rows, idx)
		return
	}
	r := len(ti.shape)
	// An F16 table (a half-precision cache) takes F32 rows, rounded to nearest even.
	sameType := ri.dtype == ti.dtype || (ti.dtype == F16 && ri.dtype == F32)
	ok := ti.kind == kindPersistent && isContiguous(ti) && r >= 2 && len(ri.shape) == r &&
		idx.Rank() == 1 && idx.DType() == I32 && sameType &&
		ri.shape[r-2] == idx.Dim(0) && ri.shape[r-1] == ti.shape[r-1] && slices.Equal(ri.shape[:r-2], ti.shape[:r-2])
	if !ok {
		g.fail("ScatterRows", "want a contiguous persistent table [..., N, D], rows [..., M, D] and int32 indices [M]", table, rows, idx)
		return
	}
	g.nodes = append(g.nodes, node{op: cgo.OpScatterRows, src: []int{g.Contiguous(rows).id, g.Contiguous(idx).id}, dst: table.id, label: g.label})
}

// ---- linear algebra ----

// Matmul multiplies [.., M, K] by [.., K, N] with broadcast batch axes.
func (g *Graph) Matmul(a, b Tensor) Tensor { return g.matmul("Matmul", a, b, nil, false) }

// Linear computes x·Wᵀ + bias for W [N, K] (nn.Linear); bias may be nil. W may be a
// Q8_0 or F16 persistent buffer [N, K] (read as stored by the quantised kernels; x is then
// [..., K] and the result [..., N]).
func (g *Graph) Linear(x, w Tensor, bias *Tensor) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if IsQuantized(w.DType()) {
		return g.linearQ(x, w, bias)
	}
	return g.matmul("Linear", x, w, bias, true)
}

func (g *Graph) linearQ(x, w Tensor, bias *Tensor) Tensor {
	wi := w.info()
	if wi.kind != kindPersistent || wi.view || len(wi.shape) != 2 {
		return g.fail("Linear", fmt.Sprintf("a %s weight must be a persistent [out, in] buffer, not a view of one", dtypeName(wi.dtype)), x, w)
	}
	n, k := wi.shape[0], wi.shape[1]
	if x.Rank() < 1 || x.Dim(-1) != k || x.DType() != F32 {
		return g.fail("Linear", fmt.Sprintf("input must be F32 [..., %d] for a %s weight [%d, %d]", k, dtypeName(wi.dtype), n, k), x, w)
	}
	s := []Tensor{g.Contiguous(x), w}
	if bias != nil {
		if numel(bias.info().shape) != n || bias.DType() != F32 {
			return g.fail("Linear", fmt.Sprintf("bias must be %d F32 values", n), x, w, *bias)
		}
		s = append(s, g.Contiguous(*bias))
	}
	shape := x.Shape()
	shape[len(shape)-1] = n
	return g.addNode(cgo.OpLinearQ, shape, F32, s, [8]int64{int64(max(g.rowGroups, 1))}, [4]float32{})
}

func (g *Graph) matmul(name string, a, b Tensor, bias *Tensor, bT bool) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if a.Rank() < 2 || b.Rank() < 2 {
		return g.fail(name, "operands need at least 2 dims", a, b)
	}
	for _, t := range []Tensor{a, b} {
		if IsQuantized(t.DType()) {
			return g.fail(name, quantMisuse(t.info())+" (use Linear)", a, b)
		}
	}
	m, k := a.Dim(-2), a.Dim(-1)
	kb, n := b.Dim(-2), b.Dim(-1)
	if bT {
		kb, n = b.Dim(-1), b.Dim(-2)
	}
	if k != kb {
		return g.fail(name, fmt.Sprintf("inner dims %d and %d differ", k, kb), a, b)
	}
	batch, ok := broadcastShape(a.info().shape[:a.Rank()-2], b.info().shape[:b.Rank()-2])
	if !ok {
		return g.fail(name, "batch dims do not broadcast", a, b)
	}
	if bias != nil && numel(bias.info().shape) != n {
		return g.fail(name, fmt.Sprintf("bias of %d values for %d outputs", numel(bias.info().shape), n), a, b, *bias)
	}
	// The kernel takes any strides (it packs what BLAS cannot read); batch axes may broadcast.
	ca, cb := a, b
	ca = g.Expand(ca, append(slices.Clone(batch), m, k)...)
	if bT {
		cb = g.Expand(cb, append(slices.Clone(batch), n, k)...)
	} else {
		cb = g.Expand(cb, append(slices.Clone(batch), k, n)...)
	}
	s := []Tensor{ca, cb}
	if bias != nil {
		s = append(s, g.Contiguous(*bias))
	}
	tr := int64(0)
	if bT {
		tr = 1
	}
	return g.addNode(cgo.OpMatmul, append(slices.Clone(batch), m, n), F32, s, [8]int64{tr}, [4]float32{})
}

// innerContiguous makes the last axis unit-stride, the one layout requirement of kernels
// that otherwise take any strides (attention).
func (g *Graph) innerContiguous(t Tensor) Tensor {
	if ti := t.info(); ti.stride[len(ti.stride)-1] == 1 {
		return t
	}
	return g.copyOf(t)
}

// Conv1D: x [B, Cin, T], w [Cout, Cin/groups, K], bias [Cout] or nil.
func (g *Graph) Conv1D(x, w Tensor, bias *Tensor, stride, padLeft, padRight, dilation, groups int64) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if x.Rank() != 3 || w.Rank() != 3 || stride < 1 || dilation < 1 || groups < 1 || padLeft < 0 || padRight < 0 {
		return g.fail("Conv1D", "want x [B, Cin, T], w [Cout, Cin/g, K] and positive stride/dilation/groups", x, w)
	}
	cin, cout, k := x.Dim(1), w.Dim(0), w.Dim(2)
	if cin%groups != 0 || cout%groups != 0 || w.Dim(1) != cin/groups {
		return g.fail("Conv1D", fmt.Sprintf("%d groups do not fit %d→%d channels", groups, cin, cout), x, w)
	}
	if bias != nil && numel(bias.info().shape) != cout {
		return g.fail("Conv1D", "bias must have Cout values", x, w, *bias)
	}
	tOut := (x.Dim(2)+padLeft+padRight-dilation*(k-1)-1)/stride + 1
	if tOut < 1 {
		return g.fail("Conv1D", "input shorter than the kernel", x, w)
	}
	if w.DType() == F32P { // packed at load: a persistent kernel, read as is
		if groups != 1 || w.info().kind != kindPersistent {
			return g.fail("Conv1D", "a packed (F32P) kernel takes a persistent weight and no groups", x, w)
		}
	} else {
		w = g.Contiguous(w)
	}
	return g.addNode(cgo.OpConv1D, []int64{x.Dim(0), cout, tOut}, F32, srcs(x, &w, bias),
		[8]int64{stride, padLeft, padRight, dilation, groups}, [4]float32{})
}

// Conv2D: x [B, Cin, H, W], w [Cout, Cin/groups, KH, KW].
func (g *Graph) Conv2D(x, w Tensor, bias *Tensor, strideH, strideW, padH, padW, groups int64) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if x.Rank() != 4 || w.Rank() != 4 || strideH < 1 || strideW < 1 || groups < 1 || padH < 0 || padW < 0 {
		return g.fail("Conv2D", "want x [B, Cin, H, W], w [Cout, Cin/g, KH, KW]", x, w)
	}
	cin, cout := x.Dim(1), w.Dim(0)
	if cin%groups != 0 || cout%groups != 0 || w.Dim(1) != cin/groups {
		return g.fail("Conv2D", fmt.Sprintf("%d groups do not fit %d→%d channels", groups, cin, cout), x, w)
	}
	if bias != nil && numel(bias.info().shape) != cout {
		return g.fail("Conv2D", "bias must have Cout values", x, w, *bias)
	}
	h := (x.Dim(2)+2*padH-w.Dim(2))/strideH + 1
	wd := (x.Dim(3)+2*padW-w.Dim(3))/strideW + 1
	if h < 1 || wd < 1 {
		return g.fail("Conv2D", "input smaller than the kernel", x, w)
	}
	if w.DType() == F32P { // packed at load: a persistent kernel, read as is
		if groups != 1 || w.info().kind != kindPersistent {
			return g.fail("Conv2D", "a packed (F32P) kernel takes a persistent weight and no groups", x, w)
		}
	} else {
		w = g.Contiguous(w)
	}
	return g.addNode(cgo.OpConv2D, []int64{x.Dim(0), cout, h, wd}, F32, srcs(x, &w, bias),
		[8]int64{strideH, strideW, padH, padW, 1, 1, groups}, [4]float32{})
}

// ConvTranspose1D: x [B, Cin, T], w [Cin, Cout/groups, K].
func (g *Graph) ConvTranspose1D(x, w Tensor, bias *Tensor, stride, padding, outputPadding, dilation, groups int64) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if x.Rank() != 3 || w.Rank() != 3 || stride < 1 || dilation < 1 || groups < 1 || padding < 0 || outputPadding < 0 {
		return g.fail("ConvTranspose1D", "want x [B, Cin, T], w [Cin, Cout/g, K]", x, w)
	}
	cin, k := x.Dim(1), w.Dim(2)
	if w.Dim(0) != cin || cin%groups != 0 {
		return g.fail("ConvTranspose1D", "weight's first axis must be Cin, divisible by groups", x, w)
	}
	cout := w.Dim(1) * groups
	if bias != nil && numel(bias.info().shape) != cout {
		return g.fail("ConvTranspose1D", "bias must have Cout values", x, w, *bias)
	}
	tOut := (x.Dim(2)-1)*stride - 2*padding + dilation*(k-1) + outputPadding + 1
	if tOut < 1 {
		return g.fail("ConvTranspose1D", "empty output", x, w)
	}
	w = g.Contiguous(w)
	return g.addNode(cgo.OpConvTranspose1D, []int64{x.Dim(0), cout, tOut}, F32, srcs(x, &w, bias),
		[8]int64{stride, padding, outputPadding, dilation, groups}, [4]float32{})
}

// RoPE modes.
const (
	RoPEInterleaved = 0 // rotate pairs (x[2i], x[2i+1])
	RoPEHalf        = 1 // rotate x[i] with x[i+d/2] (HF Qwen/LLaMA)
)

// RoPE rotates the first dims features of x [B, H, T, D] by positions [T] (int32).
func (g *Graph) RoPE(x, pos Tensor, dims int64, mode int, theta float32) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if x.Rank() != 4 || pos.Rank() != 1 || pos.DType() != I32 || pos.Dim(0) != x.Dim(2) || dims <= 0 || dims > x.Dim(3) || dims%2 != 0 {
		return g.fail("RoPE", "want x [B, H, T, D], int32 positions [T], even dims ≤ D", x, pos)
	}
	// x may be strided (a permuted view of a projection's heads): the kernels read any strides.
	return g.addNode(cgo.OpRoPE, x.Shape(), F32, []Tensor{x, g.Contiguous(pos)}, [8]int64{dims, int64(mode)}, [4]float32{theta})
}

// Attention computes softmax(q·kᵀ·scale + bias + mask)·v for q [B, H, Tq, D], k [B, Hk, Tk, D],
// v [B, Hk, Tk, Dv] (H a multiple of Hk: grouped-query); mask broadcasts to [Tq, Tk], bias to
// [H, Tq, Tk]; either may be nil. scale 0 means 1/√D.
func (g *Graph) Attention(q, k, v Tensor, mask, bias *Tensor, scale float32) Tensor {
	if g.err != nil {
		return g.dummy()
	}
	if q.Rank() != 4 || k.Rank() != 4 || v.Rank() != 4 {
		return g.fail("Attention", "q, k, v must be [B, H, T, D]", q, k, v)
	}
	b, h, tq, d := q.Dim(0), q.Dim(1), q.Dim(2), q.Dim(3)
	hk, tk := k.Dim(1), k.Dim(2)
	if k.Dim(0) != b || v.Dim(0) != b || k.Dim(3) != d || v.Dim(1) != hk || v.Dim(2) != tk || h%hk != 0 {
		return g.fail("Attention", "batch, heads or lengths disagree", q, k, v)
	}
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(d)))
	}
	s := []Tensor{g.innerContiguous(q), g.innerContiguous(k), g.innerContiguous(v)}
	var ip [8]int64
	if mask != nil {
		if b, ok := broadcastShape(mask.info().shape, []int64{tq, tk}); mask.Rank() > 2 || !ok || b[0] != tq || b[1] != tk {
			return g.fail("Attention", "mask must broadcast to [Tq, Tk]", q, *mask)
		}
		s = append(s, g.Expand(*mask, tq, tk))
		ip[0] = 1
	} else {
		s = append(s, s[0]) // placeholder keeps bias at index 4
	}
	if bias != nil {
		if b, ok := broadcastShape(bias.info().shape, []int64{h, tq, tk}); bias.Rank() > 3 || !ok || b[0] != h || b[1] != tq || b[2] != tk {
			return g.fail("Attention", "bias must broadcast to [H, Tq, Tk]", q, *bias)
		}
		s = append(s, g.Expand(*bias, h, tq, tk))
		ip[1] = 1
	} else if ip[0] == 0 {
		s = s[:3]
	}
	return g.addNode(cgo.OpAttention, []int64{b, h, tq, v.Dim(3)}, F32, s, ip, [4]float32{scale})
}
