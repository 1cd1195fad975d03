package qwen3

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// layer is one decoder layer (Hugging Face names under model.layers.N).
type layer struct {
	InNorm   nn.RMSNorm `gguf:"input_layernorm"`
	Q        nn.Linear  `gguf:"self_attn.q_proj"`
	K        nn.Linear  `gguf:"self_attn.k_proj"`
	V        nn.Linear  `gguf:"self_attn.v_proj"`
	O        nn.Linear  `gguf:"self_attn.o_proj"`
	QNorm    nn.RMSNorm `gguf:"self_attn.q_norm"`
	KNorm    nn.RMSNorm `gguf:"self_attn.k_norm"`
	PostNorm nn.RMSNorm `gguf:"post_attention_layernorm"`
	Gate     nn.Linear  `gguf:"mlp.gate_proj"`
	Up       nn.Linear  `gguf:"mlp.up_proj"`
	Down     nn.Linear  `gguf:"mlp.down_proj"`
}

// lm is the whole model. The output head is read by rows (SetOutputRows) as well as by
// Linear, so it is a row table like the embedding; lm_head is only read when embeddings are
// not tied.
type lm struct {
	Embed  nn.Embedding `gguf:"model.embed_tokens"`
	Layers []layer      `gguf:"model.layers.%d"`
	Norm   nn.RMSNorm   `gguf:"model.norm"`
	Head   nn.Rows      `gguf:"lm_head.weight,optional"`
}

// declare is the model of c with every expected shape.
func (c Config) declare() *lm {
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	w := &lm{Embed: nn.NewEmbedding(c.Vocab, c.Hidden), Layers: make([]layer, c.Layers), Norm: nn.NewRMSNorm(c.Hidden)}
	if !c.TieEmbed {
		w.Head = nn.NewEmbedding(c.Vocab, c.Hidden).Weight
	}
	for i := range w.Layers {
		w.Layers[i] = layer{
			InNorm: nn.NewRMSNorm(c.Hidden),
			Q:      nn.NewLinear(c.Hidden, q, false), K: nn.NewLinear(c.Hidden, kv, false),
			V: nn.NewLinear(c.Hidden, kv, false), O: nn.NewLinear(q, c.Hidden, false),
			QNorm: nn.NewRMSNorm(c.HeadDim), KNorm: nn.NewRMSNorm(c.HeadDim),
			PostNorm: nn.NewRMSNorm(c.Hidden),
			Gate:     nn.NewLinear(c.Hidden, c.FFN, false), Up: nn.NewLinear(c.Hidden, c.FFN, false),
			Down: nn.NewLinear(c.FFN, c.Hidden, false),
		}
	}
	return w
}

func (c Config) validate() error {
	switch {
	case c.Hidden <= 0, c.Layers <= 0, c.Heads <= 0, c.KVHeads <= 0, c.HeadDim <= 0, c.FFN <= 0, c.Vocab <= 0:
		return fmt.Errorf("qwen3: config has a non-positive dimension: %+v", c)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("qwen3: %d attention heads are not a multiple of %d KV heads", c.Heads, c.KVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("qwen3: head_dim %d is odd (RoPE needs pairs)", c.HeadDim)
	case c.RMSEps <= 0 || c.RopeTheta <= 0:
		return fmt.Errorf("qwen3: rms_norm_eps %g and rope_theta %g must be positive", c.RMSEps, c.RopeTheta)
	}
	return nil
}

// Model is a loaded Qwen3 causal LM: its config and its weights in the backend's buffers,
// shared by every Session.
type Model struct {
	Config  Config
	backend engine.Backend
	w       *lm
	embed   *engine.Buffer // [Vocab, Hidden], also the output head when tied
	head    *engine.Buffer // [Vocab, Hidden]; == embed when tied
	// Per layer, q, k and v (and gate and up) as one product each where the weights stack
	// (host weights in one encoding), else nil: a decode step reads the same bytes in fewer,
	// wider products, which stream the weights faster than narrow ones. The separate
	// weights are freed once fused.
	qkv, gateUp []*nn.Linear
	kvType      engine.DType // the KV caches' encoding for new sessions (SetKVCache)

	mu         sync.Mutex
	restricted []restrictedHead // output heads made by SetOutputRows, shared by sessions

	batchMu sync.Mutex    // one StepBatch at a time: its programs are not reentrant
	batch   *engine.Cache // StepBatch's programs, keyed by their sessions and cache lengths
}

// restrictedHead is the head for one row set: gathered once per model, not per session.
type restrictedHead struct {
	rows []int32
	buf  *engine.Buffer
}

// ParseConfig reads a Hugging Face config.json. An eos_token_id list keeps its first id;
// rope_scaling is not supported.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return c, fmt.Errorf("qwen3: config.json: %w", err)
	}
	if e := raw["eos_token_id"]; len(e) > 0 && e[0] == '[' {
		var ids []int
		if err := json.Unmarshal(e, &ids); err != nil || len(ids) == 0 {
			return c, fmt.Errorf("qwen3: config.json: eos_token_id %s", e)
		}
		raw["eos_token_id"], _ = json.Marshal(ids[0])
		data, _ = json.Marshal(raw)
	}
	if rs := raw["rope_scaling"]; len(rs) > 0 && string(rs) != "null" {
		return c, fmt.Errorf("qwen3: config.json: rope_scaling %s is not supported", rs)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("qwen3: config.json: %w", err)
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	return c, c.validate()
}

// Load opens an audio.cpp-packaged GGUF (config.json embedded, Hugging Face tensor names at
// the root) and copies its weights into persistent buffers for backend.
func Load(path string, backend engine.Backend) (*Model, error) {
	f, err := gguf.OpenModel(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, ok := f.EmbeddedFile("config.json")
	if !ok {
		return nil, fmt.Errorf("qwen3: %s: no embedded config.json", path)
	}
	cfg, err := ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	return FromSource(cfg, f, backend)
}

// FromSource builds a Model from a config and a weight source.
func FromSource(cfg Config, src weights.Source, backend engine.Backend) (*Model, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := cfg.declare()
	if err := nn.Bind(src, backend, w); err != nil {
		return nil, fmt.Errorf("qwen3: %w", err)
	}
	m := &Model{Config: cfg, backend: backend, w: w, embed: w.Embed.Weight.Buf, head: w.Embed.Weight.Buf, kvType: DefaultKVCache(backend)}
	if err := m.fuse(); err != nil {
		m.Close()
		return nil, fmt.Errorf("qwen3: %w", err)
	}
	if !cfg.TieEmbed {
		m.head = w.Head.Buf
	} else if w.Head.Present() {
		w.Head.Buf.Free() // tied: a stored lm_head is not read
		w.Head.Buf = nil
	}
	return m, nil
}

// fuse stacks each layer's q, k and v weights, and its gate and up weights, into one Linear
// and frees the separate ones (a layer at a time, so loading peaks at one layer's extra).
func (m *Model) fuse() error {
	m.qkv = make([]*nn.Linear, len(m.w.Layers))
	m.gateUp = make([]*nn.Linear, len(m.w.Layers))
	for i := range m.w.Layers {
		lb := &m.w.Layers[i]
		for _, f := range []struct {
			dst  **nn.Linear
			name string
			ls   []*nn.Linear
		}{
			{&m.qkv[i], "self_attn.qkv_proj", []*nn.Linear{&lb.Q, &lb.K, &lb.V}},
			{&m.gateUp[i], "mlp.gate_up_proj", []*nn.Linear{&lb.Gate, &lb.Up}},
		} {
			fused, err := nn.FuseLinears(m.backend, fmt.Sprintf("model.layers.%d.%s", i, f.name), f.ls...)
			if err != nil {
				return err
			}
			if *f.dst = fused; fused != nil {
				for _, l := range f.ls {
					nn.Free(l)
				}
			}
		}
	}
	return nil
}

// Close frees the weight buffers; no session of the model may run afterwards.
func (m *Model) Close() {
	nn.Free(m.w)
	for _, l := range slices.Concat(m.qkv, m.gateUp) {
		if l != nil {
			l.Free()
		}
	}
	m.qkv, m.gateUp = nil, nil
	m.mu.Lock()
	for _, h := range m.restricted {
		h.buf.Free()
	}
	m.restricted = nil
	m.mu.Unlock()
	m.batchMu.Lock()
	if m.batch != nil {
		m.batch.Close()
	}
	m.batchMu.Unlock()
}

// restrictedHead returns the output head holding rows, in that order, making it on first
// use. The rows are copied as stored, so a quantised head stays quantised (Q8_0 rows are
// interleaved for the decode kernel).
func (m *Model) restrictedHead(rows []int32) (*engine.Buffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range m.restricted {
		if slices.Equal(h.rows, rows) {
			return h.buf, nil
		}
	}
	hid := m.Config.Hidden
	dt := m.head.DType()
	rb := int(m.head.Bytes()) / m.Config.Vocab
	src := m.head.Raw() // nil on a GPU: the rows are read back, runs of consecutive rows at once
	data := make([]byte, len(rows)*rb)
	for i := 0; i < len(rows); {
		r := rows[i]
		if r < 0 || int(r) >= m.Config.Vocab {
			return nil, fmt.Errorf("qwen3: output row %d outside the vocabulary of %d", r, m.Config.Vocab)
		}
		n := 1
		for i+n < len(rows) && rows[i+n] == r+int32(n) && int(r)+n < m.Config.Vocab {
			n++
		}
		dst := data[i*rb : (i+n)*rb]
		if src != nil {
			copy(dst, src[int(r)*rb:])
		} else if err := m.head.Read(int64(r)*int64(rb), dst); err != nil {
			return nil, fmt.Errorf("qwen3: output head rows: %w", err)
		}
		i += n
	}
	// In the layout the CPU's Linear kernels read fastest, as models/nn loads a Linear.
	if packed := map[engine.DType]engine.DType{engine.Q8_0: engine.Q8_0R8, engine.F16: engine.F16P, engine.F32: engine.F32P}[dt]; packed != 0 && engine.Accepts(m.backend, packed) {
		dt = packed
	}
	buf, err := engine.UploadRaw(m.backend, "lm_head.restricted", dt, data, int64(len(rows)), int64(hid))
	if err != nil {
		return nil, err
	}
	// Kept until Close: sessions may hold it, and callers use one or two row sets.
	m.restricted = append(m.restricted, restrictedHead{slices.Clone(rows), buf})
	return buf, nil
}

// DefaultKVCache is the KV cache encoding a model on backend starts with: F16 on the CPU,
// where decoding many streams spends a fifth of its time reading the caches (half the bytes
// is nearly half that time; the values keep 11 significant bits, as llama.cpp's default
// cache does), F32 on the GPU backends, whose attention shaders read F32.
func DefaultKVCache(backend engine.Backend) engine.DType {
	if _, cpu := backend.(*engine.CPU); cpu {
		return engine.F16
	}
	return engine.F32
}

// SetKVCache sets the encoding of the KV caches of sessions made from now on: F32 (the
// reference's precision) or F16 (CPU backend only). Set it before sessions are made from
// several goroutines (at load); sessions already made keep theirs.
func (m *Model) SetKVCache(dt engine.DType) error {
	switch {
	case dt == engine.F32:
	case dt == engine.F16 && DefaultKVCache(m.backend) == engine.F16:
	case dt == engine.F16:
		return fmt.Errorf("qwen3: an F16 KV cache runs on the CPU only: attention on the %s backend reads F32 (use f32 or auto)", m.backend.Name())
	default:
		return fmt.Errorf("qwen3: a KV cache of %s: F16 or F32 only", engine.DTypeName(dt))
	}
	m.kvType = dt
	return nil
}

// KVCache is the encoding of new sessions' KV caches.
func (m *Model) KVCache() engine.DType { return m.kvType }

// KVCacheUsage documents the values SetKVCacheName takes.
const KVCacheUsage = "auto (f16 on the CPU, f32 on a GPU), f16 or f32"

// SetKVCacheName is SetKVCache by name (KVCacheUsage); "" is auto.
func (m *Model) SetKVCacheName(name string) error {
	dt, auto, err := ParseKVCache(name)
	if err != nil {
		return err
	}
	if auto {
		dt = DefaultKVCache(m.backend)
	}
	return m.SetKVCache(dt)
}

// ParseKVCache reads a KV cache name (KVCacheUsage): its encoding, or auto for the backend's
// default ("" too).
func ParseKVCache(name string) (dt engine.DType, auto bool, err error) {
	switch name {
	case "", "auto":
		return engine.F32, true, nil
	case "f16":
		return engine.F16, false, nil
	case "f32":
		return engine.F32, false, nil
	}
	return engine.F32, false, fmt.Errorf("qwen3: KV cache %q: want %s", name, KVCacheUsage)
}

// Session is one generation: a KV cache of MaxT positions and the programs compiled for it.
// A Session is used by one goroutine at a time.
type Session struct {
	m      *Model
	id     uint64 // names the session in StepBatch's program keys
	maxT   int
	pos    int              // positions already in the cache
	kc, vc []*engine.Buffer // per layer [KVHeads, MaxT, HeadDim]
	cache  *engine.Cache
	head   *engine.Buffer // restricted output rows [R, Hidden] (SetOutputRows), or nil
	logits []float32
	trace  bool                 // programs also output the embeddings and every layer's residual
	hidden map[string][]float32 // the traced tensors of the last call
	busy   time.Duration        // PrefillTime
}

// PrefillTime is the backend time the session's prefills have taken so far: their programs'
// own run time, without the waits for the backend while other programs ran (the wall time
// where the backend cannot tell). It is what the prefills cost the backend's other users.
func (s *Session) PrefillTime() time.Duration { return s.busy }

// maxPrograms bounds the compiled programs a session keeps (one per (tokens, cache bucket)).
const maxPrograms = 256

// NewSession makes a session whose KV cache holds maxTokens positions in all (prompt plus
// generated tokens).
func (m *Model) NewSession(maxTokens int) (*Session, error) {
	c := m.Config
	if maxTokens <= 0 {
		return nil, fmt.Errorf("qwen3: session of %d tokens", maxTokens)
	}
	if c.MaxPos > 0 && maxTokens > c.MaxPos {
		return nil, fmt.Errorf("qwen3: session of %d tokens exceeds max_position_embeddings %d", maxTokens, c.MaxPos)
	}
	s := &Session{m: m, id: sessionIDs.Add(1), maxT: maxTokens, cache: engine.NewCache(m.backend, maxPrograms)}
	for i := range c.Layers {
		k, err := m.backend.Alloc(fmt.Sprintf("kv.%d.k", i), m.kvType, int64(c.KVHeads), int64(maxTokens), int64(c.HeadDim))
		if err != nil {
			s.Close()
			return nil, err
		}
		s.kc = append(s.kc, k)
		v, err := m.backend.Alloc(fmt.Sprintf("kv.%d.v", i), m.kvType, int64(c.KVHeads), int64(maxTokens), int64(c.HeadDim))
		if err != nil {
			s.Close()
			return nil, err
		}
		s.vc = append(s.vc, v)
	}
	return s, nil
}

// MaxTokens is the session's KV cache capacity in positions.
func (s *Session) MaxTokens() int { return s.maxT }

// Pos is the number of positions in the KV cache.
func (s *Session) Pos() int { return s.pos }

// Reset empties the KV cache (the compiled programs are kept).
func (s *Session) Reset() { s.pos = 0 }

// Close frees the cache and the programs.
func (s *Session) Close() {
	if s.cache != nil {
		s.cache.Close()
		s.m.forgetBatch(s) // before its caches are freed: batch programs write them
	}
	s.head = nil // owned by the model
	for _, b := range s.kc {
		b.Free()
	}
	for _, b := range s.vc {
		b.Free()
	}
	s.kc, s.vc, s.cache = nil, nil, nil
}

// KCache and VCache are layer i's caches, [KVHeads, MaxT, HeadDim] row-major (keys after
// k_norm and RoPE); positions [0, Pos()) are valid. An F32 cache on the CPU shares the
// cache's memory (valid until Close); an F16 one, or one on a GPU, is a copy.
func (s *Session) KCache(i int) []float32 { return values(s.kc[i]) }
func (s *Session) VCache(i int) []float32 { return values(s.vc[i]) }

// values is a cache's contents, read back from a GPU when it lives there (nil on failure).
func values(b *engine.Buffer) []float32 {
	v, _ := b.Values()
	return v
}

// Prefill feeds ids at positions Pos()..Pos()+len(ids)-1 and returns the logits of the last
// one (over the whole vocabulary, or the rows chosen by SetOutputRows; a slice owned by the
// session, valid until the next call).
func (s *Session) Prefill(ids []int32) ([]float32, error) {
	t := len(ids)
	if t == 0 {
		return nil, fmt.Errorf("qwen3: prefill of no tokens")
	}
	if err := s.checkTokens(ids); err != nil {
		return nil, err
	}
	p := s.pos
	prog, l, err := s.program(t, p)
	if err != nil {
		return nil, err
	}
	copy(prog.InputInt32("ids"), ids)
	pos := prog.InputInt32("pos")
	for i := range pos {
		pos[i] = int32(p + i)
	}
	// Causal additive mask over the cache bucket [0, l): row i sees positions ≤ p+i; the rest
	// of the bucket (not yet written) is masked too.
	mask := prog.Input("mask")
	for i := range t {
		causalRow(mask[i*l:(i+1)*l], p+i)
	}
	t0 := time.Now()
	if err := prog.Run(); err != nil {
		return nil, err
	}
	if rt, ok := prog.(engine.RunTimer); ok {
		s.busy += rt.LastRun()
	} else {
		s.busy += time.Since(t0)
	}
	s.pos += t
	s.logits = append(s.logits[:0], prog.Output("logits")...)
	if s.trace {
		s.hidden = map[string][]float32{"embed": slices.Clone(prog.Output("embed"))}
		for i := range s.m.w.Layers {
			name := fmt.Sprintf("layer%d", i)
			s.hidden[name] = slices.Clone(prog.Output(name))
		}
	}
	return s.logits, nil
}

// causalRow fills one row of an additive attention mask over the cache: positions up to
// last are seen (0), the rest of the bucket is not (−Inf).
func causalRow(row []float32, last int) {
	ninf := float32(math.Inf(-1))
	for j := range row {
		if j <= last {
			row[j] = 0
		} else {
			row[j] = ninf
		}
	}
}

// Trace makes the following calls also keep the token embeddings ("embed") and each
// layer's residual stream ("layer0", ...) for all their tokens, read with Hidden: for
// golden checks, not for serving.
func (s *Session) Trace(on bool) { s.trace = on }

// Hidden returns a traced tensor of the last call, [tokens, Hidden], or nil.
func (s *Session) Hidden(name string) []float32 { return s.hidden[name] }

// SetOutputRows restricts the logits to the given vocabulary rows, in that order (for
// MioTTS: the speech tokens and EOS), so the output head multiplies R rows instead of the
// whole vocabulary; nil restores the full vocabulary. The head for a row set is made once
// per model and shared by its sessions. Changing the head drops the compiled programs
// (they are rebuilt for the new head); the KV cache is kept.
func (s *Session) SetOutputRows(rows []int32) error {
	if s.cache == nil {
		return fmt.Errorf("qwen3: session is closed")
	}
	var head *engine.Buffer
	if rows != nil {
		if len(rows) == 0 {
			return fmt.Errorf("qwen3: empty output row set")
		}
		var err error
		if head, err = s.m.restrictedHead(rows); err != nil {
			return err
		}
	}
	if head == s.head {
		return nil // same head: the compiled programs stay valid
	}
	s.cache.Close()
	s.m.forgetBatch(s) // its batch programs multiply by the old head too
	s.head = head
	return nil
}

// ProgramStats compiles (or finds) the program for t tokens at position p and returns its
// memory statistics.
func (s *Session) ProgramStats(t, p int) (engine.PlanStats, error) {
	prog, _, err := s.program(t, p)
	if err != nil {
		return engine.PlanStats{}, err
	}
	return prog.Stats(), nil
}

// bucket is the granularity of the attended cache length: one program serves every position
// whose cache fits the same bucket.
const bucket = 64

// attendLen is the cache length a program attends when its last new token is at position
// end-1: end rounded up to a bucket, at most the cache.
func (s *Session) attendLen(end int) int { return min(s.maxT, (end+bucket-1)/bucket*bucket) }

// checkTokens reports why ids cannot be fed next: a closed session, a cache they overflow,
// an id outside the vocabulary.
func (s *Session) checkTokens(ids []int32) error {
	if s.cache == nil {
		return fmt.Errorf("qwen3: session is closed")
	}
	if s.pos+len(ids) > s.maxT {
		return fmt.Errorf("qwen3: %d tokens at position %d overflow the %d-position cache", len(ids), s.pos, s.maxT)
	}
	vocab := int32(s.m.Config.Vocab)
	for _, id := range ids {
		if id < 0 || id >= vocab {
			return fmt.Errorf("qwen3: token id %d outside the vocabulary of %d", id, vocab)
		}
	}
	return nil
}

// program returns the program for t new tokens at position p and the cache length it attends.
func (s *Session) program(t, p int) (engine.Program, int, error) {
	if t <= 0 || p < 0 || p+t > s.maxT {
		return nil, 0, fmt.Errorf("qwen3: %d tokens at position %d do not fit the %d-position cache", t, p, s.maxT)
	}
	l := s.attendLen(p + t)
	key := fmt.Sprintf("T%d/L%d", t, l)
	if s.trace {
		key += "/trace"
	}
	prog, err := s.cache.Get(key, func() (*engine.Graph, error) {
		g := s.build(t, l)
		return g, g.Err()
	})
	return prog, l, err
}

// Step feeds one token at position Pos() and returns its logits (see Prefill).
func (s *Session) Step(id int32) ([]float32, error) { return s.Prefill([]int32{id}) }

// build makes the graph for t new tokens at the positions of the "pos" input, attending over
// cache[0, l) under the "mask" input. The new keys (after k_norm and RoPE) and values are
// written into the cache rows given by "pos" (ScatterRows), so one program serves every
// position whose cache fits l.
func (s *Session) build(t, l int) *engine.Graph {
	c := s.m.Config
	T, L := int64(t), int64(l)
	KV, D, maxT := int64(c.KVHeads), int64(c.HeadDim), int64(s.maxT)

	g := engine.NewGraph(fmt.Sprintf("qwen3[T=%d,L=%d]", t, l))
	ids := g.Input("ids", engine.I32, T)
	pos := g.Input("pos", engine.I32, T)
	mask := g.Input("mask", engine.F32, T, L)
	x := s.m.w.Embed.Forward(g, ids) // [T, Hidden]
	if s.trace {
		g.Output("embed", x)
	}
	// store writes the new rows y [1, KV, T, D] into the cache rows given by pos of every KV
	// head and returns the attended cache view [1, KV, L, D].
	store := func(buf *engine.Buffer, y engine.Tensor) engine.Tensor {
		cb := g.Persistent(buf) // [KV, MaxT, D]
		g.ScatterRows(cb, g.Reshape(y, KV, T, D), pos)
		return g.Slice(g.Reshape(cb, 1, KV, maxT, D), 2, 0, L)
	}
	attend := func(i int, q, k, v engine.Tensor) engine.Tensor {
		return g.Attention(q, store(s.kc[i], k), store(s.vc[i], v), &mask, nil, 0)
	}
	var trace func(int, engine.Tensor)
	if s.trace {
		trace = func(i int, x engine.Tensor) { g.Output(fmt.Sprintf("layer%d", i), x) }
	}
	x = s.m.layers(g, x, pos, attend, trace)
	g.Label("head")
	last := s.m.w.Norm.Forward(g, g.Slice(x, 0, T-1, T), float32(c.RMSEps))
	g.Output("logits", g.Linear(last, g.Persistent(s.m.outputHead(s)), nil))
	return g
}

// outputHead is the head s's logits come from: its restricted rows, or the whole vocabulary.
func (m *Model) outputHead(s *Session) *engine.Buffer {
	if s.head != nil {
		return s.head
	}
	return m.head
}

// layers runs x [T, Hidden] — T tokens of one session, or one token of each of T sessions —
// through the decoder layers at positions pos [T]. attend gets layer i's queries
// [1, H, T, D] and new keys and values [1, KV, T, D] (normed, rotated) and returns the
// attention output [1, H, T, D]: it is what differs between one session and a batch. after,
// if not nil, sees each layer's output.
func (m *Model) layers(g *engine.Graph, x, pos engine.Tensor, attend func(i int, q, k, v engine.Tensor) engine.Tensor, after func(i int, x engine.Tensor)) engine.Tensor {
	c := m.Config
	T := x.Dim(0)
	H, KV, D := int64(c.Heads), int64(c.KVHeads), int64(c.HeadDim)
	eps, theta := float32(c.RMSEps), float32(c.RopeTheta)
	// heads turns [T, n·D] into [1, n, T, D] (a view) after a per-head RMSNorm if norm != nil.
	heads := func(y engine.Tensor, n int64, norm *nn.RMSNorm) engine.Tensor {
		y = g.Reshape(y, T, n, D)
		if norm != nil {
			y = norm.Forward(g, y, eps)
		}
		return g.Permute(g.Reshape(y, 1, T, n, D), 0, 2, 1, 3)
	}
	for i := range m.w.Layers {
		lb := &m.w.Layers[i]
		g.Label(fmt.Sprintf("model.layers.%d", i))
		h := lb.InNorm.Forward(g, x, eps)
		qkv := nn.ForwardFused(g, m.qkv[i], h, &lb.Q, &lb.K, &lb.V)
		q := g.RoPE(heads(qkv[0], H, &lb.QNorm), pos, D, engine.RoPEHalf, theta)
		k := g.RoPE(heads(qkv[1], KV, &lb.KNorm), pos, D, engine.RoPEHalf, theta)
		v := heads(qkv[2], KV, nil)
		att := g.Reshape(g.Permute(attend(i, q, k, v), 0, 2, 1, 3), T, H*D)
		x = g.Add(x, lb.O.Forward(g, att))

		h2 := lb.PostNorm.Forward(g, x, eps)
		gu := nn.ForwardFused(g, m.gateUp[i], h2, &lb.Gate, &lb.Up)
		mlp := g.Mul(g.SiLU(gu[0]), gu[1])
		x = g.Add(x, lb.Down.Forward(g, mlp))
		if after != nil {
			after(i, x)
		}
	}
	return x
}
