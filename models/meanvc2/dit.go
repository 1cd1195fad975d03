package meanvc2

import (
	"fmt"
	"math"
	"sync"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
)

type linearW struct {
	W weights.Tensor `gguf:"weight"`
	B weights.Tensor `gguf:"bias"`
}

type timeEmbedW struct {
	L0 linearW `gguf:"time_mlp.0"`
	L2 linearW `gguf:"time_mlp.2"`
}

type blockW struct {
	Mod   linearW        `gguf:"attn_norm.linear"`
	Q     linearW        `gguf:"attn.to_q"`
	K     linearW        `gguf:"attn.to_k"`
	V     linearW        `gguf:"attn.to_v"`
	QNorm weights.Tensor `gguf:"attn.q_norm.weight"`
	KNorm weights.Tensor `gguf:"attn.k_norm.weight"`
	Out   linearW        `gguf:"attn.to_out.0"`
	FF1   linearW        `gguf:"ff.ff.0.0"`
	FF2   linearW        `gguf:"ff.ff.2"`
}

type gtmSideW struct {
	L0 linearW `gguf:"0"`
	L2 linearW `gguf:"2"`
}

// ditW is the vc/ namespace: the DiT state dict as released.
type ditW struct {
	TTime   timeEmbedW     `gguf:"t_time_embed"`
	RTime   timeEmbedW     `gguf:"r_time_embed"`
	InProj  linearW        `gguf:"input_embed.proj"`
	InvFreq weights.Tensor `gguf:"rotary_embed.inv_freq,optional"`
	GTM     struct {
		MlpK   gtmSideW       `gguf:"mlp_k"`
		MlpV   gtmSideW       `gguf:"mlp_v"`
		KPrior weights.Tensor `gguf:"k_prior"`
		VPrior weights.Tensor `gguf:"v_prior"`
		NormK  linearW        `gguf:"norm_k"`
		NormV  linearW        `gguf:"norm_v"`
	} `gguf:"gtm"`
	TVT struct {
		Q    linearW `gguf:"q_proj"`
		K    linearW `gguf:"k_proj"`
		V    linearW `gguf:"v_proj"`
		Out  linearW `gguf:"out_proj"`
		Norm linearW `gguf:"attn_norm"`
	} `gguf:"temporal_timbre"`
	Blocks  []blockW `gguf:"transformer_blocks.%d"`
	NormOut linearW  `gguf:"norm_out.linear"`
	ProjOut linearW  `gguf:"proj_out"`
}

// shapeOf is a tensor's shape without keeping its values (nil when absent); a gguf view
// answers without reading the data.
func shapeOf(src weights.Source, name string) []int {
	if ts, ok := src.(interface {
		Tensor(string) (*gguf.ModelTensor, bool)
	}); ok {
		if mt, ok := ts.Tensor(name); ok {
			return mt.Shape
		}
		return nil
	}
	if !src.Has(name) {
		return nil
	}
	_, s, err := src.Get(name)
	if err != nil {
		return nil
	}
	return s
}

// deriveDims fills the widths from the tensors that define them; an absent or malformed
// tensor leaves the config's value, and Bind then reports it by name.
func deriveDims(src weights.Source, c *Config) {
	if s := shapeOf(src, "proj_out.weight"); len(s) == 2 {
		c.MelDim, c.Dim = s[0], s[1]
	}
	if s := shapeOf(src, "gtm.mlp_k.0.weight"); len(s) == 2 {
		c.SpkDim = s[1]
	}
	if s := shapeOf(src, "gtm.k_prior"); len(s) == 2 {
		c.GTMSlots, c.GTMHidden = s[0], s[1]
	}
	if s := shapeOf(src, "temporal_timbre.q_proj.weight"); len(s) == 2 {
		c.TVTAttnDim, c.BNDim = s[0], s[1]
	}
	if s := shapeOf(src, "t_time_embed.time_mlp.0.weight"); len(s) == 2 {
		c.TimeFreqDim = s[1]
	}
	if s := shapeOf(src, "transformer_blocks.0.attn.q_norm.weight"); len(s) == 1 && s[0] > 0 {
		c.DimHead = s[0]
		if q := shapeOf(src, "transformer_blocks.0.attn.to_q.weight"); len(q) == 2 && q[0]%c.DimHead == 0 {
			c.Heads = q[0] / c.DimHead
		}
	}
	if s := shapeOf(src, "transformer_blocks.0.ff.ff.0.0.weight"); len(s) == 2 {
		c.FF = s[0]
	}
	depth := 0
	for src.Has(fmt.Sprintf("transformer_blocks.%d.attn.to_q.weight", depth)) {
		depth++
	}
	if depth > 0 {
		c.Depth = depth
	}
}

// expect sets the shapes Bind checks from the (derived) config.
func (w *ditW) expect(c Config) {
	byName := map[string][]int{}
	for _, t := range c.Tensors() {
		byName[t.Name] = t.Shape
	}
	lin := func(l *linearW, p string) {
		l.W.Shape, l.B.Shape = byName[p+".weight"], byName[p+".bias"]
	}
	for _, te := range []struct {
		w *timeEmbedW
		p string
	}{{&w.TTime, "t_time_embed"}, {&w.RTime, "r_time_embed"}} {
		lin(&te.w.L0, te.p+".time_mlp.0")
		lin(&te.w.L2, te.p+".time_mlp.2")
	}
	lin(&w.InProj, "input_embed.proj")
	w.InvFreq.Shape = []int{-1}
	lin(&w.GTM.MlpK.L0, "gtm.mlp_k.0")
	lin(&w.GTM.MlpK.L2, "gtm.mlp_k.2")
	lin(&w.GTM.MlpV.L0, "gtm.mlp_v.0")
	lin(&w.GTM.MlpV.L2, "gtm.mlp_v.2")
	w.GTM.KPrior.Shape, w.GTM.VPrior.Shape = byName["gtm.k_prior"], byName["gtm.v_prior"]
	lin(&w.GTM.NormK, "gtm.norm_k")
	lin(&w.GTM.NormV, "gtm.norm_v")
	lin(&w.TVT.Q, "temporal_timbre.q_proj")
	lin(&w.TVT.K, "temporal_timbre.k_proj")
	lin(&w.TVT.V, "temporal_timbre.v_proj")
	lin(&w.TVT.Out, "temporal_timbre.out_proj")
	lin(&w.TVT.Norm, "temporal_timbre.attn_norm")
	w.Blocks = make([]blockW, c.Depth)
	for l := range w.Blocks {
		b, p := &w.Blocks[l], fmt.Sprintf("transformer_blocks.%d.", l)
		lin(&b.Mod, p+"attn_norm.linear")
		lin(&b.Q, p+"attn.to_q")
		lin(&b.K, p+"attn.to_k")
		lin(&b.V, p+"attn.to_v")
		b.QNorm.Shape, b.KNorm.Shape = byName[p+"attn.q_norm.weight"], byName[p+"attn.k_norm.weight"]
		lin(&b.Out, p+"attn.to_out.0")
		lin(&b.FF1, p+"ff.ff.0.0")
		lin(&b.FF2, p+"ff.ff.2")
	}
	lin(&w.NormOut, "norm_out.linear")
	lin(&w.ProjOut, "proj_out")
}

// lin is a Linear's weight and bias in persistent buffers.
type lin struct{ w, b *engine.Buffer }

type blockBufs struct {
	mod, q, k, v, out, ff1, ff2 lin
	qNorm, kNorm                *engine.Buffer
}

// DiT is a loaded MeanVC2 conversion model: weights in persistent engine buffers shared by
// every State (stream).
type DiT struct {
	Config  Config
	backend engine.Backend

	tTime, rTime [2]lin
	inProj       lin
	gtmK, gtmV   [2]lin
	kPrior       *engine.Buffer
	vPrior       *engine.Buffer
	normK, normV lin
	tvtQ, tvtK   lin
	tvtV, tvtOut lin
	tvtNorm      lin
	blocks       []blockBufs
	normOut      lin
	projOut      lin
	ropeDims     int64
	ropeBase     float32
	bufs         []*engine.Buffer

	mu       sync.Mutex // serialises the GTM program (Timbre may be called from any stream)
	gtmCache *engine.Cache
}

// LoadDiT binds the vc/ tensors of src (a gguf Model's Sub("vc")) and copies them into
// persistent buffers. Widths come from the tensor shapes; cfg supplies the rest. Every
// missing or misshapen tensor is reported at once, by name.
func LoadDiT(src weights.Source, cfg Config, backend engine.Backend) (*DiT, error) {
	if backend == nil {
		return nil, fmt.Errorf("meanvc2: load: no backend")
	}
	deriveDims(src, &cfg)
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("meanvc2: load: %w", err)
	}
	if cfg.DimHead%2 != 0 {
		return nil, fmt.Errorf("meanvc2: load: head width %d must be even (RoPE pairs)", cfg.DimHead)
	}
	var w ditW
	w.expect(cfg)
	if err := weights.Bind(src, &w); err != nil {
		return nil, fmt.Errorf("meanvc2: load: %w", err)
	}
	if len(w.Blocks) != cfg.Depth {
		return nil, fmt.Errorf("meanvc2: load: %d transformer blocks, config says %d", len(w.Blocks), cfg.Depth)
	}
	d := &DiT{Config: cfg, backend: backend, ropeDims: int64(cfg.DimHead), ropeBase: float32(cfg.RopeBase)}
	if w.InvFreq.Present() {
		base, dims, err := ropeFromInvFreq(w.InvFreq.Data, cfg.DimHead)
		if err != nil {
			return nil, fmt.Errorf("meanvc2: load: rotary_embed.inv_freq: %w", err)
		}
		d.ropeBase, d.ropeDims = base, dims
	}
	var err error
	buf := func(name string, t *weights.Tensor) *engine.Buffer {
		if err != nil {
			return nil
		}
		shape := make([]int64, len(t.Shape))
		for i, n := range t.Shape {
			shape[i] = int64(n)
		}
		var b *engine.Buffer
		if b, err = engine.NewBufferFrom("vc/"+name, t.Data, shape...); err != nil {
			err = fmt.Errorf("meanvc2: load %s: %w", name, err)
			return nil
		}
		t.Data = nil
		d.bufs = append(d.bufs, b)
		return b
	}
	mk := func(name string, l *linearW) lin {
		return lin{buf(name+".weight", &l.W), buf(name+".bias", &l.B)}
	}
	d.tTime = [2]lin{mk("t_time_embed.time_mlp.0", &w.TTime.L0), mk("t_time_embed.time_mlp.2", &w.TTime.L2)}
	d.rTime = [2]lin{mk("r_time_embed.time_mlp.0", &w.RTime.L0), mk("r_time_embed.time_mlp.2", &w.RTime.L2)}
	d.inProj = mk("input_embed.proj", &w.InProj)
	d.gtmK = [2]lin{mk("gtm.mlp_k.0", &w.GTM.MlpK.L0), mk("gtm.mlp_k.2", &w.GTM.MlpK.L2)}
	d.gtmV = [2]lin{mk("gtm.mlp_v.0", &w.GTM.MlpV.L0), mk("gtm.mlp_v.2", &w.GTM.MlpV.L2)}
	d.kPrior = buf("gtm.k_prior", &w.GTM.KPrior)
	d.vPrior = buf("gtm.v_prior", &w.GTM.VPrior)
	d.normK = mk("gtm.norm_k", &w.GTM.NormK)
	d.normV = mk("gtm.norm_v", &w.GTM.NormV)
	d.tvtQ = mk("temporal_timbre.q_proj", &w.TVT.Q)
	d.tvtK = mk("temporal_timbre.k_proj", &w.TVT.K)
	d.tvtV = mk("temporal_timbre.v_proj", &w.TVT.V)
	d.tvtOut = mk("temporal_timbre.out_proj", &w.TVT.Out)
	d.tvtNorm = mk("temporal_timbre.attn_norm", &w.TVT.Norm)
	d.blocks = make([]blockBufs, cfg.Depth)
	for l := range d.blocks {
		b, bw, p := &d.blocks[l], &w.Blocks[l], fmt.Sprintf("transformer_blocks.%d.", l)
		b.mod = mk(p+"attn_norm.linear", &bw.Mod)
		b.q = mk(p+"attn.to_q", &bw.Q)
		b.k = mk(p+"attn.to_k", &bw.K)
		b.v = mk(p+"attn.to_v", &bw.V)
		b.qNorm = buf(p+"attn.q_norm.weight", &bw.QNorm)
		b.kNorm = buf(p+"attn.k_norm.weight", &bw.KNorm)
		b.out = mk(p+"attn.to_out.0", &bw.Out)
		b.ff1 = mk(p+"ff.ff.0.0", &bw.FF1)
		b.ff2 = mk(p+"ff.ff.2", &bw.FF2)
	}
	d.normOut = mk("norm_out.linear", &w.NormOut)
	d.projOut = mk("proj_out", &w.ProjOut)
	if err != nil {
		d.Close()
		return nil, err
	}
	d.gtmCache = engine.NewCache(backend, 1)
	return d, nil
}

// LoadDiTFromModel checks the family, parses the embedded config and loads the vc/ namespace.
func LoadDiTFromModel(m *gguf.Model, backend engine.Backend) (*DiT, error) {
	cfg, err := ConfigFromModel(m)
	if err != nil {
		return nil, err
	}
	return LoadDiT(m.Sub("vc"), cfg, backend)
}

// ropeFromInvFreq recovers the RoPE base from the stored frequencies (inv_freq[i] =
// base^(−2i/dims)) so the engine's RoPE op reproduces them, and refuses any other table.
func ropeFromInvFreq(f []float32, dimHead int) (float32, int64, error) {
	n := len(f)
	if n < 2 || 2*n > dimHead || f[0] != 1 || !(f[1] > 0 && f[1] < 1) {
		return 0, 0, fmt.Errorf("%d values %v… are not a RoPE table for head width %d", n, f[:min(n, 3)], dimHead)
	}
	dims := 2 * n
	base := math.Pow(float64(f[1]), -float64(dims)/2)
	for i, v := range f {
		want := math.Pow(base, -2*float64(i)/float64(dims))
		if math.Abs(float64(v)-want) > 1e-6*want+1e-12 {
			return 0, 0, fmt.Errorf("value %d is %g, want %g for base %g", i, v, want, base)
		}
	}
	return float32(base), int64(dims), nil
}

// Close frees the weights; no State of the model may run afterwards.
func (d *DiT) Close() {
	if d.gtmCache != nil {
		d.gtmCache.Close()
	}
	for _, b := range d.bufs {
		b.Free()
	}
	d.bufs = nil
}

func (d *DiT) linear(g *engine.Graph, x engine.Tensor, l lin) engine.Tensor {
	b := g.Persistent(l.b)
	return g.Linear(x, g.Persistent(l.w), &b)
}

func (d *DiT) layerNorm(g *engine.Graph, x engine.Tensor, l lin, eps float64) engine.Tensor {
	w, b := g.Persistent(l.w), g.Persistent(l.b)
	return g.LayerNorm(x, &w, &b, float32(eps))
}

// stepOpts selects a DiT call program: commit writes the new K/V rows into the caches
// (the last call of a step); trace exposes the intermediate stages.
type stepOpts struct{ commit, trace bool }

// buildStep is one DiT call over the Window() frames of a step. Inputs: x [W, mel], cond
// [W, bn], spk [1, spk], gtm_k/gtm_v [slots, hidden], t_freq/r_freq [1, freq] (host
// sinusoids), qpos [W] and per layer kpos{l} [cap+W] (absolute frame positions) and mask{l}
// [W, cap+W]. Layer l's caches are [H, cap, Dh] with the valid rows at the end (older rows
// are masked), keys after RMSNorm and before RoPE; a commit shifts in the chunk's rows.
func (d *DiT) buildStep(kc, vc []*engine.Buffer, o stepOpts) *engine.Graph {
	c := d.Config
	W, H, Dh := int64(c.Window()), int64(c.Heads), int64(c.DimHead)
	chunk := int64(c.ChunkSize)
	g := engine.NewGraph(fmt.Sprintf("meanvc2.dit[commit=%v,trace=%v]", o.commit, o.trace))
	x := g.Input("x", engine.F32, W, int64(c.MelDim))
	cond := g.Input("cond", engine.F32, W, int64(c.BNDim))
	spk := g.Input("spk", engine.F32, 1, int64(c.SpkDim))
	gk := g.Input("gtm_k", engine.F32, int64(c.GTMSlots), int64(c.GTMHidden))
	gv := g.Input("gtm_v", engine.F32, int64(c.GTMSlots), int64(c.GTMHidden))
	tf := g.Input("t_freq", engine.F32, 1, int64(c.TimeFreqDim))
	rf := g.Input("r_freq", engine.F32, 1, int64(c.TimeFreqDim))
	qpos := g.Input("qpos", engine.I32, W)
	trace := func(name string, t engine.Tensor) {
		if o.trace {
			g.Output(name, t)
		}
	}

	g.Label("time_embed")
	te := func(f engine.Tensor, mlp [2]lin) engine.Tensor {
		return d.linear(g, g.SiLU(d.linear(g, f, mlp[0])), mlp[1])
	}
	tEmb, rEmb := te(tf, d.tTime), te(rf, d.rTime)
	trace("t_time_embed", tEmb)
	trace("r_time_embed", rEmb)
	silu := g.SiLU(g.Add(tEmb, rEmb)) // [1, dim]

	g.Label("temporal_timbre")
	th := int64(c.TVTHeads)
	tdh := int64(c.TVTAttnDim) / th
	split := func(t engine.Tensor, n int64) engine.Tensor { // [n, A] → [1, th, n, tdh]
		return g.Permute(g.Reshape(t, 1, n, th, tdh), 0, 2, 1, 3)
	}
	slots := int64(c.GTMSlots)
	tq := split(d.linear(g, cond, d.tvtQ), W)
	tk := split(d.linear(g, gk, d.tvtK), slots)
	tv := split(d.linear(g, gv, d.tvtV), slots)
	ta := g.Attention(tq, tk, tv, nil, nil, float32(1/math.Sqrt(float64(tdh))))
	ta = g.Reshape(g.Permute(ta, 0, 2, 1, 3), W, int64(c.TVTAttnDim))
	timbre := d.layerNorm(g, d.linear(g, ta, d.tvtOut), d.tvtNorm, c.LNEps)
	trace("temporal_timbre", timbre)

	g.Label("input_embed")
	h := d.linear(g, g.Concat(1, x, timbre, g.Expand(spk, W, int64(c.SpkDim))), d.inProj)
	trace("input_embed", h)

	dim := int64(c.Dim)
	adaEps := float32(c.AdaEps)
	// modulate is LN(h; no affine)·(1+scale)+shift.
	modulate := func(h, shift, scale engine.Tensor) engine.Tensor {
		return g.Add(g.Mul(g.LayerNorm(h, nil, nil, adaEps), g.Scale(scale, 1, 1)), shift)
	}
	heads := func(t engine.Tensor, norm *engine.Buffer) engine.Tensor { // [W, H·Dh] → [1, H, W, Dh]
		t = g.Reshape(t, W, H, Dh)
		if norm != nil {
			nw := g.Persistent(norm)
			t = g.RMSNorm(t, &nw, float32(c.RMSEps))
		}
		return g.Permute(g.Reshape(t, 1, W, H, Dh), 0, 2, 1, 3)
	}
	for l, b := range d.blocks {
		g.Label(fmt.Sprintf("transformer_blocks.%d", l))
		capL := int64(c.CacheFrames(l))
		kpos := g.Input(fmt.Sprintf("kpos%d", l), engine.I32, capL+W)
		mask := g.Input(fmt.Sprintf("mask%d", l), engine.F32, W, capL+W)
		mod := d.linear(g, silu, b.mod) // [1, 6·dim]
		part := func(i int64) engine.Tensor { return g.Slice(mod, 1, i*dim, (i+1)*dim) }
		shiftMSA, scaleMSA, gateMSA := part(0), part(1), part(2)
		shiftMLP, scaleMLP, gateMLP := part(3), part(4), part(5)

		n := modulate(h, shiftMSA, scaleMSA)
		q := heads(d.linear(g, n, b.q), b.qNorm)
		k := heads(d.linear(g, n, b.k), b.kNorm)
		v := heads(d.linear(g, n, b.v), nil)
		ck := g.Reshape(g.Persistent(kc[l]), 1, H, capL, Dh)
		cv := g.Reshape(g.Persistent(vc[l]), 1, H, capL, Dh)
		kAll := g.Concat(2, ck, k)
		vAll := g.Concat(2, cv, v)
		if o.commit {
			// The cache keeps the newest cap rows of [cache ‖ the chunk's rows]; the
			// lookahead rows are never cached.
			shift := func(cache, cur engine.Tensor, dst *engine.Buffer) {
				rows := g.Slice(cur, 2, 0, chunk)
				if capL > chunk {
					rows = g.Concat(2, g.Slice(cache, 2, chunk, capL), rows)
				}
				g.Assign(g.Persistent(dst), g.Reshape(rows, H, capL, Dh))
			}
			shift(ck, k, kc[l])
			shift(cv, v, vc[l])
		}
		qr := g.RoPE(q, qpos, d.ropeDims, engine.RoPEInterleaved, d.ropeBase)
		kr := g.RoPE(kAll, kpos, d.ropeDims, engine.RoPEInterleaved, d.ropeBase)
		att := g.Attention(qr, kr, vAll, &mask, nil, float32(1/math.Sqrt(float64(Dh))))
		att = d.linear(g, g.Reshape(g.Permute(att, 0, 2, 1, 3), W, H*Dh), b.out)
		h = g.Add(h, g.Mul(gateMSA, att))

		n2 := modulate(h, shiftMLP, scaleMLP)
		ff := d.linear(g, g.GELU(d.linear(g, n2, b.ff1), true), b.ff2)
		h = g.Add(h, g.Mul(gateMLP, ff))
		trace(fmt.Sprintf("block%d", l), h)
	}

	g.Label("norm_out")
	fin := d.linear(g, silu, d.normOut) // [1, 2·dim]: scale, then shift
	h = modulate(h, g.Slice(fin, 1, dim, 2*dim), g.Slice(fin, 1, 0, dim))
	trace("norm_out", h)
	g.Label("proj_out")
	g.Output("u", d.linear(g, h, d.projOut))
	return g
}
