package miocodec

import (
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/engine"
)

// builder builds one graph over a model's weights and its shared constants.
type builder struct {
	g      *engine.Graph
	consts *constants
	dbg    bool  // stage outputs for the golden checks
	batch  int64 // streams stacked in the graph (0: one)
}

// streams is the number of streams whose rows the graph stacks.
func (b *builder) streams() int64 { return max(b.batch, 1) }

// transformer runs a MioCodec Transformer on x [B·T, dim] (time-major, the B streams' rows
// stacked). cond is SiLU(c) [B, condDim] for AdaLN-Zero modules, nil otherwise; tag names
// its debug outputs.
func (b *builder) transformer(name, tag string, w *transformer, c TransformerConfig, x engine.Tensor, cond *engine.Tensor) engine.Tensor {
	g := b.g
	B := b.streams()
	T, dim := x.Dim(0)/B, x.Dim(1)
	H := int64(c.Heads)
	hd := dim / H
	pos := g.Slice(g.Persistent(b.consts.positions(T)), 0, 0, T)
	theta := float32(c.RopeTheta)
	const eps = 1e-5

	// adaParams splits Linear(SiLU(c)) into n chunks of dim ([B, 1, dim] each: one row per
	// stream, broadcast over its frames).
	adaParams := func(a *adaNorm, n int) []engine.Tensor {
		p := a.Proj.Forward(g, *cond)
		out := make([]engine.Tensor, n)
		for i := range out {
			out[i] = g.Reshape(g.Slice(p, 1, int64(i)*dim, int64(i+1)*dim), B, 1, dim)
		}
		return out
	}
	// perStream applies f to the [B, T, dim] view of rows h [B·T, dim].
	perStream := func(h engine.Tensor, f func(engine.Tensor) engine.Tensor) engine.Tensor {
		return g.Reshape(f(g.Reshape(h, B, T, dim)), B*T, dim)
	}
	modulate := func(h, shift, scale engine.Tensor) engine.Tensor {
		return perStream(h, func(h engine.Tensor) engine.Tensor { return g.Add(g.Mul(h, g.Scale(scale, 1, 1)), shift) })
	}
	gate := func(h, gate engine.Tensor) engine.Tensor {
		return perStream(h, func(h engine.Tensor) engine.Tensor { return g.Mul(h, gate) })
	}
	heads := func(y engine.Tensor) engine.Tensor {
		return g.Permute(g.Reshape(y, B, T, H, hd), 0, 2, 1, 3)
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		g.Label(fmt.Sprintf("%s.layers.%d", name, i))
		var h engine.Tensor
		var gateA, gateF, shiftF, scaleF engine.Tensor
		if cond != nil {
			pa := adaParams(&l.AttnAdaNorm, 3)
			pf := adaParams(&l.FFNAdaNorm, 3)
			h = modulate(g.LayerNorm(x, nil, nil, eps), pa[0], pa[1])
			gateA, shiftF, scaleF, gateF = pa[2], pf[0], pf[1], pf[2]
		} else {
			h = l.AttnNorm.Forward(g, x, eps)
		}
		q := g.RoPE(heads(l.Q.Forward(g, h)), pos, hd, engine.RoPEInterleaved, theta)
		k := g.RoPE(heads(l.K.Forward(g, h)), pos, hd, engine.RoPEInterleaved, theta)
		v := heads(l.V.Forward(g, h))
		att := b.windowAttention(q, k, v, c.HalfWindow, float32(1/math.Sqrt(float64(hd))))
		att = g.Reshape(g.Permute(att, 0, 2, 1, 3), B*T, dim)
		o := l.O.Forward(g, att)
		if cond != nil {
			o = gate(o, gateA)
		}
		x = g.Add(x, o)

		if cond != nil {
			h = modulate(g.LayerNorm(x, nil, nil, eps), shiftF, scaleF)
		} else {
			h = l.FFNNorm.Forward(g, x, eps)
		}
		f := g.Mul(g.SiLU(l.W1.Forward(g, h)), l.W3.Forward(g, h))
		f = l.W2.Forward(g, f)
		if cond != nil {
			f = gate(f, gateF)
		}
		x = g.Add(x, f)
		if i == 0 {
			b.debug(tag+"_layer0", x)
		}
	}
	g.Label(name + ".norm")
	if cond != nil {
		pn := adaParams(&w.AdaNorm, 2)
		x = modulate(g.LayerNorm(x, nil, nil, eps), pn[0], pn[1])
	} else {
		x = w.Norm.Forward(g, x, eps)
	}
	if w.Out.Weight.Present() {
		x = w.Out.Forward(g, x)
	}
	return x
}

// attnBlock is the query block of windowed attention on long sequences (0: never block).
var attnBlock int64 = 64

// windowAttention is softmax(q·kᵀ·scale + mask)·v for q, k, v [B, H, T, D] with keys
// within ±half of the query visible. Long sequences go in query blocks, each against the
// keys its window can reach, so the cost grows with T·window instead of T².
func (b *builder) windowAttention(q, k, v engine.Tensor, half int, scale float32) engine.Tensor {
	g := b.g
	T := q.Dim(2)
	h := int64(half)
	qb := max(attnBlock, 2*h)
	if attnBlock <= 0 || T < 3*qb {
		full := g.Persistent(b.consts.mask(max(3*qb, T), max(3*qb, T), 0, half))
		m := g.Slice(g.Slice(full, 0, 0, T), 1, 0, T)
		return g.Attention(q, k, v, &m, nil, scale)
	}
	band := g.Persistent(b.consts.mask(qb, qb+2*h, h, half))
	var parts []engine.Tensor
	for q0 := int64(0); q0 < T; q0 += qb {
		q1 := min(T, q0+qb)
		k0, k1 := max(0, q0-h), min(T, q1+h)
		c0 := k0 - (q0 - h) // band column of key k0
		m := g.Slice(g.Slice(band, 0, 0, q1-q0), 1, c0, c0+k1-k0)
		parts = append(parts, g.Attention(g.Slice(q, 2, q0, q1), g.Slice(k, 2, k0, k1), g.Slice(v, 2, k0, k1), &m, nil, scale))
	}
	return g.Concat(2, parts...)
}
