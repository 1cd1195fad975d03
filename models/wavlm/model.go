package wavlm

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// Options adjust loading.
type Options struct {
	// Variant forces a switch set; VariantAuto infers it from the tensors.
	Variant Variant
	// ConvStrides overrides the real strides [5,2,2,2,2,2,2] (one per conv).
	ConvStrides []int
	// MaxDistance overrides the relative-position max distance (800).
	MaxDistance int
}

type conv struct {
	W nn.Tensor `gguf:"0.weight"`
	// Large: a LayerNorm per conv; Base+: a GroupNorm on the first (same two tensors).
	Norm nn.LayerNorm `gguf:"2|2.1,optional"`
}

type layer struct {
	Q     nn.Linear `gguf:"self_attn.q_proj"`
	K     nn.Linear `gguf:"self_attn.k_proj"`
	V     nn.Linear `gguf:"self_attn.v_proj"`
	O     nn.Linear `gguf:"self_attn.out_proj"`
	Grep  nn.Linear `gguf:"self_attn.grep_linear"`
	GrepA nn.Tensor `gguf:"self_attn.grep_a"`
	// Layer 0's table [buckets, heads] serves every layer; it is expanded on the host.
	RelBias weights.Tensor `gguf:"self_attn.relative_attention_bias.weight,optional"`
	AttnLN  nn.LayerNorm   `gguf:"self_attn_layer_norm"`
	FC1     nn.Linear      `gguf:"fc1"`
	FC2     nn.Linear      `gguf:"fc2"`
	FinalLN nn.LayerNorm   `gguf:"final_layer_norm"`
}

type encoder struct {
	Convs []conv       `gguf:"feature_extractor.conv_layers.%d"`
	LN    nn.LayerNorm `gguf:"layer_norm"`
	Proj  nn.Linear    `gguf:"post_extract_proj,optional"`
	// Unused at inference; declared so random models carry the checkpoint's full table.
	MaskEmb weights.Tensor `gguf:"mask_emb,optional"`
	// The positional conv's weight norm is folded on the host into one weight at load.
	PosG   weights.Tensor `gguf:"encoder.pos_conv.0.weight_g"`
	PosV   weights.Tensor `gguf:"encoder.pos_conv.0.weight_v"`
	PosB   nn.Tensor      `gguf:"encoder.pos_conv.0.bias"`
	EncLN  nn.LayerNorm   `gguf:"encoder.layer_norm"`
	Layers []layer        `gguf:"encoder.layers.%d"`
}

// declare is the encoder of c with every expected shape (the checkpoint's table).
func (c Config) declare() *encoder {
	h, cd := c.Hidden, c.ConvDim()
	w := &encoder{
		Convs:   make([]conv, len(c.ConvDims)),
		LN:      nn.NewLayerNorm(cd),
		MaskEmb: weights.Tensor{Shape: []int{h}},
		PosG:    weights.Tensor{Shape: []int{1, 1, c.PosConvKernel}},
		PosV:    weights.Tensor{Shape: []int{h, h / max(c.PosConvGroups, 1), c.PosConvKernel}},
		PosB:    nn.Shaped(h),
		EncLN:   nn.NewLayerNorm(h),
		Layers:  make([]layer, c.Layers),
	}
	cin := 1
	for i, d := range c.ConvDims {
		w.Convs[i].W = nn.Shaped(d, cin, c.ConvKernels[i])
		if c.ConvLayerNorm || i == 0 {
			w.Convs[i].Norm = nn.NewLayerNorm(d)
		}
		cin = d
	}
	if cd != h {
		w.Proj = nn.NewLinear(cd, h, true)
	}
	for i := range w.Layers {
		w.Layers[i] = layer{
			Q: nn.NewLinear(h, h, true), K: nn.NewLinear(h, h, true), V: nn.NewLinear(h, h, true), O: nn.NewLinear(h, h, true),
			Grep:    nn.NewLinear(c.HeadDim(), 8, true),
			GrepA:   nn.Shaped(1, c.Heads, 1, 1),
			AttnLN:  nn.NewLayerNorm(h),
			FC1:     nn.NewLinear(h, c.FFN, true),
			FC2:     nn.NewLinear(c.FFN, h, true),
			FinalLN: nn.NewLayerNorm(h),
		}
	}
	if len(w.Layers) > 0 {
		w.Layers[0].RelBias.Shape = []int{c.NumBuckets, c.Heads}
	}
	return w
}

// Model is a loaded WavLM encoder: weights in persistent engine buffers, the dense
// relative-position bias per input length (persistent, shared by every layer and caller), and
// compiled programs per input length.
//
// A Model is safe for concurrent use: calls are serialised (one program runs at a time and
// uses every backend thread). Other models running programs on the same CPU backend must not
// run at the same time as a call here: the backend's thread pool is not re-entrant.
type Model struct {
	Config Config

	backend engine.Backend

	w       *encoder
	posW    *engine.Buffer // the positional conv's weight, weight norm folded
	relRows [][]float32    // per head: bias by relative position r + maxRel
	maxRel  int

	mu     sync.Mutex
	biases []*biasEntry // least recently used first
	progs  []*progEntry // least recently used first
	closed bool
}

type biasEntry struct {
	t   int
	buf *engine.Buffer
}

type progEntry struct {
	key  string
	t    int
	prog engine.Program
}

// Cache sizes: dense biases are H·T²·4 bytes (16 MB for Large at 10 s) and each program owns
// its arena, so only a few of each are kept.
const (
	maxBiases   = 4
	maxPrograms = 4
)

// shapeOf is a tensor's shape, read from the metadata when the source is a GGUF view (no
// need to load a real-size tensor just to size the model).
func shapeOf(src weights.Source, name string) ([]int, bool) {
	if !src.Has(name) {
		return nil, false
	}
	if s, ok := src.(weights.Shaper); ok {
		if shape, ok := s.Shape(name); ok {
			return shape, true
		}
	}
	_, shape, err := src.Get(name)
	return shape, err == nil
}

// inferConfig reads the dimensions from the tensor shapes.
func inferConfig(src weights.Source, opts Options) (Config, error) {
	c := Config{NumBuckets: 0, MaxDistance: 800, Eps: 1e-5}
	if opts.MaxDistance > 0 {
		c.MaxDistance = opts.MaxDistance
	}
	var missing []string
	need := func(name string, rank int) []int {
		s, ok := shapeOf(src, name)
		if !ok {
			missing = append(missing, name)
			return nil
		}
		if len(s) != rank {
			missing = append(missing, fmt.Sprintf("%s (rank %d, want %d)", name, len(s), rank))
			return nil
		}
		return s
	}
	for i := 0; ; i++ {
		s, ok := shapeOf(src, fmt.Sprintf("feature_extractor.conv_layers.%d.0.weight", i))
		if !ok {
			break
		}
		if len(s) != 3 {
			return c, fmt.Errorf("wavlm: feature_extractor.conv_layers.%d.0.weight has shape %v, want [out, in, kernel]", i, s)
		}
		c.ConvDims = append(c.ConvDims, s[0])
		c.ConvKernels = append(c.ConvKernels, s[2])
	}
	if len(c.ConvDims) == 0 {
		return c, fmt.Errorf("wavlm: missing tensor %sfeature_extractor.conv_layers.0.0.weight", prefixOf(src))
	}
	if opts.ConvStrides != nil {
		if len(opts.ConvStrides) != len(c.ConvDims) {
			return c, fmt.Errorf("wavlm: %d strides given for %d convs", len(opts.ConvStrides), len(c.ConvDims))
		}
		c.ConvStrides = slices.Clone(opts.ConvStrides)
	} else {
		for i := range c.ConvDims {
			c.ConvStrides = append(c.ConvStrides, map[bool]int{true: 5, false: 2}[i == 0])
		}
	}
	rel := need("encoder.layers.0.self_attn.relative_attention_bias.weight", 2)
	v := need("encoder.pos_conv.0.weight_v", 3)
	fc1 := need("encoder.layers.0.fc1.weight", 2)
	if len(missing) > 0 {
		return c, fmt.Errorf("wavlm: missing or misshapen tensors: %s%s", prefixOf(src), strings.Join(missing, ", "+prefixOf(src)))
	}
	c.Hidden = c.ConvDim()
	if s, ok := shapeOf(src, "post_extract_proj.weight"); ok && len(s) == 2 {
		c.Hidden = s[0]
	}
	c.NumBuckets, c.Heads = rel[0], rel[1]
	c.PosConvKernel = v[2]
	if v[1] > 0 && c.Hidden%v[1] == 0 {
		c.PosConvGroups = c.Hidden / v[1]
	}
	c.FFN = fc1[0]
	for c.Layers = 0; src.Has(fmt.Sprintf("encoder.layers.%d.fc1.weight", c.Layers)); c.Layers++ {
	}
	variant := opts.Variant
	if variant == VariantAuto {
		variant = VariantBasePlus
		if src.Has("feature_extractor.conv_layers.1.2.weight") || src.Has("feature_extractor.conv_layers.1.2.1.weight") {
			variant = VariantLarge
		}
	}
	c.setSwitches(variant)
	return c, c.validate()
}

func prefixOf(src weights.Source) string {
	if p, ok := src.(interface{ Prefix() string }); ok {
		return p.Prefix()
	}
	return ""
}

// Load binds WavLM's unilm-named tensors from src (a namespace view such as the
// `speaker_wavlm/` or `wavlm_weights/` namespace of a model file), checks every shape against
// the dimensions inferred from the tensors, and uploads the weights for backend.
func Load(src weights.Source, backend engine.Backend, opts Options) (*Model, error) {
	cfg, err := inferConfig(src, opts)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: cfg, backend: backend}
	fail := func(err error) (*Model, error) {
		m.Close()
		return nil, err
	}
	c := cfg
	h, cd := c.Hidden, c.ConvDim()
	w := c.declare()
	w.Proj.Weight.Shape, w.Proj.Bias.Shape = []int{h, cd}, []int{h} // checked when present
	m.w = w
	if err := nn.Bind(src, backend, w); err != nil {
		return fail(fmt.Errorf("wavlm: %w", err))
	}
	var problems []string
	pfx := prefixOf(src)
	for i, cv := range w.Convs {
		if cv.Norm.Weight.Present() != cv.Norm.Bias.Present() {
			problems = append(problems, fmt.Sprintf("%sfeature_extractor.conv_layers.%d.2: weight and bias must come together", pfx, i))
		}
		if (c.ConvLayerNorm || i == 0) && !cv.Norm.Weight.Present() {
			problems = append(problems, fmt.Sprintf("missing %sfeature_extractor.conv_layers.%d.2.weight|2.1.weight (%s)", pfx, i, c.Variant))
		}
	}
	if cd != h && !w.Proj.Weight.Present() {
		problems = append(problems, fmt.Sprintf("missing %spost_extract_proj.weight (conv dim %d ≠ hidden %d)", pfx, cd, h))
	}
	if w.Proj.Weight.Present() != w.Proj.Bias.Present() {
		problems = append(problems, fmt.Sprintf("%spost_extract_proj: weight and bias must come together", pfx))
	}
	if !w.Layers[0].RelBias.Present() {
		problems = append(problems, fmt.Sprintf("missing %sencoder.layers.0.self_attn.relative_attention_bias.weight", pfx))
	}
	if len(problems) > 0 {
		return fail(fmt.Errorf("wavlm: %s", strings.Join(problems, "; ")))
	}
	if m.posW, err = engine.Upload(backend, "encoder.pos_conv.0.weight", foldWeightNormDim2(w.PosG.Data, w.PosV.Data, w.PosV.Shape), int64(h), int64(h/c.PosConvGroups), int64(c.PosConvKernel)); err != nil {
		return fail(fmt.Errorf("wavlm: %w", err))
	}
	m.setRelRows(w.Layers[0].RelBias.Data)
	// The host copies are folded into buffers: drop them.
	w.PosG, w.PosV, w.MaskEmb, w.Layers[0].RelBias = weights.Tensor{}, weights.Tensor{}, weights.Tensor{}, weights.Tensor{}
	return m, nil
}

// foldWeightNormDim2 is torch weight_norm with dim=2 on a conv weight v [O, I, K]:
// W[o,i,k] = g[k]·v[o,i,k] / ‖v[:,:,k]‖.
func foldWeightNormDim2(g, v []float32, shape []int) []float32 {
	k := shape[2]
	norm := make([]float64, k)
	for i, x := range v {
		norm[i%k] += float64(x) * float64(x)
	}
	out := make([]float32, len(v))
	for i, x := range v {
		j := i % k
		out[i] = float32(float64(g[j]) * float64(x) / math.Sqrt(norm[j]))
	}
	return out
}

// setRelRows turns the [buckets, heads] table into per-head rows over every relative
// position a supported length can need, so a dense bias is row copies.
func (m *Model) setRelRows(table []float32) {
	c := m.Config
	// Beyond MaxDistance every bucket saturates, but lengths are not bounded: rows cover
	// the distances up to maxRel and saturate beyond (clamped on lookup).
	m.maxRel = max(c.MaxDistance, 1) * 2
	m.relRows = make([][]float32, c.Heads)
	for h := range m.relRows {
		row := make([]float32, 2*m.maxRel+1)
		for i := range row {
			row[i] = table[bucket(i-m.maxRel, c.NumBuckets, c.MaxDistance)*c.Heads+h]
		}
		m.relRows[h] = row
	}
}

// fillBias writes the dense [heads, t, t] bias: bias[h,q,k] = table[bucket(k − q), h].
func (m *Model) fillBias(dst []float32, t int) {
	for h, row := range m.relRows {
		for q := range t {
			out := dst[(h*t+q)*t : (h*t+q+1)*t]
			lo := -q + m.maxRel // index of k = 0
			if lo >= 0 && lo+t <= len(row) {
				copy(out, row[lo:lo+t])
				continue
			}
			for k := range t {
				r := min(max(k-q, -m.maxRel), m.maxRel)
				out[k] = row[r+m.maxRel]
			}
		}
	}
}

// biasFor returns the persistent dense bias for length t (m.mu held).
func (m *Model) biasFor(t int) (*engine.Buffer, error) {
	for i, e := range m.biases {
		if e.t == t {
			m.biases = append(append(m.biases[:i:i], m.biases[i+1:]...), e)
			return e.buf, nil
		}
	}
	if len(m.biases) >= maxBiases {
		old := m.biases[0]
		m.biases = m.biases[1:]
		// Programs built on the evicted bias read its memory: drop them with it.
		m.progs = slices.DeleteFunc(m.progs, func(p *progEntry) bool {
			if p.t == old.t {
				p.prog.Close()
				return true
			}
			return false
		})
		old.buf.Free()
	}
	c := m.Config
	// Filled on the host and uploaded: the buffer may live in a GPU's memory.
	bias := make([]float32, c.Heads*t*t)
	m.fillBias(bias, t)
	b, err := engine.Upload(m.backend, fmt.Sprintf("wavlm.rel_bias[T=%d]", t), bias, int64(c.Heads), int64(t), int64(t))
	if err != nil {
		return nil, fmt.Errorf("wavlm: relative bias for %d frames: %w", t, err)
	}
	m.biases = append(m.biases, &biasEntry{t: t, buf: b})
	return b, nil
}

// Trim frees the cached programs and relative-position biases (they are rebuilt on demand),
// giving their memory back between bursts of work.
func (m *Model) Trim() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.progs {
		p.prog.Close()
	}
	for _, b := range m.biases {
		b.buf.Free()
	}
	m.progs, m.biases = nil, nil
}

// Close frees the weights, biases and programs.
func (m *Model) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.progs {
		p.prog.Close()
	}
	for _, b := range m.biases {
		b.buf.Free()
	}
	nn.Free(m.w)
	m.posW.Free()
	m.progs, m.biases, m.posW = nil, nil, nil
	m.closed = true
}

// Result is one forward pass.
type Result struct {
	// T is the number of frames.
	T int
	// States are the requested hidden states in request order, each T×Hidden row-major:
	// index 0 is the input of the first layer, i the output of layer i (for Large, the last
	// layer's output after encoder.layer_norm).
	States [][]float32
	// ConvFeatures is the feature extractor output, ConvDim×T (channels first), and
	// Projected the post_extract_proj output, T×Hidden (only with intermediates).
	ConvFeatures []float32
	Projected    []float32
}

// Hidden runs the encoder on 16 kHz samples up to the highest requested layer and returns the
// requested hidden states (each T×Hidden row-major) and T.
func (m *Model) Hidden(wave16k []float32, layers []int) ([][]float32, int, error) {
	r, err := m.Forward(wave16k, layers, false)
	if err != nil {
		return nil, 0, err
	}
	return r.States, r.T, nil
}

// Forward is Hidden with, optionally, the feature extractor and projection outputs.
func (m *Model) Forward(wave16k []float32, layers []int, intermediates bool) (*Result, error) {
	c := m.Config
	n := len(wave16k)
	t := c.Frames(n)
	if t < 1 {
		return nil, fmt.Errorf("wavlm: %d samples are too short (at least %d needed for one frame)", n, c.ReceptiveField())
	}
	if len(layers) == 0 && !intermediates {
		return nil, errors.New("wavlm: no hidden state requested")
	}
	top := 0
	for _, l := range layers {
		if l < 0 || l > c.Layers {
			return nil, fmt.Errorf("wavlm: hidden state %d outside 0..%d", l, c.Layers)
		}
		top = max(top, l)
	}
	key := fmt.Sprintf("N%d/L%v/i%v", n, layers, intermediates)

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errors.New("wavlm: model is closed")
	}
	prog, err := m.program(key, n, t, layers, top, intermediates)
	if err != nil {
		return nil, err
	}
	copy(prog.Input("wave"), wave16k)
	if err := prog.Run(); err != nil {
		return nil, fmt.Errorf("wavlm: run %d samples: %w", n, err)
	}
	r := &Result{T: t, States: make([][]float32, len(layers))}
	for i := range layers {
		r.States[i] = slices.Clone(prog.Output(fmt.Sprintf("h%d", i)))
	}
	if intermediates {
		r.ConvFeatures = slices.Clone(prog.Output("conv_features"))
		r.Projected = slices.Clone(prog.Output("projected"))
	}
	return r, nil
}

// program finds or compiles the program for key (m.mu held).
func (m *Model) program(key string, n, t int, layers []int, top int, intermediates bool) (engine.Program, error) {
	for i, p := range m.progs {
		if p.key == key {
			m.progs = append(append(m.progs[:i:i], m.progs[i+1:]...), p)
			return p.prog, nil
		}
	}
	var bias *engine.Buffer
	var err error
	if top > 0 {
		if bias, err = m.biasFor(t); err != nil {
			return nil, err
		}
	}
	g := m.build(n, t, layers, top, intermediates, bias)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("wavlm: %w", err)
	}
	prog, err := m.backend.Compile(g)
	if err != nil {
		return nil, fmt.Errorf("wavlm: %w", err)
	}
	if len(m.progs) >= maxPrograms {
		m.progs[0].prog.Close()
		m.progs = m.progs[1:]
	}
	m.progs = append(m.progs, &progEntry{key: key, t: t, prog: prog})
	return prog, nil
}

// ProgramStats compiles (or finds) the program for n samples and the requested layers and
// returns its memory statistics.
func (m *Model) ProgramStats(n int, layers []int) (engine.PlanStats, error) {
	c := m.Config
	t := c.Frames(n)
	if t < 1 {
		return engine.PlanStats{}, fmt.Errorf("wavlm: %d samples are too short", n)
	}
	top := 0
	for _, l := range layers {
		if l < 0 || l > c.Layers {
			return engine.PlanStats{}, fmt.Errorf("wavlm: hidden state %d outside 0..%d", l, c.Layers)
		}
		top = max(top, l)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prog, err := m.program(fmt.Sprintf("N%d/L%v/i%v", n, layers, false), n, t, layers, top, false)
	if err != nil {
		return engine.PlanStats{}, err
	}
	return prog.Stats(), nil
}

// build makes the graph for n samples (t frames) computing layers up to top.
func (m *Model) build(n, t int, layers []int, top int, intermediates bool, bias *engine.Buffer) *engine.Graph {
	c := m.Config
	N, T, H := int64(n), int64(t), int64(c.Hidden)
	nh, hd := int64(c.Heads), int64(c.HeadDim())
	eps := c.Eps
	g := engine.NewGraph(fmt.Sprintf("wavlm[%s,N=%d,top=%d]", c.Variant, n, top))
	w := m.w

	g.Label("input")
	wave := g.Input("wave", engine.F32, 1, N)
	x := wave
	if c.NormalizeInput {
		x = g.LayerNorm(x, nil, nil, eps)
	}
	// Feature extractor, channels first [1, C, time]; tc is the same values time-major
	// [1, time, C] when a LayerNorm left them that way.
	h := g.Reshape(x, 1, 1, N)
	var tc engine.Tensor
	for i := range w.Convs {
		cv := &w.Convs[i]
		g.Label(fmt.Sprintf("feature_extractor.conv_layers.%d", i))
		h = g.Conv1D(h, cv.W.In(g), nil, int64(c.ConvStrides[i]), 0, 0, 1, 1)
		if c.ConvLayerNorm {
			tc = g.GELU(cv.Norm.Forward(g, g.Permute(h, 0, 2, 1), eps), false)
			h = g.Permute(tc, 0, 2, 1)
			continue
		}
		if i == 0 {
			h = g.GroupNorm(h, c.ConvDims[0], cv.Norm.Weight.Opt(g), cv.Norm.Bias.Opt(g), eps)
		}
		h = g.GELU(h, false)
		tc = g.Permute(h, 0, 2, 1)
	}
	if intermediates {
		g.Output("conv_features", h)
	}
	g.Label("post_extract_proj")
	f := w.LN.Forward(g, tc, eps)
	if w.Proj.Weight.Present() {
		f = w.Proj.Forward(g, f)
	}
	x = g.Reshape(f, T, H)
	if intermediates {
		g.Output("projected", x)
	}

	g.Label("encoder.pos_conv")
	k := int64(c.PosConvKernel)
	padR := k / 2
	if k%2 == 0 {
		padR-- // SamePad drops the last frame of an even kernel
	}
	pc := g.Conv1D(g.Permute(g.Reshape(x, 1, T, H), 0, 2, 1), g.Persistent(m.posW), w.PosB.Opt(g), 1, k/2, padR, 1, int64(c.PosConvGroups))
	x = g.Add(x, g.GELU(g.Reshape(g.Permute(pc, 0, 2, 1), T, H), false))
	if !c.LayerNormFirst {
		g.Label("encoder.layer_norm")
		x = w.EncLN.Forward(g, x, eps)
	}
	emit := func(idx int, v engine.Tensor) {
		for i, l := range layers {
			if l == idx {
				g.Output(fmt.Sprintf("h%d", i), v)
			}
		}
	}
	emit(0, x)

	var pb engine.Tensor
	if top > 0 {
		pb = g.Persistent(bias) // [heads, T, T]
	}
	for i := range top {
		lb := &w.Layers[i]
		g.Label(fmt.Sprintf("encoder.layers.%d", i))
		a := x
		if c.LayerNormFirst {
			a = lb.AttnLN.Forward(g, x, eps)
		}
		heads := func(t engine.Tensor) engine.Tensor { // [T, H] → [1, heads, T, hd]
			return g.Permute(g.Reshape(t, 1, T, nh, hd), 0, 2, 1, 3)
		}
		q, kk, v := heads(lb.Q.Forward(g, a)), heads(lb.K.Forward(g, a)), heads(lb.V.Forward(g, a))
		// Gate per (head, query) from the attention input split into heads.
		gr := lb.Grep.Forward(g, g.Reshape(a, T, nh, hd))      // [T, nh, 8]
		gs := g.Sigmoid(g.Sum(g.Reshape(gr, T, nh, 2, 4), -1)) // [T, nh, 2, 1]
		ga, gb := g.Slice(gs, 2, 0, 1), g.Slice(gs, 2, 1, 2)
		grepA := g.Reshape(lb.GrepA.In(g), nh, 1, 1)
		gate := g.Scale(g.Mul(ga, g.Scale(g.Mul(gb, grepA), 1, -1)), 1, 2) // [T, nh, 1, 1]
		gate = g.Reshape(g.Permute(g.Reshape(gate, T, nh), 1, 0), nh, T, 1)
		gb2 := g.Mul(gate, pb) // [nh, T, T]
		att := g.Attention(q, kk, v, nil, &gb2, 0)
		att = g.Reshape(g.Permute(att, 0, 2, 1, 3), T, H)
		x = g.Add(x, lb.O.Forward(g, att))
		if !c.LayerNormFirst {
			x = lb.AttnLN.Forward(g, x, eps)
		}
		ff := x
		if c.LayerNormFirst {
			ff = lb.FinalLN.Forward(g, x, eps)
		}
		ff = lb.FC2.Forward(g, g.GELU(lb.FC1.Forward(g, ff), false))
		x = g.Add(x, ff)
		if !c.LayerNormFirst {
			x = lb.FinalLN.Forward(g, x, eps)
		}
		if c.LayerNormFirst && i+1 == c.Layers {
			g.Label("encoder.layer_norm")
			x = w.EncLN.Forward(g, x, eps)
		}
		emit(i+1, x)
	}
	return g
}
