package nn

import (
	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine"
)

// Linear is torch.nn.Linear: weight [out, in] (kept quantised when the file is), bias [out].
type Linear struct {
	Weight Matrix `gguf:"weight"`
	Bias   Tensor `gguf:"bias,optional"`
}

// NewLinear declares a Linear in → out, with a bias when bias is set.
func NewLinear(in, out int, bias bool) Linear {
	l := Linear{Weight: Matrix{Shaped(shapeOr(out, in)...)}}
	if bias {
		l.Bias = declaredBias(out)
	}
	return l
}

// Forward is x·Wᵀ + b over the last axis. A weight declared as a 1×1 convolution
// [out, in, 1] is loaded as the matrix [out, in].
func (l *Linear) Forward(g *engine.Graph, x engine.Tensor) engine.Tensor {
	return g.Linear(x, l.Weight.In(g), l.Bias.Opt(g))
}

// Embedding is torch.nn.Embedding: weight [n, dim] rows (kept quantised when the file is).
type Embedding struct {
	Weight Rows `gguf:"weight"`
}

// NewEmbedding declares n rows of dim values.
func NewEmbedding(n, dim int) Embedding {
	return Embedding{Weight: Rows{Shaped(shapeOr(n, dim)...)}}
}

// Forward gathers the rows of int32 ids.
func (e *Embedding) Forward(g *engine.Graph, ids engine.Tensor) engine.Tensor {
	return g.GatherRows(e.Weight.In(g), ids)
}

// LayerNorm is torch.nn.LayerNorm over the last axis: weight and bias [n].
type LayerNorm struct {
	Weight Tensor `gguf:"weight"`
	Bias   Tensor `gguf:"bias,optional"`
}

// NewLayerNorm declares a LayerNorm over n features (with a bias).
func NewLayerNorm(n int) LayerNorm {
	return LayerNorm{Weight: Shaped(n), Bias: declaredBias(n)}
}

// Forward normalises the last axis of x.
func (l *LayerNorm) Forward(g *engine.Graph, x engine.Tensor, eps float32) engine.Tensor {
	return g.LayerNorm(x, l.Weight.Opt(g), l.Bias.Opt(g), eps)
}

// RMSNorm is an RMS norm over the last axis: weight [n].
type RMSNorm struct {
	Weight Tensor `gguf:"weight"`
}

// NewRMSNorm declares an RMSNorm over n features.
func NewRMSNorm(n int) RMSNorm { return RMSNorm{Weight: Shaped(n)} }

// Forward normalises the last axis of x.
func (l *RMSNorm) Forward(g *engine.Graph, x engine.Tensor, eps float32) engine.Tensor {
	return g.RMSNorm(x, l.Weight.Opt(g), eps)
}

// GroupNorm is torch.nn.GroupNorm: weight and bias [channels].
type GroupNorm struct {
	Weight Tensor `gguf:"weight"`
	Bias   Tensor `gguf:"bias"`
}

// NewGroupNorm declares a GroupNorm over channels.
func NewGroupNorm(channels int) GroupNorm {
	return GroupNorm{Weight: Shaped(channels), Bias: Shaped(channels)}
}

// Forward normalises x [B, C, ...] in groups.
func (l *GroupNorm) Forward(g *engine.Graph, x engine.Tensor, groups int, eps float32) engine.Tensor {
	return g.GroupNorm(x, groups, l.Weight.Opt(g), l.Bias.Opt(g), eps)
}

// Conv1d is torch.nn.Conv1d: weight [out, in/groups, k], bias [out].
type Conv1d struct {
	Weight Tensor `gguf:"weight"`
	Bias   Tensor `gguf:"bias,optional"`
}

// NewConv1d declares a Conv1d in → out with kernel k in groups, with a bias when bias is set.
// Without groups its F32 weight is packed (F32P) when a row (in·k values, k > 1) has 64 values
// or more, as a Conv2d's is.
func NewConv1d(in, out, k, groups int, bias bool) Conv1d {
	c := Conv1d{Weight: Shaped(shapeOr(out, in/max(groups, 1), k)...)}
	if groups <= 1 {
		c.Weight.enc = kernelEnc // packed for the small-matrix kernel where its rows are long enough
	}
	if bias {
		c.Bias = declaredBias(out)
	}
	return c
}

// Forward convolves x [B, in, T]; the groups follow from x's and the weight's channels.
func (c *Conv1d) Forward(g *engine.Graph, x engine.Tensor, stride, padLeft, padRight, dilation int64) engine.Tensor {
	groups := x.Dim(1) / int64(max(c.Weight.Dim(1), 1))
	return g.Conv1D(x, c.Weight.In(g), c.Bias.Opt(g), stride, padLeft, padRight, dilation, groups)
}

// ConvTranspose1d is torch.nn.ConvTranspose1d: weight [in, out/groups, k], bias [out].
type ConvTranspose1d struct {
	Weight Tensor `gguf:"weight"`
	Bias   Tensor `gguf:"bias,optional"`
}

// NewConvTranspose1d declares a ConvTranspose1d in → out with kernel k in groups.
func NewConvTranspose1d(in, out, k, groups int, bias bool) ConvTranspose1d {
	c := ConvTranspose1d{Weight: Shaped(shapeOr(in, out/max(groups, 1), k)...)}
	if bias {
		c.Bias = declaredBias(out)
	}
	return c
}

// Forward is the transposed convolution of x [B, in, T].
func (c *ConvTranspose1d) Forward(g *engine.Graph, x engine.Tensor, stride, padding, outputPadding, dilation, groups int64) engine.Tensor {
	return g.ConvTranspose1D(x, c.Weight.In(g), c.Bias.Opt(g), stride, padding, outputPadding, dilation, groups)
}

// BatchNorm1d is torch.nn.BatchNorm1d in eval mode: weight, bias, running mean and variance
// [channels]. The fold into a per-channel scale and shift is part of the graph, so the
// statistics stay in the backend's buffers as the file has them.
type BatchNorm1d struct {
	Weight      Tensor `gguf:"weight"`
	Bias        Tensor `gguf:"bias"`
	RunningMean Tensor `gguf:"running_mean"`
	RunningVar  Tensor `gguf:"running_var"`
}

// NewBatchNorm1d declares a BatchNorm1d over channels.
func NewBatchNorm1d(channels int) BatchNorm1d {
	return BatchNorm1d{Weight: Shaped(channels), Bias: Shaped(channels), RunningMean: Shaped(channels), RunningVar: Shaped(channels)}
}

// Forward normalises x [B, C, ...] with the running statistics.
func (b *BatchNorm1d) Forward(g *engine.Graph, x engine.Tensor, eps float32) engine.Tensor {
	scale := g.Mul(b.Weight.In(g), g.Recip(g.Sqrt(g.Scale(b.RunningVar.In(g), 1, eps))))
	shift := g.Sub(b.Bias.In(g), g.Mul(b.RunningMean.In(g), scale))
	return g.ChannelAffine(x, scale, shift)
}

// Conv2d is torch.nn.Conv2d: weight [out, in/groups, kh, kw], bias [out].
type Conv2d struct {
	Weight Kernel `gguf:"weight"`
	Bias   Tensor `gguf:"bias,optional"`
}

// NewConv2d declares a Conv2d in → out with a kh×kw kernel, with a bias when bias is set.
// Its weight is packed for the small-matrix kernel, so it runs without groups.
func NewConv2d(in, out, kh, kw int, bias bool) Conv2d {
	c := Conv2d{Weight: Kernel{Shaped(shapeOr(out, in, kh, kw)...)}}
	if bias {
		c.Bias = declaredBias(out)
	}
	return c
}

// Forward convolves x [B, in, H, W]; the groups follow from x's and the weight's channels.
func (c *Conv2d) Forward(g *engine.Graph, x engine.Tensor, strideH, strideW, padH, padW int64) engine.Tensor {
	groups := x.Dim(1) / int64(max(c.Weight.Dim(1), 1))
	return g.Conv2D(x, c.Weight.In(g), c.Bias.Opt(g), strideH, strideW, padH, padW, groups)
}

// shapeOr is shape, or nil (any) when a dimension is unknown (≤ 0: taken from the file).
func shapeOr(shape ...int) []int {
	for _, d := range shape {
		if d <= 0 {
			return nil
		}
	}
	return shape
}

// FuseLinears returns one Linear computing what ls compute on the same input, their outputs
// side by side (weights stacked by rows, biases concatenated): one product with more columns
// instead of several small ones (a transformer's q, k and v). Each output column is the same
// computation as in its own layer, so slices of the fused output equal the separate outputs
// (bit for bit on the small-matrix kernel). It returns nil, and allocates nothing, when the
// weights cannot be stacked: different types or widths, some with a bias and some without,
// or a row count that breaks the packed layout's row groups.
func FuseLinears(a engine.Allocator, name string, ls ...*Linear) (*Linear, error) {
	if len(ls) < 2 {
		return nil, nil
	}
	w0 := ls[0].Weight.Buf
	if w0 == nil || len(w0.Shape()) != 2 {
		return nil, nil
	}
	dt, k := w0.DType(), w0.Shape()[1]
	group := map[engine.DType]int64{engine.F32P: 2 * cgo.F32PRows, engine.F16P: 2 * cgo.F32PRows, engine.Q8_0R8: 8}[dt]
	rows, withBias := int64(0), ls[0].Bias.Present()
	for _, l := range ls {
		w := l.Weight.Buf
		if w == nil || w.DType() != dt || len(w.Shape()) != 2 || w.Shape()[1] != k || w.Raw() == nil ||
			l.Bias.Present() != withBias || group > 0 && w.Shape()[0]%group != 0 {
			return nil, nil
		}
		rows += w.Shape()[0]
	}
	wb, err := a.Alloc(name+".weight", dt, rows, k)
	if err != nil {
		return nil, err
	}
	fused := &Linear{Weight: Matrix{Tensor{Shape: []int{int(rows), int(k)}, Buf: wb, enc: linearEnc}}}
	var off int64
	for _, l := range ls {
		raw := l.Weight.Buf.Raw()
		if err := wb.Write(off, raw); err != nil {
			wb.Free()
			return nil, err
		}
		off += int64(len(raw))
	}
	if withBias {
		var bias []float32
		for _, l := range ls {
			bias = append(bias, l.Bias.Buf.Float32s()...)
		}
		bb, err := engine.Upload(a, name+".bias", bias, rows)
		if err != nil {
			wb.Free()
			return nil, err
		}
		fused.Bias = Tensor{Shape: []int{int(rows)}, Buf: bb}
	}
	return fused, nil
}

// ForwardFused is x through each of ls: one product over fused (made from ls by
// FuseLinears) split by columns after, or, fused nil, one product each.
func ForwardFused(g *engine.Graph, fused *Linear, x engine.Tensor, ls ...*Linear) []engine.Tensor {
	out := make([]engine.Tensor, len(ls))
	if fused == nil {
		for i, l := range ls {
			out[i] = l.Forward(g, x)
		}
		return out
	}
	y := fused.Forward(g, x)
	last, at := y.Rank()-1, int64(0)
	for i, l := range ls {
		n := int64(l.Weight.Dim(0))
		out[i] = g.Slice(y, last, at, at+n)
		at += n
	}
	return out
}

// Free releases a Linear made by FuseLinears.
func (l *Linear) Free() {
	l.Weight.Buf.Free()
	l.Bias.Buf.Free()
}
