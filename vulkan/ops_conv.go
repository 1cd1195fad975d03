package vulkan

import (
	"fmt"
	"math"
)

// convOperand validates a conv operand of rank len(shape) against shape; the shaders index
// with 32-bit unsigned offsets.
func convOperand(op, role string, t Tensor, shape []int64) error {
	if len(t.Shape) != len(shape) {
		return fmt.Errorf("vulkan: %s: %s of shape %v, want %d axes %v", op, role, t.Shape, len(shape), shape)
	}
	for _, d := range shape {
		if d < 0 {
			return fmt.Errorf("vulkan: %s: %s of shape %v", op, role, shape)
		}
	}
	if err := t.check(op, role, shape); err != nil {
		return err
	}
	if t.span() > math.MaxUint32 {
		return fmt.Errorf("vulkan: %s: %s %v at offset %d is past the shaders' 32-bit indices", op, role, t.Shape, t.Off)
	}
	return nil
}

// convOutput validates y: an operand whose axes of more than one value do not broadcast
// (one invocation per element writes it).
func convOutput(op string, y Tensor, shape []int64) error {
	if err := convOperand(op, "y", y, shape); err != nil {
		return err
	}
	for i, d := range shape {
		if d > 1 && y.Stride[i] == 0 {
			return fmt.Errorf("vulkan: %s: y %v has a broadcast axis (strides %v)", op, y.Shape, y.Stride)
		}
	}
	return nil
}

// convBias validates an optional bias of n values (any shape with one axis of n and the
// others 1, any stride along it) and returns its buffer (y's when absent, never read),
// offset, stride and presence flag.
func convBias(op string, bias *Tensor, n int64, y Tensor) (*Buffer, uint32, uint32, uint32, error) {
	if bias == nil {
		return y.Buf, 0, 0, 0, nil
	}
	b := *bias
	if len(b.Shape) == 0 || len(b.Stride) != len(b.Shape) || numel(b.Shape) != n {
		return nil, 0, 0, 0, fmt.Errorf("vulkan: %s: bias of shape %v (strides %v), want %d values", op, b.Shape, b.Stride, n)
	}
	var stride int64
	for i, d := range b.Shape {
		if d == n && n != 1 {
			stride = b.Stride[i]
		} else if d != 1 {
			return nil, 0, 0, 0, fmt.Errorf("vulkan: %s: bias of shape %v, want %d values along one axis", op, b.Shape, n)
		}
	}
	if err := convOperand(op, "bias", b, b.Shape); err != nil {
		return nil, 0, 0, 0, err
	}
	return b.Buf, uint32(b.Off), uint32(stride), 1, nil
}

// convParams checks that every parameter is at least its minimum (strides, dilations,
// groups ≥ 1; paddings ≥ 0) and small enough for the shaders' int arithmetic.
func convParams(op string, vals []int, mins []int, names []string) error {
	for i, v := range vals {
		if v < mins[i] || v > math.MaxInt32/4 {
			return fmt.Errorf("vulkan: %s: %s %d (want %d to %d)", op, names[i], v, mins[i], math.MaxInt32/4)
		}
	}
	return nil
}

// convGroups checks groups against the input and output channels.
func convGroups(op string, cin, cout int64, groups int) error {
	g := int64(groups)
	if cin%g != 0 || cout%g != 0 {
		return fmt.Errorf("vulkan: %s: %d groups do not divide %d input and %d output channels", op, groups, cin, cout)
	}
	return nil
}

// convDispatch is one invocation per output (n of them) in workgroups of 256, over x and y
// of the grid (elementGroups keeps each axis within 65 535 groups).
func convDispatch(op, shader string, n int64, x, w Tensor, biasBuf *Buffer, y Tensor, push []uint32) (Dispatch, error) {
	if n > math.MaxInt32 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: %d outputs are too many for one dispatch (32-bit invocation index)", op, n)
	}
	return Dispatch{op: op, shader: shader, nbuf: 4, bufs: []*Buffer{x.Buf, w.Buf, biasBuf, y.Buf}, push: push, groups: elementGroups(n)}, nil
}

// Conv1DOp is VX_OP_CONV1D: y [B, Cout, Tout] = conv(x [B, Cin, T], w [Cout, Cin/groups, K])
// + bias [Cout] (optional), with x zero-padded by padL on the left and padR on the right and
// Tout = (T + padL + padR − dil·(K−1) − 1)/stride + 1. Every operand may be a strided view
// (x's batch may broadcast with stride 0).
func Conv1DOp(x, w Tensor, bias *Tensor, y Tensor, stride, padL, padR, dil, groups int) (Dispatch, error) {
	const op = "conv1d"
	if err := convParams(op, []int{stride, padL, padR, dil, groups}, []int{1, 0, 0, 1, 1},
		[]string{"stride", "left padding", "right padding", "dilation", "groups"}); err != nil {
		return Dispatch{}, err
	}
	if len(x.Shape) != 3 || len(w.Shape) != 3 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: x %v and w %v, want x [B, Cin, T] and w [Cout, Cin/groups, K]", op, x.Shape, w.Shape)
	}
	B, Cin, T := x.Shape[0], x.Shape[1], x.Shape[2]
	Cout, K := w.Shape[0], w.Shape[2]
	if err := convGroups(op, Cin, Cout, groups); err != nil {
		return Dispatch{}, err
	}
	cig, cog := Cin/int64(groups), Cout/int64(groups)
	if w.Shape[1] != cig || K < 1 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: w %v, want [%d, %d, K ≥ 1] for %d input channels in %d groups", op, w.Shape, Cout, cig, Cin, groups)
	}
	span := T + int64(padL) + int64(padR) - int64(dil)*(K-1) - 1
	if span < 0 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: input of %d steps (padded %d+%d) is shorter than the kernel's %d taps at dilation %d", op, T, padL, padR, K, dil)
	}
	Tout := span/int64(stride) + 1
	if T > math.MaxInt32/4 || K > math.MaxInt32/4 || Tout*int64(stride)+int64(dil)*K > math.MaxInt32 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: %d steps with kernel %d, stride %d, dilation %d overflow the shader's 32-bit indices", op, T, K, stride, dil)
	}
	if err := convOperand(op, "x", x, x.Shape); err != nil {
		return Dispatch{}, err
	}
	if err := convOperand(op, "w", w, w.Shape); err != nil {
		return Dispatch{}, err
	}
	if err := convOutput(op, y, []int64{B, Cout, Tout}); err != nil {
		return Dispatch{}, err
	}
	biasBuf, boff, bs, has, err := convBias(op, bias, Cout, y)
	if err != nil {
		return Dispatch{}, err
	}
	cb := int64(1) // output channels an invocation sums: 4 when they never straddle a group
	if cog%4 == 0 {
		cb = 4
	}
	n := B * (Cout / cb) * Tout
	push := []uint32{uint32(n), uint32(Cout), uint32(Tout), uint32(T),
		uint32(cig), uint32(cog), uint32(K), uint32(stride), uint32(padL), uint32(dil),
		uint32(x.Off), uint32(x.Stride[0]), uint32(x.Stride[1]), uint32(x.Stride[2]),
		uint32(w.Off), uint32(w.Stride[0]), uint32(w.Stride[1]), uint32(w.Stride[2]),
		boff, bs, has,
		uint32(y.Off), uint32(y.Stride[0]), uint32(y.Stride[1]), uint32(y.Stride[2]), uint32(cb)}
	return convDispatch(op, "conv1d", n, x, w, biasBuf, y, push)
}

// ConvTranspose1DOp is VX_OP_CONV_TRANSPOSE1D: y [B, Cout, Tout] for x [B, Cin, T] and
// w [Cin, Cout/groups, K] (+ bias [Cout], optional), Tout = (T−1)·stride − 2·pad +
// dil·(K−1) + outPad + 1: every x[b, ci, j] adds w[ci, c, k]·x to y[b, g·Cout/groups + c,
// j·stride + k·dil − pad] where that lies in [0, Tout). Every operand may be a strided view
// (x's batch may broadcast with stride 0).
func ConvTranspose1DOp(x, w Tensor, bias *Tensor, y Tensor, stride, pad, outPad, dil, groups int) (Dispatch, error) {
	const op = "conv_transpose1d"
	if err := convParams(op, []int{stride, pad, outPad, dil, groups}, []int{1, 0, 0, 1, 1},
		[]string{"stride", "padding", "output padding", "dilation", "groups"}); err != nil {
		return Dispatch{}, err
	}
	if len(x.Shape) != 3 || len(w.Shape) != 3 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: x %v and w %v, want x [B, Cin, T] and w [Cin, Cout/groups, K]", op, x.Shape, w.Shape)
	}
	B, Cin, T := x.Shape[0], x.Shape[1], x.Shape[2]
	cog, K := w.Shape[1], w.Shape[2]
	Cout := cog * int64(groups)
	if w.Shape[0] != Cin || K < 1 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: w %v, want [%d, Cout/groups, K ≥ 1] for x %v", op, w.Shape, Cin, x.Shape)
	}
	if err := convGroups(op, Cin, Cout, groups); err != nil {
		return Dispatch{}, err
	}
	cig := Cin / int64(groups)
	if T < 1 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: input of %d steps", op, T)
	}
	if T > math.MaxInt32/4 || K > math.MaxInt32/4 || (T-1)*int64(stride)+int64(dil)*K+int64(outPad)+int64(pad) > math.MaxInt32 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: %d steps with kernel %d, stride %d, dilation %d overflow the shader's 32-bit indices", op, T, K, stride, dil)
	}
	Tout := (T-1)*int64(stride) - 2*int64(pad) + int64(dil)*(K-1) + int64(outPad) + 1
	if Tout < 1 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: padding %d leaves no output of %d steps with kernel %d, stride %d", op, pad, T, K, stride)
	}
	if err := convOperand(op, "x", x, x.Shape); err != nil {
		return Dispatch{}, err
	}
	if err := convOperand(op, "w", w, w.Shape); err != nil {
		return Dispatch{}, err
	}
	if err := convOutput(op, y, []int64{B, Cout, Tout}); err != nil {
		return Dispatch{}, err
	}
	biasBuf, boff, bs, has, err := convBias(op, bias, Cout, y)
	if err != nil {
		return Dispatch{}, err
	}
	kstep := stride / convGCD(stride, dil)
	n := B * Cout * Tout
	push := []uint32{uint32(n), uint32(Cout), uint32(Tout), uint32(T),
		uint32(cig), uint32(cog), uint32(K), uint32(stride), uint32(pad), uint32(dil), uint32(kstep),
		uint32(x.Off), uint32(x.Stride[0]), uint32(x.Stride[1]), uint32(x.Stride[2]),
		uint32(w.Off), uint32(w.Stride[0]), uint32(w.Stride[1]), uint32(w.Stride[2]),
		boff, bs, has,
		uint32(y.Off), uint32(y.Stride[0]), uint32(y.Stride[1]), uint32(y.Stride[2])}
	return convDispatch(op, "convt1d", n, x, w, biasBuf, y, push)
}

func convGCD(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Conv2DOp is VX_OP_CONV2D: y [B, Cout, OH, OW] = conv(x [B, Cin, H, W], w [Cout,
// Cin/groups, KH, KW]) + bias [Cout] (optional), x zero-padded by padH above and below and
// padW left and right, OH = (H + 2·padH − dilH·(KH−1) − 1)/strideH + 1 (OW alike). x and y
// may be strided views (x's batch may broadcast); w must be contiguous (the graph builder
// makes it so).
func Conv2DOp(x, w Tensor, bias *Tensor, y Tensor, strideH, strideW, padH, padW, dilH, dilW, groups int) (Dispatch, error) {
	const op = "conv2d"
	if err := convParams(op, []int{strideH, strideW, padH, padW, dilH, dilW, groups}, []int{1, 1, 0, 0, 1, 1, 1},
		[]string{"stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w", "groups"}); err != nil {
		return Dispatch{}, err
	}
	if len(x.Shape) != 4 || len(w.Shape) != 4 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: x %v and w %v, want x [B, Cin, H, W] and w [Cout, Cin/groups, KH, KW]", op, x.Shape, w.Shape)
	}
	B, Cin, H, W := x.Shape[0], x.Shape[1], x.Shape[2], x.Shape[3]
	Cout, KH, KW := w.Shape[0], w.Shape[2], w.Shape[3]
	if err := convGroups(op, Cin, Cout, groups); err != nil {
		return Dispatch{}, err
	}
	cig, cog := Cin/int64(groups), Cout/int64(groups)
	if w.Shape[1] != cig || KH < 1 || KW < 1 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: w %v, want [%d, %d, KH ≥ 1, KW ≥ 1] for %d input channels in %d groups", op, w.Shape, Cout, cig, Cin, groups)
	}
	spanH := H + 2*int64(padH) - int64(dilH)*(KH-1) - 1
	spanW := W + 2*int64(padW) - int64(dilW)*(KW-1) - 1
	if spanH < 0 || spanW < 0 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: input %d×%d (padded by %d, %d) is smaller than the kernel %d×%d at dilation %d, %d", op, H, W, padH, padW, KH, KW, dilH, dilW)
	}
	OH, OW := spanH/int64(strideH)+1, spanW/int64(strideW)+1
	if H > math.MaxInt32/4 || W > math.MaxInt32/4 || KH*KW > math.MaxInt32 ||
		OH*int64(strideH)+int64(dilH)*KH > math.MaxInt32 || OW*int64(strideW)+int64(dilW)*KW > math.MaxInt32 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: input %d×%d with kernel %d×%d overflows the shader's 32-bit indices", op, H, W, KH, KW)
	}
	if err := convOperand(op, "x", x, x.Shape); err != nil {
		return Dispatch{}, err
	}
	if err := convOperand(op, "w", w, w.Shape); err != nil {
		return Dispatch{}, err
	}
	if !w.contiguous() {
		return Dispatch{}, fmt.Errorf("vulkan: %s: w %v (strides %v) must be contiguous", op, w.Shape, w.Stride)
	}
	if err := convOutput(op, y, []int64{B, Cout, OH, OW}); err != nil {
		return Dispatch{}, err
	}
	biasBuf, boff, bs, has, err := convBias(op, bias, Cout, y)
	if err != nil {
		return Dispatch{}, err
	}
	n := B * Cout * OH * OW
	push := []uint32{uint32(n), uint32(Cout), uint32(OH), uint32(OW), uint32(H), uint32(W),
		uint32(cig), uint32(cog), uint32(KH), uint32(KW),
		uint32(strideH), uint32(strideW), uint32(padH), uint32(padW), uint32(dilH), uint32(dilW),
		uint32(x.Off), uint32(x.Stride[0]), uint32(x.Stride[1]), uint32(x.Stride[2]), uint32(x.Stride[3]),
		uint32(w.Off),
		boff, bs, has,
		uint32(y.Off), uint32(y.Stride[0]), uint32(y.Stride[1]), uint32(y.Stride[2]), uint32(y.Stride[3])}
	return convDispatch(op, "conv2d", n, x, w, biasBuf, y, push)
}
