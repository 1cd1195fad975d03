package ecapa

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/weights"
)

type convW struct {
	W weights.Tensor `gguf:"weight"`
	B weights.Tensor `gguf:"bias"`
}

type bnW struct {
	W    weights.Tensor `gguf:"weight"`
	B    weights.Tensor `gguf:"bias"`
	Mean weights.Tensor `gguf:"running_mean"`
	Var  weights.Tensor `gguf:"running_var"`
}

type convBNW struct {
	Conv convW `gguf:"conv"`
	BN   bnW   `gguf:"bn"`
}

type blockW struct {
	In    convBNW `gguf:"Conv1dReluBn1"`
	Convs []convW `gguf:"Res2Conv1dReluBn.convs.%d"`
	BNs   []bnW   `gguf:"Res2Conv1dReluBn.bns.%d"`
	Out   convBNW `gguf:"Conv1dReluBn2"`
	SE1   convW   `gguf:"SE_Connect.linear1"`
	SE2   convW   `gguf:"SE_Connect.linear2"`
}

type headW struct {
	FeatureWeight weights.Tensor `gguf:"feature_weight"`
	Layer1        convBNW        `gguf:"layer1"`
	Layer2        blockW         `gguf:"layer2"`
	Layer3        blockW         `gguf:"layer3"`
	Layer4        blockW         `gguf:"layer4"`
	Conv          convW          `gguf:"conv"`
	Pool1         convW          `gguf:"pooling.linear1"`
	Pool2         convW          `gguf:"pooling.linear2"`
	BN            bnW            `gguf:"bn"`
	Linear        convW          `gguf:"linear"`
}

func (w *headW) blocks() []*blockW { return []*blockW{&w.Layer2, &w.Layer3, &w.Layer4} }

// expect fills in the shapes Bind checks, all from d.
func (d Dims) expect(w *headW) {
	set := func(t *weights.Tensor, shape ...int) { t.Shape = shape }
	bn := func(b *bnW, c int) {
		for _, t := range []*weights.Tensor{&b.W, &b.B, &b.Mean, &b.Var} {
			set(t, c)
		}
	}
	cbn := func(c *convBNW, cout, cin, k int) {
		set(&c.Conv.W, cout, cin, k)
		set(&c.Conv.B, cout)
		bn(&c.BN, cout)
	}
	set(&w.FeatureWeight, d.Layers)
	cbn(&w.Layer1, d.Channels, d.Feat, d.Kernel1)
	width := d.Channels / d.Scale
	for _, bw := range w.blocks() {
		cbn(&bw.In, d.Channels, d.Channels, 1)
		cbn(&bw.Out, d.Channels, d.Channels, 1)
		bw.Convs = make([]convW, d.Scale-1)
		bw.BNs = make([]bnW, d.Scale-1)
		for i := range bw.Convs {
			set(&bw.Convs[i].W, width, width, d.Kernel)
			set(&bw.Convs[i].B, width)
			bn(&bw.BNs[i], width)
		}
		if d.SEConv {
			set(&bw.SE1.W, d.SE, d.Channels, 1)
			set(&bw.SE2.W, d.Channels, d.SE, 1)
		} else {
			set(&bw.SE1.W, d.SE, d.Channels)
			set(&bw.SE2.W, d.Channels, d.SE)
		}
		set(&bw.SE1.B, d.SE)
		set(&bw.SE2.B, d.Channels)
	}
	set(&w.Conv.W, d.MFA, d.MFA, 1)
	set(&w.Conv.B, d.MFA)
	set(&w.Pool1.W, d.Att, d.MFA, 1)
	set(&w.Pool1.B, d.Att)
	set(&w.Pool2.W, d.MFA, d.Att, 1)
	set(&w.Pool2.B, d.MFA)
	bn(&w.BN, 2*d.MFA)
	set(&w.Linear.W, d.Emb, 2*d.MFA)
	set(&w.Linear.B, d.Emb)
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

// ---- engine buffers ----

type conv struct{ w, b *engine.Buffer }
type affine struct{ scale, shift *engine.Buffer } // eval-mode batch norm, folded

type block struct {
	in, out   conv
	inBN      affine
	outBN     affine
	convs     []conv
	bns       []affine
	se1, se2  conv
	dilation  int
	padding   int
	splitSize int
}

// Model is a loaded ECAPA head. Embed may be called from several goroutines; runs are
// serialised (the head runs once per target voice).
type Model struct {
	Dims   Dims
	Config Config

	mix      []float32 // softmax(feature_weight)
	layer1   conv
	layer1BN affine
	blocks   []block
	mfa      conv
	pool1    conv
	pool2    conv
	bn       affine
	linear   conv

	mu    sync.Mutex
	cache *engine.Cache
	bufs  []*engine.Buffer
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
	var w headW
	d.expect(&w)
	if err := weights.Bind(src, &w); err != nil {
		return nil, fmt.Errorf("ecapa: %w", err)
	}
	m := &Model{Dims: d, Config: cfg, cache: engine.NewCache(backend, 4)}
	if err := m.upload(&w); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Model) buffer(name string, data []float32, shape ...int) (*engine.Buffer, error) {
	s := make([]int64, len(shape))
	for i, v := range shape {
		s[i] = int64(v)
	}
	b, err := engine.NewBufferFrom(name, data, s...)
	if err != nil {
		return nil, fmt.Errorf("ecapa: %w", err)
	}
	m.bufs = append(m.bufs, b)
	return b, nil
}

func (m *Model) upload(w *headW) error {
	var errs []error
	cv := func(name string, c *convW, shape ...int) conv {
		if shape == nil {
			shape = c.W.Shape
		}
		wb, err1 := m.buffer(name+".weight", c.W.Data, shape...)
		bb, err2 := m.buffer(name+".bias", c.B.Data, c.B.Shape...)
		errs = append(errs, err1, err2)
		return conv{wb, bb}
	}
	bn := func(name string, b *bnW) affine {
		n := len(b.W.Data)
		scale, shift := make([]float32, n), make([]float32, n)
		for i := range n {
			s := float64(b.W.Data[i]) / math.Sqrt(float64(b.Var.Data[i])+m.Config.BatchNormEps)
			scale[i] = float32(s)
			shift[i] = float32(float64(b.B.Data[i]) - float64(b.Mean.Data[i])*s)
		}
		sb, err1 := m.buffer(name+".scale", scale, n)
		hb, err2 := m.buffer(name+".shift", shift, n)
		errs = append(errs, err1, err2)
		return affine{sb, hb}
	}
	// Softmax of the layer weights, as the reference does before the weighted sum.
	fw := w.FeatureWeight.Data
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
	m.mix = make([]float32, len(fw))
	for i := range ex {
		m.mix[i] = float32(ex[i] / sum)
	}
	m.layer1 = cv("layer1.conv", &w.Layer1.Conv)
	m.layer1BN = bn("layer1.bn", &w.Layer1.BN)
	d := m.Dims
	for i, bw := range w.blocks() {
		p := fmt.Sprintf("layer%d", i+2)
		b := block{dilation: m.Config.Dilations[i+1], splitSize: d.Channels / d.Scale}
		b.padding = b.dilation * (d.Kernel - 1) / 2
		b.in = cv(p+".Conv1dReluBn1.conv", &bw.In.Conv)
		b.inBN = bn(p+".Conv1dReluBn1.bn", &bw.In.BN)
		for j := range bw.Convs {
			b.convs = append(b.convs, cv(fmt.Sprintf("%s.Res2Conv1dReluBn.convs.%d", p, j), &bw.Convs[j]))
			b.bns = append(b.bns, bn(fmt.Sprintf("%s.Res2Conv1dReluBn.bns.%d", p, j), &bw.BNs[j]))
		}
		b.out = cv(p+".Conv1dReluBn2.conv", &bw.Out.Conv)
		b.outBN = bn(p+".Conv1dReluBn2.bn", &bw.Out.BN)
		b.se1 = cv(p+".SE_Connect.linear1", &bw.SE1, d.SE, d.Channels)
		b.se2 = cv(p+".SE_Connect.linear2", &bw.SE2, d.Channels, d.SE)
		m.blocks = append(m.blocks, b)
	}
	m.mfa = cv("conv", &w.Conv)
	m.pool1 = cv("pooling.linear1", &w.Pool1)
	m.pool2 = cv("pooling.linear2", &w.Pool2)
	m.bn = bn("bn", &w.BN)
	m.linear = cv("linear", &w.Linear)
	return errors.Join(errs...)
}

// Close releases the compiled programs and the weight buffers.
func (m *Model) Close() {
	if m == nil {
		return
	}
	m.cache.Close()
	for _, b := range m.bufs {
		b.Free()
	}
	m.bufs = nil
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
	p := func(b *engine.Buffer) engine.Tensor { return g.Persistent(b) }
	pp := func(b *engine.Buffer) *engine.Tensor { t := g.Persistent(b); return &t }
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
	convReluBN := func(x engine.Tensor, c conv, a affine, pad, dil int64) engine.Tensor {
		y := g.Conv1D(x, p(c.w), pp(c.b), 1, pad, pad, dil, 1)
		return g.ChannelAffine(g.ReLU(y), p(a.scale), p(a.shift))
	}
	g.Label("layer1")
	k1 := int64(d.Kernel1)
	dil1 := int64(m.Config.Dilations[0])
	x = convReluBN(x, m.layer1, m.layer1BN, dil1*(k1-1)/2, dil1)
	out("layer1", x)

	var outs []engine.Tensor
	for i, b := range m.blocks {
		g.Label(fmt.Sprintf("layer%d", i+2))
		res := x
		y := convReluBN(x, b.in, b.inBN, 0, 1)
		// Res2: split i (i < scale−1) plus the previous output goes through its conv; the
		// last split passes through unchanged.
		w := int64(b.splitSize)
		parts := make([]engine.Tensor, 0, d.Scale)
		var sp engine.Tensor
		for j := range b.convs {
			s := g.Slice(y, 1, int64(j)*w, int64(j+1)*w)
			if j == 0 {
				sp = s
			} else {
				sp = g.Add(sp, s)
			}
			sp = convReluBN(sp, b.convs[j], b.bns[j], int64(b.padding), int64(b.dilation))
			parts = append(parts, sp)
		}
		parts = append(parts, g.Slice(y, 1, int64(d.Scale-1)*w, int64(d.Scale)*w))
		y = g.Concat(1, parts...)
		y = convReluBN(y, b.out, b.outBN, 0, 1)
		// SE: squeeze over time, bottleneck, sigmoid gate per channel.
		s := g.Reshape(g.Mean(y, 2), 1, int64(d.Channels))
		s = g.ReLU(g.Linear(s, p(b.se1.w), pp(b.se1.b)))
		s = g.Sigmoid(g.Linear(s, p(b.se2.w), pp(b.se2.b)))
		y = g.Mul(y, g.Reshape(s, 1, int64(d.Channels), 1))
		x = g.Add(y, res)
		out(fmt.Sprintf("layer%d", i+2), x)
		outs = append(outs, x)
	}

	g.Label("conv")
	x = g.Conv1D(g.Concat(1, outs...), p(m.mfa.w), pp(m.mfa.b), 1, 0, 0, 1, 1)
	out("conv", x)
	x = g.ReLU(x)

	g.Label("pooling")
	a := g.Tanh(g.Conv1D(x, p(m.pool1.w), pp(m.pool1.b), 1, 0, 0, 1, 1))
	a = g.Conv1D(a, p(m.pool2.w), pp(m.pool2.b), 1, 0, 0, 1, 1)
	a = g.Softmax(a, nil, 1) // over time, the last axis
	mean := g.Sum(g.Mul(a, x), 2)
	sq := g.Sum(g.Mul(a, g.Square(x)), 2)
	std := g.Sqrt(g.Clamp(g.Sub(sq, g.Square(mean)), float32(m.Config.StatsEps), math.MaxFloat32))
	pooled := g.Reshape(g.Concat(1, mean, std), 1, int64(2*d.MFA))
	out("pooling", pooled)

	g.Label("bn")
	x = g.ChannelAffine(pooled, p(m.bn.scale), p(m.bn.shift))
	out("bn", x)
	g.Label("linear")
	x = g.Linear(x, p(m.linear.w), pp(m.linear.b))
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
