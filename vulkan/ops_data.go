package vulkan

import (
	"fmt"
	"math"
	"slices"
)

// dmMaxLines is the most workgroups rowGroups can spread over its two axes.
const dmMaxLines = 65535 * 65535

// dmSerialMax is the longest axis reduced or scanned by one invocation per line: a
// workgroup of 256 on a shorter axis would mostly idle, and an fp32 running sum stays
// accurate over so few values.
const dmSerialMax = 64

// dmBasic checks what contiguous() and the collapsing below index: a buffer, one stride per
// axis, no negative sizes.
func dmBasic(op, role string, t Tensor) error {
	if t.Buf == nil || t.Buf.b == nil {
		return fmt.Errorf("vulkan: %s: %s has no buffer", op, role)
	}
	if len(t.Stride) != len(t.Shape) {
		return fmt.Errorf("vulkan: %s: %s of shape %v has strides %v", op, role, t.Shape, t.Stride)
	}
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("vulkan: %s: %s of shape %v", op, role, t.Shape)
		}
	}
	return nil
}

// dmCheck is check plus the shaders' 32-bit indexing: every value an operand reaches must
// have an index below 2³².
func dmCheck(op, role string, t Tensor) error {
	if err := t.check(op, role, t.Shape); err != nil {
		return err
	}
	if t.span() > math.MaxUint32 || numel(t.Shape) > math.MaxUint32 {
		return fmt.Errorf("vulkan: %s: %s %v at offset %d is past the shaders' 32-bit indices", op, role, t.Shape, t.Off)
	}
	return nil
}

// dmInOut checks an op's input x and output y (dmBasic, dmWritable).
func dmInOut(op string, x, y Tensor) error {
	if err := dmBasic(op, "x", x); err != nil {
		return err
	}
	if err := dmBasic(op, "y", y); err != nil {
		return err
	}
	return dmWritable(op, y)
}

// dmWritable refuses an output whose stride 0 on an axis longer than 1 would make several
// invocations write one value.
func dmWritable(op string, y Tensor) error {
	for i, d := range y.Shape {
		if d > 1 && y.Stride[i] == 0 {
			return fmt.Errorf("vulkan: %s: y %v (strides %v) broadcasts: an output must not", op, y.Shape, y.Stride)
		}
	}
	return nil
}

// dmAround views contiguous t as [outer, n, inner] around axis, so contiguous operands of
// any rank (the engine's go to 5) fit the shaders' 4 axes.
func dmAround(t Tensor, axis int) Tensor {
	outer, inner := numel(t.Shape[:axis]), numel(t.Shape[axis+1:])
	n := t.Shape[axis]
	return Tensor{Buf: t.Buf, Off: t.Off, Shape: []int64{outer, n, inner}, Stride: []int64{n * inner, inner, 1}}
}

// dmAxis normalises an axis of rank (negative counts from the end).
func dmAxis(op string, axis, rank int) (int, error) {
	a := axis
	if a < 0 {
		a += rank
	}
	if a < 0 || a >= rank {
		return 0, fmt.Errorf("vulkan: %s: axis %d of %d axes", op, axis, rank)
	}
	return a, nil
}

// PadOp is y = x padded on axis (negative counts from the end) by before values ahead and
// after values behind: mode 0 the constant whose 32-bit word is fill (math.Float32bits(v)
// for F32, uint32(int32(v)) for I32, as the CPU kernel's int conversion of its value), 1
// reflect (the edge not repeated: before and after below x's size there), 2 replicate the
// edge. It moves 32-bit words, so x and y may be F32 or I32. Both may be strided views of
// up to MaxDims axes; contiguous ones may have any rank.
func PadOp(x, y Tensor, axis int, before, after int64, mode int, fill uint32) (Dispatch, error) {
	const op = "pad"
	if err := dmInOut(op, x, y); err != nil {
		return Dispatch{}, err
	}
	ax, err := dmAxis(op, axis, len(x.Shape))
	if err != nil {
		return Dispatch{}, err
	}
	if before < 0 || after < 0 || mode < 0 || mode > 2 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: pad %d before, %d after, mode %d (0 constant, 1 reflect, 2 replicate)", op, before, after, mode)
	}
	n := x.Shape[ax]
	want := append([]int64(nil), x.Shape...)
	want[ax] = n + before + after
	if !slices.Equal(y.Shape, want) {
		return Dispatch{}, fmt.Errorf("vulkan: %s: y of shape %v, want %v (x %v padded by %d and %d on axis %d)", op, y.Shape, want, x.Shape, before, after, ax)
	}
	if want[ax] > math.MaxInt32 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: axis %d of %d values is past the shader's signed 32-bit positions", op, ax, want[ax])
	}
	if mode == 1 && (before >= n || after >= n) {
		return Dispatch{}, fmt.Errorf("vulkan: %s: reflect pad %d/%d needs more than %d values on axis %d", op, before, after, n, ax)
	}
	if mode == 2 && n == 0 && before+after > 0 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: replicate pad of an empty axis %d", op, ax)
	}
	if x.contiguous() && y.contiguous() {
		x, y, ax = dmAround(x, ax), dmAround(y, ax), 1
	}
	if err := dmCheck(op, "x", x); err != nil {
		return Dispatch{}, err
	}
	if err := dmCheck(op, "y", y); err != nil {
		return Dispatch{}, err
	}
	_, xs := words4(x.Shape, x.Stride)
	sh, ys := words4(y.Shape, y.Stride) // the shader walks y
	a := MaxDims - len(y.Shape) + ax
	total := numel(y.Shape)
	push := []uint32{uint32(total), sh[0], sh[1], sh[2], sh[3], uint32(x.Off), xs[0], xs[1], xs[2], xs[3],
		uint32(y.Off), ys[0], ys[1], ys[2], ys[3], uint32(a), uint32(before), uint32(n), uint32(mode), fill}
	return Dispatch{op: op, shader: "pad", nbuf: 2, bufs: []*Buffer{x.Buf, y.Buf}, push: push, groups: elementGroups(total)}, nil
}

// InterpLinearOp is y = x resampled linearly along its last axis to y's size there (PyTorch
// interpolate, mode linear, align_corners=False; the source positions computed in float as
// the CPU kernel does). F32; both may be strided views of up to MaxDims axes, contiguous ones
// of any rank.
func InterpLinearOp(x, y Tensor) (Dispatch, error) {
	const op = "interplinear"
	if err := dmInOut(op, x, y); err != nil {
		return Dispatch{}, err
	}
	r := len(x.Shape)
	if r == 0 || len(y.Shape) != r || !slices.Equal(x.Shape[:r-1], y.Shape[:r-1]) {
		return Dispatch{}, fmt.Errorf("vulkan: %s: x %v and y %v must differ only in the last axis", op, x.Shape, y.Shape)
	}
	ti, to := x.Shape[r-1], y.Shape[r-1]
	if ti == 0 && numel(y.Shape) > 0 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: %d points from none", op, to)
	}
	if x.contiguous() && y.contiguous() {
		rows := numel(y.Shape[:r-1])
		x = Tensor{Buf: x.Buf, Off: x.Off, Shape: []int64{rows, ti}, Stride: []int64{ti, 1}}
		y = Tensor{Buf: y.Buf, Off: y.Off, Shape: []int64{rows, to}, Stride: []int64{to, 1}}
	}
	if err := dmCheck(op, "x", x); err != nil {
		return Dispatch{}, err
	}
	if err := dmCheck(op, "y", y); err != nil {
		return Dispatch{}, err
	}
	scale := float32(1)
	if to > 0 {
		scale = float32(ti) / float32(to) // rounded once here, as the CPU kernel's float scale
	}
	sh, ys := words4(y.Shape, y.Stride)
	_, xs := words4(x.Shape, x.Stride)
	total := numel(y.Shape)
	push := []uint32{uint32(total), sh[0], sh[1], sh[2], sh[3], uint32(x.Off), xs[0], xs[1], xs[2], xs[3],
		uint32(y.Off), ys[0], ys[1], ys[2], ys[3], uint32(ti), math.Float32bits(scale)}
	return Dispatch{op: op, shader: "interp", nbuf: 2, bufs: []*Buffer{x.Buf, y.Buf}, push: push, groups: elementGroups(total)}, nil
}

// ScatterRowsOp writes rows [..., M, D] into table [..., N, D] in place at the int32 row
// indices idx (M values): table[l, idx[i], :] = rows[l, i, :] for every index l of the
// leading axes (none, or any number, the same in both). It moves 32-bit words, so rows and
// table may be F32 or I32. All three are contiguous. An index outside [0, N) skips its row
// (the CPU backend refuses the run instead); with an index given twice, which of its rows
// lands is unspecified (the CPU's is the last).
func ScatterRowsOp(rows, idx, table Tensor) (Dispatch, error) {
	const op = "scatterrows"
	for _, c := range []struct {
		t    Tensor
		role string
	}{{rows, "rows"}, {idx, "indices"}, {table, "table"}} {
		if err := dmBasic(op, c.role, c.t); err != nil {
			return Dispatch{}, err
		}
		if !c.t.contiguous() {
			return Dispatch{}, fmt.Errorf("vulkan: %s: %s %v (strides %v) must be contiguous", op, c.role, c.t.Shape, c.t.Stride)
		}
	}
	r := len(table.Shape)
	if r < 2 || len(rows.Shape) != r || !slices.Equal(rows.Shape[:r-2], table.Shape[:r-2]) || rows.Shape[r-1] != table.Shape[r-1] ||
		rows.Shape[r-2] != numel(idx.Shape) {
		return Dispatch{}, fmt.Errorf("vulkan: %s: table %v, rows %v and %d indices: want [..., N, D], [..., M, D] and M indices", op, table.Shape, rows.Shape, numel(idx.Shape))
	}
	L, N, D, M := numel(table.Shape[:r-2]), table.Shape[r-2], table.Shape[r-1], rows.Shape[r-2]
	flat := func(t Tensor) Tensor {
		return Tensor{Buf: t.Buf, Off: t.Off, Shape: []int64{numel(t.Shape)}, Stride: []int64{1}}
	}
	for _, c := range []struct {
		t    Tensor
		role string
	}{{flat(rows), "rows"}, {flat(idx), "indices"}, {flat(table), "table"}} {
		if err := dmCheck(op, c.role, c.t); err != nil {
			return Dispatch{}, err
		}
	}
	total := L * M * D
	push := []uint32{uint32(total), uint32(M), uint32(D), uint32(N), uint32(rows.Off), uint32(idx.Off), uint32(table.Off)}
	return Dispatch{op: op, shader: "scatter", nbuf: 3, bufs: []*Buffer{rows.Buf, idx.Buf, table.Buf}, push: push, groups: elementGroups(total)}, nil
}

// dmLines is x and y around an axis as the reduce and cumsum shaders walk them: n values
// (strides xa, ya) for each of lines indexes into the three other axes (shape osh; strides
// xo, yo), padded on the left.
type dmLines struct {
	lines, n   int64
	osh        [3]uint32
	xoff, yoff uint32
	xo, yo     [3]uint32
	xa, ya     uint32
}

// dmLinesOf validates x and y (y of x's rank, size 1 on the axis for a reduction) and views
// them around axis ax: contiguous pairs as [outer, n, inner], others as they are (at most
// MaxDims axes).
func dmLinesOf(op string, x, y Tensor, ax int) (dmLines, error) {
	if x.contiguous() && y.contiguous() {
		x, y, ax = dmAround(x, ax), dmAround(y, ax), 1
	}
	if err := dmCheck(op, "x", x); err != nil {
		return dmLines{}, err
	}
	if err := dmCheck(op, "y", y); err != nil {
		return dmLines{}, err
	}
	sh, xs := words4(x.Shape, x.Stride)
	_, ys := words4(y.Shape, y.Stride)
	a := MaxDims - len(x.Shape) + ax
	l := dmLines{n: x.Shape[ax], xoff: uint32(x.Off), yoff: uint32(y.Off), xa: xs[a], ya: ys[a], lines: 1}
	k := 0
	for i := range MaxDims {
		if i == a {
			continue
		}
		l.osh[k], l.xo[k], l.yo[k] = sh[i], xs[i], ys[i]
		l.lines *= int64(sh[i])
		k++
	}
	if l.lines > dmMaxLines {
		return dmLines{}, fmt.Errorf("vulkan: %s: %d lines are too many for one dispatch", op, l.lines)
	}
	return l, nil
}

// groups is the dispatch size: one invocation per line on short axes, else one workgroup.
func (l dmLines) groups() (mode uint32, g [3]uint32) {
	if l.n <= dmSerialMax {
		return 0, elementGroups(l.lines)
	}
	return 1, rowGroups(l.lines)
}

// ReduceOp reduces x's axis (negative counts from the end) into y: kind 0 sum, 1 mean, 2
// max (NaN propagates, as torch.max), 3 population variance (divide by n, as the CPU
// kernel's). F32, accumulated in fp32 (the CPU sums in double). y has x's shape with the
// axis 1 (keepdim) or removed. Both may be strided views of up to MaxDims axes; contiguous
// ones may have any rank. An empty axis gives sum 0 and mean/var NaN; max of it is an error.
func ReduceOp(kind int, x, y Tensor, axis int) (Dispatch, error) {
	const op = "reduce"
	if kind < 0 || kind > 3 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: kind %d (0 sum, 1 mean, 2 max, 3 var)", op, kind)
	}
	if err := dmInOut(op, x, y); err != nil {
		return Dispatch{}, err
	}
	ax, err := dmAxis(op, axis, len(x.Shape))
	if err != nil {
		return Dispatch{}, err
	}
	keep := append([]int64(nil), x.Shape...)
	keep[ax] = 1
	dropped := append(append([]int64(nil), x.Shape[:ax]...), x.Shape[ax+1:]...)
	switch {
	case slices.Equal(y.Shape, keep):
	case slices.Equal(y.Shape, dropped):
		// The removed axis back with size 1, so y indexes like x.
		y.Shape = keep
		y.Stride = append(append(append([]int64(nil), y.Stride[:ax]...), 0), y.Stride[ax:]...)
	default:
		return Dispatch{}, fmt.Errorf("vulkan: %s: y of shape %v, want %v or %v (x %v over axis %d)", op, y.Shape, keep, dropped, x.Shape, ax)
	}
	if kind == 2 && x.Shape[ax] == 0 && numel(keep) > 0 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: max over an empty axis %d of %v", op, ax, x.Shape)
	}
	l, err := dmLinesOf(op, x, y, ax)
	if err != nil {
		return Dispatch{}, err
	}
	mode, groups := l.groups()
	push := []uint32{uint32(l.lines), uint32(l.n), l.osh[0], l.osh[1], l.osh[2], l.xoff, l.xo[0], l.xo[1], l.xo[2], l.xa,
		l.yoff, l.yo[0], l.yo[1], l.yo[2], uint32(kind), mode}
	return Dispatch{op: op, shader: "reduce", nbuf: 2, bufs: []*Buffer{x.Buf, y.Buf}, push: push, groups: groups}, nil
}

// CumsumOp is y = the running sum of x along axis (negative counts from the end), in fp32
// (the CPU sums in double). F32, y of x's shape; y may be x itself (in place). Both may be
// strided views of up to MaxDims axes; contiguous ones may have any rank.
func CumsumOp(x, y Tensor, axis int) (Dispatch, error) {
	const op = "cumsum"
	if err := dmInOut(op, x, y); err != nil {
		return Dispatch{}, err
	}
	ax, err := dmAxis(op, axis, len(x.Shape))
	if err != nil {
		return Dispatch{}, err
	}
	if !slices.Equal(x.Shape, y.Shape) {
		return Dispatch{}, fmt.Errorf("vulkan: %s: y of shape %v, want x's %v", op, y.Shape, x.Shape)
	}
	l, err := dmLinesOf(op, x, y, ax)
	if err != nil {
		return Dispatch{}, err
	}
	mode, groups := l.groups()
	push := []uint32{uint32(l.lines), uint32(l.n), l.osh[0], l.osh[1], l.osh[2], l.xoff, l.xo[0], l.xo[1], l.xo[2], l.xa,
		l.yoff, l.yo[0], l.yo[1], l.yo[2], l.ya, mode}
	return Dispatch{op: op, shader: "cumsum", nbuf: 2, bufs: []*Buffer{x.Buf, y.Buf}, push: push, groups: groups}, nil
}
