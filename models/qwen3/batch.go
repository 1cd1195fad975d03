package qwen3

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/voxpipe/voxpipe/engine"
)

// Batched decoding: one program computes the next token's logits for several sessions at
// once. A decode step of one session multiplies a single row by every weight matrix, so its
// cost is reading the weights; B sessions stepping together share that read (one product of
// B rows per projection), while each attends over its own KV cache at its own position.

// MaxBatch is the most sessions one StepBatch runs together.
const MaxBatch = 16

// maxBatchPrograms bounds the batch programs kept: one per set of sessions and cache
// lengths, so a set that steps together compiles again only when one of its sessions moves
// to the next cache bucket or the set changes.
const maxBatchPrograms = 32

// maskInputs are the batch programs' mask input names, one per session (made once: StepBatch
// fills them every decode step).
var maskInputs = func() (names [MaxBatch]string) {
	for i := range names {
		names[i] = fmt.Sprintf("mask%d", i)
	}
	return names
}()

// sessionIDs numbers sessions for the batch program keys.
var sessionIDs atomic.Uint64

// StepBatch feeds ids[i] to sessions[i] at its position Pos() and returns each session's
// logits (a slice owned by the session, as Step's, valid until its next call). The sessions
// must be distinct, of this model, open, and share one output head (SetOutputRows). One
// session alone runs its own Step program. The logits equal Step's up to the rounding of
// the matrix kernels, which may differ between one row and several.
func (m *Model) StepBatch(sessions []*Session, ids []int32) ([][]float32, error) {
	n := len(sessions)
	if n == 0 || n != len(ids) {
		return nil, fmt.Errorf("qwen3: batch of %d sessions and %d ids", n, len(ids))
	}
	if n > MaxBatch {
		return nil, fmt.Errorf("qwen3: batch of %d sessions (at most %d)", n, MaxBatch)
	}
	if n == 1 {
		if sessions[0].m != m {
			return nil, errors.New("qwen3: session of another model")
		}
		l, err := sessions[0].Step(ids[0])
		return [][]float32{l}, err
	}
	// The program is the same for the same sessions in any order: run them sorted by id.
	ord := make([]int, n)
	for i := range ord {
		ord[i] = i
	}
	slices.SortFunc(ord, func(a, b int) int { return cmp.Compare(sessions[a].id, sessions[b].id) })
	sorted := make([]*Session, n)
	for j, i := range ord {
		sorted[j] = sessions[i]
	}
	ls := make([]int, n)
	var key strings.Builder
	key.WriteString("batch")
	for j, s := range sorted {
		if s.m != m {
			return nil, errors.New("qwen3: session of another model")
		}
		if err := s.checkTokens(ids[ord[j] : ord[j]+1]); err != nil {
			return nil, err
		}
		switch {
		case j > 0 && sorted[j-1] == s:
			return nil, errors.New("qwen3: a session twice in one batch")
		case s.head != sorted[0].head:
			return nil, errors.New("qwen3: sessions with different output rows in one batch")
		case s.trace:
			return nil, errors.New("qwen3: traced sessions step alone")
		}
		ls[j] = s.attendLen(s.pos + 1)
		fmt.Fprintf(&key, "/%d:%d", s.id, ls[j])
	}

	m.batchMu.Lock()
	defer m.batchMu.Unlock()
	if m.batch == nil {
		m.batch = engine.NewCache(m.backend, maxBatchPrograms)
	}
	prog, err := m.batch.Get(key.String(), func() (*engine.Graph, error) {
		g := m.buildBatch(sorted, ls)
		return g, g.Err()
	})
	if err != nil {
		return nil, err
	}
	in, pos := prog.InputInt32("ids"), prog.InputInt32("pos")
	for j, s := range sorted {
		in[j] = ids[ord[j]]
		pos[j] = int32(s.pos)
		causalRow(prog.Input(maskInputs[j]), s.pos) // [1, L]: the cache up to the new token
	}
	if err := prog.Run(); err != nil {
		return nil, err
	}
	all := prog.Output("logits") // [n, rows]
	r := len(all) / n
	out := make([][]float32, n)
	for j, s := range sorted {
		s.pos++
		s.logits = append(s.logits[:0], all[j*r:(j+1)*r]...)
		out[ord[j]] = s.logits
	}
	return out, nil
}

// forgetBatch drops the batch programs that use s's caches.
func (m *Model) forgetBatch(s *Session) {
	m.batchMu.Lock()
	defer m.batchMu.Unlock()
	if m.batch == nil {
		return
	}
	tag := fmt.Sprintf("/%d:", s.id)
	m.batch.Remove(func(key string) bool { return strings.Contains(key, tag) })
}

// buildBatch is build for one new token of each session: the rows of all sessions go through
// the projections and the MLP together; session b's keys and values are written into its
// own caches at pos[b] and its query attends over the first ls[b] positions under "mask{b}".
func (m *Model) buildBatch(sessions []*Session, ls []int) *engine.Graph {
	c := m.Config
	B := int64(len(sessions))
	KV, D := int64(c.KVHeads), int64(c.HeadDim)

	g := engine.NewGraph(fmt.Sprintf("qwen3.batch[B=%d]", B))
	ids := g.Input("ids", engine.I32, B)
	pos := g.Input("pos", engine.I32, B)
	masks := make([]engine.Tensor, B)
	for b := range masks {
		masks[b] = g.Input(maskInputs[b], engine.F32, 1, int64(ls[b]))
	}
	x := m.w.Embed.Forward(g, ids) // [B, Hidden]: one row per session, in the place of tokens

	// store writes session b's new row of y [1, KV, B, D] into its cache buf at pos[b] and
	// returns the attended cache view [1, KV, L, D].
	store := func(buf *engine.Buffer, y engine.Tensor, b int64) engine.Tensor {
		maxT := buf.Shape()[1]
		cb := g.Persistent(buf) // [KV, MaxT, D]
		g.ScatterRows(cb, g.Reshape(g.Slice(y, 2, b, b+1), KV, 1, D), g.Slice(pos, 0, b, b+1))
		return g.Slice(g.Reshape(cb, 1, KV, maxT, D), 2, 0, int64(ls[b]))
	}
	att := make([]engine.Tensor, B)
	attend := func(i int, q, k, v engine.Tensor) engine.Tensor {
		for b, s := range sessions {
			bb := int64(b)
			att[b] = g.Attention(g.Slice(q, 2, bb, bb+1), store(s.kc[i], k, bb), store(s.vc[i], v, bb), &masks[b], nil, 0) // [1, H, 1, D]
		}
		return g.Concat(2, att...)
	}
	x = m.layers(g, x, pos, attend, nil)
	g.Label("head")
	g.Output("logits", g.Linear(m.w.Norm.Forward(g, x, float32(c.RMSEps)), g.Persistent(m.outputHead(sessions[0])), nil))
	return g
}
