package conformer

import (
	"errors"
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
)

type affine struct {
	W weights.Tensor `gguf:"weight"`
	B weights.Tensor `gguf:"bias"`
}

type ffnWeights struct {
	W1 affine `gguf:"w_1"`
	W2 affine `gguf:"w_2"`
}

// layerWeights are one conformer layer (encoder.encoders.N). Fast-U2++ keeps the causal
// conv under conv_module.streaming_conv; a plain causal WeNet checkpoint has conv_module.
type layerWeights struct {
	NormFFMac affine     `gguf:"norm_ff_macaron"`
	FFMac     ffnWeights `gguf:"feed_forward_macaron"`
	NormMHA   affine     `gguf:"norm_mha"`
	Attn      struct {
		Q   affine         `gguf:"linear_q"`
		K   affine         `gguf:"linear_k"`
		V   affine         `gguf:"linear_v"`
		Out affine         `gguf:"linear_out"`
		Pos weights.Tensor `gguf:"linear_pos.weight"`
		BU  weights.Tensor `gguf:"pos_bias_u"`
		BV  weights.Tensor `gguf:"pos_bias_v"`
	} `gguf:"self_attn"`
	NormConv affine `gguf:"norm_conv"`
	Conv     struct {
		PW1  affine `gguf:"pointwise_conv1"`
		DW   affine `gguf:"depthwise_conv"`
		Norm affine `gguf:"norm"`
		PW2  affine `gguf:"pointwise_conv2"`
	} `gguf:"conv_module.streaming_conv|conv_module"`
	NormFF    affine     `gguf:"norm_ff"`
	FF        ffnWeights `gguf:"feed_forward"`
	NormFinal affine     `gguf:"norm_final"`
}

type modelWeights struct {
	Conv0     affine         `gguf:"encoder.embed.conv.0"`
	Conv2     affine         `gguf:"encoder.embed.conv.2"`
	Out       affine         `gguf:"encoder.embed.out.0"`
	Layers    []layerWeights `gguf:"encoder.encoders.%d"`
	AfterNorm affine         `gguf:"encoder.after_norm"`
}

func shp(d ...int) []int { return d }

// expectShapes fills in every shape Bind checks, from the (completed) config.
func (c Config) expectShapes(w *modelWeights) {
	d, cs, ff, k, h := c.OutputSize, c.SubsampleChannels, c.LinearUnits, c.CNNKernel, c.Heads
	dk := d / h
	set := func(a *affine, wShape ...int) { a.W.Shape, a.B.Shape = wShape, shp(wShape[0]) }
	set(&w.Conv0, cs, 1, 3, 3)
	set(&w.Conv2, cs, cs, 3, 3)
	set(&w.Out, d, cs*c.subFreq())
	set(&w.AfterNorm, d)
	w.Layers = make([]layerWeights, c.NumBlocks)
	for i := range w.Layers {
		l := &w.Layers[i]
		for _, n := range []*affine{&l.NormFFMac, &l.NormMHA, &l.NormConv, &l.Conv.Norm, &l.NormFF, &l.NormFinal} {
			set(n, d)
		}
		for _, f := range []*ffnWeights{&l.FFMac, &l.FF} {
			set(&f.W1, ff, d)
			set(&f.W2, d, ff)
		}
		for _, a := range []*affine{&l.Attn.Q, &l.Attn.K, &l.Attn.V, &l.Attn.Out} {
			set(a, d, d)
		}
		l.Attn.Pos.Shape = shp(d, d)
		l.Attn.BU.Shape, l.Attn.BV.Shape = shp(h, dk), shp(h, dk)
		set(&l.Conv.PW1, 2*d, d, 1)
		set(&l.Conv.DW, d, 1, k)
		set(&l.Conv.PW2, d, d, 1)
	}
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

type layerBuffers struct {
	normFFMacW, normFFMacB, ffMac1W, ffMac1B, ffMac2W, ffMac2B *engine.Buffer
	normMHAW, normMHAB, qW, qB, kW, kB, vW, vB, outW, outB     *engine.Buffer
	posW, bu, bv                                               *engine.Buffer
	normConvW, normConvB, pw1W, pw1B, dwW, dwB                 *engine.Buffer
	convNormW, convNormB, pw2W, pw2B                           *engine.Buffer
	normFFW, normFFB, ff1W, ff1B, ff2W, ff2B                   *engine.Buffer
	normFinalW, normFinalB                                     *engine.Buffer
}

// Model is a loaded encoder: its config and weights in persistent engine buffers, shared by
// every State (one per stream).
type Model struct {
	Config  Config
	backend engine.Backend

	conv0W, conv0B, conv2W, conv2B, outW, outB, afterW, afterB *engine.Buffer
	layers                                                     []layerBuffers
	bufs                                                       []*engine.Buffer
	invFreq                                                    []float32 // positional encoding frequencies
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
	var w modelWeights
	cfg.expectShapes(&w)
	if err := weights.Bind(src, &w); err != nil {
		return nil, fmt.Errorf("conformer: %w", err)
	}
	m := &Model{Config: cfg, backend: backend}
	var ferr error
	buf := func(name string, t weights.Tensor, shape ...int) *engine.Buffer {
		if ferr != nil {
			return nil
		}
		if len(shape) == 0 {
			shape = t.Shape
		}
		s := make([]int64, len(shape))
		for i, d := range shape {
			s[i] = int64(d)
		}
		b, err := engine.NewBufferFrom(name, t.Data, s...)
		if err != nil {
			ferr = fmt.Errorf("conformer: %w", err)
			return nil
		}
		m.bufs = append(m.bufs, b)
		return b
	}
	d := cfg.OutputSize
	m.conv0W, m.conv0B = buf("embed.conv.0.weight", w.Conv0.W), buf("embed.conv.0.bias", w.Conv0.B)
	m.conv2W, m.conv2B = buf("embed.conv.2.weight", w.Conv2.W), buf("embed.conv.2.bias", w.Conv2.B)
	m.outW, m.outB = buf("embed.out.0.weight", w.Out.W), buf("embed.out.0.bias", w.Out.B)
	m.afterW, m.afterB = buf("after_norm.weight", w.AfterNorm.W), buf("after_norm.bias", w.AfterNorm.B)
	m.layers = make([]layerBuffers, cfg.NumBlocks)
	for i := range m.layers {
		l, b := &w.Layers[i], &m.layers[i]
		p := fmt.Sprintf("encoders.%d.", i)
		b.normFFMacW, b.normFFMacB = buf(p+"norm_ff_macaron.weight", l.NormFFMac.W), buf(p+"norm_ff_macaron.bias", l.NormFFMac.B)
		b.ffMac1W, b.ffMac1B = buf(p+"feed_forward_macaron.w_1.weight", l.FFMac.W1.W), buf(p+"feed_forward_macaron.w_1.bias", l.FFMac.W1.B)
		b.ffMac2W, b.ffMac2B = buf(p+"feed_forward_macaron.w_2.weight", l.FFMac.W2.W), buf(p+"feed_forward_macaron.w_2.bias", l.FFMac.W2.B)
		b.normMHAW, b.normMHAB = buf(p+"norm_mha.weight", l.NormMHA.W), buf(p+"norm_mha.bias", l.NormMHA.B)
		b.qW, b.qB = buf(p+"self_attn.linear_q.weight", l.Attn.Q.W), buf(p+"self_attn.linear_q.bias", l.Attn.Q.B)
		b.kW, b.kB = buf(p+"self_attn.linear_k.weight", l.Attn.K.W), buf(p+"self_attn.linear_k.bias", l.Attn.K.B)
		b.vW, b.vB = buf(p+"self_attn.linear_v.weight", l.Attn.V.W), buf(p+"self_attn.linear_v.bias", l.Attn.V.B)
		b.outW, b.outB = buf(p+"self_attn.linear_out.weight", l.Attn.Out.W), buf(p+"self_attn.linear_out.bias", l.Attn.Out.B)
		b.posW = buf(p+"self_attn.linear_pos.weight", l.Attn.Pos)
		b.bu, b.bv = buf(p+"self_attn.pos_bias_u", l.Attn.BU), buf(p+"self_attn.pos_bias_v", l.Attn.BV)
		b.normConvW, b.normConvB = buf(p+"norm_conv.weight", l.NormConv.W), buf(p+"norm_conv.bias", l.NormConv.B)
		// Pointwise convs run as Linear over [time, channels]: drop the kernel axis of 1.
		b.pw1W, b.pw1B = buf(p+"conv.pointwise_conv1.weight", l.Conv.PW1.W, 2*d, d), buf(p+"conv.pointwise_conv1.bias", l.Conv.PW1.B)
		b.dwW, b.dwB = buf(p+"conv.depthwise_conv.weight", l.Conv.DW.W), buf(p+"conv.depthwise_conv.bias", l.Conv.DW.B)
		b.convNormW, b.convNormB = buf(p+"conv.norm.weight", l.Conv.Norm.W), buf(p+"conv.norm.bias", l.Conv.Norm.B)
		b.pw2W, b.pw2B = buf(p+"conv.pointwise_conv2.weight", l.Conv.PW2.W, d, d), buf(p+"conv.pointwise_conv2.bias", l.Conv.PW2.B)
		b.normFFW, b.normFFB = buf(p+"norm_ff.weight", l.NormFF.W), buf(p+"norm_ff.bias", l.NormFF.B)
		b.ff1W, b.ff1B = buf(p+"feed_forward.w_1.weight", l.FF.W1.W), buf(p+"feed_forward.w_1.bias", l.FF.W1.B)
		b.ff2W, b.ff2B = buf(p+"feed_forward.w_2.weight", l.FF.W2.W), buf(p+"feed_forward.w_2.bias", l.FF.W2.B)
		b.normFinalW, b.normFinalB = buf(p+"norm_final.weight", l.NormFinal.W), buf(p+"norm_final.bias", l.NormFinal.B)
		*l = layerWeights{} // the float32 copies can go once in buffers
	}
	if ferr != nil {
		m.Close()
		return nil, ferr
	}
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
	for _, b := range m.bufs {
		b.Free()
	}
	m.bufs = nil
}

// CacheFrames is the attention cache length (required_cache_size) and ConvCacheFrames the
// conv cache length (kernel − 1).
func (m *Model) CacheFrames() int     { return m.Config.Stream.RequiredCache }
func (m *Model) ConvCacheFrames() int { return m.Config.CNNKernel - 1 }

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
	att, err := engine.NewBuffer("asr.att_cache", engine.F32, int64(c.NumBlocks), int64(c.Heads),
		int64(c.Stream.RequiredCache), int64(2*c.OutputSize/c.Heads))
	if err != nil {
		return nil, fmt.Errorf("conformer: %w", err)
	}
	cnn, err := engine.NewBuffer("asr.cnn_cache", engine.F32, int64(c.NumBlocks), 1, int64(c.OutputSize), int64(c.CNNKernel-1))
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
	p := func(b *engine.Buffer) engine.Tensor { return g.Persistent(b) }
	pp := func(b *engine.Buffer) *engine.Tensor { t := g.Persistent(b); return &t }
	x := g.Input("fbank", engine.F32, 1, 1, int64(nf), int64(c.InputDim))
	pos := g.Input("pos", engine.F32, R+T, d)

	g.Label("encoder.embed")
	x = g.ReLU(g.Conv2D(x, p(m.conv0W), pp(m.conv0B), 2, 2, 0, 0, 1))
	x = g.ReLU(g.Conv2D(x, p(m.conv2W), pp(m.conv2B), 2, 2, 0, 0, 1)) // [1, C, T, F']
	x = g.Reshape(g.Transpose(x, 1, 2), T, -1)                        // [T, C·F'] channel-major
	x = g.Linear(x, p(m.outW), pp(m.outB))
	x = g.Scale(x, float32(math.Sqrt(float64(d))), 0)

	att, cnn := p(s.att), p(s.cnn)
	ln := func(y engine.Tensor, w, b *engine.Buffer) engine.Tensor { return g.LayerNorm(y, pp(w), pp(b), eps) }
	ffn := func(y engine.Tensor, w1, b1, w2, b2 *engine.Buffer) engine.Tensor {
		return g.Linear(g.SiLU(g.Linear(y, p(w1), pp(b1))), p(w2), pp(b2))
	}
	for i, l := range m.layers {
		li := int64(i)
		g.Label(fmt.Sprintf("encoder.encoders.%d.feed_forward_macaron", i))
		x = g.Add(x, g.Scale(ffn(ln(x, l.normFFMacW, l.normFFMacB), l.ffMac1W, l.ffMac1B, l.ffMac2W, l.ffMac2B), 0.5, 0))

		g.Label(fmt.Sprintf("encoder.encoders.%d.self_attn", i))
		y := ln(x, l.normMHAW, l.normMHAB)
		q := g.Reshape(g.Linear(y, p(l.qW), pp(l.qB)), T, h, dk)
		heads := func(t engine.Tensor) engine.Tensor { // [T, d] → [1, H, T, dk]
			return g.Permute(g.Reshape(t, 1, T, h, dk), 0, 2, 1, 3)
		}
		k := heads(g.Linear(y, p(l.kW), pp(l.kB)))
		v := heads(g.Linear(y, p(l.vW), pp(l.vB)))
		cache := g.Slice(att, 0, li, li+1) // [1, H, R, 2dk]
		kAll := g.Concat(2, g.Slice(cache, 3, 0, dk), k)
		vAll := g.Concat(2, g.Slice(cache, 3, dk, 2*dk), v)
		g.Assign(cache, g.Slice(g.Concat(3, kAll, vAll), 2, T, T+R))
		// Positional term without rel-shift: (q + v_bias)·pᵀ over the absolute key positions.
		pe := g.Permute(g.Reshape(g.Linear(pos, p(l.posW), nil), R+T, h, dk), 1, 0, 2) // [H, R+T, dk]
		qv := g.Permute(g.Add(q, p(l.bv)), 1, 0, 2)                                    // [H, T, dk]
		bd := g.Scale(g.Matmul(qv, g.Transpose(pe, 1, 2)), scale, 0)                   // [H, T, R+T]
		qu := g.Permute(g.Reshape(g.Add(q, p(l.bu)), 1, T, h, dk), 0, 2, 1, 3)
		o := g.Attention(qu, kAll, vAll, nil, &bd, scale) // [1, H, T, dk]
		o = g.Reshape(g.Permute(o, 0, 2, 1, 3), T, d)
		x = g.Add(x, g.Linear(o, p(l.outW), pp(l.outB)))

		g.Label(fmt.Sprintf("encoder.encoders.%d.conv_module", i))
		y = ln(x, l.normConvW, l.normConvB)                            // [T, d]
		cc := g.Slice(cnn, 0, li, li+1)                                // [1, 1, d, KC]
		xin := g.Concat(0, g.Transpose(g.Reshape(cc, d, KC), 0, 1), y) // [KC+T, d]
		g.Assign(cc, g.Reshape(g.Transpose(g.Slice(xin, 0, T, T+KC), 0, 1), 1, 1, d, KC))
		u := g.GLU(g.Linear(xin, p(l.pw1W), pp(l.pw1B)), -1) // [KC+T, d]
		u = g.Contiguous(g.Reshape(g.Transpose(u, 0, 1), 1, d, KC+T))
		u = g.Conv1D(u, p(l.dwW), pp(l.dwB), 1, 0, 0, 1, d) // [1, d, T]
		u = g.Transpose(g.Reshape(u, d, T), 0, 1)           // [T, d]
		u = g.SiLU(ln(u, l.convNormW, l.convNormB))
		x = g.Add(x, g.Linear(u, p(l.pw2W), pp(l.pw2B)))

		g.Label(fmt.Sprintf("encoder.encoders.%d.feed_forward", i))
		x = g.Add(x, g.Scale(ffn(ln(x, l.normFFW, l.normFFB), l.ff1W, l.ff1B, l.ff2W, l.ff2B), 0.5, 0))
		x = ln(x, l.normFinalW, l.normFinalB)
	}
	g.Label("encoder.after_norm")
	g.Output("bn", ln(x, m.afterW, m.afterB))
	return g
}
