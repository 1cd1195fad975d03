package vulkan

import (
	"fmt"
	"math"
)

// gnOperand validates x or y of a [B, C, ...] op against shape (at least 2 axes) and returns
// the view the shaders index: contiguous operands of any rank collapse to [B, C, S]; strided
// ones keep their axes (at most MaxDims).
func gnOperand(op, role string, t Tensor, shape []int64) (Tensor, error) {
	if t.Buf == nil || t.Buf.b == nil {
		return Tensor{}, fmt.Errorf("vulkan: %s: %s has no buffer", op, role)
	}
	if len(shape) < 2 || len(t.Shape) != len(shape) || len(t.Stride) != len(t.Shape) {
		return Tensor{}, fmt.Errorf("vulkan: %s: %s of shape %v (strides %v), want %v: [B, C, ...]", op, role, t.Shape, t.Stride, shape)
	}
	for i, d := range t.Shape {
		if d != shape[i] || d < 0 {
			return Tensor{}, fmt.Errorf("vulkan: %s: %s of shape %v, want %v", op, role, t.Shape, shape)
		}
	}
	v := t
	if t.contiguous() {
		s := numel(shape[2:])
		v = Tensor{Buf: t.Buf, Off: t.Off, Shape: []int64{shape[0], shape[1], s}, Stride: []int64{shape[1] * s, s, 1}}
	}
	if err := v.check(op, role, v.Shape); err != nil {
		return Tensor{}, err
	}
	if v.span() > math.MaxUint32 {
		return Tensor{}, fmt.Errorf("vulkan: %s: %s %v at offset %d is past the shaders' 32-bit indices", op, role, t.Shape, t.Off)
	}
	return v, nil
}

// gnParam validates a per-channel parameter: c contiguous values (any shape: [C], [1, C, 1]).
func gnParam(op, role string, t Tensor, c int64) error {
	switch {
	case t.Buf == nil || t.Buf.b == nil:
		return fmt.Errorf("vulkan: %s: %s has no buffer", op, role)
	case len(t.Stride) != len(t.Shape) || numel(t.Shape) != c || !t.contiguous():
		return fmt.Errorf("vulkan: %s: %s of shape %v (strides %v), want %d contiguous values", op, role, t.Shape, t.Stride, c)
	case t.Off < 0 || t.span() > int64(t.Buf.Len()):
		return fmt.Errorf("vulkan: %s: %s %v at offset %d reaches past its buffer of %d values", op, role, t.Shape, t.Off, t.Buf.Len())
	case t.span() > math.MaxUint32:
		return fmt.Errorf("vulkan: %s: %s at offset %d is past the shaders' 32-bit indices", op, role, t.Off)
	}
	return nil
}

// gnElementwise checks x and y of a per-channel elementwise op and returns the push
// constants' common head (n, shape, x and y offsets and strides, channel axis) and groups.
func gnElementwise(op string, x, y Tensor) ([]uint32, [3]uint32, error) {
	yv, err := gnOperand(op, "y", y, y.Shape)
	if err != nil {
		return nil, [3]uint32{}, err
	}
	xv, err := gnOperand(op, "x", x, y.Shape)
	if err != nil {
		return nil, [3]uint32{}, err
	}
	// Both views must have the same axes: collapse only when both are contiguous.
	if len(xv.Shape) != len(yv.Shape) {
		if xv, err = gnStrided(op, "x", x); err == nil {
			yv, err = gnStrided(op, "y", y)
		}
		if err != nil {
			return nil, [3]uint32{}, err
		}
	}
	n := numel(yv.Shape)
	if n > math.MaxUint32 {
		return nil, [3]uint32{}, fmt.Errorf("vulkan: %s: %v is past the shaders' 32-bit indices", op, y.Shape)
	}
	sh, xs := words4(xv.Shape, xv.Stride)
	_, ys := words4(yv.Shape, yv.Stride)
	caxis := uint32(MaxDims - len(yv.Shape) + 1)
	push := []uint32{uint32(n), sh[0], sh[1], sh[2], sh[3], uint32(xv.Off), xs[0], xs[1], xs[2], xs[3],
		uint32(yv.Off), ys[0], ys[1], ys[2], ys[3], caxis}
	return push, elementGroups(n), nil
}

// gnStrided is t as it is (already validated by gnOperand), for at most MaxDims axes.
func gnStrided(op, role string, t Tensor) (Tensor, error) {
	if err := t.check(op, role, t.Shape); err != nil {
		return Tensor{}, err
	}
	return t, nil
}

// GroupNormOp normalises contiguous x [B, C, ...] (any number of trailing axes) over each of
// groups groups of C/groups channels and all trailing values (population variance), into
// contiguous y of x's shape: y = (x − mean)/sqrt(var + eps)·w[c] + b[c]; w and b (C
// contiguous values each) optional. groups = C is instance norm.
func GroupNormOp(x Tensor, w, b *Tensor, y Tensor, groups int, eps float32) (Dispatch, error) {
	const op = "groupnorm"
	yv, err := gnOperand(op, "y", y, y.Shape)
	if err != nil {
		return Dispatch{}, err
	}
	xv, err := gnOperand(op, "x", x, y.Shape)
	if err != nil {
		return Dispatch{}, err
	}
	if !x.contiguous() || !y.contiguous() {
		return Dispatch{}, fmt.Errorf("vulkan: %s: x (strides %v) and y (strides %v) must be contiguous", op, x.Stride, y.Stride)
	}
	B, C, S := yv.Shape[0], yv.Shape[1], yv.Shape[2]
	if groups <= 0 || C%int64(groups) != 0 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: %d groups for %d channels", op, groups, C)
	}
	if math.IsNaN(float64(eps)) || eps < 0 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: eps %v", op, eps)
	}
	rows := B * int64(groups)
	if rows > 65535*65535 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: %d batch×group rows are too many for one dispatch", op, rows)
	}
	bufs := []*Buffer{x.Buf, x.Buf, x.Buf, y.Buf}
	var hasW, hasB, woff, boff uint32
	if w != nil {
		if err := gnParam(op, "weight", *w, C); err != nil {
			return Dispatch{}, err
		}
		bufs[1], hasW, woff = w.Buf, 1, uint32(w.Off)
	}
	if b != nil {
		if err := gnParam(op, "bias", *b, C); err != nil {
			return Dispatch{}, err
		}
		bufs[2], hasB, boff = b.Buf, 1, uint32(b.Off)
	}
	cpg := C / int64(groups)
	push := []uint32{uint32(rows), uint32(cpg * S), uint32(S), uint32(cpg), uint32(groups), hasW, hasB, math.Float32bits(eps),
		uint32(xv.Off), woff, boff, uint32(yv.Off)}
	return Dispatch{op: op, shader: "groupnorm", nbuf: 4, bufs: bufs, push: push, groups: rowGroups(rows)}, nil
}

// ChannelAffineOp is y = x·scale[c] + shift[c] over x [B, C, ...] (inference batch norm,
// folded); scale and shift are C contiguous values each. A shift without a buffer
// (Tensor{}) is none, as the CPU kernel's optional shift. x and y may be strided views of up
// to MaxDims axes; contiguous ones may have any rank.
func ChannelAffineOp(x, scale, shift, y Tensor) (Dispatch, error) {
	const op = "channelaffine"
	push, groups, err := gnElementwise(op, x, y)
	if err != nil {
		return Dispatch{}, err
	}
	C := y.Shape[1]
	if err := gnParam(op, "scale", scale, C); err != nil {
		return Dispatch{}, err
	}
	shiftBuf, hoff, has := scale.Buf, uint32(0), uint32(0)
	if shift.Buf != nil {
		if err := gnParam(op, "shift", shift, C); err != nil {
			return Dispatch{}, err
		}
		shiftBuf, hoff, has = shift.Buf, uint32(shift.Off), 1
	}
	push = append(push, uint32(scale.Off), hoff, has)
	return Dispatch{op: op, shader: "chanaffine", nbuf: 4, bufs: []*Buffer{x.Buf, scale.Buf, shiftBuf, y.Buf}, push: push, groups: groups}, nil
}

// SnakeBetaOp is y = x + 1/(exp(beta[c]) + 1e-9)·sin(x·exp(alpha[c]))² over x [B, C, T]
// (alpha and beta: C contiguous values each, log scale). x and y may be strided views of up
// to MaxDims axes; contiguous ones may have any rank from 2.
func SnakeBetaOp(x, alpha, beta, y Tensor) (Dispatch, error) {
	const op = "snakebeta"
	push, groups, err := gnElementwise(op, x, y)
	if err != nil {
		return Dispatch{}, err
	}
	C := y.Shape[1]
	if err := gnParam(op, "alpha", alpha, C); err != nil {
		return Dispatch{}, err
	}
	if err := gnParam(op, "beta", beta, C); err != nil {
		return Dispatch{}, err
	}
	push = append(push, uint32(alpha.Off), uint32(beta.Off))
	return Dispatch{op: op, shader: "snake", nbuf: 4, bufs: []*Buffer{x.Buf, alpha.Buf, beta.Buf, y.Buf}, push: push, groups: groups}, nil
}
