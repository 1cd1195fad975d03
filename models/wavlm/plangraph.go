package wavlm

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
)

// PlannerGraph is the encoder's graph on samples of 16 kHz audio, every layer, built by the
// same code as a loaded Model's programs but over shape-only weights: the planner can be
// measured on a real-size model (`voxpipe bench planner`, RealLarge()) without its weights
// in memory. The graph is for engine.PlanStatsOf only; it cannot be compiled.
func PlannerGraph(c Config, samples int) (*engine.Graph, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	t := c.Frames(samples)
	if t < 1 {
		return nil, fmt.Errorf("wavlm: %d samples are too short (at least %d needed for one frame)", samples, c.ReceptiveField())
	}
	m := shapeModel(c)
	bias := engine.ShapeBuffer(fmt.Sprintf("wavlm.rel_bias[T=%d]", t), int64(c.Heads), int64(t), int64(t))
	g := m.build(samples, t, []int{c.Layers}, c.Layers, false, bias)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("wavlm: %w", err)
	}
	return g, nil
}

// shapeModel is a Model of c whose weight buffers have Load's shapes and no memory.
func shapeModel(c Config) *Model {
	m := &Model{Config: c}
	buf := func(name string, shape ...int) *engine.Buffer {
		s := make([]int64, len(shape))
		for i, d := range shape {
			s[i] = int64(d)
		}
		return engine.ShapeBuffer(name, s...)
	}
	cin := 1
	for i, d := range c.ConvDims {
		p := fmt.Sprintf("feature_extractor.conv_layers.%d.", i)
		cv := convBufs{w: buf(p+"0.weight", d, cin, c.ConvKernels[i])}
		if c.ConvLayerNorm || i == 0 {
			cv.normW, cv.normB = buf(p+"2.weight", d), buf(p+"2.bias", d)
		}
		m.convs = append(m.convs, cv)
		cin = d
	}
	h, cd, hd := c.Hidden, c.ConvDim(), c.HeadDim()
	m.lnW, m.lnB = buf("layer_norm.weight", cd), buf("layer_norm.bias", cd)
	if cd != h {
		m.projW, m.projB = buf("post_extract_proj.weight", h, cd), buf("post_extract_proj.bias", h)
	}
	m.posW = buf("encoder.pos_conv.0.weight", h, h/c.PosConvGroups, c.PosConvKernel)
	m.posB = buf("encoder.pos_conv.0.bias", h)
	m.encLNW, m.encLNB = buf("encoder.layer_norm.weight", h), buf("encoder.layer_norm.bias", h)
	for i := range c.Layers {
		p := fmt.Sprintf("encoder.layers.%d.", i)
		l := layerBufs{
			qkv: buf(p+"self_attn.qkv.weight", 3*h, h), qkvB: buf(p+"self_attn.qkv.bias", 3*h),
			o: buf(p+"self_attn.out_proj.weight", h, h), oB: buf(p+"self_attn.out_proj.bias", h),
			fc1: buf(p+"fc1.weight", c.FFN, h), fc1B: buf(p+"fc1.bias", c.FFN),
			fc2: buf(p+"fc2.weight", h, c.FFN), fc2B: buf(p+"fc2.bias", h),
		}
		l.grepW, l.grepB = buf(p+"self_attn.grep_linear.weight", 8, hd), buf(p+"self_attn.grep_linear.bias", 8)
		l.grepA = buf(p+"self_attn.grep_a", c.Heads, 1, 1)
		l.attnLW, l.attnLB = buf(p+"self_attn_layer_norm.weight", h), buf(p+"self_attn_layer_norm.bias", h)
		l.finLW, l.finLB = buf(p+"final_layer_norm.weight", h), buf(p+"final_layer_norm.bias", h)
		m.layers = append(m.layers, l)
	}
	return m
}
