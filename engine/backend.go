package engine

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/voxpipe/voxpipe/cgo"
)

// Backend compiles graphs into programs for one kind of device. The CPU backend is the first;
// a Vulkan or CUDA backend keeps the same contract with the arena and the persistent buffers
// on the device and submits a whole program at once.
type Backend interface {
	Name() string
	// Alloc (Allocator) places weights and state where the backend's programs read them.
	Allocator
	Compile(g *Graph) (Program, error)
	Close()
}

// Program is a compiled graph: fill the inputs, Run, read the outputs. One Run is one call
// into the device. A Program is used by one goroutine at a time.
type Program interface {
	Run() error
	// Input is the memory of a float32 input (InputInt32 for int32 ones); write it before Run.
	Input(name string) []float32
	InputInt32(name string) []int32
	// Output is the memory of an output, valid until the next Run.
	Output(name string) []float32
	Stats() PlanStats
	Close()
}

// RunTimer is a Program that knows how long its last Run computed, not counting the wait for
// the backend while another program ran (the CPU's): what a run costs the other users of a
// shared backend.
type RunTimer interface {
	LastRun() time.Duration
}

// PlanStats describe a compiled program's memory.
type PlanStats struct {
	Nodes int `json:"nodes"`
	// ArenaBytes is the one block all intermediates share by liveness; NaiveBytes is what
	// they would take each on its own.
	ArenaBytes int64 `json:"arena_bytes"`
	NaiveBytes int64 `json:"naive_bytes"`
	// PersistentBytes are the buffers the program reads or writes that outlive it (weights,
	// caches, constants), counted once each.
	PersistentBytes int64 `json:"persistent_bytes"`
	IOBytes         int64 `json:"io_bytes"`
	// Barriers (Vulkan) is how many of the nodes wait for earlier ones; the rest may overlap
	// the node before them on a GPU.
	Barriers int `json:"barriers,omitempty"`
}

// CPU runs programs on this machine's cores with the C kernels.
type CPU struct {
	ctx     *cgo.Context
	naive   bool
	unfused bool
}

// SetFusion chooses whether programs compiled after it fold elementwise chains into the
// Linear or LayerNorm before them (fuseEpilogues; the default) or run every node on its own
// (for comparison).
func (c *CPU) SetFusion(on bool) { c.unfused = !on }

// OpTime is the time the backend's programs spent in one kind of op while it was profiled.
type OpTime struct {
	Op    string
	Calls int64
	Time  time.Duration
}

// ShapeTime is the time profiled runs spent in one kind of op with given operand shapes (the
// node's first two sources; nil when absent).
type ShapeTime struct {
	Op       string
	In0, In1 []int64
	Calls    int64
	Time     time.Duration
}

// StartProfile makes every following run time each node, until StopProfile, which returns
// the time per kind of op and per kind of op and operand shapes, most first (for the bench
// commands' --profile).
func (b *CPU) StartProfile() { b.ctx.StartProfile() }

// StopProfile: see StartProfile.
func (b *CPU) StopProfile() ([]OpTime, []ShapeTime) {
	ops, shapes := b.ctx.StopProfileShapes()
	var out []OpTime
	for _, t := range ops {
		out = append(out, OpTime{Op: opName(t.Op), Calls: t.Calls, Time: t.Time})
	}
	var byShape []ShapeTime
	for _, t := range shapes {
		byShape = append(byShape, ShapeTime{Op: opName(t.Op), In0: t.In0, In1: t.In1, Calls: t.Calls, Time: t.Time})
	}
	return out, byShape
}

// NewCPU returns a CPU backend using threads cores (≤ 0: one).
func NewCPU(threads int) (*CPU, error) {
	ctx, err := cgo.NewContext(max(threads, 1))
	if err != nil {
		return nil, err
	}
	return &CPU{ctx: ctx}, nil
}

// Name implements Backend.
func (c *CPU) Name() string { return fmt.Sprintf("cpu(%d threads)", c.ctx.Threads()) }

// Threads is the size of the context's thread pool: the cores one program run occupies.
func (c *CPU) Threads() int { return c.ctx.Threads() }

// Close implements Backend.
func (c *CPU) Close() { c.ctx.Close() }

// Alloc implements Backend: the CPU reads host memory.
func (c *CPU) Alloc(name string, dtype DType, shape ...int64) (*Buffer, error) {
	return Host.Alloc(name, dtype, shape...)
}

type cpuProgram struct {
	ctx     *cgo.Context
	plan    *cgo.Plan
	arena   *cgo.Buffer
	io      map[string]*cgo.Buffer
	inputs  map[string]int
	outputs map[string]int
	stats   PlanStats
}

// Compile implements Backend.
func (c *CPU) Compile(g *Graph) (Program, error) {
	if !c.unfused {
		g = fuseEpilogues(g)
	}
	p, err := planMemory(g, c.naive)
	if err != nil {
		return nil, err
	}
	prog := &cpuProgram{ctx: c.ctx, io: map[string]*cgo.Buffer{}, inputs: g.inputs, outputs: g.outputs}
	fail := func(err error) (Program, error) {
		prog.Close()
		return nil, fmt.Errorf("engine: %s: compile: %w", g.name, err)
	}
	if prog.arena, err = cgo.Alloc(int(p.arenaBytes)); err != nil {
		return fail(err)
	}
	// Each storage's memory: arena slot, input/output buffer, or persistent buffer.
	base := make([]unsafe.Pointer, len(g.tensors))
	for id, t := range g.tensors {
		if p.root[id] != id {
			continue
		}
		switch {
		case t.kind == kindPersistent:
			h, ok := t.persist.mem.(hostMem)
			if !ok {
				return fail(fmt.Errorf("buffer %q is not in host memory (allocate it with this backend)", t.persist.name))
			}
			base[id] = h.b.Ptr()
		case t.kind == kindInput || t.output != "":
			name := t.name
			if t.output != "" {
				name = "out:" + t.output
			}
			b, err := cgo.Alloc(int(numel(t.shape)) * 4)
			if err != nil {
				return fail(err)
			}
			prog.io[name] = b
			prog.stats.IOBytes += int64(b.Bytes())
			base[id] = b.Ptr()
		case p.offset[id] >= 0:
			base[id] = unsafe.Add(prog.arena.Ptr(), p.offset[id])
		}
	}
	tensors := make([]cgo.Tensor, len(g.tensors))
	for id, t := range g.tensors {
		var data unsafe.Pointer
		if b := base[p.root[id]]; b != nil {
			data = unsafe.Add(b, t.offset*elemBytes(t.dtype)) // views: F32, I32 or F16
		}
		tensors[id] = cgo.Tensor{Data: data, DType: t.dtype, Shape: t.shape, Stride: t.stride}
	}
	nodes := make([]cgo.Node, len(g.nodes))
	for i, nd := range g.nodes {
		nodes[i] = cgo.Node{Op: nd.op, Src: nd.src, Dst: nd.dst, IP: nd.ip, FP: nd.fp}
	}
	if prog.plan, err = cgo.NewPlan(nodes, tensors); err != nil {
		return fail(err)
	}
	prog.stats.Nodes = len(nodes)
	prog.stats.ArenaBytes, prog.stats.NaiveBytes, prog.stats.PersistentBytes = p.arenaBytes, p.naiveBytes, p.persistentBytes
	return prog, nil
}

func (p *cpuProgram) Run() error { return p.ctx.Execute(p.plan) }

// LastRun: see RunTimer.
func (p *cpuProgram) LastRun() time.Duration { return p.plan.LastRun() }

func (p *cpuProgram) Input(name string) []float32 {
	if b := p.io[name]; b != nil {
		return b.Float32s()
	}
	return nil
}

func (p *cpuProgram) InputInt32(name string) []int32 {
	if b := p.io[name]; b != nil {
		return b.Int32s()
	}
	return nil
}

func (p *cpuProgram) Output(name string) []float32 {
	if b := p.io["out:"+name]; b != nil {
		return b.Float32s()
	}
	return nil
}

func (p *cpuProgram) Stats() PlanStats { return p.stats }

func (p *cpuProgram) Close() {
	if p.plan != nil {
		p.plan.Free()
	}
	p.arena.Free()
	for _, b := range p.io {
		b.Free()
	}
	p.io = nil
}
