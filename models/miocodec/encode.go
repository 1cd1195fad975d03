package miocodec

import (
	"fmt"
	"sync"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/models/nn"
)

// Encoder is MioCodec's content encoder: the WavLM hidden states of the local SSL layers
// (at 50 Hz) → local_encoder Transformer → conv downsampling to 25 Hz → FSQ tokens and
// their content embedding.
type Encoder struct {
	Config      Config
	Dim, OutDim int // local_encoder width; content embedding width (proj_out)
	w           *encoderWeights
	consts      *constants
	codes       *engine.Buffer
	fsq         fsq
	cache       *engine.Cache
	mu          sync.Mutex
}

// Encoded is the result of Encode.
type Encoded struct {
	Tokens  []int32   // FSQ indices (N)
	Content []float32 // proj_out(codes), (N, OutDim)
	// Stages are the intermediates, time-major: local_ssl_norm, local_encoder_out,
	// downsampled, fsq_latent.
	Stages map[string][]float32
}

// LoadEncoder binds the encode-path tensors of `weights/` (local_encoder, conv_downsample,
// local_quantizer) into persistent buffers for backend.
func LoadEncoder(m *gguf.Model, backend engine.Backend) (*Encoder, error) {
	cfg, err := configOf(m)
	if err != nil {
		return nil, err
	}
	lc := cfg.LocalEncoder
	if lc.Heads <= 0 || lc.Layers <= 0 || lc.Window <= 0 {
		return nil, fmt.Errorf("miocodec: config.yaml has no usable local_encoder (heads %d, layers %d, window %d)", lc.Heads, lc.Layers, lc.Window)
	}
	if len(cfg.LocalSSLLayers) == 0 || cfg.DownsampleFactor <= 0 || !cfg.UseConvDownsample {
		return nil, fmt.Errorf("miocodec: encode path needs local_ssl_layers and a conv downsampler (layers %v, factor %d, conv %t)",
			cfg.LocalSSLLayers, cfg.DownsampleFactor, cfg.UseConvDownsample)
	}
	src := m.Sub("weights")
	dim := func(name string, i, fallback int) int {
		if t, ok := src.Tensor(name); ok && i < len(t.Shape) {
			return t.Shape[i]
		}
		return fallback
	}
	e := &Encoder{Config: cfg, fsq: newFSQ(cfg.Levels)}
	D := dim("local_encoder.layers.0.attention.wq.weight", 0, lc.Dim)
	ffn := dim("local_encoder.layers.0.feed_forward.w1.weight", 0, 0)
	out := dim("local_quantizer.proj_out.weight", 0, D)
	if D%lc.Heads != 0 || (D/lc.Heads)%2 != 0 {
		return nil, fmt.Errorf("miocodec: local_encoder dim %d does not split into %d heads of even size", D, lc.Heads)
	}
	e.Dim, e.OutDim = D, out
	k := len(cfg.Levels)
	w := declareEncoder(cfg, D, ffn, out, k)
	if err := nn.Bind(src, backend, w); err != nil {
		return nil, fmt.Errorf("miocodec: load encoder: %w", err)
	}
	e.w, e.consts = w, newConstants(backend)
	if err := checkTransformer("local_encoder", &w.Local, false, false); err != nil {
		e.free()
		return nil, err
	}
	if e.codes, err = e.consts.upload("fsq.codes", e.fsq.table(), int64(e.fsq.size()), int64(k)); err != nil {
		e.free()
		return nil, err
	}
	e.cache = engine.NewCache(backend, 16)
	return e, nil
}

// Close frees the programs and the weights.
func (e *Encoder) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cache != nil {
		e.cache.Close()
		e.cache = nil
	}
	e.free()
}

// free releases the weights and constants.
func (e *Encoder) free() {
	nn.Free(e.w)
	if e.consts != nil {
		e.consts.close()
	}
	e.w = nil
}

// buildLatent: inputs "ssl0".. [T, C] (the local SSL layers) → outputs local_ssl_norm,
// local_encoder_out, downsampled and fsq_latent (time-major).
func (e *Encoder) buildLatent(T, C int) (*engine.Graph, error) {
	cfg := e.Config
	g := engine.NewGraph(fmt.Sprintf("miocodec.encode[T=%d]", T))
	b := &builder{g: g, consts: e.consts}
	n := len(cfg.LocalSSLLayers)
	ins := make([]engine.Tensor, n)
	ws := make([]float32, n)
	for i := range ins {
		ins[i] = g.Input(fmt.Sprintf("ssl%d", i), engine.F32, int64(T), int64(C))
		ws[i] = 1 / float32(n)
	}
	g.Label("ssl")
	x := g.WeightedSum(ins, ws)
	if cfg.NormalizeSSL {
		// Per channel over time, unbiased std + 1e-8 (torch.std default).
		unbiased := float32(T) / float32(max(T-1, 1))
		std := g.Scale(g.Sqrt(g.Scale(g.Var(x, 0), unbiased, 0)), 1, 1e-8)
		x = g.Div(g.Sub(x, g.Mean(x, 0)), std)
	}
	g.Output("local_ssl_norm", x)
	x = b.transformer("local_encoder", "local_encoder", &e.w.Local, cfg.LocalEncoder, x, nil)
	g.Output("local_encoder_out", x)
	g.Label("conv_downsample")
	f := int64(cfg.DownsampleFactor)
	y := e.w.Down.Forward(g, g.Reshape(g.Transpose(x, 0, 1), 1, x.Dim(1), x.Dim(0)), f, 0, 0, 1)
	y = g.Transpose(g.Reshape(y, y.Dim(1), y.Dim(2)), 0, 1)
	g.Output("downsampled", y)
	g.Label("local_quantizer")
	g.Output("fsq_latent", e.w.Quantize.In.Forward(g, y))
	if e.consts.err != nil {
		return nil, e.consts.err
	}
	return g, g.Err()
}

// buildContent: input "tokens" [N] → output "content" [N, OutDim] = proj_out(codes).
func (e *Encoder) buildContent(N int) (*engine.Graph, error) {
	g := engine.NewGraph(fmt.Sprintf("miocodec.content[N=%d]", N))
	tok := g.Input("tokens", engine.I32, int64(N))
	codes := g.GatherRows(g.Persistent(e.codes), tok)
	g.Output("content", e.w.Quantize.Out.Forward(g, codes))
	return g, g.Err()
}

// Encode quantizes an utterance given the WavLM hidden states of Config.LocalSSLLayers
// (each T frames × C channels, time-major, in that order) into tokens at 25 Hz.
func (e *Encoder) Encode(layers [][]float32, T int) (*Encoded, error) {
	if len(layers) != len(e.Config.LocalSSLLayers) {
		return nil, fmt.Errorf("miocodec: encode: %d SSL layers, want %d (%v)", len(layers), len(e.Config.LocalSSLLayers), e.Config.LocalSSLLayers)
	}
	if T < e.Config.DownsampleFactor || len(layers[0])%T != 0 {
		return nil, fmt.Errorf("miocodec: encode: %d values are not %d frames (at least %d)", len(layers[0]), T, e.Config.DownsampleFactor)
	}
	C := len(layers[0]) / T
	for i, l := range layers {
		if len(l) != T*C {
			return nil, fmt.Errorf("miocodec: encode: SSL layer %d has %d values, want %d", i, len(l), T*C)
		}
	}
	if C != e.Dim {
		return nil, fmt.Errorf("miocodec: encode: SSL features of %d channels, local_encoder wants %d", C, e.Dim)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cache == nil {
		return nil, fmt.Errorf("miocodec: encoder is closed")
	}
	prog, err := e.cache.Get(fmt.Sprintf("latent T%d", T), func() (*engine.Graph, error) { return e.buildLatent(T, C) })
	if err != nil {
		return nil, fmt.Errorf("miocodec: encode program: %w", err)
	}
	for i, l := range layers {
		copy(prog.Input(fmt.Sprintf("ssl%d", i)), l)
	}
	if err := prog.Run(); err != nil {
		return nil, fmt.Errorf("miocodec: encode: %w", err)
	}
	out := &Encoded{Stages: map[string][]float32{}}
	for _, name := range []string{"local_ssl_norm", "local_encoder_out", "downsampled", "fsq_latent"} {
		out.Stages[name] = append([]float32(nil), prog.Output(name)...)
	}
	k := len(e.Config.Levels)
	lat := out.Stages["fsq_latent"]
	N := len(lat) / k
	out.Tokens = make([]int32, N)
	code := make([]float32, k)
	for i := range N {
		out.Tokens[i] = int32(e.fsq.quantize(lat[i*k:(i+1)*k], code))
	}
	cp, err := e.cache.Get(fmt.Sprintf("content N%d", N), func() (*engine.Graph, error) { return e.buildContent(N) })
	if err != nil {
		return nil, fmt.Errorf("miocodec: content program: %w", err)
	}
	copy(cp.InputInt32("tokens"), out.Tokens)
	if err := cp.Run(); err != nil {
		return nil, fmt.Errorf("miocodec: content embedding: %w", err)
	}
	out.Content = append([]float32(nil), cp.Output("content")...)
	return out, nil
}
