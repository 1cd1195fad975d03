package wavlm

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/nn"
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
	w := c.declare()
	nn.ShapeOnly(w)
	pos := w.PosV.Shape
	return &Model{Config: c, w: w, posW: engine.ShapeBuffer("encoder.pos_conv.0.weight", int64(pos[0]), int64(pos[1]), int64(pos[2]))}
}
