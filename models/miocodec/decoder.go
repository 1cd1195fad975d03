package miocodec

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/internal/batcher"
	"github.com/voxpipe/voxpipe/models/nn"
)

// constants are persistent tensors shared by the programs of one model: RoPE positions and
// window masks (a bounded set of buffers that every length takes views of, so a server
// decoding many lengths does not grow), the FSQ code table and the inverse-DFT basis.
type constants struct {
	mu    sync.Mutex
	alloc engine.Allocator
	bufs  []*engine.Buffer         // every constant, for close
	pos   map[int64]*engine.Buffer // by capacity (powers of two)
	masks map[[2]int64]*engine.Buffer
	err   error
}

func newConstants(a engine.Allocator) *constants {
	return &constants{alloc: a, pos: map[int64]*engine.Buffer{}, masks: map[[2]int64]*engine.Buffer{}}
}

// upload makes a constant buffer of float32 values.
func (c *constants) upload(name string, data []float32, shape ...int64) (*engine.Buffer, error) {
	return c.keep(engine.Upload(c.alloc, name, data, shape...))
}

// uploadMatrix makes a constant Linear weight [rows, cols], packed for the CPU's
// small-matrix kernel where the backend takes that (whose row groups keep batched streams'
// results those they get alone).
func (c *constants) uploadMatrix(name string, data []float32, rows, cols int64) (*engine.Buffer, error) {
	if !engine.Accepts(c.alloc, engine.F32P) {
		return c.upload(name, data, rows, cols)
	}
	return c.keep(engine.UploadRaw(c.alloc, name, engine.F32P, unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), 4*len(data)), rows, cols))
}

// keep adds an uploaded constant to those close frees.
func (c *constants) keep(b *engine.Buffer, err error) (*engine.Buffer, error) {
	if err != nil {
		return nil, fmt.Errorf("miocodec: %w", err)
	}
	c.mu.Lock()
	c.bufs = append(c.bufs, b)
	c.mu.Unlock()
	return b, nil
}

func (c *constants) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.bufs {
		b.Free()
	}
	c.bufs, c.pos, c.masks = nil, nil, nil
}

func (c *constants) fail(err error) *engine.Buffer {
	if c.err == nil {
		c.err = err
	}
	return nil
}

// positions is a buffer holding 0..n−1 for some n ≥ T (RoPE restarts at every module call;
// slice the first T).
func (c *constants) positions(T int64) *engine.Buffer {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int64(256)
	for n < T {
		n *= 2
	}
	if b := c.pos[n]; b != nil {
		return b
	}
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(i)
	}
	b, err := engine.UploadRaw(c.alloc, fmt.Sprintf("pos[%d]", n), engine.I32, unsafe.Slice((*byte)(unsafe.Pointer(&p[0])), 4*len(p)), n)
	if err != nil {
		return c.fail(err)
	}
	c.bufs = append(c.bufs, b)
	c.pos[n] = b
	return b
}

// mask is an additive [rows, cols] mask letting row i see column j iff
// |i − (j − shift)| ≤ half: shift 0 is the window mask of any length up to rows (take the
// top-left corner), shift half the band a query block of rows sees from key q0 − half on.
func (c *constants) mask(rows, cols, shift int64, half int) *engine.Buffer {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := [2]int64{rows<<32 | cols, shift<<32 | int64(half)}
	if b := c.masks[key]; b != nil {
		return b
	}
	m := make([]float32, rows*cols)
	ninf := float32(math.Inf(-1))
	for i := range rows {
		for j := range cols {
			if d := i - (j - shift); d > int64(half) || -d > int64(half) {
				m[i*cols+j] = ninf
			}
		}
	}
	b, err := engine.Upload(c.alloc, fmt.Sprintf("mask[%d,%d,±%d]", rows, cols, half), m, rows, cols)
	if err != nil {
		return c.fail(err)
	}
	c.bufs = append(c.bufs, b)
	c.masks[key] = b
	return b
}

// GroupNorm statistics modes of the decoder's ResNet blocks.
type gnMode int

const (
	gnPlain   gnMode = iota // statistics of the frames of this call (the reference)
	gnFrozen                // given per-group mean/var (full-utterance statistics; a test mode)
	gnRunning               // accumulated over the utterance so far plus this window
)

// plan is one program's geometry and options (its cache key).
type plan struct {
	n      int // tokens
	frames int // decoder frames after interpolation (n·upsample for token decoding)
	gn     gnMode
	// Running mode: tokens [newFrom, n) of the window are not yet in the accumulated
	// statistics and count for this window; [newFrom, coreEnd) are committed afterwards.
	newFrom, coreEnd int
	debug            bool // stage outputs for the golden checks
	stats            bool // per-GroupNorm mean/var outputs (to freeze them later)
	// batch > 1: that many streams' windows of this geometry in one run (plain or running
	// statistics only), each stream's rows kept apart as if it ran alone.
	batch int
}

func (p plan) key() string {
	return fmt.Sprintf("n%d f%d gn%d nf%d ce%d d%t s%t b%d", p.n, p.frames, p.gn, p.newFrom, p.coreEnd, p.debug, p.stats, p.streams())
}

// streams is the number of windows a run of the plan decodes.
func (p plan) streams() int { return max(p.batch, 1) }

// Decoder is MioCodec's token decoder: tokens + global (speaker) embedding → waveform.
// Its methods may be called from several goroutines (each call runs its own program run
// under the decoder's lock; a Stream holds per-utterance state).
type Decoder struct {
	Config Config
	// Dims from the tensor shapes.
	PrenetDim, WaveDim, CondDim, Groups int
	backend                             engine.Backend
	w                                   *decoderWeights
	consts                              *constants
	codes                               *engine.Buffer // FSQ codes [codebook, len(levels)]
	idft                                *engine.Buffer // [n_fft, n_fft+2] windowed inverse rDFT (a Linear weight)
	window2                             []float32      // Hann² for the envelope
	ola, env                            []float32      // overlap-add scratch (under mu)
	gnNames                             [][4]string    // per GroupNorm: mean, var, acc, commit inputs/outputs
	fsq                                 fsq
	cache                               *engine.Cache
	mu                                  sync.Mutex                    // one program run at a time per decoder
	queue                               *batcher.Queue[plan, *window] // streams' windows, batched (batch.go)
	counts                              batchCounts
}

// maxPrograms bounds the compiled programs a decoder keeps (one per shape and mode).
const maxPrograms = 64

// LoadDecoder binds the decoder tensors of `weights/` in an audio.cpp-packaged MioCodec
// (config.yaml embedded) into persistent buffers for backend, folding the upsampler weight
// norm. Unknown tensors (conv_upsample.*, the encoder) are ignored; missing or misshapen
// ones are reported by name.
func LoadDecoder(m *gguf.Model, backend engine.Backend) (*Decoder, error) {
	cfg, err := configOf(m)
	if err != nil {
		return nil, err
	}
	src := m.Sub("weights")
	dim := func(name string, i int, fallback int) int {
		if t, ok := src.Tensor(name); ok && i < len(t.Shape) {
			return t.Shape[i]
		}
		return fallback
	}
	d := &Decoder{Config: cfg, backend: backend, fsq: newFSQ(cfg.Levels)}
	d.queue = batcher.New[plan](MaxBatch, d.runQueued)
	P := dim("wave_prenet.layers.0.attention.wq.weight", 0, cfg.WavePrenet.Dim)
	D := dim("wave_prenet.output_proj.weight", 0, cfg.WaveDecoderDim)
	cond := dim("wave_decoder.layers.0.attention_norm.condition_proj.1.weight", 1, cfg.WaveDecoder.CondDim)
	d.PrenetDim, d.WaveDim, d.CondDim = P, D, cond
	ffnP := dim("wave_prenet.layers.0.feed_forward.w1.weight", 0, 0)
	ffnD := dim("wave_decoder.layers.0.feed_forward.w1.weight", 0, 0)
	switch {
	case P%cfg.WavePrenet.Heads != 0 || (P/cfg.WavePrenet.Heads)%2 != 0:
		return nil, fmt.Errorf("miocodec: wave_prenet dim %d does not split into %d heads of even size", P, cfg.WavePrenet.Heads)
	case D%cfg.WaveDecoder.Heads != 0 || (D/cfg.WaveDecoder.Heads)%2 != 0:
		return nil, fmt.Errorf("miocodec: wave_decoder dim %d does not split into %d heads of even size", D, cfg.WaveDecoder.Heads)
	}
	dd := decoderDims{P: P, D: D, FFNP: ffnP, FFND: ffnD, Cond: cond, Codes: len(cfg.Levels)}
	w := declareDecoder(cfg, dd)
	if err := nn.Bind(src, backend, w); err != nil {
		return nil, fmt.Errorf("miocodec: load decoder: %w", err)
	}
	d.w = w
	d.consts = newConstants(backend)
	fail := func(err error) (*Decoder, error) {
		d.free()
		return nil, err
	}
	if err := checkTransformer("wave_prenet", &w.Prenet, false, true); err != nil {
		return fail(err)
	}
	if err := checkTransformer("wave_decoder", &w.Decoder, true, false); err != nil {
		return fail(err)
	}
	stages := len(cfg.UpsamplerFactors)
	if D>>stages < 1 || D%(1<<stages) != 0 {
		return fail(fmt.Errorf("miocodec: wave_decoder_dim %d does not halve %d times", D, stages))
	}
	for i := range w.Upsampler.Layers {
		u := &w.Upsampler.Layers[i]
		s := u.V.Shape
		if u.W, err = d.consts.upload(fmt.Sprintf("wave_upsampler.upsample_layers.%d.weight", i), foldWeightNorm(u.G, u.V), int64(s[0]), int64(s[1]), int64(s[2])); err != nil {
			return fail(err)
		}
		u.G, u.V = weights.Tensor{}, weights.Tensor{} // folded into W
	}
	d.Groups = cfg.ResNetGroups
	for _, ch := range []int{D, D >> stages} {
		if ch%min(cfg.ResNetGroups, ch) != 0 {
			return fail(fmt.Errorf("miocodec: %d channels do not split into %d GroupNorm groups", ch, cfg.ResNetGroups))
		}
	}
	if err := d.initConstants(); err != nil {
		return fail(err)
	}
	d.cache = engine.NewCache(backend, maxPrograms)
	return d, nil
}

func configOf(m *gguf.Model) (Config, error) {
	raw, ok := m.EmbeddedFile("config.yaml")
	if !ok {
		return Config{}, fmt.Errorf("miocodec: no embedded config.yaml")
	}
	return ParseConfig(raw)
}

func (d *Decoder) initConstants() error {
	cfg := d.Config
	var err error
	if d.codes, err = d.consts.upload("fsq.codes", d.fsq.table(), int64(d.fsq.size()), int64(len(cfg.Levels))); err != nil {
		return err
	}
	// Inverse real DFT with the 1/n ('backward') scale and the periodic Hann window folded
	// in: frame[n] = w[n]/N·(Re X0 + Re X_{N/2}(−1)^n + 2Σ_{0<k<N/2}(Re Xk cos − Im Xk sin)(2πkn/N)).
	// Imaginary parts of DC and Nyquist drop out as in irfft.
	N := cfg.NFFT
	K := N/2 + 1
	basis := make([]float32, 2*K*N)
	win := make([]float64, N)
	d.window2 = make([]float32, N)
	for n := range N {
		win[n] = 0.5 - 0.5*math.Cos(2*math.Pi*float64(n)/float64(N))
		d.window2[n] = float32(win[n] * win[n])
	}
	for i := range d.NumGroupNorms() {
		p := fmt.Sprintf("gn%d.", i)
		d.gnNames = append(d.gnNames, [4]string{p + "mean", p + "var", p + "acc", p + "commit"})
	}
	for k := range K {
		ck := 2.0
		if k == 0 || k == N/2 {
			ck = 1
		}
		for n := range N {
			a := 2 * math.Pi * float64((k*n)%N) / float64(N)
			basis[n*2*K+k] = float32(ck * math.Cos(a) * win[n] / float64(N))
			if k != 0 && k != N/2 {
				basis[n*2*K+K+k] = float32(-ck * math.Sin(a) * win[n] / float64(N))
			}
		}
	}
	d.idft, err = d.consts.uploadMatrix("istft.basis", basis, int64(N), int64(2*K))
	return err
}

// Close frees the programs and the weights.
func (d *Decoder) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cache != nil {
		d.cache.Close()
		d.cache = nil
	}
	d.free()
}

// free releases the weights and constants.
func (d *Decoder) free() {
	nn.Free(d.w)
	if d.consts != nil {
		d.consts.close()
	}
	d.w = nil
}

// NumGroupNorms is the number of GroupNorms in the decoder (prior, post and upsampler
// ResNet blocks, two each).
func (d *Decoder) NumGroupNorms() int {
	return 2 * (2*d.Config.ResNetBlocks + len(d.Config.UpsamplerFactors))
}

// groupsOf is the group count of GroupNorm i (graph order: prior and post blocks at the
// decoder width, then one block per upsampler stage at half the width of the one before).
func (d *Decoder) groupsOf(i int) int {
	c := d.WaveDim
	if stage := (i - 4*d.Config.ResNetBlocks) / 2; i >= 4*d.Config.ResNetBlocks {
		c = d.WaveDim >> (stage + 1)
	}
	return min(d.Config.ResNetGroups, c)
}

// decodeGraph adds the builder state of one decode program.
type decodeGraph struct {
	*builder
	d     *Decoder
	pl    plan
	gnID  int
	count *engine.Tensor // running mode: the committed-token count input
}

func (b *builder) debug(name string, x engine.Tensor) {
	if b.dbg {
		b.g.Output(name, x)
	}
}

// cf2tm is the time-major rows [B·T, C] of a channels-first [B, C, T] tensor.
func (dg *decodeGraph) cf2tm(x engine.Tensor) engine.Tensor {
	return dg.g.Reshape(dg.g.Transpose(x, 1, 2), x.Dim(0)*x.Dim(2), x.Dim(1))
}

// tm2cf is the channels-first [B, C, T] copy of time-major rows [B·T, C].
func (dg *decodeGraph) tm2cf(x engine.Tensor) engine.Tensor {
	B := dg.streams()
	return dg.g.Contiguous(dg.g.Transpose(dg.g.Reshape(x, B, x.Dim(0)/B, x.Dim(1)), 1, 2))
}

// groupNorm normalises x [B, C, T] over groups of channels and all of a stream's frames
// with the statistics of the plan's mode, then applies the affine parameters.
func (dg *decodeGraph) groupNorm(x engine.Tensor, nw *nn.GroupNorm) engine.Tensor {
	g := dg.g
	const eps = 1e-6
	B, C, T := x.Dim(0), x.Dim(1), x.Dim(2)
	G := int64(min(dg.d.Config.ResNetGroups, int(C)))
	id := dg.gnID
	dg.gnID++
	name := fmt.Sprintf("gn%d", id)
	if dg.pl.stats {
		xr := g.Reshape(x, G, -1)
		g.Output(name+".mean", g.Mean(xr, 1))
		g.Output(name+".var", g.Var(xr, 1))
	}
	var mean, variance engine.Tensor
	switch dg.pl.gn {
	case gnPlain:
		return nw.Forward(g, x, int(G), eps)
	case gnFrozen:
		mean = g.Input(name+".mean", engine.F32, G, 1)
		variance = g.Input(name+".var", engine.F32, G, 1)
	case gnRunning:
		// Per stream and group: the sums of x and x² over its frames, [B·G, 1] (stream-major).
		r := T / int64(dg.pl.n) // frames per token at this stage
		per := C / G
		sums := func(from, to int64) (engine.Tensor, engine.Tensor) {
			xs := g.Reshape(g.Contiguous(g.Slice(x, 2, from, to)), B*G, -1)
			return g.Sum(xs, 1), g.Sum(g.Square(xs), 1)
		}
		nf := int64(dg.pl.newFrom)
		s1, s2 := sums(nf*r, T)
		acc := g.Input(name+".acc", engine.F32, 2, B*G, 1)
		if dg.count == nil {
			c := g.Input("gn.count", engine.F32, B, 1) // each stream's committed tokens
			dg.count = &c
		}
		n := g.Scale(*dg.count, float32(r*per), float32((T-nf*r)*per)) // [B, 1] values per group
		perStream := func(t engine.Tensor) engine.Tensor {             // t [B·G, 1] ÷ n, back to [B·G, 1]
			return g.Reshape(g.Div(g.Reshape(t, B, G), n), B*G, 1)
		}
		t1 := g.Add(s1, g.Reshape(g.Slice(acc, 0, 0, 1), B*G, 1))
		t2 := g.Add(s2, g.Reshape(g.Slice(acc, 0, 1, 2), B*G, 1))
		mean = perStream(t1)
		variance = g.Clamp(g.Sub(perStream(t2), g.Square(mean)), 0, math.MaxFloat32)
		c1, c2 := sums(nf*r, int64(dg.pl.coreEnd)*r)
		g.Output(name+".commit", g.Concat(0, g.Reshape(c1, 1, B*G, 1), g.Reshape(c2, 1, B*G, 1)))
	}
	y := g.Div(g.Sub(g.Reshape(x, B*G, -1), mean), g.Sqrt(g.Scale(variance, 1, eps)))
	return g.ChannelAffine(g.Reshape(y, B, C, T), nw.Weight.In(g), nw.Bias.In(g))
}

func (dg *decodeGraph) resBlock(x engine.Tensor, rb *resBlock) engine.Tensor {
	g := dg.g
	pad := int64(rb.Conv1.Weight.Dim(2) / 2)
	h := g.SiLU(dg.groupNorm(x, &rb.Norm1))
	h = rb.Conv1.Forward(g, h, 1, pad, pad, 1)
	h = g.SiLU(dg.groupNorm(h, &rb.Norm2))
	h = rb.Conv2.Forward(g, h, 1, pad, pad, 1)
	return g.Add(h, x)
}

// build makes the decode graph for a plan: inputs "tokens" [B·n] (int32) and "global"
// [B, cond]; output "frames" [B·T, n_fft], the windowed inverse-DFT frames that the host
// overlap-adds. B streams' windows stack along the first axis; every op keeps a stream's
// rows apart (row-grouped products, per-stream convolutions, norms and attention), so each
// stream gets the bits it gets alone.
func (d *Decoder) build(pl plan) (*engine.Graph, error) {
	cfg := d.Config
	g := engine.NewGraph(fmt.Sprintf("miocodec.decode[%s]", pl.key()))
	B := int64(pl.streams())
	if B > 1 && (pl.gn == gnFrozen || pl.debug || pl.stats) {
		return nil, fmt.Errorf("miocodec: a batched decode takes plain or running statistics only")
	}
	g.SetRowGroups(int(B))
	dg := &decodeGraph{builder: &builder{g: g, consts: d.consts, dbg: pl.debug, batch: B}, d: d, pl: pl}
	w := d.w
	N := int64(pl.n)
	tokens := g.Input("tokens", engine.I32, B*N)
	global := g.Input("global", engine.F32, B, int64(d.CondDim))

	g.Label("local_quantizer")
	codes := g.GatherRows(g.Persistent(d.codes), tokens)
	dg.debug("fsq_codes", codes)
	x := w.ProjOut.Forward(g, codes)
	dg.debug("content_embedding", x)
	x = dg.transformer("wave_prenet", "prenet", &w.Prenet, cfg.WavePrenet, x, nil)
	dg.debug("prenet_out", x)

	g.Label("wave_conv_upsample")
	y := w.ConvUp.Forward(g, dg.tm2cf(x), int64(cfg.WaveUpsample), 0, 0, 1, 1)
	dg.debug("conv_upsample_out", dg.cf2tm(y))
	if int64(pl.frames) != y.Dim(2) {
		y = g.InterpLinear(y, int64(pl.frames))
	}
	dg.debug("interp_out", dg.cf2tm(y))
	g.Label("wave_prior_net")
	for i := range w.Prior {
		y = dg.resBlock(y, &w.Prior[i])
	}
	dg.debug("prior_out", dg.cf2tm(y))

	g.Label("wave_decoder")
	cond := g.SiLU(global)
	z := dg.transformer("wave_decoder", "decoder", &w.Decoder, cfg.WaveDecoder, dg.cf2tm(y), &cond)
	dg.debug("decoder_out", z)
	y = dg.tm2cf(z)
	g.Label("wave_post_net")
	for i := range w.Post {
		y = dg.resBlock(y, &w.Post[i])
	}
	dg.debug("post_out", dg.cf2tm(y))

	u := &w.Upsampler
	for i := range u.Layers {
		g.Label(fmt.Sprintf("wave_upsampler.%d", i))
		s := int64(cfg.UpsamplerFactors[i])
		pad := int64(cfg.UpsamplerKernels[i]-cfg.UpsamplerFactors[i]) / 2
		y = g.ConvTranspose1D(y, g.Persistent(u.Layers[i].W), u.Layers[i].B.Opt(g), s, pad, 0, 1, 1)
		dg.debug(fmt.Sprintf("ups%d_convT", i), dg.cf2tm(y))
		y = g.SnakeBeta(y, u.Snakes[i].Alpha.In(g), u.Snakes[i].Beta.In(g))
		dg.debug(fmt.Sprintf("ups%d_snake", i), dg.cf2tm(y))
		y = dg.resBlock(y, &u.ResNets[i])
		dg.debug(fmt.Sprintf("ups%d_resnet", i), dg.cf2tm(y))
	}
	g.Label("wave_upsampler.out")
	h := u.OutProj.Forward(g, dg.cf2tm(y))
	y = g.SnakeBeta(dg.tm2cf(h), u.OutSnk.Alpha.In(g), u.OutSnk.Beta.In(g))
	dg.debug("upsampler_out", dg.cf2tm(y))

	g.Label("istft_head")
	h = w.Head.Forward(g, dg.cf2tm(y)) // [B·T, n_fft+2]
	dg.debug("head_out", h)
	K := int64(cfg.NFFT/2 + 1)
	mag := g.Clamp(g.Exp(g.Slice(h, 1, 0, K)), 0, 100)
	ph := g.Slice(h, 1, K, 2*K)
	spec := g.Concat(1, g.Mul(mag, g.Cos(ph)), g.Mul(mag, g.Sin(ph)))
	g.Output("frames", g.Linear(spec, g.Persistent(d.idft), nil))
	if d.consts.err != nil {
		return nil, d.consts.err
	}
	return g, g.Err()
}

// GroupStats are the per-group mean and (biased) variance of every GroupNorm of the
// decoder, in graph order (prior, post, upsampler blocks; norm1 then norm2): Mean[i][g].
type GroupStats struct {
	Mean, Var [][]float32
}

// runIO carries the host side of one program run.
type runIO struct {
	frozen    *GroupStats // gnFrozen: the statistics to use
	acc       [][]float64 // gnRunning: per GroupNorm [sum_g..., sumsq_g...] of committed frames
	committed int         // gnRunning: tokens in acc
	commit    [][]float64 // gnRunning output: sums over the window's newly committed frames
	stats     *GroupStats // plan.stats output
	stages    map[string][]float32
}

// window is one stream's decode of one run: its tokens and speaker in, its waveform
// appended to wave.
type window struct {
	tokens []int32
	global []float32
	io     *runIO
	wave   []float32

	pl  plan  // a queued window's plan (batch.go)
	err error // and its result
}

// run executes the program of pl and appends the waveform to wave.
func (d *Decoder) run(pl plan, tokens []int32, global []float32, io *runIO, wave []float32) ([]float32, error) {
	w := window{tokens: tokens, global: global, io: io, wave: wave}
	err := d.runWindows(pl, []*window{&w})
	return w.wave, err
}

// runWindows runs pl over len(ws) windows of its geometry in one program (pl.batch is set
// here) and appends each one's waveform to its wave.
func (d *Decoder) runWindows(pl plan, ws []*window) error {
	B := len(ws)
	pl.batch = B
	for _, w := range ws {
		if err := d.fsq.check(w.tokens); err != nil {
			return err
		}
		if len(w.tokens) != pl.n {
			return fmt.Errorf("miocodec: a window of %d tokens in a program of %d", len(w.tokens), pl.n)
		}
		if len(w.global) != d.CondDim {
			return fmt.Errorf("miocodec: global embedding of %d values, want %d", len(w.global), d.CondDim)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	prog, err := d.program(pl)
	if err != nil {
		return err
	}
	tokens, global := prog.InputInt32("tokens"), prog.Input("global")
	for b, w := range ws {
		copy(tokens[b*pl.n:], w.tokens)
		copy(global[b*d.CondDim:], w.global)
	}
	nGN := d.NumGroupNorms()
	io := ws[0].io
	switch pl.gn {
	case gnFrozen:
		if io == nil || io.frozen == nil || len(io.frozen.Mean) != nGN || len(io.frozen.Var) != nGN {
			return fmt.Errorf("miocodec: frozen GroupNorm mode needs statistics of %d GroupNorms", nGN)
		}
		for i := range nGN {
			m, v := prog.Input(d.gnNames[i][0]), prog.Input(d.gnNames[i][1])
			if len(io.frozen.Mean[i]) != len(m) || len(io.frozen.Var[i]) != len(v) {
				return fmt.Errorf("miocodec: GroupNorm %d: %d/%d statistics, want %d", i, len(io.frozen.Mean[i]), len(io.frozen.Var[i]), len(m))
			}
			copy(m, io.frozen.Mean[i])
			copy(v, io.frozen.Var[i])
		}
	case gnRunning:
		// acc [2, B·G, 1]: every stream's sums, then every stream's sums of squares.
		count := prog.Input("gn.count")
		for b, w := range ws {
			count[b] = float32(w.io.committed)
		}
		for i := range nGN {
			a, G := prog.Input(d.gnNames[i][2]), d.groupsOf(i)
			for b, w := range ws {
				for j, v := range w.io.acc[i] {
					a[j/G*B*G+b*G+j%G] = float32(v)
				}
			}
		}
	}
	if err := prog.Run(); err != nil {
		return fmt.Errorf("miocodec: decode: %w", err)
	}
	if pl.gn == gnRunning {
		for i := range nGN {
			c, G := prog.Output(d.gnNames[i][3]), d.groupsOf(i)
			for b, w := range ws {
				w.io.commit[i] = w.io.commit[i][:0]
				for _, half := range [2]int{0, 1} {
					for _, v := range c[half*B*G+b*G : half*B*G+(b+1)*G] {
						w.io.commit[i] = append(w.io.commit[i], float64(v))
					}
				}
			}
		}
	}
	if pl.stats {
		io.stats = &GroupStats{}
		for i := range nGN {
			io.stats.Mean = append(io.stats.Mean, append([]float32(nil), prog.Output(d.gnNames[i][0])...))
			io.stats.Var = append(io.stats.Var, append([]float32(nil), prog.Output(d.gnNames[i][1])...))
		}
	}
	if pl.debug {
		io.stages = map[string][]float32{}
		for _, name := range stageNames(len(d.Config.UpsamplerFactors)) {
			if out := prog.Output(name); out != nil {
				io.stages[name] = append([]float32(nil), out...)
			}
		}
	}
	frames := prog.Output("frames")
	per := len(frames) / B
	for b, w := range ws {
		w.wave = d.overlapAdd(frames[b*per:(b+1)*per], per/d.Config.NFFT, w.wave)
	}
	return nil
}

// program is pl's compiled program (compiled now if it is not cached). d.mu is held.
func (d *Decoder) program(pl plan) (engine.Program, error) {
	if d.cache == nil {
		return nil, fmt.Errorf("miocodec: decoder is closed")
	}
	prog, err := d.cache.Get(pl.key(), func() (*engine.Graph, error) { return d.build(pl) })
	if err != nil {
		return nil, fmt.Errorf("miocodec: decode program: %w", err)
	}
	return prog, nil
}

// stageNames are the debug outputs of a decode program (names of the golden stages).
func stageNames(upStages int) []string {
	names := []string{"fsq_codes", "content_embedding", "prenet_layer0", "prenet_out", "conv_upsample_out",
		"interp_out", "prior_out", "decoder_layer0", "decoder_out", "post_out"}
	for i := range upStages {
		names = append(names, fmt.Sprintf("ups%d_convT", i), fmt.Sprintf("ups%d_snake", i), fmt.Sprintf("ups%d_resnet", i))
	}
	return append(names, "upsampler_out", "head_out", "frames")
}

// overlapAdd turns T windowed frames [T, n_fft] into T·hop samples: overlap-add with hop,
// drop (n_fft − hop)/2 samples at each end ('same') and divide by the overlap-added
// squared window (trimmed alike). The result is appended to wave. Called under d.mu (the
// scratch buffers are the decoder's).
func (d *Decoder) overlapAdd(frames []float32, T int, wave []float32) []float32 {
	N, hop := d.Config.NFFT, d.Config.Hop
	pad := (N - hop) / 2
	L := (T-1)*hop + N
	if cap(d.ola) < L {
		d.ola = make([]float32, L)
		d.env = make([]float32, L)
	}
	raw, env := d.ola[:L], d.env[:L]
	clear(raw)
	clear(env)
	for t := range T {
		r, e, f := raw[t*hop:t*hop+N], env[t*hop:t*hop+N], frames[t*N:(t+1)*N]
		for n, v := range f {
			r[n] += v
			e[n] += d.window2[n]
		}
	}
	start := len(wave)
	wave = append(wave, raw[pad:pad+T*hop]...)
	for i, e := range env[pad : pad+T*hop] {
		wave[start+i] /= e
	}
	return wave
}

func (d *Decoder) tokenPlan(n int) plan {
	return plan{n: n, frames: n * d.Config.WaveUpsample}
}

// Decode decodes a whole utterance of tokens with the global (speaker) embedding into
// len(tokens)·SamplesPerToken samples at Config.SampleRate.
func (d *Decoder) Decode(tokens []int32, global []float32) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, nil
	}
	return d.run(d.tokenPlan(len(tokens)), tokens, global, nil, nil)
}

// framesFor is the decoder frame count for an explicit target audio length (stft_length =
// (target // hop) // upsampler product; the VC path).
func (d *Decoder) framesFor(targetAudioLength int) (int, error) {
	f := targetAudioLength / d.Config.Hop / d.Config.upsampleProduct()
	if f < 1 {
		return 0, fmt.Errorf("miocodec: target audio length %d is shorter than one decoder frame", targetAudioLength)
	}
	return f, nil
}

// DecodeLength decodes with an explicit target audio length: the upsampled features are
// linearly interpolated to (target // hop) // Π upsampler factors frames; the output has
// that many frames × Π factors × hop samples.
func (d *Decoder) DecodeLength(tokens []int32, global []float32, targetAudioLength int) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("miocodec: decode of no tokens")
	}
	f, err := d.framesFor(targetAudioLength)
	if err != nil {
		return nil, err
	}
	return d.run(plan{n: len(tokens), frames: f}, tokens, global, nil, nil)
}

// Stages decodes like DecodeLength (targetAudioLength 0: token decoding) and returns every
// intermediate stage, time-major (T, C), by golden name (fsq_codes, content_embedding,
// prenet_layer0, prenet_out, conv_upsample_out, interp_out, prior_out, decoder_layer0,
// decoder_out, post_out, ups{i}_convT/_snake/_resnet, upsampler_out, head_out), with the
// waveform.
func (d *Decoder) Stages(tokens []int32, global []float32, targetAudioLength int) (map[string][]float32, []float32, error) {
	if len(tokens) == 0 {
		return nil, nil, fmt.Errorf("miocodec: decode of no tokens")
	}
	pl := d.tokenPlan(len(tokens))
	if targetAudioLength > 0 {
		f, err := d.framesFor(targetAudioLength)
		if err != nil {
			return nil, nil, err
		}
		pl.frames = f
	}
	pl.debug = true
	io := &runIO{}
	wave, err := d.run(pl, tokens, global, io, nil)
	return io.stages, wave, err
}

// DecodeStats decodes a whole utterance and also returns the statistics of every GroupNorm
// (to freeze them for windowed decoding, GroupStats).
func (d *Decoder) DecodeStats(tokens []int32, global []float32) ([]float32, *GroupStats, error) {
	if len(tokens) == 0 {
		return nil, nil, fmt.Errorf("miocodec: decode of no tokens")
	}
	pl := d.tokenPlan(len(tokens))
	pl.stats = true
	io := &runIO{}
	wave, err := d.run(pl, tokens, global, io, nil)
	return wave, io.stats, err
}
