package meanvc2

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

type timeEmbed struct {
	L0 nn.Linear `gguf:"time_mlp.0"`
	L2 nn.Linear `gguf:"time_mlp.2"`
}

type block struct {
	Mod   nn.Linear  `gguf:"attn_norm.linear"`
	Q     nn.Linear  `gguf:"attn.to_q"`
	K     nn.Linear  `gguf:"attn.to_k"`
	V     nn.Linear  `gguf:"attn.to_v"`
	QNorm nn.RMSNorm `gguf:"attn.q_norm"`
	KNorm nn.RMSNorm `gguf:"attn.k_norm"`
	Out   nn.Linear  `gguf:"attn.to_out.0"`
	FF1   nn.Linear  `gguf:"ff.ff.0.0"`
	FF2   nn.Linear  `gguf:"ff.ff.2"`
}

type gtmSide struct {
	L0 nn.Linear `gguf:"0"`
	L2 nn.Linear `gguf:"2"`
}

// dit is the vc/ namespace: the DiT state dict in the release's order (cache_embed, unused
// and absent from the release, is not declared).
type dit struct {
	TTime  timeEmbed `gguf:"t_time_embed"`
	RTime  timeEmbed `gguf:"r_time_embed"`
	InProj nn.Linear `gguf:"input_embed.proj"`
	// RoPE frequencies: checked on the host against the engine's RoPE (ropeFromInvFreq).
	InvFreq weights.Tensor `gguf:"rotary_embed.inv_freq,optional"`
	GTM     struct {
		KPrior nn.Tensor    `gguf:"k_prior"`
		VPrior nn.Tensor    `gguf:"v_prior"`
		MlpK   gtmSide      `gguf:"mlp_k"`
		MlpV   gtmSide      `gguf:"mlp_v"`
		NormK  nn.LayerNorm `gguf:"norm_k"`
		NormV  nn.LayerNorm `gguf:"norm_v"`
	} `gguf:"gtm"`
	TVT struct {
		Q    nn.Linear    `gguf:"q_proj"`
		K    nn.Linear    `gguf:"k_proj"`
		V    nn.Linear    `gguf:"v_proj"`
		Out  nn.Linear    `gguf:"out_proj"`
		Norm nn.LayerNorm `gguf:"attn_norm"`
	} `gguf:"temporal_timbre"`
	Blocks  []block   `gguf:"transformer_blocks.%d"`
	NormOut nn.Linear `gguf:"norm_out.linear"`
	ProjOut nn.Linear `gguf:"proj_out"`
}

// declare is the DiT of c with every expected shape.
func (c Config) declare() *dit {
	ff := c.FF
	if ff == 0 {
		ff = c.FFMult * c.Dim
	}
	inner := c.Heads * c.DimHead
	timeMLP := timeEmbed{nn.NewLinear(c.TimeFreqDim, c.Dim, true), nn.NewLinear(c.Dim, c.Dim, true)}
	w := &dit{
		TTime:   timeMLP,
		RTime:   timeMLP,
		InProj:  nn.NewLinear(c.MelDim+c.BNDim+c.SpkDim, c.Dim, true),
		InvFreq: weights.Tensor{Shape: []int{c.DimHead / 2}},
		Blocks:  make([]block, c.Depth),
		NormOut: nn.NewLinear(c.Dim, 2*c.Dim, true),
		ProjOut: nn.NewLinear(c.Dim, c.MelDim, true),
	}
	slots := c.GTMSlots * c.GTMHidden
	gt := &w.GTM
	gt.KPrior, gt.VPrior = nn.Shaped(c.GTMSlots, c.GTMHidden), nn.Shaped(c.GTMSlots, c.GTMHidden)
	gt.MlpK = gtmSide{nn.NewLinear(c.SpkDim, c.SpkDim, true), nn.NewLinear(c.SpkDim, slots, true)}
	gt.MlpV = gtmSide{nn.NewLinear(c.SpkDim, c.SpkDim, true), nn.NewLinear(c.SpkDim, slots, true)}
	gt.NormK, gt.NormV = nn.NewLayerNorm(c.GTMHidden), nn.NewLayerNorm(c.GTMHidden)
	tv := &w.TVT
	tv.Q = nn.NewLinear(c.BNDim, c.TVTAttnDim, true)
	tv.K = nn.NewLinear(c.GTMHidden, c.TVTAttnDim, true)
	tv.V = nn.NewLinear(c.GTMHidden, c.TVTAttnDim, true)
	tv.Out = nn.NewLinear(c.TVTAttnDim, c.BNDim, true)
	tv.Norm = nn.NewLayerNorm(c.BNDim)
	for l := range w.Blocks {
		w.Blocks[l] = block{
			Mod: nn.NewLinear(c.Dim, 6*c.Dim, true),
			Q:   nn.NewLinear(c.Dim, inner, true), K: nn.NewLinear(c.Dim, inner, true), V: nn.NewLinear(c.Dim, inner, true),
			QNorm: nn.NewRMSNorm(c.DimHead), KNorm: nn.NewRMSNorm(c.DimHead),
			Out: nn.NewLinear(inner, c.Dim, true),
			FF1: nn.NewLinear(c.Dim, ff, true), FF2: nn.NewLinear(ff, c.Dim, true),
		}
	}
	return w
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

// DiT is a loaded MeanVC2 conversion model: weights in persistent engine buffers shared by
// every State (stream).
type DiT struct {
	Config  Config
	backend engine.Backend

	w        *dit
	qkv      []*nn.Linear // per block, its q, k and v projections as one Linear (nil: separate)
	ropeDims int64
	ropeBase float32

	mu       sync.Mutex // serialises the GTM program (Timbre may be called from any stream)
	gtmCache *engine.Cache
	// progMu serialises the step programs (each has one set of input buffers), kept in progs
	// by batch size and options: shared by every State, since a State's caches are inputs.
	progMu sync.Mutex
	progs  *engine.Cache
	names  [MaxBatch]stepNames // the step programs' per-session input and output names
	times  []timeCond          // per (t, r) of Config.Timesteps, computed at load
}

// timeCond is what one (t, r) of the schedule gives every DiT call: the two time embeddings
// (for traces), every layer's AdaLN modulation and the output modulation. They depend on
// (t, r) alone, so they are computed once, at load, not in every call of every stream (the
// modulation weights are 4 × 6 MB at real size: reading them per call cost ~0.4 ms).
type timeCond struct {
	tEmb, rEmb []float32 // [dim] each
	// mod [depth, 6·dim] (per block: shift, scale, gate for attention, then for the MLP) and
	// fin [2·dim] (scale, then shift) hold every scale as 1 + scale, the factor AdaLN
	// multiplies by: added once here, not by two nodes per block in every DiT call.
	mod []float32
	fin []float32
}

// timeConds runs the time program for every (t, r) of the schedule (Config.Timesteps).
func (d *DiT) timeConds() ([]timeCond, error) {
	g := d.buildTime()
	if err := g.Err(); err != nil {
		return nil, err
	}
	prog, err := d.backend.Compile(g)
	if err != nil {
		return nil, err
	}
	defer prog.Close()
	var out []timeCond
	for _, ts := range d.Config.Timesteps {
		timeFreq(prog.Input("t_freq"), ts[0], d.Config.TimeScale)
		timeFreq(prog.Input("r_freq"), ts[1], d.Config.TimeScale)
		if err := prog.Run(); err != nil {
			return nil, err
		}
		cp := func(name string) []float32 { return slices.Clone(prog.Output(name)) }
		tc := timeCond{tEmb: cp("t_time_embed"), rEmb: cp("r_time_embed"), mod: cp("mod"), fin: cp("fin")}
		dim := d.Config.Dim
		onePlus := func(x []float32) {
			for i := range x {
				x[i]++
			}
		}
		for l := range d.Config.Depth {
			row := tc.mod[l*6*dim:]
			onePlus(row[dim : 2*dim])   // scale_msa
			onePlus(row[4*dim : 5*dim]) // scale_mlp
		}
		onePlus(tc.fin[:dim])
		out = append(out, tc)
	}
	return out, nil
}

// buildTime: the time embeddings of t and r (sinusoids t_freq, r_freq [1, freq] → MLP), and
// from SiLU(t_emb + r_emb) every block's modulation (mod [depth, 6·dim]) and norm_out's (fin).
func (d *DiT) buildTime() *engine.Graph {
	c := d.Config
	g := engine.NewGraph("meanvc2.time")
	tf := g.Input("t_freq", engine.F32, 1, int64(c.TimeFreqDim))
	rf := g.Input("r_freq", engine.F32, 1, int64(c.TimeFreqDim))
	g.Label("time_embed")
	w := d.w
	te := func(f engine.Tensor, mlp *timeEmbed) engine.Tensor {
		return mlp.L2.Forward(g, g.SiLU(mlp.L0.Forward(g, f)))
	}
	tEmb, rEmb := te(tf, &w.TTime), te(rf, &w.RTime)
	g.Output("t_time_embed", tEmb)
	g.Output("r_time_embed", rEmb)
	silu := g.SiLU(g.Add(tEmb, rEmb)) // [1, dim]
	mods := make([]engine.Tensor, len(w.Blocks))
	for l := range w.Blocks {
		g.Label(fmt.Sprintf("transformer_blocks.%d.modulation", l))
		mods[l] = w.Blocks[l].Mod.Forward(g, silu) // [1, 6·dim]
	}
	g.Output("mod", g.Concat(0, mods...))
	g.Label("norm_out")
	g.Output("fin", w.NormOut.Forward(g, silu))
	return g
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
	w := cfg.declare()
	w.InvFreq.Shape = []int{-1} // checked by ropeFromInvFreq
	if err := nn.Bind(src, backend, w); err != nil {
		return nil, fmt.Errorf("meanvc2: load: %w", err)
	}
	d := &DiT{Config: cfg, backend: backend, w: w, ropeDims: int64(cfg.DimHead), ropeBase: float32(cfg.RopeBase),
		names: newStepNames(cfg.Depth)}
	d.qkv = make([]*nn.Linear, len(w.Blocks))
	var err error
	for l := range w.Blocks {
		b := &w.Blocks[l]
		if d.qkv[l], err = nn.FuseLinears(backend, fmt.Sprintf("vc.transformer_blocks.%d.attn.qkv", l), &b.Q, &b.K, &b.V); err != nil {
			d.Close()
			return nil, fmt.Errorf("meanvc2: load: %w", err)
		}
	}
	if w.InvFreq.Present() {
		base, dims, err := ropeFromInvFreq(w.InvFreq.Data, cfg.DimHead)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("meanvc2: load: rotary_embed.inv_freq: %w", err)
		}
		d.ropeBase, d.ropeDims = base, dims
	}
	d.gtmCache = engine.NewCache(backend, 1)
	d.progs = engine.NewCache(backend, maxStepPrograms)
	if d.times, err = d.timeConds(); err != nil {
		d.Close()
		return nil, fmt.Errorf("meanvc2: load: time conditioning: %w", err)
	}
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
	if d.progs != nil {
		d.progs.Close()
	}
	for _, f := range d.qkv {
		if f != nil {
			f.Free()
		}
	}
	nn.Free(d.w)
}

// stepOpts selects a DiT call program: commit writes the new K/V rows into the caches
// (the last call of a step); trace exposes the intermediate stages.
type stepOpts struct{ commit, trace bool }

// stepNames are the names of one session's inputs and outputs in a batched step program:
// session 0 keeps the plain names (the single-session program's), session b > 0 gets a ".b"
// suffix. Made once at load, so a step formats no names.
type stepNames struct {
	qpos                         string
	k, v, knew, vnew, kpos, mask []string // per layer
}

func newStepNames(depth int) [MaxBatch]stepNames {
	var out [MaxBatch]stepNames
	for b := range out {
		sfx := ""
		if b > 0 {
			sfx = fmt.Sprintf(".%d", b)
		}
		n := &out[b]
		n.qpos = "qpos" + sfx
		for l := range depth {
			n.k = append(n.k, fmt.Sprintf("k%d%s", l, sfx))
			n.v = append(n.v, fmt.Sprintf("v%d%s", l, sfx))
			n.knew = append(n.knew, fmt.Sprintf("knew%d%s", l, sfx))
			n.vnew = append(n.vnew, fmt.Sprintf("vnew%d%s", l, sfx))
			n.kpos = append(n.kpos, fmt.Sprintf("kpos%d%s", l, sfx))
			n.mask = append(n.mask, fmt.Sprintf("mask%d%s", l, sfx))
		}
	}
	return out
}

// buildStep is one DiT call over the Window() frames of a step for B sessions at once: every
// projection and MLP reads its weights once for all B·W rows, each session attends over its
// own caches with its own positions and masks. Inputs: x [B·W, mel], cond [B·W, bn], spk
// [B, spk], gtm_k/gtm_v [B·slots, hidden], mod [depth, 6·dim] and fin [1, 2·dim] (the call's
// time conditioning, shared: every session of a batch is at the same call of its step), and
// per session b (d.names[b]): qpos [W], per layer kpos{l} [cap+W], mask{l} [W, cap+W],
// k{l} and v{l} [H, cap, Dh] (the cache, valid rows at the end: older rows are masked; keys
// after RMSNorm, before RoPE). Output u [B·W, mel]; a commit also outputs every cache shifted
// by the chunk's rows (knew{l}, vnew{l}). Each session's rows are bit for bit what it gets
// alone (Graph.SetRowGroups and row-wise ops).
func (d *DiT) buildStep(B int, o stepOpts) *engine.Graph {
	c := d.Config
	W, H, Dh := int64(c.Window()), int64(c.Heads), int64(c.DimHead)
	nb := int64(B)
	chunk := int64(c.ChunkSize)
	g := engine.NewGraph(fmt.Sprintf("meanvc2.dit[B=%d,commit=%v,trace=%v]", B, o.commit, o.trace))
	g.SetRowGroups(B)
	x := g.Input("x", engine.F32, nb*W, int64(c.MelDim))
	cond := g.Input("cond", engine.F32, nb*W, int64(c.BNDim))
	spk := g.Input("spk", engine.F32, nb, int64(c.SpkDim))
	slots := int64(c.GTMSlots)
	gk := g.Input("gtm_k", engine.F32, nb*slots, int64(c.GTMHidden))
	gv := g.Input("gtm_v", engine.F32, nb*slots, int64(c.GTMHidden))
	qpos := make([]engine.Tensor, B)
	for b := range B {
		qpos[b] = g.Input(d.names[b].qpos, engine.I32, W)
	}
	trace := func(name string, t engine.Tensor) {
		if o.trace {
			g.Output(name, t)
		}
	}
	rows := func(t engine.Tensor, b int, n int64) engine.Tensor { return g.Slice(t, 0, int64(b)*n, int64(b+1)*n) }
	perSession := func(f func(b int) engine.Tensor) engine.Tensor { // B results stacked on axis 0
		ts := make([]engine.Tensor, B)
		for b := range B {
			ts[b] = f(b)
		}
		return g.Concat(0, ts...)
	}

	// The AdaLN modulations depend on (t, r) alone: computed once per model, scales as 1 + scale
	// (timeCond).
	mods := g.Input("mod", engine.F32, int64(c.Depth), 6*int64(c.Dim))
	finMod := g.Input("fin", engine.F32, 1, 2*int64(c.Dim))
	w := d.w

	g.Label("temporal_timbre")
	th := int64(c.TVTHeads)
	tdh := int64(c.TVTAttnDim) / th
	split := func(t engine.Tensor, n int64) engine.Tensor { // [n, A] → [1, th, n, tdh]
		return g.Permute(g.Reshape(t, 1, n, th, tdh), 0, 2, 1, 3)
	}
	tq := w.TVT.Q.Forward(g, cond)
	tk := w.TVT.K.Forward(g, gk)
	tv := w.TVT.V.Forward(g, gv)
	ta := perSession(func(b int) engine.Tensor {
		a := g.Attention(split(rows(tq, b, W), W), split(rows(tk, b, slots), slots), split(rows(tv, b, slots), slots), nil, nil,
			float32(1/math.Sqrt(float64(tdh))))
		return g.Reshape(g.Permute(a, 0, 2, 1, 3), W, int64(c.TVTAttnDim))
	})
	timbre := w.TVT.Norm.Forward(g, w.TVT.Out.Forward(g, ta), float32(c.LNEps))
	trace("temporal_timbre", timbre)

	g.Label("input_embed")
	spkRows := perSession(func(b int) engine.Tensor { return g.Expand(rows(spk, b, 1), W, int64(c.SpkDim)) })
	h := w.InProj.Forward(g, g.Concat(1, x, timbre, spkRows))
	trace("input_embed", h)

	dim := int64(c.Dim)
	adaEps := float32(c.AdaEps)
	// modulate is LN(h; no affine)·(1+scale)+shift; the inputs hold 1+scale (timeCond).
	modulate := func(h, shift, onePlusScale engine.Tensor) engine.Tensor {
		return g.Add(g.Mul(g.LayerNorm(h, nil, nil, adaEps), onePlusScale), shift)
	}
	heads := func(t engine.Tensor, norm *nn.RMSNorm) engine.Tensor { // [B·W, H·Dh] → [B·W, H, Dh]
		t = g.Reshape(t, nb*W, H, Dh)
		if norm != nil {
			t = norm.Forward(g, t, float32(c.RMSEps))
		}
		return t
	}
	session := func(t engine.Tensor, b int) engine.Tensor { // session b's [W, H, Dh] → [1, H, W, Dh]
		return g.Permute(g.Reshape(rows(t, b, W), 1, W, H, Dh), 0, 2, 1, 3)
	}
	for l := range w.Blocks {
		blk := &w.Blocks[l]
		g.Label(fmt.Sprintf("transformer_blocks.%d", l))
		capL := int64(c.CacheFrames(l))
		mod := g.Slice(mods, 0, int64(l), int64(l)+1) // [1, 6·dim]
		part := func(i int64) engine.Tensor { return g.Slice(mod, 1, i*dim, (i+1)*dim) }
		shiftMSA, scaleMSA, gateMSA := part(0), part(1), part(2)
		shiftMLP, scaleMLP, gateMLP := part(3), part(4), part(5)

		n := modulate(h, shiftMSA, scaleMSA)
		qkv := nn.ForwardFused(g, d.qkv[l], n, &blk.Q, &blk.K, &blk.V)
		qs, ks, vs := heads(qkv[0], &blk.QNorm), heads(qkv[1], &blk.KNorm), heads(qkv[2], nil)
		att := perSession(func(b int) engine.Tensor {
			nm := &d.names[b]
			kpos := g.Input(nm.kpos[l], engine.I32, capL+W)
			mask := g.Input(nm.mask[l], engine.F32, W, capL+W)
			ck := g.Reshape(g.Input(nm.k[l], engine.F32, H, capL, Dh), 1, H, capL, Dh)
			cv := g.Reshape(g.Input(nm.v[l], engine.F32, H, capL, Dh), 1, H, capL, Dh)
			q, k, v := session(qs, b), session(ks, b), session(vs, b)
			kAll := g.Concat(2, ck, k)
			vAll := g.Concat(2, cv, v)
			if o.commit {
				// The cache keeps the newest cap rows of [cache ‖ the chunk's rows]; the
				// lookahead rows are never cached.
				shift := func(cache, cur engine.Tensor, name string) {
					rows := g.Slice(cur, 2, 0, chunk)
					if capL > chunk {
						rows = g.Concat(2, g.Slice(cache, 2, chunk, capL), rows)
					}
					g.Output(name, g.Reshape(rows, H, capL, Dh))
				}
				shift(ck, k, nm.knew[l])
				shift(cv, v, nm.vnew[l])
			}
			qr := g.RoPE(q, qpos[b], d.ropeDims, engine.RoPEInterleaved, d.ropeBase)
			kr := g.RoPE(kAll, kpos, d.ropeDims, engine.RoPEInterleaved, d.ropeBase)
			a := g.Attention(qr, kr, vAll, &mask, nil, float32(1/math.Sqrt(float64(Dh))))
			return g.Reshape(g.Permute(a, 0, 2, 1, 3), W, H*Dh)
		})
		h = g.Add(h, g.Mul(gateMSA, blk.Out.Forward(g, att)))

		n2 := modulate(h, shiftMLP, scaleMLP)
		ff := blk.FF2.Forward(g, g.GELU(blk.FF1.Forward(g, n2), true))
		h = g.Add(h, g.Mul(gateMLP, ff))
		trace(fmt.Sprintf("block%d", l), h)
	}

	g.Label("norm_out")
	h = modulate(h, g.Slice(finMod, 1, dim, 2*dim), g.Slice(finMod, 1, 0, dim)) // fin: scale, then shift
	trace("norm_out", h)
	g.Label("proj_out")
	g.Output("u", w.ProjOut.Forward(g, h))
	return g
}
