package engine

import (
	"fmt"
	"slices"
)

// arenaAlign is the alignment of every arena allocation (a cache line; enough for AVX-512).
const arenaAlign = 64

// plan is a graph compiled for memory: where every intermediate lives in the arena.
type plan struct {
	g *Graph
	// root maps each tensor to the storage it reads and writes: views to their base, in-place
	// results to the storage they overwrite.
	root []int
	// offset is the arena byte offset of each root intermediate storage (-1: not in the arena).
	offset []int64
	// def and last are the node indices where each root storage is first written and last
	// read (after in-place merging).
	def, last []int

	arenaBytes, naiveBytes, persistentBytes int64
}

// storageBytes is the size of a storage tensor's memory.
func (g *Graph) storageBytes(id int) int64 {
	return (numel(g.tensors[id].shape)*4 + arenaAlign - 1) &^ (arenaAlign - 1)
}

func (g *Graph) inArena(id int) bool {
	t := &g.tensors[id]
	return t.kind == kindIntermediate && !t.view && t.output == ""
}

// planMemory assigns arena offsets by liveness (best fit, coalescing free blocks), running
// elementwise nodes in place when their first source dies there. naive disables both and gives
// every intermediate its own memory: the reference the planner is tested against.
func planMemory(g *Graph, naive bool) (*plan, error) {
	if g.err != nil {
		return nil, g.err
	}
	n := len(g.tensors)
	p := &plan{g: g, root: make([]int, n), offset: make([]int64, n), def: make([]int, n), last: make([]int, n)}
	for i := range n {
		p.root[i] = g.tensors[i].base
		p.offset[i] = -1
		p.def[i], p.last[i] = -1, -1
	}
	// First pass: where each storage is written and last read.
	for i, nd := range g.nodes {
		for _, s := range nd.src {
			p.last[p.root[s]] = i
		}
		if r := p.root[nd.dst]; p.def[r] < 0 {
			p.def[r] = i
		}
	}
	for i := range n {
		if p.def[i] >= 0 && p.last[i] < p.def[i] {
			p.last[i] = p.def[i] // written, never read: dies where it is born
		}
	}
	// Second pass: in place when the source's storage dies at this node.
	if !naive {
		for i, nd := range g.nodes {
			if !nd.alias || !g.inArena(nd.dst) {
				continue
			}
			src := nd.src[0]
			r := p.root[src]
			st := &g.tensors[src]
			if !g.inArena(r) || p.last[r] != i || !isContiguous(st) || st.offset != 0 ||
				numel(st.shape) != numel(g.tensors[r].shape) || numel(st.shape) != numel(g.tensors[nd.dst].shape) {
				continue
			}
			// Every other source of this node must not share r (a read after write in place).
			shared := false
			for _, o := range nd.src[1:] {
				shared = shared || p.root[o] == r
			}
			if shared {
				continue
			}
			d := nd.dst
			for t := range n { // the result and its views now live in r
				if p.root[t] == d {
					p.root[t] = r
				}
			}
			p.last[r] = max(p.last[r], p.last[d])
			p.def[d], p.last[d] = -1, -1
		}
	}
	// Naive size: every intermediate storage on its own.
	persistent := map[*Buffer]bool{}
	for id := range n {
		if g.inArena(id) && g.tensors[id].base == id {
			p.naiveBytes += g.storageBytes(id)
		}
		if b := g.tensors[id].persist; b != nil && !persistent[b] {
			persistent[b] = true
			p.persistentBytes += b.Bytes()
		}
	}
	if naive {
		var off int64
		for id := range n {
			if g.inArena(id) && p.root[id] == id && p.def[id] >= 0 {
				p.offset[id] = off
				off += g.storageBytes(id)
			}
		}
		p.arenaBytes = off
		return p, nil
	}
	// Allocate in execution order; free after each storage's last reader.
	var free freeList
	dies := make([][]int, len(g.nodes))
	for id := range n {
		if g.inArena(id) && p.root[id] == id && p.def[id] >= 0 {
			dies[p.last[id]] = append(dies[p.last[id]], id)
		}
	}
	for i, nd := range g.nodes {
		if r := p.root[nd.dst]; g.inArena(r) && p.def[r] == i && p.offset[r] < 0 {
			p.offset[r] = free.alloc(g.storageBytes(r))
		}
		for _, id := range dies[i] {
			free.release(p.offset[id], g.storageBytes(id))
		}
	}
	p.arenaBytes = free.top
	return p, nil
}

// freeList is a best-fit allocator over one growing arena.
type freeList struct {
	blocks []block // sorted by offset, coalesced
	top    int64   // arena size so far
}

type block struct{ off, size int64 }

func (f *freeList) alloc(size int64) int64 {
	best := -1
	for i, b := range f.blocks {
		if b.size >= size && (best < 0 || b.size < f.blocks[best].size) {
			best = i
		}
	}
	if best >= 0 {
		b := &f.blocks[best]
		off := b.off
		b.off += size
		b.size -= size
		if b.size == 0 {
			f.blocks = slices.Delete(f.blocks, best, best+1)
		}
		return off
	}
	// Grow the arena, starting inside a free block that ends at the top.
	if k := len(f.blocks) - 1; k >= 0 && f.blocks[k].off+f.blocks[k].size == f.top {
		off := f.blocks[k].off
		f.blocks = f.blocks[:k]
		f.top = off + size
		return off
	}
	off := f.top
	f.top += size
	return off
}

func (f *freeList) release(off, size int64) {
	i, _ := slices.BinarySearchFunc(f.blocks, off, func(b block, o int64) int { return int(b.off - o) })
	f.blocks = slices.Insert(f.blocks, i, block{off, size})
	// Coalesce with the neighbours.
	if i+1 < len(f.blocks) && f.blocks[i].off+f.blocks[i].size == f.blocks[i+1].off {
		f.blocks[i].size += f.blocks[i+1].size
		f.blocks = slices.Delete(f.blocks, i+1, i+2)
	}
	if i > 0 && f.blocks[i-1].off+f.blocks[i-1].size == f.blocks[i].off {
		f.blocks[i-1].size += f.blocks[i].size
		f.blocks = slices.Delete(f.blocks, i, i+1)
	}
}

// validate checks that no two arena storages that are alive at the same time overlap. The
// tests run it on random and model-shaped graphs.
func (p *plan) validate() error {
	type live struct {
		id         int
		from, to   int
		start, end int64
	}
	var ls []live
	for id := range p.g.tensors {
		if p.root[id] == id && p.offset[id] >= 0 {
			ls = append(ls, live{id, p.def[id], p.last[id], p.offset[id], p.offset[id] + p.g.storageBytes(id)})
		}
	}
	for i := range ls {
		if ls[i].end > p.arenaBytes {
			return fmt.Errorf("storage %d [%d, %d) beyond arena %d", ls[i].id, ls[i].start, ls[i].end, p.arenaBytes)
		}
		for j := i + 1; j < len(ls); j++ {
			a, b := ls[i], ls[j]
			timeOverlap := a.from <= b.to && b.from <= a.to
			memOverlap := a.start < b.end && b.start < a.end
			if timeOverlap && memOverlap {
				return fmt.Errorf("storages %d (nodes %d–%d, bytes %d–%d) and %d (nodes %d–%d, bytes %d–%d) overlap",
					a.id, a.from, a.to, a.start, a.end, b.id, b.from, b.to, b.start, b.end)
			}
		}
	}
	return nil
}
