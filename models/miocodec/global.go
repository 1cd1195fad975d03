package miocodec

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// Speaker path (MANIFEST §3.13–3.17): reference clip → WavLM-Base+ layers (global_ssl_layers)
// → mean → global encoder (ConvNeXt backbone, attentive statistics pooling, Linear,
// LayerNorm) → 128-d global embedding.

type globalBlockWeights struct {
	Gamma weights.Tensor `gguf:"gamma,optional"`
	DwW   weights.Tensor `gguf:"dwconv.weight"`
	DwB   weights.Tensor `gguf:"dwconv.bias"`
	NW    weights.Tensor `gguf:"norm.weight"`
	NB    weights.Tensor `gguf:"norm.bias"`
	P1W   weights.Tensor `gguf:"pwconv1.weight"`
	P1B   weights.Tensor `gguf:"pwconv1.bias"`
	P2W   weights.Tensor `gguf:"pwconv2.weight"`
	P2B   weights.Tensor `gguf:"pwconv2.bias"`
}

type globalEncoderWeights struct {
	G struct {
		EmbedW weights.Tensor       `gguf:"backbone.embed.weight"`
		EmbedB weights.Tensor       `gguf:"backbone.embed.bias"`
		NormW  weights.Tensor       `gguf:"backbone.norm.weight"`
		NormB  weights.Tensor       `gguf:"backbone.norm.bias"`
		Blocks []globalBlockWeights `gguf:"backbone.convnext.%d"`
		FinW   weights.Tensor       `gguf:"backbone.final_layer_norm.weight"`
		FinB   weights.Tensor       `gguf:"backbone.final_layer_norm.bias"`
		A0W    weights.Tensor       `gguf:"pooling.attn.0.weight"`
		A0B    weights.Tensor       `gguf:"pooling.attn.0.bias"`
		A2W    weights.Tensor       `gguf:"pooling.attn.2.weight"`
		A2B    weights.Tensor       `gguf:"pooling.attn.2.bias"`
		ProjW  weights.Tensor       `gguf:"pooling.proj.weight"`
		ProjB  weights.Tensor       `gguf:"pooling.proj.bias"`
		PNW    weights.Tensor       `gguf:"pooling.norm.weight"`
		PNB    weights.Tensor       `gguf:"pooling.norm.bias"`
	} `gguf:"global_encoder"`
}

// GlobalEncoderConfig are the global encoder's dimensions, all from tensor shapes.
type GlobalEncoderConfig struct {
	In, Dim, Intermediate, Blocks, AttnChannels, Out int
	EmbedKernel, DwKernel                            int
}

type globalBlockBufs struct {
	gamma, dwW, dwB, nW, nB, p1W, p1B, p2W, p2B *engine.Buffer
}

type globalEncoder struct {
	cfg                GlobalEncoderConfig
	embedW, embedB     *engine.Buffer
	normW, normB       *engine.Buffer
	blocks             []globalBlockBufs
	finW, finB         *engine.Buffer
	a0W, a0B, a2W, a2B *engine.Buffer
	projW, projB       *engine.Buffer
	pNormW, pNormB     *engine.Buffer
	bufs               []*engine.Buffer
}

func globalDims(src *gguf.Model) (GlobalEncoderConfig, error) {
	var c GlobalEncoderConfig
	shape := func(name string, rank int) ([]int, error) {
		t, ok := src.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("miocodec: missing tensor %s%s", src.Prefix(), name)
		}
		if len(t.Shape) != rank {
			return nil, fmt.Errorf("miocodec: tensor %s%s has shape %v, want rank %d", src.Prefix(), name, t.Shape, rank)
		}
		return t.Shape, nil
	}
	e, err := shape("global_encoder.backbone.embed.weight", 3)
	if err != nil {
		return c, err
	}
	c.Dim, c.In, c.EmbedKernel = e[0], e[1], e[2]
	for src.Has(fmt.Sprintf("global_encoder.backbone.convnext.%d.dwconv.weight", c.Blocks)) {
		c.Blocks++
	}
	if c.Blocks > 0 {
		p1, err := shape("global_encoder.backbone.convnext.0.pwconv1.weight", 2)
		if err != nil {
			return c, err
		}
		dw, err := shape("global_encoder.backbone.convnext.0.dwconv.weight", 3)
		if err != nil {
			return c, err
		}
		c.Intermediate, c.DwKernel = p1[0], dw[2]
	}
	a0, err := shape("global_encoder.pooling.attn.0.weight", 3)
	if err != nil {
		return c, err
	}
	c.AttnChannels = a0[0]
	p, err := shape("global_encoder.pooling.proj.weight", 2)
	if err != nil {
		return c, err
	}
	c.Out = p[0]
	if c.EmbedKernel%2 == 0 || (c.Blocks > 0 && c.DwKernel%2 == 0) {
		return c, fmt.Errorf("miocodec: global encoder kernels %d/%d must be odd ('same' padding)", c.EmbedKernel, c.DwKernel)
	}
	return c, nil
}

// loadGlobalEncoder binds `global_encoder.*` of the `weights/` view and uploads it.
func loadGlobalEncoder(src *gguf.Model) (*globalEncoder, error) {
	c, err := globalDims(src)
	if err != nil {
		return nil, err
	}
	var w globalEncoderWeights
	g := &w.G
	g.EmbedW.Shape, g.EmbedB.Shape = []int{c.Dim, c.In, c.EmbedKernel}, []int{c.Dim}
	g.NormW.Shape, g.NormB.Shape = []int{c.Dim}, []int{c.Dim}
	g.Blocks = make([]globalBlockWeights, c.Blocks)
	for i := range g.Blocks {
		b := &g.Blocks[i]
		b.Gamma.Shape = []int{c.Dim}
		b.DwW.Shape, b.DwB.Shape = []int{c.Dim, 1, c.DwKernel}, []int{c.Dim}
		b.NW.Shape, b.NB.Shape = []int{c.Dim}, []int{c.Dim}
		b.P1W.Shape, b.P1B.Shape = []int{c.Intermediate, c.Dim}, []int{c.Intermediate}
		b.P2W.Shape, b.P2B.Shape = []int{c.Dim, c.Intermediate}, []int{c.Dim}
	}
	g.FinW.Shape, g.FinB.Shape = []int{c.Dim}, []int{c.Dim}
	g.A0W.Shape, g.A0B.Shape = []int{c.AttnChannels, c.Dim, 1}, []int{c.AttnChannels}
	g.A2W.Shape, g.A2B.Shape = []int{c.Dim, c.AttnChannels, 1}, []int{c.Dim}
	g.ProjW.Shape, g.ProjB.Shape = []int{c.Out, 2 * c.Dim}, []int{c.Out}
	g.PNW.Shape, g.PNB.Shape = []int{c.Out}, []int{c.Out}
	if err := weights.Bind(src, &w); err != nil {
		return nil, fmt.Errorf("miocodec: global encoder: %w", err)
	}
	ge := &globalEncoder{cfg: c}
	up := func(name string, t weights.Tensor, shape ...int64) (*engine.Buffer, error) {
		if shape == nil {
			for _, d := range t.Shape {
				shape = append(shape, int64(d))
			}
		}
		b, err := engine.NewBufferFrom("global_encoder."+name, t.Data, shape...)
		if err != nil {
			return nil, fmt.Errorf("miocodec: upload global_encoder.%s: %w", name, err)
		}
		ge.bufs = append(ge.bufs, b)
		return b, nil
	}
	D, A := int64(c.Dim), int64(c.AttnChannels)
	type item struct {
		dst   **engine.Buffer
		name  string
		t     weights.Tensor
		shape []int64
	}
	items := []item{
		{&ge.embedW, "backbone.embed.weight", g.EmbedW, nil},
		{&ge.embedB, "backbone.embed.bias", g.EmbedB, nil},
		{&ge.normW, "backbone.norm.weight", g.NormW, nil},
		{&ge.normB, "backbone.norm.bias", g.NormB, nil},
		{&ge.finW, "backbone.final_layer_norm.weight", g.FinW, nil},
		{&ge.finB, "backbone.final_layer_norm.bias", g.FinB, nil},
		// The k=1 pooling convs are Linear layers on time-major features.
		{&ge.a0W, "pooling.attn.0.weight", g.A0W, []int64{A, D}},
		{&ge.a0B, "pooling.attn.0.bias", g.A0B, nil},
		{&ge.a2W, "pooling.attn.2.weight", g.A2W, []int64{D, A}},
		{&ge.a2B, "pooling.attn.2.bias", g.A2B, nil},
		{&ge.projW, "pooling.proj.weight", g.ProjW, nil},
		{&ge.projB, "pooling.proj.bias", g.ProjB, nil},
		{&ge.pNormW, "pooling.norm.weight", g.PNW, nil},
		{&ge.pNormB, "pooling.norm.bias", g.PNB, nil},
	}
	ge.blocks = make([]globalBlockBufs, c.Blocks)
	for i := range g.Blocks {
		b, bb := &g.Blocks[i], &ge.blocks[i]
		p := fmt.Sprintf("backbone.convnext.%d.", i)
		items = append(items,
			item{&bb.dwW, p + "dwconv.weight", b.DwW, nil},
			item{&bb.dwB, p + "dwconv.bias", b.DwB, nil},
			item{&bb.nW, p + "norm.weight", b.NW, nil},
			item{&bb.nB, p + "norm.bias", b.NB, nil},
			item{&bb.p1W, p + "pwconv1.weight", b.P1W, nil},
			item{&bb.p1B, p + "pwconv1.bias", b.P1B, nil},
			item{&bb.p2W, p + "pwconv2.weight", b.P2W, nil},
			item{&bb.p2B, p + "pwconv2.bias", b.P2B, nil})
		if b.Gamma.Present() {
			items = append(items, item{&bb.gamma, p + "gamma", b.Gamma, nil})
		}
	}
	for _, it := range items {
		if *it.dst, err = up(it.name, it.t, it.shape...); err != nil {
			ge.close()
			return nil, err
		}
	}
	return ge, nil
}

func (ge *globalEncoder) close() {
	for _, b := range ge.bufs {
		b.Free()
	}
	ge.bufs = nil
}

// build is the global encoder for t SSL frames: input "ssl" [t, In] → output "embedding"
// [Out]; with debug, the stage outputs of the golden cases too.
func (ge *globalEncoder) build(t int, debug bool) *engine.Graph {
	c := ge.cfg
	T, D := int64(t), int64(c.Dim)
	g := engine.NewGraph(fmt.Sprintf("miocodec.global_encoder[T=%d]", t))
	p := func(b *engine.Buffer) *engine.Tensor {
		x := g.Persistent(b)
		return &x
	}
	const eps = 1e-6
	g.Label("global_encoder.backbone.embed")
	x := g.Input("ssl", engine.F32, T, int64(c.In))
	cf := g.Permute(g.Reshape(x, 1, T, int64(c.In)), 0, 2, 1) // [1, In, T]
	e := g.Conv1D(cf, *p(ge.embedW), p(ge.embedB), 1, int64(c.EmbedKernel/2), int64(c.EmbedKernel/2), 1, 1)
	if debug {
		g.Output("ge_embed", g.Permute(e, 0, 2, 1))
	}
	h := g.LayerNorm(g.Permute(e, 0, 2, 1), p(ge.normW), p(ge.normB), eps) // [1, T, D]
	for i, b := range ge.blocks {
		g.Label(fmt.Sprintf("global_encoder.backbone.convnext.%d", i))
		d := g.Conv1D(g.Permute(h, 0, 2, 1), *p(b.dwW), p(b.dwB), 1, int64(c.DwKernel/2), int64(c.DwKernel/2), 1, D)
		y := g.LayerNorm(g.Permute(d, 0, 2, 1), p(b.nW), p(b.nB), eps)
		y = g.Linear(g.GELU(g.Linear(y, *p(b.p1W), p(b.p1B)), false), *p(b.p2W), p(b.p2B))
		if b.gamma != nil {
			y = g.Mul(y, *p(b.gamma))
		}
		h = g.Add(h, y)
	}
	g.Label("global_encoder.backbone.final_layer_norm")
	h = g.Reshape(g.LayerNorm(h, p(ge.finW), p(ge.finB), eps), T, D)
	if debug {
		g.Output("ge_backbone", h)
	}
	g.Label("global_encoder.pooling")
	a := g.Linear(g.Tanh(g.Linear(h, *p(ge.a0W), p(ge.a0B))), *p(ge.a2W), p(ge.a2B)) // [T, D]
	alpha := g.Softmax(g.Permute(a, 1, 0), nil, 1)                                   // [D, T], over time
	if debug {
		g.Output("ge_attn_weights", g.Permute(alpha, 1, 0))
	}
	hT := g.Permute(h, 1, 0)
	mu := g.Sum(g.Mul(alpha, hT), 1)            // [D, 1]
	ex2 := g.Sum(g.Mul(alpha, g.Square(hT)), 1) // [D, 1]
	sd := g.Sqrt(g.Clamp(g.Sub(ex2, g.Square(mu)), 1e-4, 1e4))
	stats := g.Reshape(g.Concat(0, mu, sd), 1, 2*D)
	if debug {
		g.Output("ge_pooled_stats", stats)
	}
	out := g.LayerNorm(g.Linear(stats, *p(ge.projW), p(ge.projB)), p(ge.pNormW), p(ge.pNormB), 1e-5)
	g.Output("embedding", out)
	return g
}

// SpeakerEncoder computes MioCodec's 128-d global (speaker) embedding of a reference clip.
// It is safe for concurrent use: calls are serialised, because programs on one CPU backend
// must not run at the same time. A WavLM shared through NewSpeakerEncoderShared must not be
// run by another goroutine on the same backend while an Embedding is in progress.
type SpeakerEncoder struct {
	wavlm    *wavlm.Model
	ownWavLM bool
	layers   []int
	ge       *globalEncoder
	cache    *engine.Cache
	mu       sync.Mutex
	geo      refGeometry
}

// globalPrograms bounds the compiled global-encoder programs (one per SSL length).
const globalPrograms = 8

// NewSpeakerEncoder loads WavLM (the `wavlm_weights/` namespace, Base+ switches) and the
// global encoder (`weights/global_encoder.*`) of a MioCodec model file. layers are the
// global_ssl_layers, 1-based (transformer layer outputs; [1, 2] in the published config).
func NewSpeakerEncoder(m *gguf.Model, layers []int, backend engine.Backend) (*SpeakerEncoder, error) {
	w, err := wavlm.Load(m.Sub("wavlm_weights"), backend, wavlm.Options{})
	if err != nil {
		return nil, fmt.Errorf("miocodec: speaker encoder: %w", err)
	}
	s, err := NewSpeakerEncoderShared(m, w, layers, backend)
	if err != nil {
		w.Close()
		return nil, err
	}
	s.ownWavLM = true
	return s, nil
}

// NewSpeakerEncoderShared is NewSpeakerEncoder on an already loaded WavLM (one weight copy
// and one bias cache for the local and global branches). The caller keeps ownership of w.
func NewSpeakerEncoderShared(m *gguf.Model, w *wavlm.Model, layers []int, backend engine.Backend) (*SpeakerEncoder, error) {
	wc := w.Config
	if wc.Variant != wavlm.VariantBasePlus {
		return nil, fmt.Errorf("miocodec: speaker encoder needs WavLM-Base+, got %s", wc.Variant)
	}
	if len(layers) == 0 {
		return nil, errors.New("miocodec: speaker encoder: no global SSL layers")
	}
	for _, l := range layers {
		if l < 1 || l > wc.Layers {
			return nil, fmt.Errorf("miocodec: global SSL layer %d outside 1..%d", l, wc.Layers)
		}
	}
	ge, err := loadGlobalEncoder(m.Sub("weights"))
	if err != nil {
		return nil, err
	}
	if ge.cfg.In != wc.Hidden {
		ge.close()
		return nil, fmt.Errorf("miocodec: global encoder input %d ≠ WavLM hidden %d", ge.cfg.In, wc.Hidden)
	}
	return &SpeakerEncoder{
		wavlm: w, layers: slices.Clone(layers), ge: ge,
		cache: engine.NewCache(backend, globalPrograms),
		geo:   refGeometry{hop: wc.Hop(), receptive: wc.ReceptiveField()},
	}, nil
}

// GlobalConfig is the global encoder's dimensions.
func (s *SpeakerEncoder) GlobalConfig() GlobalEncoderConfig { return s.ge.cfg }

// Close frees the global encoder, its programs and (when it loaded it) WavLM.
func (s *SpeakerEncoder) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache != nil {
		s.cache.Close()
		s.cache = nil
	}
	if s.ge != nil {
		s.ge.close()
		s.ge = nil
	}
	if s.ownWavLM && s.wavlm != nil {
		s.wavlm.Close()
	}
	s.wavlm = nil
}

// Embedding is the 128-d global embedding of a mono reference clip at rate Hz.
func (s *SpeakerEncoder) Embedding(wave []float32, rate int) ([]float32, error) {
	st, err := s.stages(wave, rate, false)
	if err != nil {
		return nil, err
	}
	return st.embedding, nil
}

// globalStages is every intermediate of one embedding.
type globalStages struct {
	prep      *RefPrepared
	layers    [][]float32 // per global SSL layer, T×hidden
	ssl       []float32   // their mean
	t         int
	debug     map[string][]float32
	embedding []float32
}

func (s *SpeakerEncoder) stages(wave []float32, rate int, debug bool) (*globalStages, error) {
	// One lock over WavLM and the global encoder: two programs must not run at once on one
	// CPU backend (its thread pool is not re-entrant).
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ge == nil {
		return nil, errors.New("miocodec: speaker encoder is closed")
	}
	prep, err := refPrepare(wave, rate, s.geo)
	if err != nil {
		return nil, err
	}
	states, t, err := s.wavlm.Hidden(prep.Wave16k, s.layers)
	if err != nil {
		return nil, fmt.Errorf("miocodec: speaker encoder: %w", err)
	}
	if t < refMinFrames {
		return nil, fmt.Errorf("miocodec: reference gives %d SSL frames, need %d", t, refMinFrames)
	}
	ssl := slices.Clone(states[0])
	if len(states) > 1 {
		inv := 1 / float32(len(states))
		for i := range ssl {
			var sum float32
			for _, st := range states {
				sum += st[i]
			}
			ssl[i] = sum * inv
		}
	}
	st := &globalStages{prep: prep, layers: states, ssl: ssl, t: t}
	if st.debug, err = s.runGlobal(ssl, t, debug); err != nil {
		return nil, err
	}
	st.embedding = st.debug["embedding"]
	return st, nil
}

// runGlobal runs the global encoder on SSL features [t, hidden] (s.mu held).
func (s *SpeakerEncoder) runGlobal(ssl []float32, t int, debug bool) (map[string][]float32, error) {
	prog, err := s.cache.Get(fmt.Sprintf("T%d/d%v", t, debug), func() (*engine.Graph, error) {
		g := s.ge.build(t, debug)
		return g, g.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("miocodec: global encoder: %w", err)
	}
	copy(prog.Input("ssl"), ssl)
	if err := prog.Run(); err != nil {
		return nil, fmt.Errorf("miocodec: global encoder: %w", err)
	}
	names := []string{"embedding"}
	if debug {
		names = append(names, "ge_embed", "ge_backbone", "ge_attn_weights", "ge_pooled_stats")
	}
	out := map[string][]float32{}
	for _, n := range names {
		out[n] = slices.Clone(prog.Output(n))
	}
	return out, nil
}

// globalSSLLayers reads model.init_args.config.global_ssl_layers from the embedded
// config.yaml.
func globalSSLLayers(m *gguf.Model) ([]int, error) {
	raw, ok := m.EmbeddedFile("config.yaml")
	if !ok {
		return nil, errors.New("miocodec: no embedded config.yaml")
	}
	var doc struct {
		Model struct {
			InitArgs struct {
				Config struct {
					Global []int `yaml:"global_ssl_layers"`
				} `yaml:"config"`
			} `yaml:"init_args"`
		} `yaml:"model"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("miocodec: config.yaml: %w", err)
	}
	if len(doc.Model.InitArgs.Config.Global) == 0 {
		return nil, errors.New("miocodec: config.yaml has no global_ssl_layers")
	}
	return doc.Model.InitArgs.Config.Global, nil
}

// globalTol is the manifest's tolerance for the global.* stages.
const globalTol = 1e-4

// GoldenGlobal checks every global.* case of the miocodec golden folder: the reference
// preparation (padding, 16 kHz input), the WavLM layers, their mean, the global encoder
// stages and the 128-d embedding, all computed from global.ref_wave_raw through the same
// code as Embedding.
func GoldenGlobal(r *parity.Run, m *gguf.Model, backend engine.Backend) {
	names := []string{"global.pad_each_side", "global.wavlm_input_16k", "global.ssl_features",
		"global.ge_embed", "global.ge_backbone", "global.ge_attn_weights", "global.ge_pooled_stats", "global.embedding"}
	failAll := func(err error) {
		for _, n := range append(names, r.Names("global.wavlm_layer")...) {
			r.Fail(n, err)
		}
	}
	layers, err := globalSSLLayers(m)
	if err != nil {
		failAll(err)
		return
	}
	enc, err := NewSpeakerEncoder(m, layers, backend)
	if err != nil {
		failAll(err)
		return
	}
	defer enc.Close()
	raw, _, err := r.F32("global.ref_wave_raw")
	if err != nil {
		failAll(err)
		return
	}
	st, err := enc.stages(raw, RefCodecRate, true)
	if err != nil {
		failAll(err)
		return
	}
	r.CheckI32("global.pad_each_side", []int32{int32(st.prep.PadEachSide)})
	r.Check("global.wavlm_input_16k", st.prep.Wave16k, globalTol)
	for i, l := range layers {
		r.Check(fmt.Sprintf("global.wavlm_layer%d", l), st.layers[i], globalTol)
	}
	r.Check("global.ssl_features", st.ssl, globalTol)
	for _, n := range []string{"ge_embed", "ge_backbone", "ge_attn_weights", "ge_pooled_stats", "embedding"} {
		r.Check("global."+n, st.debug[n], globalTol)
	}
}
