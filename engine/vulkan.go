package engine

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

// Vulkan runs programs on a Vulkan device (a GPU, or Mesa's lavapipe on the CPU). Compile
// plans a graph like the CPU backend (one arena by liveness, here one device-local
// allocation; inputs and outputs in host-visible buffers; persistent buffers in device memory,
// allocated by Alloc) and records every node as a dispatch into one command buffer that Run
// submits once, with barriers only where a node depends on an earlier one. Every op of the
// engine has a shader (this file lowers the first ones; vulkan_*.go the rest), over views of
// up to 4 axes; weights stay in their file encoding (F32, F16, BF16, Q8_0, Q4_K), those too
// large for one buffer in parts (vulkan_parts.go). What a shader cannot take is a compile
// error naming the node, its label and op.
type Vulkan struct {
	dev *vulkan.Device

	timed     bool  // programs compiled from now on record timestamps (EnableTimestamps)
	partLimit int64 // LimitBufferBytes
	profiling atomic.Bool
	profMu    sync.Mutex
	prof      map[profKey]*ShapeTime // StartProfile's accumulated node times
}

type profKey struct{ op, in0, in1 string }

// EnableTimestamps makes the programs compiled from now on time each node on the device
// (where its queue has timestamps), for StartProfile; call it before loading a model to
// profile. Timestamps cost a little on every run.
func (v *Vulkan) EnableTimestamps() { v.timed = true }

// StartProfile collects the node times of the following runs of timed programs (see
// EnableTimestamps), until StopProfile.
func (v *Vulkan) StartProfile() {
	v.profMu.Lock()
	v.prof = map[profKey]*ShapeTime{}
	v.profMu.Unlock()
	v.profiling.Store(true)
}

// StopProfile returns the time per kind of op and per kind of op and operand shapes since
// StartProfile, most first: the device's own timestamps, not the host's wait.
func (v *Vulkan) StopProfile() ([]OpTime, []ShapeTime) {
	v.profiling.Store(false)
	v.profMu.Lock()
	defer v.profMu.Unlock()
	byOp := map[string]*OpTime{}
	var shapes []ShapeTime
	for _, s := range v.prof {
		shapes = append(shapes, *s)
		o := byOp[s.Op]
		if o == nil {
			o = &OpTime{Op: s.Op}
			byOp[s.Op] = o
		}
		o.Calls += s.Calls
		o.Time += s.Time
	}
	var ops []OpTime
	for _, o := range byOp {
		ops = append(ops, *o)
	}
	slices.SortFunc(ops, func(a, b OpTime) int { return cmp.Compare(b.Time, a.Time) })
	slices.SortFunc(shapes, func(a, b ShapeTime) int { return cmp.Compare(b.Time, a.Time) })
	return ops, shapes
}

// record adds a timed run's dispatch times to the profile.
func (v *Vulkan) record(p *vulkanProgram) {
	times, err := p.prog.Times()
	if err != nil || times == nil {
		return
	}
	v.profMu.Lock()
	defer v.profMu.Unlock()
	if v.prof == nil {
		return
	}
	for i, d := range times {
		n := p.nodes[p.dispatchNode[i]]
		k := profKey{n.Op, fmt.Sprint(n.In0), fmt.Sprint(n.In1)}
		s := v.prof[k]
		if s == nil {
			s = &ShapeTime{Op: n.Op, In0: n.In0, In1: n.In1}
			v.prof[k] = s
		}
		s.Time += d
		if i == 0 || p.dispatchNode[i-1] != p.dispatchNode[i] {
			s.Calls++
		}
	}
}

// NewVulkan opens Vulkan device index (vulkan.Devices lists them).
func NewVulkan(index int) (*Vulkan, error) {
	d, err := vulkan.Open(index)
	if err != nil {
		return nil, err
	}
	return &Vulkan{dev: d}, nil
}

// Name implements Backend.
func (v *Vulkan) Name() string { return "vulkan:" + v.dev.Info.Name }

// Device describes the device.
func (v *Vulkan) Device() vulkan.DeviceInfo { return v.dev.Info }

// MemoryInUse implements MemoryReporter: the device memory this backend's buffers and
// programs hold (weights, arenas, caches) and the host-visible memory of their inputs,
// outputs and staging.
func (v *Vulkan) MemoryInUse() (device, host int64) { return v.dev.MemoryInUse() }

// MemoryPeak implements MemoryReporter.
func (v *Vulkan) MemoryPeak() int64 { return v.dev.MemoryPeak() }

// Close implements Backend. It frees the buffers and programs still open on the device;
// freeing or closing them afterwards does nothing.
func (v *Vulkan) Close() { v.dev.Close() }

// Accepts implements EncodingChecker: the shaders read F32 and I32 values and the file
// encodings F16, BF16, Q8_0 and Q4_K (Linear weights and embedding tables), not the CPU's
// repacked layouts (Q8_0R8, F32P, F16P), which model loaders replace by the file's own.
func (v *Vulkan) Accepts(dtype DType) bool {
	switch dtype {
	case F32, I32, F16, BF16, Q8_0, Q4_K:
		return true
	}
	return false
}

// Alloc implements Backend: buffers in device-local memory, in the encodings Accepts names.
func (v *Vulkan) Alloc(name string, dtype DType, shape ...int64) (*Buffer, error) {
	if !v.Accepts(dtype) {
		return nil, fmt.Errorf("engine: buffer %q: %s is the CPU's repacked layout; Vulkan takes F32, F16, BF16, Q8_0 and Q4_K", name, dtypeName(dtype))
	}
	return AllocBuffer(func(bytes int64) (Memory, error) { return v.deviceMemory(bytes, shape) }, name, dtype, shape...)
}

// vulkanNode is a graph node's operands and parameters as a lowering sees them.
type vulkanNode struct {
	IP      [8]int64
	FP      [4]float32
	Src     []vulkan.Tensor
	SrcType []DType // Src's encodings (a quantised weight's Off counts 4-byte words)
	Dst     vulkan.Tensor
	DstType DType
}

// vulkanOperands is nd as a lowering sees it, its operands from operand.
func vulkanOperands(g *Graph, nd node, operand func(int) vulkan.Tensor) vulkanNode {
	n := vulkanNode{IP: nd.ip, FP: nd.fp, Dst: operand(nd.dst), DstType: g.tensors[nd.dst].dtype}
	for _, s := range nd.src {
		n.Src = append(n.Src, operand(s))
		n.SrcType = append(n.SrcType, g.tensors[s].dtype)
	}
	return n
}

// f32 checks that the node has lo…hi sources and that they and its destination are F32
// (the arithmetic shaders read no other encoding); roles name the sources in the error.
func (n vulkanNode) f32(op string, lo, hi int, roles ...string) error {
	if len(n.Src) < lo || len(n.Src) > hi || len(n.SrcType) != len(n.Src) {
		return fmt.Errorf("%s with %d sources (want %d to %d)", op, len(n.Src), lo, hi)
	}
	if n.DstType != F32 {
		return fmt.Errorf("%s into a %s tensor: the shader writes F32", op, dtypeName(n.DstType))
	}
	for i, dt := range n.SrcType {
		if dt != F32 {
			role := fmt.Sprintf("source %d", i)
			if i < len(roles) {
				role = roles[i]
			}
			return fmt.Errorf("%s on a %s %s: the shader takes F32", op, dtypeName(dt), role)
		}
	}
	return nil
}

// vulkanLowerings turn the nodes of an op into dispatches, for the ops whose shaders live in
// their own files (each registers itself in an init); a lowering checks its operands'
// encodings and parameters and names what it cannot run.
var vulkanLowerings = map[cgo.Op]func(n vulkanNode) ([]vulkan.Dispatch, error){}

type vulkanProgram struct {
	v    *Vulkan
	name string // the graph's, for run-time errors
	prog *vulkan.Program
	// nodes and dispatchNode name what each dispatch ran, for the profile.
	nodes        []ShapeTime
	dispatchNode []int
	arena        *vulkan.Buffer
	consts       []*vulkan.Buffer // tables the program's shaders read (RoPE cos/sin)
	prerun       []func()         // host work before each submission (the RoPE tables of the run's positions)
	io           map[string]*vulkan.Buffer
	inputs       map[string]int
	outputs      map[string]int
	stats        PlanStats
}

// Compile implements Backend.
func (v *Vulkan) Compile(g *Graph) (Program, error) {
	p, err := planMemory(g, false)
	if err != nil {
		return nil, err
	}
	prog := &vulkanProgram{v: v, name: g.name, io: map[string]*vulkan.Buffer{}, inputs: g.inputs, outputs: g.outputs}
	fail := func(err error) (Program, error) {
		prog.Close()
		return nil, fmt.Errorf("engine: %s: compile for %s: %w", g.name, v.Name(), err)
	}
	if prog.arena, err = v.dev.Alloc(int(p.arenaBytes/4)+1, false); err != nil {
		return fail(err)
	}
	// Each storage's buffer and element offset: arena slot, input/output buffer, persistent buffer.
	buf := make([]*vulkan.Buffer, len(g.tensors))
	base := make([]int, len(g.tensors))
	parted := map[int]partedTensor{} // persistent buffers held in parts, by root
	for id, t := range g.tensors {
		if p.root[id] != id {
			continue
		}
		switch {
		case t.kind == kindPersistent:
			m, ok := t.persist.mem.(vkMem)
			if !ok || m.dev != v.dev {
				return fail(fmt.Errorf("buffer %q is not in this device's memory (allocate it with this backend)", t.persist.name))
			}
			if len(m.parts) > 1 {
				rows := t.persist.shape[0]
				parted[id] = partedTensor{mem: m, rows: rows, row: t.persist.Bytes() / rows}
				continue
			}
			buf[id] = m.parts[0]
		case t.kind == kindInput || t.output != "":
			name := t.name
			if t.output != "" {
				name = "out:" + t.output
			}
			b, err := v.dev.Alloc(int(numel(t.shape)), true)
			if err != nil {
				return fail(err)
			}
			prog.io[name] = b
			prog.stats.IOBytes += int64(b.Len()) * 4
			buf[id] = b
		case p.offset[id] >= 0:
			buf[id], base[id] = prog.arena, int(p.offset[id]/4)
		}
	}
	// A view of a buffer held in parts reads the part that holds it; one that no part holds
	// has no buffer here, and lowerParted lowers its node.
	operand := func(id int) vulkan.Tensor {
		t := &g.tensors[id]
		r := p.root[id]
		o := vulkan.Tensor{Buf: buf[r], Off: base[r] + int(t.offset), Shape: t.shape, Stride: t.stride}
		if pt, ok := parted[r]; ok && (t.dtype == F32 || t.dtype == I32) {
			o, _ = pt.inOnePart(o)
		}
		return o
	}
	var ds []vulkan.Dispatch
	for i, nd := range g.nodes {
		for len(prog.dispatchNode) < len(ds) {
			prog.dispatchNode = append(prog.dispatchNode, i-1)
		}
		info := ShapeTime{Op: opName(nd.op)}
		if len(nd.src) > 0 {
			info.In0 = g.tensors[nd.src[0]].shape
		}
		if len(nd.src) > 1 {
			info.In1 = g.tensors[nd.src[1]].shape
		}
		prog.nodes = append(prog.nodes, info)
		var d vulkan.Dispatch
		var copies []vulkan.Dispatch // Concat's, each declaring its own access
		var err error
		dst := operand(nd.dst)
		if more, ok, err := lowerPartedNode(g, nd, p.root, parted, operand); ok {
			if err != nil {
				return fail(fmt.Errorf("node %d (%s, op %s): %w", i, nd.label, opName(nd.op), err))
			}
			ds = append(ds, more...)
			continue
		}
		ints := map[int]bool{} // operands that are int32 (RoPE positions)
		switch nd.op {
		case cgo.OpConcat:
			// One copy per source into its slice of the destination.
			ax := int(nd.ip[0])
			at := int64(0)
			for _, src := range nd.src {
				sv := operand(src)
				view := dst
				view.Shape = append([]int64(nil), sv.Shape...)
				view.Off += int(at * dst.Stride[ax])
				at += sv.Shape[ax]
				var c vulkan.Dispatch
				if c, err = vulkan.UnaryOp(vulkan.UCopy, sv, view, 0, 0); err != nil {
					break
				}
				copies = append(copies, c.WithAccess([]vulkan.Tensor{sv}, []vulkan.Tensor{view}))
			}
		case cgo.OpLayerNorm, cgo.OpRMSNorm:
			var w, b *vulkan.Tensor
			if len(nd.src) > 1 {
				t := operand(nd.src[1])
				w = &t
			}
			if len(nd.src) > 2 {
				t := operand(nd.src[2])
				b = &t
			}
			d, err = vulkan.NormOp(nd.op == cgo.OpRMSNorm, operand(nd.src[0]), w, b, dst, nd.fp[0])
		case cgo.OpSoftmax:
			var mask *vulkan.Tensor
			if len(nd.src) > 1 {
				t := operand(nd.src[1])
				mask = &t
			}
			scale := nd.fp[0]
			if scale == 0 {
				scale = 1
			}
			d, err = vulkan.SoftmaxOp(operand(nd.src[0]), mask, dst, scale)
		case cgo.OpRoPE:
			ints[nd.src[1]] = true
			rot := int(nd.ip[0])
			if rot == 0 {
				rot = int(dst.Shape[len(dst.Shape)-1])
			}
			var cs vulkan.Tensor
			if cs, err = prog.ropeTable(v.dev, g, p, nd.src[1], float64(nd.fp[0]), rot); err == nil {
				d, err = vulkan.RopeOp(operand(nd.src[0]), cs, dst, rot, nd.ip[1] == 1)
			}
		case cgo.OpAttention:
			var mask, bias *vulkan.Tensor
			if nd.ip[0] == 1 {
				t := operand(nd.src[3])
				mask = &t
			}
			if nd.ip[1] == 1 {
				t := operand(nd.src[4])
				bias = &t
			}
			d, err = vulkan.AttentionOp(operand(nd.src[0]), operand(nd.src[1]), operand(nd.src[2]), mask, bias, dst, nd.fp[0])
		case cgo.OpCopy:
			d, err = vulkan.UnaryOp(vulkan.UCopy, operand(nd.src[0]), dst, 0, 0)
		case cgo.OpUnary:
			d, err = vulkan.UnaryOp(int(nd.ip[0]), operand(nd.src[0]), dst, nd.fp[0], nd.fp[1])
		case cgo.OpBinary:
			d, err = vulkan.BinaryOp(int(nd.ip[0]), operand(nd.src[0]), operand(nd.src[1]), dst)
		case cgo.OpMatmul:
			var bias *vulkan.Tensor
			if len(nd.src) > 2 {
				b := operand(nd.src[2])
				bias = &b
			}
			d, err = vulkan.MatmulOp(operand(nd.src[0]), operand(nd.src[1]), bias, dst, nd.ip[0] == 1)
		default:
			lower, ok := vulkanLowerings[nd.op]
			if !ok {
				err = fmt.Errorf("op %s has no Vulkan shader yet", opName(nd.op))
				break
			}
			n := vulkanOperands(g, nd, operand)
			var more []vulkan.Dispatch
			if more, err = lower(n); err == nil {
				if len(more) == 1 && plainNode(g, nd) {
					more[0] = more[0].WithAccess(n.Src, []vulkan.Tensor{dst})
				}
				ds = append(ds, more...)
				continue
			}
		}
		if err == nil {
			for _, s := range append([]int{nd.dst}, nd.src...) {
				want := F32
				if ints[s] {
					want = I32
				}
				if dt := g.tensors[s].dtype; dt != want {
					err = fmt.Errorf("op %s on a %s tensor: the shader takes %s", opName(nd.op), dtypeName(dt), dtypeName(want))
				}
			}
		}
		if err != nil {
			return fail(fmt.Errorf("node %d (%s, op %s): %w", i, nd.label, opName(nd.op), err))
		}
		if copies != nil {
			ds = append(ds, copies...)
			continue
		}
		srcs := make([]vulkan.Tensor, len(nd.src))
		for j, s := range nd.src {
			srcs[j] = operand(s)
		}
		ds = append(ds, d.WithAccess(srcs, []vulkan.Tensor{dst}))
	}
	for len(prog.dispatchNode) < len(ds) {
		prog.dispatchNode = append(prog.dispatchNode, len(g.nodes)-1)
	}
	newProgram := v.dev.NewProgram
	if v.timed {
		newProgram = v.dev.NewTimedProgram
	}
	if prog.prog, err = newProgram(ds); err != nil {
		return fail(err)
	}
	prog.stats.Nodes, prog.stats.Barriers = len(ds), prog.prog.Barriers
	prog.stats.ArenaBytes, prog.stats.NaiveBytes, prog.stats.PersistentBytes = p.arenaBytes, p.naiveBytes, p.persistentBytes
	return prog, nil
}

// plainNode reports whether every operand of nd is F32 or I32, whose views give the values
// a dispatch touches (a quantised weight's do not).
func plainNode(g *Graph, nd node) bool {
	for _, s := range append([]int{nd.dst}, nd.src...) {
		if dt := g.tensors[s].dtype; dt != F32 && dt != I32 {
			return false
		}
	}
	return true
}

func (p *vulkanProgram) Run() error {
	for _, f := range p.prerun {
		f()
	}
	if err := p.prog.Run(); err != nil {
		// One submission runs every node: a driver's failure names no single one.
		return fmt.Errorf("engine: %s (%d dispatches in one submission): %w", p.name, p.stats.Nodes, err)
	}
	if p.v.profiling.Load() {
		p.v.record(p)
	}
	return nil
}

// ropeTable is the cos/sin table of a RoPE node, computed on the host as the CPU backend
// computes it (in double precision): before each run from positions that are a graph input,
// once at compile time from positions in a persistent buffer (a model's constant 0…T−1).
// Positions computed inside the graph are refused.
func (p *vulkanProgram) ropeTable(dev *vulkan.Device, g *Graph, pl *plan, posID int, theta float64, rot int) (vulkan.Tensor, error) {
	pos := &g.tensors[pl.root[posID]]
	view := &g.tensors[posID]
	T := int(numel(view.shape))
	off := int(view.offset)
	if pos.kind == kindPersistent {
		ids := make([]int32, T)
		if err := pos.persist.Read(int64(4*off), unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 4*T)); err != nil {
			return vulkan.Tensor{}, fmt.Errorf("RoPE positions %q: %w", pos.persist.name, err)
		}
		cs, err := dev.Alloc(T*rot, true)
		if err != nil {
			return vulkan.Tensor{}, err
		}
		p.consts = append(p.consts, cs)
		vulkan.RopeTable(cs.Float32s(), ids, theta, rot)
		return vulkan.Contiguous(cs, int64(T*rot)), nil
	}
	if pos.kind != kindInput {
		return vulkan.Tensor{}, fmt.Errorf("RoPE positions must be a graph input or a persistent buffer on Vulkan (they are computed in the graph)")
	}
	in := p.io[pos.name]
	cs, err := dev.Alloc(T*rot, true)
	if err != nil {
		return vulkan.Tensor{}, err
	}
	p.consts = append(p.consts, cs)
	p.prerun = append(p.prerun, func() {
		f := in.Float32s()
		ids := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(f))), len(f))
		vulkan.RopeTable(cs.Float32s(), ids[off:off+T], theta, rot)
	})
	return vulkan.Contiguous(cs, int64(T*rot)), nil
}

func (p *vulkanProgram) Input(name string) []float32 {
	if b := p.io[name]; b != nil {
		return b.Float32s()
	}
	return nil
}

func (p *vulkanProgram) InputInt32(name string) []int32 {
	if b := p.io[name]; b != nil {
		f := b.Float32s()
		return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(f))), len(f))
	}
	return nil
}

func (p *vulkanProgram) Output(name string) []float32 {
	if b := p.io["out:"+name]; b != nil {
		return b.Float32s()
	}
	return nil
}

func (p *vulkanProgram) Stats() PlanStats { return p.stats }

func (p *vulkanProgram) Close() {
	if p.prog != nil {
		p.prog.Close()
		p.prog = nil
	}
	if p.arena != nil {
		p.arena.Free()
		p.arena = nil
	}
	for _, b := range p.consts {
		b.Free()
	}
	p.consts = nil
	for _, b := range p.io {
		b.Free()
	}
	p.io = nil
}
