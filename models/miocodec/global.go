package miocodec

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/models/nn"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// Speaker path (MANIFEST §3.13–3.17): reference clip → WavLM-Base+ layers (global_ssl_layers)
// → mean → global encoder (ConvNeXt backbone, attentive statistics pooling, Linear,
// LayerNorm) → 128-d global embedding.

type globalBlock struct {
	Gamma nn.Tensor    `gguf:"gamma,optional"`
	Dw    nn.Conv1d    `gguf:"dwconv"`
	Norm  nn.LayerNorm `gguf:"norm"`
	P1    nn.Linear    `gguf:"pwconv1"`
	P2    nn.Linear    `gguf:"pwconv2"`
}

type globalEncoderWeights struct {
	G struct {
		Embed  nn.Conv1d     `gguf:"backbone.embed"`
		Norm   nn.LayerNorm  `gguf:"backbone.norm"`
		Blocks []globalBlock `gguf:"backbone.convnext.%d"`
		Fin    nn.LayerNorm  `gguf:"backbone.final_layer_norm"`
		// The k=1 pooling convs [out, in, 1] are Linear layers on time-major features.
		A0    nn.Linear    `gguf:"pooling.attn.0"`
		A2    nn.Linear    `gguf:"pooling.attn.2"`
		Proj  nn.Linear    `gguf:"pooling.proj"`
		PNorm nn.LayerNorm `gguf:"pooling.norm"`
	} `gguf:"global_encoder"`
}

// GlobalEncoderConfig are the global encoder's dimensions, all from tensor shapes.
type GlobalEncoderConfig struct {
	In, Dim, Intermediate, Blocks, AttnChannels, Out int
	EmbedKernel, DwKernel                            int
}

type globalEncoder struct {
	cfg GlobalEncoderConfig
	w   *globalEncoderWeights
}

// declare is the global encoder of c with every expected shape.
func (c GlobalEncoderConfig) declare() *globalEncoderWeights {
	conv1 := func(in, out int) nn.Linear {
		l := nn.NewLinear(in, out, true)
		l.Weight.Shape = []int{out, in, 1}
		return l
	}
	w := &globalEncoderWeights{}
	g := &w.G
	g.Embed = nn.NewConv1d(c.In, c.Dim, c.EmbedKernel, 1, true)
	g.Norm, g.Fin = nn.NewLayerNorm(c.Dim), nn.NewLayerNorm(c.Dim)
	g.Blocks = make([]globalBlock, c.Blocks)
	for i := range g.Blocks {
		g.Blocks[i] = globalBlock{
			Gamma: nn.Shaped(c.Dim),
			Dw:    nn.NewConv1d(c.Dim, c.Dim, c.DwKernel, c.Dim, true),
			Norm:  nn.NewLayerNorm(c.Dim),
			P1:    nn.NewLinear(c.Dim, c.Intermediate, true),
			P2:    nn.NewLinear(c.Intermediate, c.Dim, true),
		}
	}
	g.A0, g.A2 = conv1(c.Dim, c.AttnChannels), conv1(c.AttnChannels, c.Dim)
	g.Proj, g.PNorm = nn.NewLinear(2*c.Dim, c.Out, true), nn.NewLayerNorm(c.Out)
	return w
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
func loadGlobalEncoder(src *gguf.Model, backend engine.Backend) (*globalEncoder, error) {
	c, err := globalDims(src)
	if err != nil {
		return nil, err
	}
	w := c.declare()
	if err := nn.Bind(src, backend, w); err != nil {
		return nil, fmt.Errorf("miocodec: global encoder: %w", err)
	}
	return &globalEncoder{cfg: c, w: w}, nil
}

func (ge *globalEncoder) close() { nn.Free(ge.w) }

// build is the global encoder for t SSL frames: input "ssl" [t, In] → output "embedding"
// [Out]; with debug, the stage outputs of the golden cases too.
func (ge *globalEncoder) build(t int, debug bool) *engine.Graph {
	c := ge.cfg
	T, D := int64(t), int64(c.Dim)
	g := engine.NewGraph(fmt.Sprintf("miocodec.global_encoder[T=%d]", t))
	w := &ge.w.G
	const eps = 1e-6
	g.Label("global_encoder.backbone.embed")
	x := g.Input("ssl", engine.F32, T, int64(c.In))
	cf := g.Permute(g.Reshape(x, 1, T, int64(c.In)), 0, 2, 1) // [1, In, T]
	e := w.Embed.Forward(g, cf, 1, int64(c.EmbedKernel/2), int64(c.EmbedKernel/2), 1)
	if debug {
		g.Output("ge_embed", g.Permute(e, 0, 2, 1))
	}
	h := w.Norm.Forward(g, g.Permute(e, 0, 2, 1), eps) // [1, T, D]
	for i := range w.Blocks {
		b := &w.Blocks[i]
		g.Label(fmt.Sprintf("global_encoder.backbone.convnext.%d", i))
		d := b.Dw.Forward(g, g.Permute(h, 0, 2, 1), 1, int64(c.DwKernel/2), int64(c.DwKernel/2), 1)
		y := b.Norm.Forward(g, g.Permute(d, 0, 2, 1), eps)
		y = b.P2.Forward(g, g.GELU(b.P1.Forward(g, y), false))
		if b.Gamma.Present() {
			y = g.Mul(y, b.Gamma.In(g))
		}
		h = g.Add(h, y)
	}
	g.Label("global_encoder.backbone.final_layer_norm")
	h = g.Reshape(w.Fin.Forward(g, h, eps), T, D)
	if debug {
		g.Output("ge_backbone", h)
	}
	g.Label("global_encoder.pooling")
	a := w.A2.Forward(g, g.Tanh(w.A0.Forward(g, h))) // [T, D]
	alpha := g.Softmax(g.Permute(a, 1, 0), nil, 1)   // [D, T], over time
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
	out := w.PNorm.Forward(g, w.Proj.Forward(g, stats), 1e-5)
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
	ge, err := loadGlobalEncoder(m.Sub("weights"), backend)
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
