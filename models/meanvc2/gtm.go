package meanvc2

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/nn"
)

// Timbre is one target voice as the DiT uses it: the speaker embedding and the GTM memory
// computed from it once.
type Timbre struct {
	Spk []float32 // [SpkDim]
	K   []float32 // [GTMSlots, GTMHidden] timbre memory keys
	V   []float32 // [GTMSlots, GTMHidden] values
}

// Timbre runs the GTM on a speaker embedding (once per target voice).
func (d *DiT) Timbre(spk []float32) (Timbre, error) {
	c := d.Config
	if len(spk) != c.SpkDim {
		return Timbre{}, fmt.Errorf("meanvc2: timbre: speaker embedding of %d values, want %d", len(spk), c.SpkDim)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	prog, err := d.gtmCache.Get("gtm", func() (*engine.Graph, error) {
		g := d.buildGTM()
		return g, g.Err()
	})
	if err != nil {
		return Timbre{}, fmt.Errorf("meanvc2: timbre: %w", err)
	}
	copy(prog.Input("spk"), spk)
	if err := prog.Run(); err != nil {
		return Timbre{}, fmt.Errorf("meanvc2: timbre: %w", err)
	}
	return Timbre{
		Spk: append([]float32(nil), spk...),
		K:   append([]float32(nil), prog.Output("k")...),
		V:   append([]float32(nil), prog.Output("v")...),
	}, nil
}

// buildGTM: for k and v, Linear → SiLU → Linear → [slots, hidden] + tanh(prior) → LayerNorm.
func (d *DiT) buildGTM() *engine.Graph {
	c := d.Config
	g := engine.NewGraph("meanvc2.gtm")
	spk := g.Input("spk", engine.F32, 1, int64(c.SpkDim))
	w := &d.w.GTM
	for _, s := range []struct {
		name  string
		mlp   *gtmSide
		prior *nn.Tensor
		norm  *nn.LayerNorm
	}{{"k", &w.MlpK, &w.KPrior, &w.NormK}, {"v", &w.MlpV, &w.VPrior, &w.NormV}} {
		g.Label("gtm." + s.name)
		h := s.mlp.L2.Forward(g, g.SiLU(s.mlp.L0.Forward(g, spk)))
		h = g.Reshape(h, int64(c.GTMSlots), int64(c.GTMHidden))
		h = g.Add(h, g.Tanh(s.prior.In(g)))
		g.Output(s.name, s.norm.Forward(g, h, float32(c.LNEps)))
	}
	return g
}
