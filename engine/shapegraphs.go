package engine

import "fmt"

// WavLMLargeShape builds a graph with the shapes of the WavLM-Large encoder on seconds of
// 16 kHz audio — conv feature extractor with per-layer LayerNorm, projection, grouped
// positional conv, 24 pre-LN transformer layers with the gated relative position bias —
// over shape-only weights. It exists to measure the planner on a real model's graph; the
// model itself lives in models/wavlm.
func WavLMLargeShape(seconds float64) *Graph {
	const (
		dim, heads, ffn, layers = 1024, 16, 4096, 24
		convDim                 = 512
	)
	g := NewGraph("wavlm-large-shape")
	w := func(name string, shape ...int64) Tensor { return g.Persistent(shapeOnly(name, shape...)) }
	samples := int64(seconds * 16000)
	x := g.Input("wav", F32, 1, 1, samples)
	kernels := []int64{10, 3, 3, 3, 3, 2, 2}
	strides := []int64{5, 2, 2, 2, 2, 2, 2}
	cin := int64(1)
	for i := range kernels {
		g.Label(fmt.Sprintf("feature_extractor.conv_layers.%d", i))
		x = g.Conv1D(x, w("conv.w", convDim, cin, kernels[i]), nil, strides[i], 0, 0, 1, 1)
		lw, lb := w("ln.w", convDim), w("ln.b", convDim)
		x = g.Transpose(g.LayerNorm(g.Transpose(x, 1, 2), &lw, &lb, 1e-5), 1, 2)
		x = g.GELU(x, false)
		cin = convDim
	}
	frames := x.Dim(2)
	g.Label("feature_projection")
	h := g.Transpose(x, 1, 2) // [1, T, 512]
	lw, lb := w("fp.ln.w", convDim), w("fp.ln.b", convDim)
	h = g.LayerNorm(h, &lw, &lb, 1e-5)
	pb := w("fp.b", dim)
	h = g.Linear(h, w("fp.w", dim, convDim), &pb)
	g.Label("pos_conv")
	cb := w("pos.b", dim)
	pos := g.Conv1D(g.Transpose(h, 1, 2), w("pos.w", dim, dim/16, 128), &cb, 1, 64, 64, 1, 16)
	pos = g.GELU(g.Slice(pos, 2, 0, frames), false)
	h = g.Add(h, g.Transpose(pos, 1, 2))
	// The dense relative position bias for this length: one persistent table for all layers.
	bias := g.Persistent(shapeOnly("rel_pos_bias", heads, frames, frames))
	for l := range layers {
		g.Label(fmt.Sprintf("encoder.layers.%d", l))
		aw, ab := w("attn_ln.w", dim), w("attn_ln.b", dim)
		y := g.LayerNorm(h, &aw, &ab, 1e-5)
		qb, kb, vb, ob := w("q.b", dim), w("k.b", dim), w("v.b", dim), w("o.b", dim)
		split := func(t Tensor) Tensor { return g.Permute(g.Reshape(t, 1, frames, heads, dim/heads), 0, 2, 1, 3) }
		q := split(g.Linear(y, w("q.w", dim, dim), &qb))
		k := split(g.Linear(y, w("k.w", dim, dim), &kb))
		v := split(g.Linear(y, w("v.w", dim, dim), &vb))
		// Gate per head and query from the query itself: [1, H, T, 1] scales the shared bias.
		gb := w("gru.b", 8)
		gate := g.Sigmoid(g.Reshape(g.Sum(g.Reshape(g.Linear(q, w("gru.w", 8, dim/heads), &gb), 1, heads, frames, 2, 4), -1), 1, heads, frames, 2))
		ga, gbb := g.Slice(gate, 3, 0, 1), g.Slice(gate, 3, 1, 2)
		gated := g.Scale(g.Mul(ga, g.Scale(gbb, 1.7, -1)), 1, 2) // a·(b·c − 1) + 2
		lb := g.Reshape(g.Mul(gated, bias), heads, frames, frames)
		att := g.Attention(q, k, v, nil, &lb, 0)
		att = g.Reshape(g.Permute(att, 0, 2, 1, 3), 1, frames, dim)
		h = g.Add(h, g.Linear(att, w("o.w", dim, dim), &ob))
		fw, fb := w("ffn_ln.w", dim), w("ffn_ln.b", dim)
		y = g.LayerNorm(h, &fw, &fb, 1e-5)
		b1, b2 := w("ffn1.b", ffn), w("ffn2.b", dim)
		y = g.Linear(g.GELU(g.Linear(y, w("ffn1.w", ffn, dim), &b1), false), w("ffn2.w", dim, ffn), &b2)
		h = g.Add(h, y)
	}
	g.Label("encoder.layer_norm")
	fw, fb := w("final_ln.w", dim), w("final_ln.b", dim)
	g.Output("hidden", g.LayerNorm(h, &fw, &fb, 1e-5))
	return g
}

// PlanStatsOf plans a graph's memory without compiling it for a device.
func PlanStatsOf(g *Graph) (PlanStats, error) {
	p, err := planMemory(g, false)
	if err != nil {
		return PlanStats{}, err
	}
	if err := p.validate(); err != nil {
		return PlanStats{}, fmt.Errorf("engine: %s: invalid plan: %w", g.name, err)
	}
	return PlanStats{Nodes: len(g.nodes), ArenaBytes: p.arenaBytes, NaiveBytes: p.naiveBytes, PersistentBytes: p.persistentBytes}, nil
}
