package engine

import (
	"fmt"
	"unsafe"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

// Vulkan runs programs on a Vulkan device (a GPU, or Mesa's lavapipe on the CPU). Compile
// plans a graph like the CPU backend (one arena by liveness, here one device-local
// allocation; inputs and outputs in host-visible buffers; persistent buffers in device memory,
// allocated by Alloc) and records every node as a dispatch into one command buffer that Run
// submits once. Today the ops with shaders are Copy, the unary and binary ops and Matmul
// (Linear with F32 weights) over views of up to 4 axes; a graph with any other op, or a
// weight in another encoding, is a compile error naming it, so a caller can keep that
// model on the CPU.
type Vulkan struct {
	dev *vulkan.Device
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

// Close implements Backend; every buffer and program must be freed before.
func (v *Vulkan) Close() { v.dev.Close() }

// vkMem is a device-local allocation.
type vkMem struct {
	dev *vulkan.Device
	b   *vulkan.Buffer
}

func (m vkMem) Bytes() int64 { return int64(m.b.Len()) * 4 }
func (m vkMem) Free()        { m.b.Free() }

// Write copies p through a host-visible staging buffer (whole float32 values only).
func (m vkMem) Write(off int64, p []byte) error {
	if off < 0 || off%4 != 0 || len(p)%4 != 0 || off+int64(len(p)) > m.Bytes() {
		return fmt.Errorf("engine: write of %d bytes at %d into %d bytes of device memory", len(p), off, m.Bytes())
	}
	if len(p) == 0 {
		return nil
	}
	st, err := m.dev.Alloc(len(p)/4, true)
	if err != nil {
		return err
	}
	defer st.Free()
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(st.Float32s()))), len(p)), p)
	return st.CopyRange(0, m.b, int(off/4), len(p)/4)
}

// Alloc implements Backend: F32 and I32 buffers in device-local memory (the shaders read
// no other encoding yet).
func (v *Vulkan) Alloc(name string, dtype DType, shape ...int64) (*Buffer, error) {
	if dtype != F32 && dtype != I32 {
		return nil, fmt.Errorf("engine: buffer %q: %s weights are not on Vulkan yet (F32 only)", name, dtypeName(dtype))
	}
	return AllocBuffer(func(bytes int64) (Memory, error) {
		b, err := v.dev.Alloc(int((bytes+3)/4), false)
		if err != nil {
			return nil, err
		}
		return vkMem{dev: v.dev, b: b}, nil
	}, name, dtype, shape...)
}

type vulkanProgram struct {
	prog    *vulkan.Program
	arena   *vulkan.Buffer
	io      map[string]*vulkan.Buffer
	inputs  map[string]int
	outputs map[string]int
	stats   PlanStats
}

// Compile implements Backend.
func (v *Vulkan) Compile(g *Graph) (Program, error) {
	p, err := planMemory(g, false)
	if err != nil {
		return nil, err
	}
	prog := &vulkanProgram{io: map[string]*vulkan.Buffer{}, inputs: g.inputs, outputs: g.outputs}
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
			buf[id] = m.b
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
	operand := func(id int) vulkan.Tensor {
		t := &g.tensors[id]
		r := p.root[id]
		return vulkan.Tensor{Buf: buf[r], Off: base[r] + int(t.offset), Shape: t.shape, Stride: t.stride}
	}
	var ds []vulkan.Dispatch
	for i, nd := range g.nodes {
		var d vulkan.Dispatch
		var err error
		dst := operand(nd.dst)
		switch nd.op {
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
			err = fmt.Errorf("op %s has no Vulkan shader yet", opName(nd.op))
		}
		if err == nil {
			for _, s := range append([]int{nd.dst}, nd.src...) {
				if dt := g.tensors[s].dtype; dt != F32 {
					err = fmt.Errorf("op %s on a %s tensor: the shaders take F32", opName(nd.op), dtypeName(dt))
				}
			}
		}
		if err != nil {
			return fail(fmt.Errorf("node %d (%s): %w", i, nd.label, err))
		}
		ds = append(ds, d)
	}
	if prog.prog, err = v.dev.NewProgram(ds); err != nil {
		return fail(err)
	}
	prog.stats.Nodes = len(ds)
	prog.stats.ArenaBytes, prog.stats.NaiveBytes, prog.stats.PersistentBytes = p.arenaBytes, p.naiveBytes, p.persistentBytes
	return prog, nil
}

func (p *vulkanProgram) Run() error { return p.prog.Run() }

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
	for _, b := range p.io {
		b.Free()
	}
	p.io = nil
}
