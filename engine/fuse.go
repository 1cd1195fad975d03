package engine

import (
	"slices"

	"github.com/voxpipe/voxpipe/cgo"
)

// fuseEpilogues folds chains of elementwise nodes into the Linear (quantised or packed
// weights) or LayerNorm node that produces their input, as that node's epilogue (vx.h): the
// kernel then runs the steps on each block of its output while the block is in cache. Each
// folded node is one dispatch, one wait between threads and one pass over memory less —
// the activation after a feed-forward's first Linear, a residual's gate and add after its
// last, AdaLN's scale and shift after its norm.
//
// A node folds when the value it reads comes from the chain, has no other reader, is not an
// output, and is read whole (itself or a view that regroups its rows); a Binary's other operand
// must broadcast to the output with one stride over its rows. The folded node runs where the
// chain's last node ran, so no node in between may write what it reads. The result equals
// the unfused graph's bit for bit: the same kernels run on the same values.
//
// g is left as it is; the returned graph shares its tensors.
func fuseEpilogues(g *Graph) *Graph {
	if g.err != nil {
		return g
	}
	reads := make([]int, len(g.tensors)) // per storage: how many sources read it
	reader := make([]int, len(g.tensors))
	for i, nd := range g.nodes {
		for _, s := range nd.src {
			r := g.tensors[s].base
			reads[r]++
			reader[r] = i
		}
	}
	nodes := slices.Clone(g.nodes)
	gone := make([]bool, len(nodes))
	folded := make([]bool, len(nodes)) // holds a folded node (which reads no longer what it did)
	for i := range nodes {
		nd := nodes[i]
		if gone[i] || (nd.op != cgo.OpLinearQ && nd.op != cgo.OpLayerNorm) || nd.ip[cgo.EpiIP] != 0 {
			continue
		}
		f := nd
		f.src = slices.Clone(nd.src)
		steps, unary := 0, false
		cur, at := nd.dst, i
		var chain []int
		for steps < cgo.EpiSteps {
			j, k, ok := soleReader(g, reads, reader, cur)
			if !ok {
				break
			}
			if gone[j] || folded[j] {
				break
			}
			c := nodes[j]
			shape := g.tensors[c.src[k]].shape
			if !slices.Equal(g.tensors[c.dst].shape, shape) {
				break
			}
			var code int64
			operand := -1
			switch {
			case c.op == cgo.OpUnary && !unary:
				code = cgo.EpiUnary<<8 | c.ip[0]
			case c.op == cgo.OpBinary && len(c.src) == 2:
				operand = c.src[1-k]
				if !slices.Equal(g.tensors[operand].shape, shape) || !rowBroadcast(&g.tensors[operand]) {
					break
				}
				code = int64(cgo.EpiLeft+k)<<8 | c.ip[0]
			}
			if code == 0 || writesAny(g, nodes[at+1:j], f.src) {
				break
			}
			if operand >= 0 {
				f.src = append(f.src, operand)
			} else {
				f.fp[2], f.fp[3] = c.fp[0], c.fp[1] // the unary's parameters
				unary = true
			}
			f.ip[cgo.EpiIP+1+steps] = code
			steps++
			chain = append(chain, j)
			cur, at = c.dst, j
		}
		if steps == 0 {
			continue
		}
		f.ip[cgo.EpiIP] = int64(steps)
		f.dst = cur
		f.alias = false
		gone[i] = true
		for _, j := range chain {
			gone[j] = true
		}
		nodes[at] = f
		gone[at], folded[at] = false, true
	}
	out := *g
	out.nodes = nil
	for i, nd := range nodes {
		if !gone[i] {
			out.nodes = append(out.nodes, nd)
		}
	}
	return &out
}

// soleReader is the node that reads storage id, and at which source, when it is the only
// read, id is an intermediate that is no output, and the read is of id whole: itself or a
// contiguous view of it that only regroups its rows (the same last dim).
func soleReader(g *Graph, reads, reader []int, id int) (node, src int, ok bool) {
	t := &g.tensors[id]
	if t.kind != kindIntermediate || t.view || t.output != "" || t.dtype != F32 || reads[id] != 1 {
		return 0, 0, false
	}
	node = reader[id]
	for k, s := range g.nodes[node].src {
		st := &g.tensors[s]
		if st.base == id {
			whole := s == id || (st.offset == 0 && isContiguous(st) && numel(st.shape) == numel(t.shape) &&
				len(st.shape) > 0 && len(t.shape) > 0 && st.shape[len(st.shape)-1] == t.shape[len(t.shape)-1])
			return node, k, whole
		}
	}
	return 0, 0, false
}

// rowBroadcast: o (a Binary's operand, expanded to the output's shape) has its rows — the
// leading dims flattened — one stride apart, the form an epilogue operand takes (vx.h).
func rowBroadcast(o *tensorInfo) bool {
	r := len(o.shape)
	if o.dtype != F32 || r == 0 {
		return false
	}
	rs, inner := int64(-1), int64(1)
	for d := r - 2; d >= 0; d-- {
		if o.shape[d] > 1 {
			switch {
			case rs < 0 && o.stride[d]%inner != 0:
				return false
			case rs < 0:
				rs = o.stride[d] / inner
			case o.stride[d] != rs*inner:
				return false
			}
		}
		inner *= o.shape[d]
	}
	return true
}

// writesAny reports whether one of nodes writes the storage of one of the tensors srcs.
func writesAny(g *Graph, nodes []node, srcs []int) bool {
	for _, nd := range nodes {
		w := g.tensors[nd.dst].base
		for _, s := range srcs {
			if g.tensors[s].base == w {
				return true
			}
		}
	}
	return false
}
