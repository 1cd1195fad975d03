package miocodec

import (
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/weights"
)

// builder builds one graph over the weights of a store and the shared constants.
type builder struct {
	g      *engine.Graph
	st     *store
	consts *constants
	dbg    bool // stage outputs for the golden checks
	err    error
}

// p is the persistent tensor of a bound weight.
func (b *builder) p(t weights.Tensor) engine.Tensor {
	buf := b.st.buf(t)
	if buf == nil {
		if b.err == nil {
			b.err = fmt.Errorf("miocodec: internal: weight %v not uploaded", t.Shape)
		}
		return b.g.Input(fmt.Sprintf("missing.%d", b.g.NumNodes()), engine.F32, 1)
	}
	return b.g.Persistent(buf)
}

func (b *builder) pp(t weights.Tensor) *engine.Tensor {
	x := b.p(t)
	return &x
}

// linear is x·Wᵀ + b over the last axis.
func (b *builder) linear(x engine.Tensor, w, bias weights.Tensor) engine.Tensor {
	if bias.Present() {
		return b.g.Linear(x, b.p(w), b.pp(bias))
	}
	return b.g.Linear(x, b.p(w), nil)
}

// transformer runs a MioCodec Transformer on x [T, dim] (time-major). cond is SiLU(c)
// [1, condDim] for AdaLN-Zero modules, nil otherwise; tag names its debug outputs.
func (b *builder) transformer(name, tag string, w *transformer, c TransformerConfig, x engine.Tensor, cond *engine.Tensor) engine.Tensor {
	g := b.g
	T, dim := x.Dim(0), x.Dim(1)
	H := int64(c.Heads)
	hd := dim / H
	pos := g.Slice(g.Persistent(b.consts.positions(T)), 0, 0, T)
	theta := float32(c.RopeTheta)
	const eps = 1e-5

	// adaParams splits Linear(SiLU(c)) into n chunks of dim ([1, dim] each).
	adaParams := func(a adaNorm, n int) []engine.Tensor {
		p := b.linear(*cond, a.W, a.B)
		out := make([]engine.Tensor, n)
		for i := range out {
			out[i] = g.Slice(p, 1, int64(i)*dim, int64(i+1)*dim)
		}
		return out
	}
	modulate := func(h, shift, scale engine.Tensor) engine.Tensor {
		return g.Add(g.Mul(h, g.Scale(scale, 1, 1)), shift)
	}
	heads := func(y engine.Tensor) engine.Tensor {
		return g.Permute(g.Reshape(y, 1, T, H, hd), 0, 2, 1, 3)
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		g.Label(fmt.Sprintf("%s.layers.%d", name, i))
		var h engine.Tensor
		var gateA, gateF, shiftF, scaleF engine.Tensor
		if cond != nil {
			pa := adaParams(l.AttnAdaNorm, 3)
			pf := adaParams(l.FFNAdaNorm, 3)
			h = modulate(g.LayerNorm(x, nil, nil, eps), pa[0], pa[1])
			gateA, shiftF, scaleF, gateF = pa[2], pf[0], pf[1], pf[2]
		} else {
			h = g.LayerNorm(x, b.pp(l.AttnNorm.W), b.pp(l.AttnNorm.B), eps)
		}
		q := g.RoPE(heads(g.Linear(h, b.p(l.Q), nil)), pos, hd, engine.RoPEInterleaved, theta)
		k := g.RoPE(heads(g.Linear(h, b.p(l.K), nil)), pos, hd, engine.RoPEInterleaved, theta)
		v := heads(g.Linear(h, b.p(l.V), nil))
		att := b.windowAttention(q, k, v, c.HalfWindow, float32(1/math.Sqrt(float64(hd))))
		att = g.Reshape(g.Permute(att, 0, 2, 1, 3), T, dim)
		o := g.Linear(att, b.p(l.O), nil)
		if cond != nil {
			o = g.Mul(o, gateA)
		}
		x = g.Add(x, o)

		if cond != nil {
			h = modulate(g.LayerNorm(x, nil, nil, eps), shiftF, scaleF)
		} else {
			h = g.LayerNorm(x, b.pp(l.FFNNorm.W), b.pp(l.FFNNorm.B), eps)
		}
		f := g.Mul(g.SiLU(g.Linear(h, b.p(l.W1), nil)), g.Linear(h, b.p(l.W3), nil))
		f = g.Linear(f, b.p(l.W2), nil)
		if cond != nil {
			f = g.Mul(f, gateF)
		}
		x = g.Add(x, f)
		if i == 0 {
			b.debug(tag+"_layer0", x)
		}
	}
	g.Label(name + ".norm")
	if cond != nil {
		pn := adaParams(w.AdaNorm, 2)
		x = modulate(g.LayerNorm(x, nil, nil, eps), pn[0], pn[1])
	} else {
		x = g.LayerNorm(x, b.pp(w.Norm.W), b.pp(w.Norm.B), eps)
	}
	if w.OutW.Present() {
		x = b.linear(x, w.OutW, w.OutB)
	}
	return x
}

// attnBlock is the query block of windowed attention on long sequences (0: never block).
var attnBlock int64 = 64

// windowAttention is softmax(q·kᵀ·scale + mask)·v for q, k, v [1, H, T, D] with keys
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
