package conformer

import (
	"errors"
	"fmt"
	"math"
	"sync"

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

	// progMu serialises the window programs (each has one set of input buffers), kept in
	// progs by window length and batch size and shared by every State: a State's caches
	// are the programs' inputs and outputs.
	progMu sync.Mutex
	progs  *engine.Cache
	// The last program used, so the steady state does not build a cache key per window.
	lastF, lastB int
	lastProg     engine.Program
	names        [MaxBatch]cacheNames
}

// MaxBatch is the most streams one batched window program runs.
const MaxBatch = 16

// cacheNames are one batch position's cache inputs and outputs.
type cacheNames struct{ att, cnn, attNew, cnnNew string }

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
	m := &Model{Config: cfg, backend: backend, w: w, qkv: make([]*nn.Linear, len(w.Layers)), progs: engine.NewCache(backend, 16)}
	for b := range m.names {
		sfx := ""
		if b > 0 {
			sfx = fmt.Sprintf(".%d", b)
		}
		m.names[b] = cacheNames{"att" + sfx, "cnn" + sfx, "att_new" + sfx, "cnn_new" + sfx}
	}
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
	if m.progs != nil {
		m.progs.Close()
		m.progs, m.lastProg = nil, nil
	}
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
// inputs of each conv module), handed to the window program with each window and replaced
// by its outputs — so one program serves any states batched together. A State is used by
// one goroutine at a time.
type State struct {
	m        *Model
	att, cnn []float32
	closed   bool
	out      []float32
}

// NewState makes a stream state with zero caches: the reference starts from full-size zero
// caches, so the first window attends to R zero keys.
func (m *Model) NewState() (*State, error) {
	c := m.Config
	return &State{m: m,
		att: make([]float32, c.NumBlocks*c.Heads*c.Stream.RequiredCache*2*c.OutputSize/c.Heads),
		cnn: make([]float32, c.NumBlocks*c.OutputSize*(c.CNNKernel-1))}, nil
}

// Reset zeroes the caches for a new stream.
func (s *State) Reset() {
	clear(s.att)
	clear(s.cnn)
}

// Close drops the caches; later windows fail.
func (s *State) Close() { s.closed = true }

// AttCache and CNNCache are the caches' memory ([layers, heads, R, 2·d_k] and
// [layers, 1, d, kernel−1], row-major): read them, or write them to start from a given
// state.
func (s *State) AttCache() []float32 { return s.att }
func (s *State) CNNCache() []float32 { return s.cnn }

// Forward encodes one window of fbank frames (frames×InputDim values, frame-major) at the
// given ASR offset and updates the caches. It returns OutFrames(frames)×OutputSize values,
// owned by the State and valid until the next call.
func (s *State) Forward(window []float32, offset int) ([]float32, error) {
	states, windows, offsets := [1]*State{s}, [1][]float32{window}, [1]int{offset}
	if err := s.m.forward(states[:], windows[:], offsets[:]); err != nil {
		return nil, err
	}
	return s.out, nil
}

// ForwardBatch is Forward for several streams' windows of one length at once (distinct
// states, at most MaxBatch): one program whose products read each weight once for all of
// them; each state's output and caches come out bit for bit as if it ran alone. Each result
// is owned by its State until its next call. Nothing is changed when an argument is refused.
func (m *Model) ForwardBatch(states []*State, windows [][]float32, offsets []int) ([][]float32, error) {
	if err := m.forward(states, windows, offsets); err != nil {
		return nil, err
	}
	out := make([][]float32, len(states))
	for b, s := range states {
		out[b] = s.out
	}
	return out, nil
}

func (m *Model) forward(states []*State, windows [][]float32, offsets []int) error {
	c := m.Config
	B := len(states)
	if B == 0 || B > MaxBatch || len(windows) != B || len(offsets) != B {
		return fmt.Errorf("conformer: %d states (at most %d) for %d windows and %d offsets", B, MaxBatch, len(windows), len(offsets))
	}
	frames := len(windows[0]) / c.InputDim
	r := c.Stream.RequiredCache
	for b, s := range states {
		window, offset := windows[b], offsets[b]
		switch {
		case s.closed || s.m != m:
			return errors.New("conformer: state is closed or of another model")
		case len(window) == 0 || len(window)%c.InputDim != 0:
			return fmt.Errorf("conformer: window of %d values is not whole frames of %d bins", len(window), c.InputDim)
		case OutFrames(len(window)/c.InputDim) < 1:
			return fmt.Errorf("conformer: window of %d frames is shorter than the subsampling's 7", len(window)/c.InputDim)
		case len(window) != frames*c.InputDim:
			return fmt.Errorf("conformer: batched windows of %d and %d frames", frames, len(window)/c.InputDim)
		case offset < r:
			// Key positions run from offset − R; WeNet's table has none below zero.
			return fmt.Errorf("conformer: offset %d is below the %d cached frames", offset, r)
		}
		for _, o := range states[:b] {
			if o == s {
				return errors.New("conformer: a state twice in one batch")
			}
		}
	}
	m.progMu.Lock()
	defer m.progMu.Unlock()
	if m.progs == nil {
		return errors.New("conformer: model is closed")
	}
	prog := m.lastProg
	if prog == nil || m.lastF != frames || m.lastB != B {
		// A miss may evict (and close) an older program, but never the one it returns.
		p, err := m.program(frames, B)
		if err != nil {
			return fmt.Errorf("conformer: %w", err)
		}
		prog, m.lastProg, m.lastF, m.lastB = p, p, frames, B
	}
	T, d := OutFrames(frames), c.OutputSize
	fb, pos := prog.Input("fbank"), prog.Input("pos")
	for b, s := range states {
		copy(fb[b*frames*c.InputDim:], windows[b])
		m.posEnc(pos[b*(r+T)*d:(b+1)*(r+T)*d], offsets[b]-r)
		copy(prog.Input(m.names[b].att), s.att)
		copy(prog.Input(m.names[b].cnn), s.cnn)
	}
	if err := prog.Run(); err != nil {
		return fmt.Errorf("conformer: %w", err)
	}
	bn := prog.Output("bn")
	for b, s := range states {
		s.out = append(s.out[:0], bn[b*T*d:(b+1)*T*d]...)
		copy(s.att, prog.Output(m.names[b].attNew))
		copy(s.cnn, prog.Output(m.names[b].cnnNew))
	}
	return nil
}

// Warm compiles the program for batches of B windows of nf frames ahead of their first use.
func (m *Model) Warm(nf, B int) error {
	m.progMu.Lock()
	defer m.progMu.Unlock()
	if m.progs == nil {
		return errors.New("conformer: model is closed")
	}
	_, err := m.program(nf, B)
	return err
}

// program is the compiled program for B windows of nf frames; m.progMu is held.
func (m *Model) program(nf, B int) (engine.Program, error) {
	return m.progs.Get(fmt.Sprintf("F%d,B%d", nf, B), func() (*engine.Graph, error) {
		g := m.build(nf, B)
		return g, g.Err()
	})
}

// build makes the graph for B windows of nf fbank frames (WeNet forward_chunk with each
// window's caches as inputs, their updates as outputs). Products and row-wise ops run on all
// B·T rows at once; attention and the causal conv's cache run per window.
func (m *Model) build(nf, B int) *engine.Graph {
	c := m.Config
	d, h := int64(c.OutputSize), int64(c.Heads)
	dk := d / h
	T := int64(OutFrames(nf))
	R := int64(c.Stream.RequiredCache)
	KC := int64(c.CNNKernel - 1)
	L := int64(c.NumBlocks)
	eps := float32(c.LayerNormEps)
	scale := float32(1 / math.Sqrt(float64(dk)))
	nb := int64(B)

	g := engine.NewGraph(fmt.Sprintf("conformer[F=%d,B=%d]", nf, B))
	g.SetRowGroups(B)
	w := m.w
	x := g.Input("fbank", engine.F32, nb, 1, int64(nf), int64(c.InputDim))
	pos := g.Input("pos", engine.F32, nb*(R+T), d)
	rows := func(t engine.Tensor, b int, n int64) engine.Tensor { return g.Slice(t, 0, int64(b)*n, int64(b+1)*n) }
	att := make([]engine.Tensor, B)
	cnn := make([]engine.Tensor, B)
	attNew := make([][]engine.Tensor, B)
	cnnNew := make([][]engine.Tensor, B)
	for b := range B {
		att[b] = g.Input(m.names[b].att, engine.F32, L, h, R, 2*dk)
		cnn[b] = g.Input(m.names[b].cnn, engine.F32, L, 1, d, KC)
	}

	g.Label("encoder.embed")
	x = g.ReLU(w.Conv0.Forward(g, x, 2, 2, 0, 0))
	x = g.ReLU(w.Conv2.Forward(g, x, 2, 2, 0, 0)) // [B, C, T, F']
	x = g.Reshape(g.Transpose(x, 1, 2), nb*T, -1) // [B·T, C·F'] channel-major
	x = w.Out.Forward(g, x)
	x = g.Scale(x, float32(math.Sqrt(float64(d))), 0)

	ff := func(y engine.Tensor, f *ffn) engine.Tensor { return f.W2.Forward(g, g.SiLU(f.W1.Forward(g, y))) }
	perWindow := func(f func(b int) engine.Tensor) engine.Tensor { // B results stacked on axis 0
		ts := make([]engine.Tensor, B)
		for b := range B {
			ts[b] = f(b)
		}
		return g.Concat(0, ts...)
	}
	for i := range w.Layers {
		l, li := &w.Layers[i], int64(i)
		g.Label(fmt.Sprintf("encoder.encoders.%d.feed_forward_macaron", i))
		x = g.Add(x, g.Scale(ff(l.NormFFMac.Forward(g, x, eps), &l.FFMac), 0.5, 0))

		g.Label(fmt.Sprintf("encoder.encoders.%d.self_attn", i))
		y := l.NormMHA.Forward(g, x, eps)
		qkv := nn.ForwardFused(g, m.qkv[i], y, &l.Attn.Q, &l.Attn.K, &l.Attn.V)
		peAll := l.Attn.Pos.Forward(g, pos)            // [B·(R+T), d]
		heads := func(t engine.Tensor) engine.Tensor { // [T, d] → [1, H, T, dk]
			return g.Permute(g.Reshape(t, 1, T, h, dk), 0, 2, 1, 3)
		}
		o := perWindow(func(b int) engine.Tensor {
			q := g.Reshape(rows(qkv[0], b, T), T, h, dk)
			k := heads(rows(qkv[1], b, T))
			v := heads(rows(qkv[2], b, T))
			cache := g.Slice(att[b], 0, li, li+1) // [1, H, R, 2dk]
			kAll := g.Concat(2, g.Slice(cache, 3, 0, dk), k)
			vAll := g.Concat(2, g.Slice(cache, 3, dk, 2*dk), v)
			attNew[b] = append(attNew[b], g.Slice(g.Concat(3, kAll, vAll), 2, T, T+R))
			// Positional term without rel-shift: (q + v_bias)·pᵀ over the absolute key positions.
			pe := g.Permute(g.Reshape(rows(peAll, b, R+T), R+T, h, dk), 1, 0, 2) // [H, R+T, dk]
			qv := g.Permute(g.Add(q, l.Attn.BV.In(g)), 1, 0, 2)                  // [H, T, dk]
			bd := g.Scale(g.Matmul(qv, g.Transpose(pe, 1, 2)), scale, 0)         // [H, T, R+T]
			qu := g.Permute(g.Reshape(g.Add(q, l.Attn.BU.In(g)), 1, T, h, dk), 0, 2, 1, 3)
			a := g.Attention(qu, kAll, vAll, nil, &bd, scale) // [1, H, T, dk]
			return g.Reshape(g.Permute(a, 0, 2, 1, 3), T, d)
		})
		x = g.Add(x, l.Attn.Out.Forward(g, o))

		g.Label(fmt.Sprintf("encoder.encoders.%d.conv_module", i))
		y = l.NormConv.Forward(g, x, eps) // [B·T, d]
		xin := perWindow(func(b int) engine.Tensor {
			cc := g.Slice(cnn[b], 0, li, li+1)                                        // [1, 1, d, KC]
			xb := g.Concat(0, g.Transpose(g.Reshape(cc, d, KC), 0, 1), rows(y, b, T)) // [KC+T, d]
			cnnNew[b] = append(cnnNew[b], g.Reshape(g.Transpose(g.Slice(xb, 0, T, T+KC), 0, 1), 1, 1, d, KC))
			return xb
		}) // [B·(KC+T), d]
		u := g.GLU(l.Conv.PW1.Forward(g, xin), -1)                     // [B·(KC+T), d]
		u = g.Contiguous(g.Transpose(g.Reshape(u, nb, KC+T, d), 1, 2)) // [B, d, KC+T]
		u = l.Conv.DW.Forward(g, u, 1, 0, 0, 1)                        // [B, d, T]
		u = g.Reshape(g.Transpose(u, 1, 2), nb*T, d)                   // [B·T, d]
		u = g.SiLU(l.Conv.Norm.Forward(g, u, eps))
		x = g.Add(x, l.Conv.PW2.Forward(g, u))

		g.Label(fmt.Sprintf("encoder.encoders.%d.feed_forward", i))
		x = g.Add(x, g.Scale(ff(l.NormFF.Forward(g, x, eps), &l.FF), 0.5, 0))
		x = l.NormFinal.Forward(g, x, eps)
	}
	g.Label("encoder.after_norm")
	g.Output("bn", w.AfterNorm.Forward(g, x, eps))
	for b := range B {
		g.Output(m.names[b].attNew, g.Concat(0, attNew[b]...))
		g.Output(m.names[b].cnnNew, g.Concat(0, cnnNew[b]...))
	}
	return g
}
