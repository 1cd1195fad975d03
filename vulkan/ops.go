package vulkan

/*
#include <stdlib.h>
#include "vk.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"
)

// MaxDims is the most axes an operand of these shaders has.
const MaxDims = 4

// Tensor is an operand in a buffer: its element offset, shape and strides (in elements;
// stride 0 broadcasts). At most MaxDims axes.
type Tensor struct {
	Buf    *Buffer
	Off    int
	Shape  []int64
	Stride []int64
}

// Contiguous is a row-major tensor of shape at the start of b.
func Contiguous(b *Buffer, shape ...int64) Tensor {
	stride := make([]int64, len(shape))
	s := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		stride[i] = s
		s *= shape[i]
	}
	return Tensor{Buf: b, Shape: shape, Stride: stride}
}

func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// span is the value index one past the last element t reads or writes.
func (t Tensor) span() int64 {
	end := int64(t.Off) + 1
	for i, d := range t.Shape {
		if d == 0 {
			return int64(t.Off)
		}
		end += (d - 1) * t.Stride[i]
	}
	return end
}

// words4 pads shape and strides on the left to 4 axes: the shaders' layout.
func words4(shape, stride []int64) (sh, st [4]uint32) {
	pad := MaxDims - len(shape)
	for i := range MaxDims {
		sh[i], st[i] = 1, 0
		if i >= pad {
			sh[i], st[i] = uint32(shape[i-pad]), uint32(stride[i-pad])
		}
	}
	return sh, st
}

// check validates an operand of op for shape.
func (t Tensor) check(op, role string, shape []int64) error {
	switch {
	case t.Buf == nil || t.Buf.b == nil:
		return fmt.Errorf("vulkan: %s: %s has no buffer", op, role)
	case len(t.Shape) != len(shape) || len(t.Stride) != len(t.Shape):
		return fmt.Errorf("vulkan: %s: %s of shape %v (strides %v), want %d axes", op, role, t.Shape, t.Stride, len(shape))
	case len(t.Shape) > MaxDims:
		return fmt.Errorf("vulkan: %s: %s has %d axes; the shaders take at most %d", op, role, len(t.Shape), MaxDims)
	case t.Off < 0 || t.span() > int64(t.Buf.Len()):
		return fmt.Errorf("vulkan: %s: %s %v at offset %d reaches past its buffer of %d values", op, role, t.Shape, t.Off, t.Buf.Len())
	}
	for i, d := range t.Shape {
		if d != shape[i] || t.Stride[i] < 0 || t.Stride[i] > math.MaxUint32 {
			return fmt.Errorf("vulkan: %s: %s of shape %v (strides %v), want %v", op, role, t.Shape, t.Stride, shape)
		}
	}
	return nil
}

// Dispatch is one recorded shader run: a pipeline, its buffers, push constants, groups.
type Dispatch struct {
	op     string
	shader string
	nbuf   int
	bufs   []*Buffer
	push   []uint32
	groups [3]uint32

	declared      bool // reads and writes are known (WithAccess)
	reads, writes []span
}

// span is the values [lo, hi) of a buffer an operand may touch.
type span struct {
	buf    *Buffer
	lo, hi int64
}

func (a span) overlaps(b span) bool { return a.buf == b.buf && a.lo < b.hi && b.lo < a.hi }

// WithAccess declares what the dispatch reads and writes, so that a Program puts a barrier
// before it only when it reads or writes what an earlier dispatch since the last barrier
// wrote, or writes what one read; on a GPU independent dispatches then overlap. A dispatch
// without declared access is fenced on both sides.
func (d Dispatch) WithAccess(reads, writes []Tensor) Dispatch {
	d.declared = true
	d.reads, d.writes = nil, nil
	for _, t := range reads {
		d.reads = append(d.reads, span{t.Buf, int64(t.Off), t.span()})
	}
	for _, t := range writes {
		d.writes = append(d.writes, span{t.Buf, int64(t.Off), t.span()})
	}
	return d
}

// hazards tracks what the dispatches since the last barrier read and wrote.
type hazards struct {
	fenced        bool // the last dispatch declared nothing: the next needs a barrier
	reads, writes []span
}

// needs reports whether d must wait for the dispatches before it, and notes d's access.
func (h *hazards) needs(d Dispatch) bool {
	conflict := func(a, b []span) bool {
		for _, x := range a {
			for _, y := range b {
				if x.overlaps(y) {
					return true
				}
			}
		}
		return false
	}
	barrier := h.fenced || !d.declared || conflict(d.reads, h.writes) || conflict(d.writes, h.writes) || conflict(d.writes, h.reads)
	if barrier {
		h.reads, h.writes = nil, nil
	}
	h.fenced = !d.declared
	h.reads = append(h.reads, d.reads...)
	h.writes = append(h.writes, d.writes...)
	return barrier
}

// elementGroups is the dispatch size for n elements in workgroups of 256 (the y axis takes
// what the x axis's 65 535 groups cannot).
func elementGroups(n int64) [3]uint32 {
	g := (n + 255) / 256
	gx := min(g, 65535)
	return [3]uint32{uint32(max(gx, 1)), uint32(max((g+gx-1)/max(gx, 1), 1)), 1}
}

// UnaryOp is y = op(x) elementwise (op: cgo.UNeg … cgo.URecip, or UCopy); p0 and p1 are
// clamp's bounds and scale's factor and offset.
func UnaryOp(op int, x, y Tensor, p0, p1 float32) (Dispatch, error) {
	if op < 0 || op > UCopy {
		return Dispatch{}, fmt.Errorf("vulkan: unary op %d", op)
	}
	if err := x.check("unary", "x", y.Shape); err != nil {
		return Dispatch{}, err
	}
	if err := y.check("unary", "y", y.Shape); err != nil {
		return Dispatch{}, err
	}
	sh, xs := words4(x.Shape, x.Stride)
	_, ys := words4(y.Shape, y.Stride)
	n := numel(y.Shape)
	push := []uint32{uint32(n), sh[0], sh[1], sh[2], sh[3], uint32(x.Off), xs[0], xs[1], xs[2], xs[3],
		uint32(y.Off), ys[0], ys[1], ys[2], ys[3], uint32(op), math.Float32bits(p0), math.Float32bits(p1)}
	return Dispatch{op: "unary", shader: "unary", nbuf: 2, bufs: []*Buffer{x.Buf, y.Buf}, push: push, groups: elementGroups(n)}, nil
}

// UCopy is the unary shader's plain copy (a strided view made contiguous, a broadcast).
const UCopy = 17

// BinaryOp is y = a op b elementwise (op: cgo.BAdd … cgo.BMin); a and b may broadcast
// (stride 0) to y's shape.
func BinaryOp(op int, a, b, y Tensor) (Dispatch, error) {
	if op < 0 || op > 5 {
		return Dispatch{}, fmt.Errorf("vulkan: binary op %d", op)
	}
	for _, c := range []struct {
		t    Tensor
		role string
	}{{a, "a"}, {b, "b"}, {y, "y"}} {
		if err := c.t.check("binary", c.role, y.Shape); err != nil {
			return Dispatch{}, err
		}
	}
	sh, as := words4(a.Shape, a.Stride)
	_, bs := words4(b.Shape, b.Stride)
	_, ys := words4(y.Shape, y.Stride)
	n := numel(y.Shape)
	push := []uint32{uint32(n), sh[0], sh[1], sh[2], sh[3], uint32(a.Off), as[0], as[1], as[2], as[3],
		uint32(b.Off), bs[0], bs[1], bs[2], bs[3], uint32(y.Off), ys[0], ys[1], ys[2], ys[3], uint32(op)}
	return Dispatch{op: "binary", shader: "binary", nbuf: 3, bufs: []*Buffer{a.Buf, b.Buf, y.Buf}, push: push, groups: elementGroups(n)}, nil
}

// MatmulOp is y[.., M, N] = a[.., M, K]·b[.., K, N] (+ bias[N]) with up to two batch axes;
// bT: b is given as [.., N, K]. Every operand may be a strided view; batch axes of a and b
// may broadcast (stride 0).
func MatmulOp(a, b Tensor, bias *Tensor, y Tensor, bT bool) (Dispatch, error) {
	r := len(y.Shape)
	if r < 2 || r > 4 {
		return Dispatch{}, fmt.Errorf("vulkan: matmul: y %v must have 2 to 4 axes", y.Shape)
	}
	m, n := y.Shape[r-2], y.Shape[r-1]
	k := a.Shape[len(a.Shape)-1]
	batch := y.Shape[:r-2]
	bshape := append(append([]int64(nil), batch...), k, n)
	if bT {
		bshape = append(append([]int64(nil), batch...), n, k)
	}
	if err := a.check("matmul", "a", append(append([]int64(nil), batch...), m, k)); err != nil {
		return Dispatch{}, err
	}
	if err := b.check("matmul", "b", bshape); err != nil {
		return Dispatch{}, err
	}
	if err := y.check("matmul", "y", y.Shape); err != nil {
		return Dispatch{}, err
	}
	if k < 1 || m < 1 || n < 1 {
		return Dispatch{}, fmt.Errorf("vulkan: matmul of %d×%d×%d", m, k, n)
	}
	// Batch strides padded to two axes.
	bat := func(t Tensor) (uint32, uint32) {
		s := t.Stride[:len(t.Stride)-2]
		switch len(s) {
		case 2:
			return uint32(s[0]), uint32(s[1])
		case 1:
			return 0, uint32(s[0])
		}
		return 0, 0
	}
	nb0, nb1 := int64(1), int64(1)
	switch len(batch) {
	case 2:
		nb0, nb1 = batch[0], batch[1]
	case 1:
		nb1 = batch[0]
	}
	ab0, ab1 := bat(a)
	bb0, bb1 := bat(b)
	yb0, yb1 := bat(y)
	bk, bn := b.Stride[len(b.Stride)-2], b.Stride[len(b.Stride)-1]
	if bT {
		bk, bn = bn, bk
	}
	biasBuf, biasOff, has := y.Buf, uint32(0), uint32(0)
	if bias != nil {
		if err := bias.check("matmul", "bias", []int64{n}); err != nil {
			return Dispatch{}, err
		}
		if bias.Stride[0] != 1 {
			return Dispatch{}, fmt.Errorf("vulkan: matmul: bias must be contiguous")
		}
		biasBuf, biasOff, has = bias.Buf, uint32(bias.Off), 1
	}
	push := []uint32{uint32(m), uint32(n), uint32(k), uint32(nb1),
		uint32(a.Off), ab0, ab1, uint32(a.Stride[r-2]), uint32(a.Stride[r-1]),
		uint32(b.Off), bb0, bb1, uint32(bk), uint32(bn),
		uint32(y.Off), yb0, yb1, uint32(y.Stride[r-2]), uint32(y.Stride[r-1]),
		biasOff, has}
	shader := matmulShader(y.Buf.dev, m, n, a.Stride[r-1] == 1 && bk == 1)
	tile := map[string]int64{"matmul": 16, "matmul_tiled": 64, "matmul_sg8k": 8}[shader]
	groups := [3]uint32{uint32((n + tile - 1) / tile), uint32((m + tile - 1) / tile), uint32(nb0 * nb1)}
	if groups[0] > 65535 || groups[1] > 65535 || groups[2] > 65535 {
		return Dispatch{}, fmt.Errorf("vulkan: matmul %v too large for one dispatch", y.Shape)
	}
	return Dispatch{op: "matmul", shader: shader, nbuf: 4, bufs: []*Buffer{a.Buf, b.Buf, biasBuf, y.Buf}, push: push, groups: groups}, nil
}

// tiledMatmulRows is the smallest M and N that take the 64×64-tile kernel: smaller products
// (a DiT step's 16 rows, a decode step's one) keep 16×16 tiles, which give a GPU more
// workgroups and waste no work on empty rows.
var tiledMatmulRows int64 = 64

// matmulTestShader, when set, is the shader Matmul takes (matmul_sg8k only where it
// applies): tests run each on one device.
var matmulTestShader string

// matmulShader is Matmul's shader for an m×n output on dev, a and b contiguous along k or
// not: on a software device with subgroup arithmetic in subgroups of 8 or more, matmul_sg8k
// where both run along k (a Linear), whose workgroups of one subgroup meet no barrier
// (lavapipe, MioCodec's 2736×394×392 with Wᵀ: 315 ms a product in 64×64 tiles, 114 ms);
// else the 64×64 tiles from tiledMatmulRows rows and columns, and 16×16 ones below.
func matmulShader(dev *Device, m, n int64, kContiguous bool) string {
	if matmulTestShader != "" && (kContiguous || matmulTestShader != "matmul_sg8k") {
		return matmulTestShader
	}
	switch {
	case kContiguous && lqOneSubgroup(dev.Info):
		return "matmul_sg8k"
	case m >= tiledMatmulRows && n >= tiledMatmulRows:
		return "matmul_tiled"
	}
	return "matmul"
}

// Run runs one dispatch at once (a program of one) and waits for it.
func (d *Device) Run(ds Dispatch) error {
	p, err := d.NewProgram([]Dispatch{ds})
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Run()
}

// Program is dispatches recorded once into one command buffer, with barriers where one
// depends on another (see Dispatch.WithAccess), and replayed by Run in one submission.
type Program struct {
	dev *Device
	p   *C.vxk_prog
	// Barriers is how many barriers the dispatches needed (the first dispatch has none).
	Barriers int
	n        int
	timed    bool
	err      *C.char // Run's error message buffer, allocated once: a run allocates nothing
}

// Times is how long each dispatch of the last run took on the device (from the end of the
// one before; dispatches that overlap share their time); nil for an untimed program.
func (p *Program) Times() ([]time.Duration, error) {
	if !p.timed || p.n == 0 {
		return nil, nil
	}
	ns := (*C.double)(C.calloc(C.size_t(p.n), C.sizeof_double))
	defer C.free(unsafe.Pointer(ns))
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	if C.vxk_prog_times(p.p, ns, e) != 0 {
		return nil, p.dev.errorf("timestamps", e)
	}
	out := make([]time.Duration, p.n)
	for i, v := range unsafe.Slice((*float64)(unsafe.Pointer(ns)), p.n) {
		out[i] = time.Duration(v)
	}
	return out, nil
}

// NewProgram records the dispatches in order.
func (d *Device) NewProgram(ds []Dispatch) (*Program, error) { return d.newProgram(ds, false) }

// NewTimedProgram is NewProgram with a timestamp after every dispatch (Times), where the
// device has timestamps (Timestamps); they cost a little on every run.
func (d *Device) NewTimedProgram(ds []Dispatch) (*Program, error) { return d.newProgram(ds, true) }

// Timestamps reports whether the device's compute queue can time dispatches.
func (d *Device) Timestamps() bool { return C.vxk_timestamps(d.d) != 0 }

func (d *Device) newProgram(ds []Dispatch, timed bool) (*Program, error) {
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	if d.isClosed() {
		return nil, ErrClosed
	}
	ct := C.int(0)
	if timed && d.Timestamps() {
		ct = 1
	}
	p := C.vxk_prog_new(d.d, C.int(len(ds)), ct, e)
	if p == nil {
		return nil, d.errorf("program", e)
	}
	prog := &Program{dev: d, p: p, n: len(ds), timed: ct != 0, err: errBuf()}
	if !d.track(nil, prog) { // closed meanwhile
		prog.free()
		return nil, ErrClosed
	}
	table := (*[16]*C.vxk_buf)(C.calloc(16, C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(table))
	push := (*[32]uint32)(C.calloc(32, 4))
	defer C.free(unsafe.Pointer(push))
	var hz hazards
	for i, dp := range ds {
		pl, err := d.shader(dp.shader, dp.nbuf, 4*len(dp.push))
		if err != nil {
			prog.Close()
			return nil, err
		}
		for j, b := range dp.bufs {
			if b == nil || b.b == nil || b.dev != d {
				prog.Close()
				return nil, fmt.Errorf("vulkan: dispatch %d (%s): buffer %d is freed or of another device", i, dp.op, j)
			}
			table[j] = b.b
		}
		copy(push[:], dp.push)
		barrier := C.int(0)
		if hz.needs(dp) && i > 0 {
			barrier = 1
			prog.Barriers++
		}
		if C.vxk_prog_add(p, pl.p, barrier, &table[0], C.int(len(dp.bufs)), unsafe.Pointer(&push[0]), C.int(4*len(dp.push)),
			C.uint32_t(dp.groups[0]), C.uint32_t(dp.groups[1]), C.uint32_t(dp.groups[2]), e) != 0 {
			prog.Close()
			return nil, d.errorf(fmt.Sprintf("dispatch %d (%s)", i, dp.op), e)
		}
	}
	if C.vxk_prog_end(p, e) != 0 {
		prog.Close()
		return nil, d.errorf("program", e)
	}
	return prog, nil
}

// Run submits the recorded dispatches and waits for them.
func (p *Program) Run() error {
	if p.p == nil {
		return errors.New("vulkan: run of a closed program")
	}
	*p.err = 0
	if C.vxk_prog_run(p.p, p.err) != 0 {
		return p.dev.errorf("run", p.err)
	}
	return nil
}

// Close frees the program (not its buffers).
func (p *Program) Close() {
	if p.dev.untrack(nil, p) {
		p.free()
	}
}

// free releases the program; its caller has taken it off the device's live list.
func (p *Program) free() {
	if p.p != nil {
		C.vxk_prog_free(p.p)
		C.free(unsafe.Pointer(p.err))
		p.p, p.err = nil, nil
	}
}

// contiguous reports whether t is row-major with no gaps.
func (t Tensor) contiguous() bool {
	s := int64(1)
	for i := len(t.Shape) - 1; i >= 0; i-- {
		if t.Shape[i] != 1 && t.Stride[i] != s {
			return false
		}
		s *= t.Shape[i]
	}
	return true
}

// rowGroups is the dispatch size for one workgroup per row.
func rowGroups(rows int64) [3]uint32 {
	gx := min(rows, 65535)
	return [3]uint32{uint32(max(gx, 1)), uint32(max((rows+gx-1)/max(gx, 1), 1)), 1}
}

// rowsOf checks a contiguous operand and returns its rows and row length.
func rowsOf(op, role string, t Tensor, shape []int64) (rows, n int64, err error) {
	if err := t.check(op, role, shape); err != nil {
		return 0, 0, err
	}
	if !t.contiguous() || len(shape) == 0 {
		return 0, 0, fmt.Errorf("vulkan: %s: %s %v must be contiguous", op, role, t.Shape)
	}
	n = shape[len(shape)-1]
	if n == 0 {
		return 0, 0, fmt.Errorf("vulkan: %s: rows of no values", op)
	}
	return numel(shape) / n, n, nil
}

// NormOp is LayerNorm (rms false: (x − mean)/sqrt(var + eps)·w + b) or RMSNorm (x/rms·w) over
// the last axis of contiguous x into contiguous y; w and b (length n, contiguous) optional.
func NormOp(rms bool, x Tensor, w, b *Tensor, y Tensor, eps float32) (Dispatch, error) {
	rows, n, err := rowsOf("norm", "x", x, y.Shape)
	if err == nil {
		_, _, err = rowsOf("norm", "y", y, y.Shape)
	}
	if err != nil {
		return Dispatch{}, err
	}
	bufs := []*Buffer{x.Buf, x.Buf, x.Buf, y.Buf}
	var hasW, hasB, woff, boff uint32
	for i, o := range []*Tensor{w, b} {
		if o == nil {
			continue
		}
		if err := o.check("norm", "weight", []int64{n}); err != nil || o.Stride[0] != 1 {
			return Dispatch{}, fmt.Errorf("vulkan: norm: weight/bias must be %d contiguous values", n)
		}
		bufs[1+i] = o.Buf
		if i == 0 {
			hasW, woff = 1, uint32(o.Off)
		} else {
			hasB, boff = 1, uint32(o.Off)
		}
	}
	mode := uint32(0)
	if rms {
		mode = 1
	}
	push := []uint32{uint32(rows), uint32(n), mode, hasW, hasB, math.Float32bits(eps), uint32(x.Off), woff, boff, uint32(y.Off)}
	return Dispatch{op: "norm", shader: "norm", nbuf: 4, bufs: bufs, push: push, groups: rowGroups(rows)}, nil
}

// SoftmaxOp is y = softmax(x·scale + mask) over the last axis of contiguous x (up to 4
// axes) into contiguous y; the mask (x's shape, any strides, 0 to broadcast) is optional.
func SoftmaxOp(x Tensor, mask *Tensor, y Tensor, scale float32) (Dispatch, error) {
	rows, n, err := rowsOf("softmax", "x", x, y.Shape)
	if err == nil {
		_, _, err = rowsOf("softmax", "y", y, y.Shape)
	}
	if err != nil {
		return Dispatch{}, err
	}
	sh, _ := words4(y.Shape, y.Stride)
	bufs := []*Buffer{x.Buf, x.Buf, y.Buf}
	var has, moff uint32
	var ms [4]uint32
	if mask != nil {
		if err := mask.check("softmax", "mask", y.Shape); err != nil {
			return Dispatch{}, err
		}
		_, ms = words4(mask.Shape, mask.Stride)
		bufs[1], has, moff = mask.Buf, 1, uint32(mask.Off)
	}
	push := []uint32{uint32(rows), uint32(n), math.Float32bits(scale), has, uint32(x.Off), uint32(y.Off), moff,
		sh[1], sh[2], ms[0], ms[1], ms[2], ms[3]}
	return Dispatch{op: "softmax", shader: "softmax", nbuf: 3, bufs: bufs, push: push, groups: rowGroups(rows)}, nil
}

// RopeTable writes the cos and sin of every rotary angle for positions pos into cs
// ([len(pos)][rot/2][2]): pair i of position p turns by p·theta^(−2i/rot), computed in
// double precision and rounded to float, as the CPU backend does.
func RopeTable(cs []float32, pos []int32, theta float64, rot int) {
	half := rot / 2
	for i := range half {
		inv := math.Pow(theta, -float64(2*i)/float64(rot))
		for t, p := range pos {
			a := float64(p) * inv
			cs[2*(t*half+i)] = float32(math.Cos(a))
			cs[2*(t*half+i)+1] = float32(math.Sin(a))
		}
	}
}

// RopeOp turns x [B, H, T, D] (any strides) into contiguous y: pair i of the first rot dims
// (interleaved pairs, or rotate-half) by the angle whose cos and sin RopeTable wrote in cs
// ([T, rot/2, 2]) for the run's positions.
func RopeOp(x, cs Tensor, y Tensor, rot int, rotateHalf bool) (Dispatch, error) {
	if len(y.Shape) != 4 {
		return Dispatch{}, fmt.Errorf("vulkan: rope: y %v must be [B, H, T, D]", y.Shape)
	}
	T, D := y.Shape[2], y.Shape[3]
	if err := x.check("rope", "x", y.Shape); err != nil {
		return Dispatch{}, err
	}
	if _, _, err := rowsOf("rope", "y", y, y.Shape); err != nil {
		return Dispatch{}, err
	}
	if rot <= 0 || rot%2 != 0 || int64(rot) > D {
		return Dispatch{}, fmt.Errorf("vulkan: rope: %d rotary dims of %d", rot, D)
	}
	if err := cs.check("rope", "cos/sin table", []int64{T * int64(rot)}); err != nil || cs.Off%2 != 0 || cs.Stride[0] != 1 {
		return Dispatch{}, fmt.Errorf("vulkan: rope: a table of %d×%d values (RopeTable) at an even offset wanted", T, rot)
	}
	mode := uint32(0)
	if rotateHalf {
		mode = 1
	}
	n := numel(y.Shape)
	push := []uint32{uint32(n), uint32(y.Shape[1]), uint32(T), uint32(D), uint32(rot), mode,
		uint32(x.Off), uint32(x.Stride[0]), uint32(x.Stride[1]), uint32(x.Stride[2]), uint32(x.Stride[3]),
		uint32(cs.Off / 2), uint32(y.Off)}
	return Dispatch{op: "rope", shader: "rope", nbuf: 3, bufs: []*Buffer{x.Buf, cs.Buf, y.Buf}, push: push, groups: elementGroups(n)}, nil
}

// AttentionOp is y = softmax(q·kᵀ·scale + mask + bias)·v for q [B, H, Tq, D], k [B, Hk, Tk, D],
// v [B, Hk, Tk, Dv] (H a multiple of Hk: grouped-query), mask [Tq, Tk] and bias [H, Tq, Tk]
// optional; every operand but y [B, H, Tq, Dv] (contiguous) takes any strides. Dv ≤ 256.
func AttentionOp(q, k, v Tensor, mask, bias *Tensor, y Tensor, scale float32) (Dispatch, error) {
	if len(q.Shape) != 4 || len(k.Shape) != 4 || len(v.Shape) != 4 || len(y.Shape) != 4 {
		return Dispatch{}, fmt.Errorf("vulkan: attention: q, k, v, y must be [B, H, T, D]")
	}
	B, H, Tq, D := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3]
	Hk, Tk, Dv := k.Shape[1], k.Shape[2], v.Shape[3]
	if Hk == 0 || H%Hk != 0 || Dv > 256 || Tk == 0 {
		return Dispatch{}, fmt.Errorf("vulkan: attention: %d heads over %d kv heads, %d keys, value width %d (at most 256)", H, Hk, Tk, Dv)
	}
	checks := []struct {
		t     Tensor
		role  string
		shape []int64
	}{{q, "q", []int64{B, H, Tq, D}}, {k, "k", []int64{B, Hk, Tk, D}}, {v, "v", []int64{B, Hk, Tk, Dv}}, {y, "y", []int64{B, H, Tq, Dv}}}
	for _, c := range checks {
		if err := c.t.check("attention", c.role, c.shape); err != nil {
			return Dispatch{}, err
		}
	}
	if !y.contiguous() {
		return Dispatch{}, fmt.Errorf("vulkan: attention: y must be contiguous")
	}
	bufs := []*Buffer{q.Buf, k.Buf, v.Buf, q.Buf, q.Buf, y.Buf}
	var flags, moff, ms0, ms1, boff, bs0, bs1, bs2 uint32
	if mask != nil {
		if err := mask.check("attention", "mask", []int64{Tq, Tk}); err != nil {
			return Dispatch{}, err
		}
		bufs[3], flags, moff, ms0, ms1 = mask.Buf, flags|1, uint32(mask.Off), uint32(mask.Stride[0]), uint32(mask.Stride[1])
	}
	if bias != nil {
		if err := bias.check("attention", "bias", []int64{H, Tq, Tk}); err != nil {
			return Dispatch{}, err
		}
		bufs[4], flags, boff = bias.Buf, flags|2, uint32(bias.Off)
		bs0, bs1, bs2 = uint32(bias.Stride[0]), uint32(bias.Stride[1]), uint32(bias.Stride[2])
	}
	rows := B * H * Tq
	push := []uint32{uint32(H), uint32(Hk), uint32(Tq), uint32(Tk), uint32(D), uint32(Dv), math.Float32bits(scale), flags,
		uint32(q.Off), uint32(q.Stride[0]), uint32(q.Stride[1]), uint32(q.Stride[2]),
		uint32(k.Off), uint32(k.Stride[0]), uint32(k.Stride[1]), uint32(k.Stride[2]),
		uint32(v.Off), uint32(v.Stride[0]), uint32(v.Stride[1]), uint32(v.Stride[2]),
		moff, ms0, ms1, boff, bs0, bs1, bs2,
		uint32(y.Off), uint32(q.Stride[3]), uint32(k.Stride[3]), uint32(v.Stride[3]), uint32(rows)}
	return Dispatch{op: "attention", shader: "attention", nbuf: 6, bufs: bufs, push: push, groups: rowGroups(rows)}, nil
}
