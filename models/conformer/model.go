package conformer

import (
	"errors"
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

type ffn struct {
	W1 nn.Linear `gguf:"w_1"`
	W2 nn.Linear `gguf:"w_2"`
}

// layer is one conformer layer (encoder.encoders.N). Fast-U2++ keeps the causal conv under
// conv_module.streaming_conv; a plain causal WeNet checkpoint has conv_module.
type layer struct {
	NormFFMac nn.LayerNorm `gguf:"norm_ff_macaron"`
	FFMac     ffn          `gguf:"feed_forward_macaron"`
	NormMHA   nn.LayerNorm `gguf:"norm_mha"`
	Attn      struct {
		Q   nn.Linear `gguf:"linear_q"`
		K   nn.Linear `gguf:"linear_k"`
		V   nn.Linear `gguf:"linear_v"`
		Out nn.Linear `gguf:"linear_out"`
		Pos nn.Linear `gguf:"linear_pos"`
		BU  nn.Tensor `gguf:"pos_bias_u"`
		BV  nn.Tensor `gguf:"pos_bias_v"`
	} `gguf:"self_attn"`
	NormConv nn.LayerNorm `gguf:"norm_conv"`
	Conv     struct {
		// The pointwise convs [out, in, 1] run as Linear over [time, channels].
		PW1  nn.Linear    `gguf:"pointwise_conv1"`
		DW   nn.Conv1d    `gguf:"depthwise_conv"`
		Norm nn.LayerNorm `gguf:"norm"`
		PW2  nn.Linear    `gguf:"pointwise_conv2"`
	} `gguf:"conv_module.streaming_conv|conv_module"`
	NormFF    nn.LayerNorm `gguf:"norm_ff"`
	FF        ffn          `gguf:"feed_forward"`
	NormFinal nn.LayerNorm `gguf:"norm_final"`
}

type encoder struct {
	Conv0     nn.Conv2d    `gguf:"encoder.embed.conv.0"`
	Conv2     nn.Conv2d    `gguf:"encoder.embed.conv.2"`
	Out       nn.Linear    `gguf:"encoder.embed.out.0"`
	Layers    []layer      `gguf:"encoder.encoders.%d"`
	AfterNorm nn.LayerNorm `gguf:"encoder.after_norm"`
}

// declare is the encoder of the (completed) config with every expected shape.
func (c Config) declare() *encoder {
	d, cs, ff, k, h := c.OutputSize, c.SubsampleChannels, c.LinearUnits, c.CNNKernel, c.Heads
	if cs == 0 {
		cs = d
	}
	dk := d / max(h, 1)
	w := &encoder{
		Conv0:     nn.NewConv2d(1, cs, 3, 3, true),
		Conv2:     nn.NewConv2d(cs, cs, 3, 3, true),
		Out:       nn.NewLinear(cs*c.subFreq(), d, true),
		Layers:    make([]layer, c.NumBlocks),
		AfterNorm: nn.NewLayerNorm(d),
	}
	pointwise := func(in, out int) nn.Linear {
		l := nn.NewLinear(in, out, true)
		l.Weight.Shape = []int{out, in, 1}
		return l
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		l.NormFFMac, l.NormMHA, l.NormConv = nn.NewLayerNorm(d), nn.NewLayerNorm(d), nn.NewLayerNorm(d)
		l.NormFF, l.NormFinal, l.Conv.Norm = nn.NewLayerNorm(d), nn.NewLayerNorm(d), nn.NewLayerNorm(d)
		l.FFMac = ffn{nn.NewLinear(d, ff, true), nn.NewLinear(ff, d, true)}
		l.FF = ffn{nn.NewLinear(d, ff, true), nn.NewLinear(ff, d, true)}
		a := &l.Attn
		a.Q, a.K, a.V, a.Out = nn.NewLinear(d, d, true), nn.NewLinear(d, d, true), nn.NewLinear(d, d, true), nn.NewLinear(d, d, true)
		a.Pos = nn.NewLinear(d, d, false)
		a.BU, a.BV = nn.Shaped(h, dk), nn.Shaped(h, dk)
		l.Conv.PW1 = pointwise(d, 2*d)
		l.Conv.DW = nn.NewConv1d(d, d, k, d, true)
		l.Conv.PW2 = pointwise(d, d)
	}
	return w
}

// completeDims takes the dimensions from the tensors: zero config fields are filled in,
// non-zero ones must agree. A probe tensor that is missing is left to Bind to report.
func completeDims(src weights.Source, c *Config) error {
	if c.NumBlocks == 0 {
		for src.Has(fmt.Sprintf("encoder.encoders.%d.norm_mha.weight", c.NumBlocks)) {
			c.NumBlocks++
		}
	}
	probes := []struct {
		field  string
		dst    *int
		tensor string
		axis   int
	}{
		{"output_size", &c.OutputSize, "encoder.after_norm.weight", 0},
		{"subsampling channels", &c.SubsampleChannels, "encoder.embed.conv.0.bias", 0},
		{"attention_heads", &c.Heads, "encoder.encoders.0.self_attn.pos_bias_u", 0},
		{"linear_units", &c.LinearUnits, "encoder.encoders.0.feed_forward.w_1.bias", 0},
		{"cnn_module_kernel", &c.CNNKernel, "encoder.encoders.0.conv_module.streaming_conv.depthwise_conv.weight", 2},
		{"cnn_module_kernel", &c.CNNKernel, "encoder.encoders.0.conv_module.depthwise_conv.weight", 2},
	}
	for _, p := range probes {
		if !src.Has(p.tensor) {
			continue
		}
		_, shape, err := src.Get(p.tensor)
		if err != nil {
			return fmt.Errorf("conformer: %w", err)
		}
		if p.axis >= len(shape) {
			continue // Bind reports the shape
		}
		got := shape[p.axis]
		if *p.dst != 0 && *p.dst != got {
			return fmt.Errorf("conformer: config %s is %d but %s has %d", p.field, *p.dst, p.tensor, got)
		}
		*p.dst = got
	}
	if c.InputDim == 0 {
		c.InputDim = c.Fbank.NumMelBins
	}
	switch {
	case c.NumBlocks <= 0:
		return fmt.Errorf("conformer: no encoder layers (encoder.encoders.0.* missing)")
	case c.OutputSize <= 0 || c.Heads <= 0 || c.LinearUnits <= 0 || c.CNNKernel < 2 || c.SubsampleChannels <= 0 || c.InputDim < 7:
		return fmt.Errorf("conformer: incomplete dimensions %+v", *c)
	case c.OutputSize%c.Heads != 0:
		return fmt.Errorf("conformer: output_size %d is not a multiple of %d heads", c.OutputSize, c.Heads)
	case c.LayerNormEps <= 0:
		return fmt.Errorf("conformer: layer_norm_eps %g", c.LayerNormEps)
	}
	return nil
}

// Model is a loaded encoder: its config and weights in persistent engine buffers, shared by
// every State (one per stream).
type Model struct {
	Config  Config
	backend engine.Backend

	w       *encoder
	qkv     []*nn.Linear // per layer, its q, k and v projections as one Linear (nil: separate)
	invFreq []float32    // positional encoding frequencies
}

// LoadGGUF loads the encoder from an audio.cpp MeanVC2 GGUF: the asr/ namespace and the
// embedded config.json (without one: the MeanVC2 front end and fbank, and every dimension
// from the tensors).
func LoadGGUF(m *gguf.Model, backend engine.Backend) (*Model, error) {
	cfg := defaultConfig()
	if raw, ok := m.EmbeddedFile("config.json"); ok {
		var err error
		if cfg, err = ParseConfig(raw); err != nil {
			return nil, err
		}
	}
	return Load(m.Sub(Namespace), cfg, backend)
}

// Load binds the encoder's tensors from src (the asr/ namespace) and copies them into
// persistent buffers. Dimensions cfg leaves zero come from the tensors; a missing or
// misshapen tensor is reported by name (all of them at once).
func Load(src weights.Source, cfg Config, backend engine.Backend) (*Model, error) {
	if err := completeDims(src, &cfg); err != nil {
		return nil, err
	}
	if _, err := NewFrontEnd(cfg); err != nil {
		return nil, err
	}
	w := cfg.declare()
	if err := nn.Bind(src, backend, w); err != nil {
		return nil, fmt.Errorf("conformer: %w", err)
	}
	m := &Model{Config: cfg, backend: backend, w: w, qkv: make([]*nn.Linear, len(w.Layers))}
	for i := range w.Layers {
		a := &w.Layers[i].Attn
		var err error
		if m.qkv[i], err = nn.FuseLinears(backend, fmt.Sprintf("encoder.encoders.%d.self_attn.qkv", i), &a.Q, &a.K, &a.V); err != nil {
			m.Close()
			return nil, fmt.Errorf("conformer: %w", err)
		}
	}
	d := cfg.OutputSize
	// WeNet's table: pe[p, 2i] = sin(p·f_i), pe[p, 2i+1] = cos(p·f_i), f_i = 10000^(−2i/d),
	// the frequencies rounded to float32 as torch builds them.
	m.invFreq = make([]float32, d/2)
	step := float32(-math.Log(10000) / float64(d))
	for i := range m.invFreq {
		m.invFreq[i] = float32(math.Exp(float64(float32(2*i) * step)))
	}
	return m, nil
}

// Close frees the weights; no State of the model may run afterwards.
func (m *Model) Close() {
	for _, f := range m.qkv {
		if f != nil {
			f.Free()
		}
	}
	nn.Free(m.w)
}

// CacheFrames is the attention cache length (required_cache_size).
func (m *Model) CacheFrames() int { return m.Config.Stream.RequiredCache }

// posEnc writes the relative positional encodings of positions start, start+1, … into dst
// (rows of OutputSize values).
func (m *Model) posEnc(dst []float32, start int) {
	d := m.Config.OutputSize
	for r := 0; r*d < len(dst); r++ {
		p := float32(start + r)
		row := dst[r*d : (r+1)*d]
		for i, f := range m.invFreq {
			a := float64(p * f) // the product in float32, as torch computes it
			row[2*i] = float32(math.Sin(a))
			row[2*i+1] = float32(math.Cos(a))
		}
	}
}

// State is one stream's encoder state: the attention cache [layers, heads, R, 2·d_k]
// (keys ‖ values, raw projections) and the conv cache [layers, 1, d, kernel−1] (the last
// inputs of each conv module), in persistent buffers updated by the programs themselves.
// A State is used by one goroutine at a time.
type State struct {
	m     *Model
	att   *engine.Buffer
	cnn   *engine.Buffer
	progs *engine.Cache
	out   []float32
	// The last program used, so the steady state does not build a cache key per window.
	lastF    int
	lastProg engine.Program
}

// NewState makes a stream state with zero caches: the reference starts from full-size zero
// caches, so the first window attends to R zero keys.
func (m *Model) NewState() (*State, error) {
	c := m.Config
	att, err := m.backend.Alloc("asr.att_cache", engine.F32, int64(c.NumBlocks), int64(c.Heads),
		int64(c.Stream.RequiredCache), int64(2*c.OutputSize/c.Heads))
	if err != nil {
		return nil, fmt.Errorf("conformer: %w", err)
	}
	cnn, err := m.backend.Alloc("asr.cnn_cache", engine.F32, int64(c.NumBlocks), 1, int64(c.OutputSize), int64(c.CNNKernel-1))
	if err != nil {
		att.Free()
		return nil, fmt.Errorf("conformer: %w", err)
	}
	return &State{m: m, att: att, cnn: cnn, progs: engine.NewCache(m.backend, 4)}, nil
}

// Reset zeroes the caches for a new stream (the compiled programs are kept).
func (s *State) Reset() {
	clear(s.att.Float32s())
	clear(s.cnn.Float32s())
}

// Close frees the caches and programs.
func (s *State) Close() {
	if s.progs != nil {
		s.progs.Close()
		s.att.Free()
		s.cnn.Free()
		s.progs, s.lastProg = nil, nil
	}
}

// AttCache and CNNCache are the caches' memory ([layers, heads, R, 2·d_k] and
// [layers, 1, d, kernel−1], row-major): read them, or write them to start from a given
// state. Valid until Close.
func (s *State) AttCache() []float32 { return s.att.Float32s() }
func (s *State) CNNCache() []float32 { return s.cnn.Float32s() }

// Forward encodes one window of fbank frames (frames×InputDim values, frame-major) at the
// given ASR offset and updates the caches. It returns OutFrames(frames)×OutputSize values,
// owned by the State and valid until the next call.
func (s *State) Forward(window []float32, offset int) ([]float32, error) {
	if s.progs == nil {
		return nil, errors.New("conformer: state is closed")
	}
	c := s.m.Config
	if len(window) == 0 || len(window)%c.InputDim != 0 {
		return nil, fmt.Errorf("conformer: window of %d values is not whole frames of %d bins", len(window), c.InputDim)
	}
	frames := len(window) / c.InputDim
	t := OutFrames(frames)
	if t < 1 {
		return nil, fmt.Errorf("conformer: window of %d frames is shorter than the subsampling's 7", frames)
	}
	r := c.Stream.RequiredCache
	if offset < r {
		// Key positions run from offset − R; WeNet's table has none below zero.
		return nil, fmt.Errorf("conformer: offset %d is below the %d cached frames", offset, r)
	}
	prog := s.lastProg
	if prog == nil || s.lastF != frames {
		// A miss may evict (and close) an older program, but never the one it returns.
		p, err := s.progs.Get(fmt.Sprintf("F%d", frames), func() (*engine.Graph, error) {
			g := s.build(frames)
			return g, g.Err()
		})
		if err != nil {
			return nil, fmt.Errorf("conformer: %w", err)
		}
		prog, s.lastProg, s.lastF = p, p, frames
	}
	copy(prog.Input("fbank"), window)
	s.m.posEnc(prog.Input("pos"), offset-r)
	if err := prog.Run(); err != nil {
		return nil, fmt.Errorf("conformer: %w", err)
	}
	s.out = append(s.out[:0], prog.Output("bn")...)
	return s.out, nil
}

// build makes the graph for one window of nf fbank frames (WeNet forward_chunk with the
// caches in this State's buffers).
func (s *State) build(nf int) *engine.Graph {
	m, c := s.m, s.m.Config
	d, h := int64(c.OutputSize), int64(c.Heads)
	dk := d / h
	T := int64(OutFrames(nf))
	R := int64(c.Stream.RequiredCache)
	KC := int64(c.CNNKernel - 1)
	eps := float32(c.LayerNormEps)
	scale := float32(1 / math.Sqrt(float64(dk)))

	g := engine.NewGraph(fmt.Sprintf("conformer[F=%d]", nf))
	w := m.w
	x := g.Input("fbank", engine.F32, 1, 1, int64(nf), int64(c.InputDim))
	pos := g.Input("pos", engine.F32, R+T, d)

	g.Label("encoder.embed")
	x = g.ReLU(w.Conv0.Forward(g, x, 2, 2, 0, 0))
	x = g.ReLU(w.Conv2.Forward(g, x, 2, 2, 0, 0)) // [1, C, T, F']
	x = g.Reshape(g.Transpose(x, 1, 2), T, -1)    // [T, C·F'] channel-major
	x = w.Out.Forward(g, x)
	x = g.Scale(x, float32(math.Sqrt(float64(d))), 0)

	att, cnn := g.Persistent(s.att), g.Persistent(s.cnn)
	ff := func(y engine.Tensor, f *ffn) engine.Tensor { return f.W2.Forward(g, g.SiLU(f.W1.Forward(g, y))) }
	for i := range w.Layers {
		l, li := &w.Layers[i], int64(i)
		g.Label(fmt.Sprintf("encoder.encoders.%d.feed_forward_macaron", i))
		x = g.Add(x, g.Scale(ff(l.NormFFMac.Forward(g, x, eps), &l.FFMac), 0.5, 0))

		g.Label(fmt.Sprintf("encoder.encoders.%d.self_attn", i))
		y := l.NormMHA.Forward(g, x, eps)
		qkv := nn.ForwardFused(g, m.qkv[i], y, &l.Attn.Q, &l.Attn.K, &l.Attn.V)
		q := g.Reshape(qkv[0], T, h, dk)
		heads := func(t engine.Tensor) engine.Tensor { // [T, d] → [1, H, T, dk]
			return g.Permute(g.Reshape(t, 1, T, h, dk), 0, 2, 1, 3)
		}
		k := heads(qkv[1])
		v := heads(qkv[2])
		cache := g.Slice(att, 0, li, li+1) // [1, H, R, 2dk]
		kAll := g.Concat(2, g.Slice(cache, 3, 0, dk), k)
		vAll := g.Concat(2, g.Slice(cache, 3, dk, 2*dk), v)
		g.Assign(cache, g.Slice(g.Concat(3, kAll, vAll), 2, T, T+R))
		// Positional term without rel-shift: (q + v_bias)·pᵀ over the absolute key positions.
		pe := g.Permute(g.Reshape(l.Attn.Pos.Forward(g, pos), R+T, h, dk), 1, 0, 2) // [H, R+T, dk]
		qv := g.Permute(g.Add(q, l.Attn.BV.In(g)), 1, 0, 2)                         // [H, T, dk]
		bd := g.Scale(g.Matmul(qv, g.Transpose(pe, 1, 2)), scale, 0)                // [H, T, R+T]
		qu := g.Permute(g.Reshape(g.Add(q, l.Attn.BU.In(g)), 1, T, h, dk), 0, 2, 1, 3)
		o := g.Attention(qu, kAll, vAll, nil, &bd, scale) // [1, H, T, dk]
		o = g.Reshape(g.Permute(o, 0, 2, 1, 3), T, d)
		x = g.Add(x, l.Attn.Out.Forward(g, o))

		g.Label(fmt.Sprintf("encoder.encoders.%d.conv_module", i))
		y = l.NormConv.Forward(g, x, eps)                              // [T, d]
		cc := g.Slice(cnn, 0, li, li+1)                                // [1, 1, d, KC]
		xin := g.Concat(0, g.Transpose(g.Reshape(cc, d, KC), 0, 1), y) // [KC+T, d]
		g.Assign(cc, g.Reshape(g.Transpose(g.Slice(xin, 0, T, T+KC), 0, 1), 1, 1, d, KC))
		u := g.GLU(l.Conv.PW1.Forward(g, xin), -1) // [KC+T, d]
		u = g.Contiguous(g.Reshape(g.Transpose(u, 0, 1), 1, d, KC+T))
		u = l.Conv.DW.Forward(g, u, 1, 0, 0, 1)   // [1, d, T]
		u = g.Transpose(g.Reshape(u, d, T), 0, 1) // [T, d]
		u = g.SiLU(l.Conv.Norm.Forward(g, u, eps))
		x = g.Add(x, l.Conv.PW2.Forward(g, u))

		g.Label(fmt.Sprintf("encoder.encoders.%d.feed_forward", i))
		x = g.Add(x, g.Scale(ff(l.NormFF.Forward(g, x, eps), &l.FF), 0.5, 0))
		x = l.NormFinal.Forward(g, x, eps)
	}
	g.Label("encoder.after_norm")
	g.Output("bn", w.AfterNorm.Forward(g, x, eps))
	return g
}
