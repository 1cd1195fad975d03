package ecapa

import (
	"fmt"
	"math"
	"sync"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

type convBN struct {
	Conv nn.Conv1d      `gguf:"conv"`
	BN   nn.BatchNorm1d `gguf:"bn"`
}

type block struct {
	In    convBN           `gguf:"Conv1dReluBn1"`
	Convs []nn.Conv1d      `gguf:"Res2Conv1dReluBn.convs.%d"`
	BNs   []nn.BatchNorm1d `gguf:"Res2Conv1dReluBn.bns.%d"`
	Out   convBN           `gguf:"Conv1dReluBn2"`
	// The SE linears, stored as [out, in] or as 1×1 convs [out, in, 1].
	SE1 nn.Linear `gguf:"SE_Connect.linear1"`
	SE2 nn.Linear `gguf:"SE_Connect.linear2"`
}

type head struct {
	// The layer mix is a softmax over these, taken once on the host at load.
	FeatureWeight weights.Tensor `gguf:"feature_weight"`
	Layer1        convBN         `gguf:"layer1"`
	Layer2        block          `gguf:"layer2"`
	Layer3        block          `gguf:"layer3"`
	Layer4        block          `gguf:"layer4"`
	Conv          nn.Conv1d      `gguf:"conv"`
	Pool1         nn.Conv1d      `gguf:"pooling.linear1"`
	Pool2         nn.Conv1d      `gguf:"pooling.linear2"`
	BN            nn.BatchNorm1d `gguf:"bn"`
	Linear        nn.Linear      `gguf:"linear"`
}

func (w *head) blocks() []*block { return []*block{&w.Layer2, &w.Layer3, &w.Layer4} }

// declare is the head of dims d with every expected shape.
func (d Dims) declare() *head {
	cbn := func(cout, cin, k int) convBN {
		return convBN{nn.NewConv1d(cin, cout, k, 1, true), nn.NewBatchNorm1d(cout)}
	}
	se := func(in, out int) nn.Linear {
		l := nn.NewLinear(in, out, true)
		if d.SEConv {
			l.Weight.Shape = []int{out, in, 1}
		}
		return l
	}
	w := &head{
		FeatureWeight: weights.Tensor{Shape: []int{d.Layers}},
		Layer1:        cbn(d.Channels, d.Feat, d.Kernel1),
		Conv:          nn.NewConv1d(d.MFA, d.MFA, 1, 1, true),
		Pool1:         nn.NewConv1d(d.MFA, d.Att, 1, 1, true),
		Pool2:         nn.NewConv1d(d.Att, d.MFA, 1, 1, true),
		BN:            nn.NewBatchNorm1d(2 * d.MFA),
		Linear:        nn.NewLinear(2*d.MFA, d.Emb, true),
	}
	width := d.Channels / max(d.Scale, 1)
	for _, b := range w.blocks() {
		*b = block{
			In:    cbn(d.Channels, d.Channels, 1),
			Out:   cbn(d.Channels, d.Channels, 1),
			Convs: make([]nn.Conv1d, d.Scale-1),
			BNs:   make([]nn.BatchNorm1d, d.Scale-1),
			SE1:   se(d.Channels, d.SE),
			SE2:   se(d.SE, d.Channels),
		}
		for i := range b.Convs {
			b.Convs[i] = nn.NewConv1d(width, width, d.Kernel, 1, true)
			b.BNs[i] = nn.NewBatchNorm1d(width)
		}
	}
	return w
}

func displayName(src weights.Source, name string) string {
	if p, ok := src.(interface{ Prefix() string }); ok {
		return p.Prefix() + name
	}
	return name
}

// shapeOf reads one tensor's shape (the dimension-defining tensors, before binding).
func shapeOf(src weights.Source, name string, rank ...int) ([]int, error) {
	if !src.Has(name) {
		return nil, fmt.Errorf("ecapa: missing tensor %s", displayName(src, name))
	}
	_, shape, err := src.Get(name)
	if err != nil {
		return nil, fmt.Errorf("ecapa: tensor %s: %w", displayName(src, name), err)
	}
	for _, r := range rank {
		if len(shape) == r {
			return shape, nil
		}
	}
	return nil, fmt.Errorf("ecapa: tensor %s has shape %v, want rank %v", displayName(src, name), shape, rank)
}

// dimsOf derives the head's widths from the tensor shapes.
func dimsOf(src weights.Source) (Dims, error) {
	var d Dims
	fw, err := shapeOf(src, "feature_weight", 1)
	if err != nil {
		return d, err
	}
	l1, err := shapeOf(src, "layer1.conv.weight", 3)
	if err != nil {
		return d, err
	}
	r2, err := shapeOf(src, "layer2.Res2Conv1dReluBn.convs.0.weight", 3)
	if err != nil {
		return d, err
	}
	se, err := shapeOf(src, "layer2.SE_Connect.linear1.weight", 2, 3)
	if err != nil {
		return d, err
	}
	mfa, err := shapeOf(src, "conv.weight", 3)
	if err != nil {
		return d, err
	}
	att, err := shapeOf(src, "pooling.linear1.weight", 3)
	if err != nil {
		return d, err
	}
	lin, err := shapeOf(src, "linear.weight", 2)
	if err != nil {
		return d, err
	}
	d = Dims{Layers: fw[0], Channels: l1[0], Feat: l1[1], Kernel1: l1[2], Kernel: r2[2], SE: se[0],
		SEConv: len(se) == 3, MFA: mfa[0], Att: att[0], Emb: lin[0]}
	if r2[0] <= 0 || d.Channels%r2[0] != 0 || d.Channels/r2[0] < 2 {
		return d, fmt.Errorf("ecapa: Res2 width %d (%s) does not split %d channels into ≥ 2 parts",
			r2[0], displayName(src, "layer2.Res2Conv1dReluBn.convs.0.weight"), d.Channels)
	}
	d.Scale = d.Channels / r2[0]
	if d.MFA != 3*d.Channels {
		return d, fmt.Errorf("ecapa: %s has %d channels, want 3 × %d (three blocks concatenated)",
			displayName(src, "conv.weight"), d.MFA, d.Channels)
	}
	if d.Kernel1%2 == 0 || d.Kernel%2 == 0 {
		return d, fmt.Errorf("ecapa: even kernels %d/%d have no same padding", d.Kernel1, d.Kernel)
	}
	return d, nil
}

// ---- model ----

// Model is a loaded ECAPA head. Embed may be called from several goroutines; runs are
// serialised (the head runs once per target voice).
type Model struct {
	Dims   Dims
	Config Config

	mix []float32 // softmax(feature_weight)
	w   *head

	mu    sync.Mutex
	cache *engine.Cache
}

// Load binds a speaker_ecapa weight view (e.g. model.Sub("speaker_ecapa")) with the
// reference's hard-coded dilations and epsilons.
func Load(src weights.Source, backend engine.Backend) (*Model, error) {
	return LoadConfig(src, DefaultConfig(), backend)
}

// LoadConfig is Load with a Config (see ParseConfig).
func LoadConfig(src weights.Source, cfg Config, backend engine.Backend) (*Model, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d, err := dimsOf(src)
	if err != nil {
		return nil, err
	}
	w := d.declare()
	if err := nn.Bind(src, backend, w); err != nil {
		return nil, fmt.Errorf("ecapa: %w", err)
	}
	return &Model{Dims: d, Config: cfg, cache: engine.NewCache(backend, 4), w: w, mix: softmax(w.FeatureWeight.Data)}, nil
}

// softmax of the layer weights, as the reference takes before the weighted sum.
func softmax(fw []float32) []float32 {
	peak := math.Inf(-1)
	for _, v := range fw {
		peak = max(peak, float64(v))
	}
	var sum float64
	ex := make([]float64, len(fw))
	for i, v := range fw {
		ex[i] = math.Exp(float64(v) - peak)
		sum += ex[i]
	}
	mix := make([]float32, len(fw))
	for i := range ex {
		mix[i] = float32(ex[i] / sum)
	}
	return mix
}

// Close releases the compiled programs and the weight buffers.
func (m *Model) Close() {
	if m == nil {
		return
	}
	m.cache.Close()
	nn.Free(m.w)
}

// ---- graph ----

// stageNames are the outputs of the stages graph, in pipeline order (the golden checks read
// them; "embedding" is also the plain graph's one output).
var stageNames = []string{"instance_norm", "layer1", "layer2", "layer3", "layer4", "conv", "pooling", "bn", "embedding"}

func (m *Model) build(T int, stages bool) (*engine.Graph, error) {
	d := m.Dims
	g := engine.NewGraph(fmt.Sprintf("ecapa(T=%d)", T))
	out := func(name string, t engine.Tensor) {
		if stages || name == "embedding" {
			g.Output(name, t)
		}
	}
	w, bnEps := m.w, float32(m.Config.BatchNormEps)
	hs := g.Input("hidden", engine.F32, int64(d.Layers), int64(T), int64(d.Feat))

	g.Label("feature_weight")
	layers := make([]engine.Tensor, d.Layers)
	for i := range layers {
		layers[i] = g.Reshape(g.Slice(hs, 0, int64(i), int64(i+1)), int64(T), int64(d.Feat))
	}
	x := g.WeightedSum(layers, m.mix)
	x = g.Reshape(g.Transpose(x, 0, 1), 1, int64(d.Feat), int64(T))
	// _get_feat adds 1e-6 before the instance norm.
	x = g.Scale(x, 1, 1e-6)
	x = g.GroupNorm(x, d.Feat, nil, nil, float32(m.Config.InstanceNormEps))
	out("instance_norm", x)

	// Conv1dReluBn: conv → ReLU → batch norm (the reference's order).
	convReluBN := func(x engine.Tensor, c *nn.Conv1d, bn *nn.BatchNorm1d, pad, dil int64) engine.Tensor {
		return bn.Forward(g, g.ReLU(c.Forward(g, x, 1, pad, pad, dil)), bnEps)
	}
	g.Label("layer1")
	k1 := int64(d.Kernel1)
	dil1 := int64(m.Config.Dilations[0])
	x = convReluBN(x, &w.Layer1.Conv, &w.Layer1.BN, dil1*(k1-1)/2, dil1)
	out("layer1", x)

	var outs []engine.Tensor
	for i, b := range w.blocks() {
		g.Label(fmt.Sprintf("layer%d", i+2))
		dil := int64(m.Config.Dilations[i+1])
		pad := dil * int64(d.Kernel-1) / 2
		res := x
		y := convReluBN(x, &b.In.Conv, &b.In.BN, 0, 1)
		// Res2: split i (i < scale−1) plus the previous output goes through its conv; the
		// last split passes through unchanged.
		split := int64(d.Channels / d.Scale)
		parts := make([]engine.Tensor, 0, d.Scale)
		var sp engine.Tensor
		for j := range b.Convs {
			s := g.Slice(y, 1, int64(j)*split, int64(j+1)*split)
			if j == 0 {
				sp = s
			} else {
				sp = g.Add(sp, s)
			}
			sp = convReluBN(sp, &b.Convs[j], &b.BNs[j], pad, dil)
			parts = append(parts, sp)
		}
		parts = append(parts, g.Slice(y, 1, int64(d.Scale-1)*split, int64(d.Scale)*split))
		y = g.Concat(1, parts...)
		y = convReluBN(y, &b.Out.Conv, &b.Out.BN, 0, 1)
		// SE: squeeze over time, bottleneck, sigmoid gate per channel.
		s := g.Reshape(g.Mean(y, 2), 1, int64(d.Channels))
		s = g.ReLU(b.SE1.Forward(g, s))
		s = g.Sigmoid(b.SE2.Forward(g, s))
		y = g.Mul(y, g.Reshape(s, 1, int64(d.Channels), 1))
		x = g.Add(y, res)
		out(fmt.Sprintf("layer%d", i+2), x)
		outs = append(outs, x)
	}

	g.Label("conv")
	x = w.Conv.Forward(g, g.Concat(1, outs...), 1, 0, 0, 1)
	out("conv", x)
	x = g.ReLU(x)

	g.Label("pooling")
	a := g.Tanh(w.Pool1.Forward(g, x, 1, 0, 0, 1))
	a = w.Pool2.Forward(g, a, 1, 0, 0, 1)
	a = g.Softmax(a, nil, 1) // over time, the last axis
	mean := g.Sum(g.Mul(a, x), 2)
	sq := g.Sum(g.Mul(a, g.Square(x)), 2)
	std := g.Sqrt(g.Clamp(g.Sub(sq, g.Square(mean)), float32(m.Config.StatsEps), math.MaxFloat32))
	pooled := g.Reshape(g.Concat(1, mean, std), 1, int64(2*d.MFA))
	out("pooling", pooled)

	g.Label("bn")
	x = w.BN.Forward(g, pooled, bnEps)
	out("bn", x)
	g.Label("linear")
	x = w.Linear.Forward(g, x)
	out("embedding", x)
	if err := g.Err(); err != nil {
		return nil, err
	}
	return g, nil
}

func (m *Model) program(T int, stages bool) (engine.Program, error) {
	return m.cache.Get(fmt.Sprintf("T=%d stages=%v", T, stages), func() (*engine.Graph, error) { return m.build(T, stages) })
}

func (m *Model) run(hidden []float32, T int, stages bool) (engine.Program, error) {
	d := m.Dims
	if T < 1 {
		return nil, fmt.Errorf("ecapa: %d frames", T)
	}
	if len(hidden) != d.Layers*T*d.Feat {
		return nil, fmt.Errorf("ecapa: %d values for %d hidden states × %d frames × %d", len(hidden), d.Layers, T, d.Feat)
	}
	prog, err := m.program(T, stages)
	if err != nil {
		return nil, fmt.Errorf("ecapa: %w", err)
	}
	copy(prog.Input("hidden"), hidden)
	if err := prog.Run(); err != nil {
		return nil, fmt.Errorf("ecapa: run: %w", err)
	}
	return prog, nil
}

// Embed computes the speaker embedding [Emb] from WavLM hidden states, flat [Layers, T, Feat]
// (hidden state 0 first).
func (m *Model) Embed(hidden []float32, T int) ([]float32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prog, err := m.run(hidden, T, false)
	if err != nil {
		return nil, err
	}
	return append([]float32(nil), prog.Output("embedding")...), nil
}

// EmbedLayers is Embed with one [T, Feat] slice per hidden state.
func (m *Model) EmbedLayers(hidden [][]float32, T int) ([]float32, error) {
	if len(hidden) != m.Dims.Layers {
		return nil, fmt.Errorf("ecapa: %d hidden states, want %d", len(hidden), m.Dims.Layers)
	}
	flat := make([]float32, 0, m.Dims.Layers*T*m.Dims.Feat)
	for i, h := range hidden {
		if len(h) != T*m.Dims.Feat {
			return nil, fmt.Errorf("ecapa: hidden state %d has %d values, want %d × %d", i, len(h), T, m.Dims.Feat)
		}
		flat = append(flat, h...)
	}
	return m.Embed(flat, T)
}

// Stages runs the head and returns every intermediate the golden data holds, by stage name
// (instance_norm, layer1…layer4 [C, T], conv [MFA, T] before its ReLU, pooling and bn
// [2·MFA], embedding [Emb]).
func (m *Model) Stages(hidden []float32, T int) (map[string][]float32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prog, err := m.run(hidden, T, true)
	if err != nil {
		return nil, err
	}
	res := make(map[string][]float32, len(stageNames))
	for _, n := range stageNames {
		res[n] = append([]float32(nil), prog.Output(n)...)
	}
	return res, nil
}
