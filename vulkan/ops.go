package vulkan

/*
#include <stdlib.h>
#include "vk.h"
*/
import "C"

import (
	"fmt"
	"math"
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
	groups := [3]uint32{uint32((n + 15) / 16), uint32((m + 15) / 16), uint32(nb0 * nb1)}
	if groups[0] > 65535 || groups[1] > 65535 || groups[2] > 65535 {
		return Dispatch{}, fmt.Errorf("vulkan: matmul %v too large for one dispatch", y.Shape)
	}
	return Dispatch{op: "matmul", shader: "matmul", nbuf: 4, bufs: []*Buffer{a.Buf, b.Buf, biasBuf, y.Buf}, push: push, groups: groups}, nil
}

// Run runs one dispatch at once and waits for it.
func (d *Device) Run(ds Dispatch) error {
	p, err := d.shader(ds.shader, ds.nbuf, 4*len(ds.push))
	if err != nil {
		return err
	}
	return d.dispatch(ds.op, p, ds.bufs, ds.push, ds.groups)
}

// Program is dispatches recorded once into one command buffer, with a barrier between
// consecutive ones, and replayed by Run in one submission.
type Program struct {
	dev *Device
	p   *C.vxk_prog
}

// NewProgram records the dispatches in order.
func (d *Device) NewProgram(ds []Dispatch) (*Program, error) {
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	p := C.vxk_prog_new(d.d, C.int(len(ds)), e)
	if p == nil {
		return nil, d.errorf("program", e)
	}
	prog := &Program{dev: d, p: p}
	table := (*[16]*C.vxk_buf)(C.calloc(16, C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(table))
	push := (*[32]uint32)(C.calloc(32, 4))
	defer C.free(unsafe.Pointer(push))
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
		if C.vxk_prog_add(p, pl.p, &table[0], C.int(len(dp.bufs)), unsafe.Pointer(&push[0]), C.int(4*len(dp.push)),
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
	e := errBuf()
	defer C.free(unsafe.Pointer(e))
	if C.vxk_prog_run(p.p, e) != 0 {
		return p.dev.errorf("run", e)
	}
	return nil
}

// Close frees the program (not its buffers).
func (p *Program) Close() {
	if p.p != nil {
		C.vxk_prog_free(p.p)
		p.p = nil
	}
}
