package engine

import (
	"fmt"
	"unsafe"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

// vkMem is a persistent buffer in device-local memory: one Vulkan buffer, or, when it is
// larger than a shader may bind (maxStorageBufferRange: 128 MiB on lavapipe and on some
// GPUs, where a 0.6B LM's embedding table is 180 MB in Q8_0 and 670 MB in F32), consecutive
// parts of whole rows, partBytes each but the last. The ops that read whole weights
// (GatherRows, Linear) run one dispatch per part; a view inside one part reads that part.
type vkMem struct {
	dev       *vulkan.Device
	parts     []*vulkan.Buffer
	partBytes int64 // bytes of every part but the last (a multiple of 4)
}

func (m vkMem) Bytes() int64 {
	n := int64(0)
	for _, p := range m.parts {
		n += int64(p.Len()) * 4
	}
	return n
}

func (m vkMem) Free() {
	for _, p := range m.parts {
		p.Free()
	}
}

// pieces calls f for each part that bytes [off, off+n) of m cross, with the part, the range's
// offset in it and the range's bytes [from, to) relative to off.
func (m vkMem) pieces(off, n int64, f func(b *vulkan.Buffer, at, from, to int64) error) error {
	if off < 0 || n < 0 || off+n > m.Bytes() {
		return fmt.Errorf("engine: %d bytes at %d of %d bytes of device memory", n, off, m.Bytes())
	}
	for i, p := range m.parts {
		lo := int64(i) * m.partBytes
		hi := lo + int64(p.Len())*4
		a, b := max(off, lo), min(off+n, hi)
		if a >= b {
			continue
		}
		if err := f(p, a-lo, a-off, b-off); err != nil {
			return err
		}
	}
	return nil
}

// Write copies p through host-visible staging, a part at a time.
func (m vkMem) Write(off int64, p []byte) error {
	return m.pieces(off, int64(len(p)), func(b *vulkan.Buffer, at, from, to int64) error {
		return writeDevice(m.dev, b, at, p[from:to])
	})
}

// Read copies bytes back from device memory through host-visible staging.
func (m vkMem) Read(off int64, p []byte) error {
	return m.pieces(off, int64(len(p)), func(b *vulkan.Buffer, at, from, to int64) error {
		return readDevice(m.dev, b, at, p[from:to])
	})
}

// writeDevice copies p into b from byte off; a range that does not start or end on a 4-byte
// word keeps the bytes it shares a word with (the copies move whole words).
func writeDevice(dev *vulkan.Device, b *vulkan.Buffer, off int64, p []byte) error {
	return staged(dev, b, off, int64(len(p)), func(st *vulkan.Buffer, lo, hi int64) error {
		if lo != off || hi != off+int64(len(p)) {
			if err := b.CopyRange(int(lo/4), st, 0, int(hi-lo)/4); err != nil {
				return err
			}
		}
		copy(stagingBytes(st)[off-lo:], p)
		return st.CopyRange(0, b, int(lo/4), int(hi-lo)/4)
	})
}

// readDevice copies bytes of b from byte off into p.
func readDevice(dev *vulkan.Device, b *vulkan.Buffer, off int64, p []byte) error {
	return staged(dev, b, off, int64(len(p)), func(st *vulkan.Buffer, lo, hi int64) error {
		if err := b.CopyRange(int(lo/4), st, 0, int(hi-lo)/4); err != nil {
			return err
		}
		copy(p, stagingBytes(st)[off-lo:])
		return nil
	})
}

// staged calls f with a host-visible staging buffer for the words [lo, hi) of b that hold
// its n bytes from off (nothing for none).
func staged(dev *vulkan.Device, b *vulkan.Buffer, off, n int64, f func(st *vulkan.Buffer, lo, hi int64) error) error {
	if n == 0 {
		return nil
	}
	lo, hi := off&^3, (off+n+3)&^3
	st, err := dev.Alloc(int(hi-lo)/4, true)
	if err != nil {
		return err
	}
	defer st.Free()
	return f(st, lo, hi)
}

func stagingBytes(st *vulkan.Buffer) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(st.Float32s()))), 4*st.Len())
}

// LimitBufferBytes makes buffers allocated from now on that are larger than n bytes go into
// parts of at most n, as those larger than the device's maxStorageBufferRange always do;
// tests use it to run tiny models' tables in parts. n ≤ 0 restores the device's limit.
func (v *Vulkan) LimitBufferBytes(n int64) { v.partLimit = n }

// bufferLimit is the most bytes one part of a persistent buffer holds (0: no limit).
func (v *Vulkan) bufferLimit() int64 {
	limit := int64(v.dev.Info.MaxBufferBytes)
	if v.partLimit > 0 && (limit == 0 || v.partLimit < limit) {
		limit = v.partLimit
	}
	return limit
}

// deviceMemory allocates bytes of device-local memory for a buffer of shape: one Vulkan
// buffer when a shader may bind it whole, else parts of whole rows (shape[0] indexes them).
func (v *Vulkan) deviceMemory(bytes int64, shape []int64) (Memory, error) {
	limit := v.bufferLimit()
	if limit == 0 || bytes <= limit {
		b, err := v.dev.Alloc(int((bytes+3)/4), false)
		if err != nil {
			return nil, err
		}
		return vkMem{dev: v.dev, parts: []*vulkan.Buffer{b}, partBytes: int64(b.Len()) * 4}, nil
	}
	var rowBytes, perPart int64
	if len(shape) >= 2 && shape[0] > 0 && bytes%shape[0] == 0 {
		rowBytes = bytes / shape[0]
		perPart = limit / rowBytes &^ 3 // rows a part: a multiple of 4, so every part ends on a word
	}
	if perPart == 0 {
		return nil, fmt.Errorf("vulkan: %d bytes (shape %v) on %s, whose shaders bind at most %d bytes of a buffer (maxStorageBufferRange), and it cannot be cut into parts of whole rows that fit",
			bytes, shape, v.dev.Info.Name, limit)
	}
	m := vkMem{dev: v.dev, partBytes: perPart * rowBytes}
	for first := int64(0); first < shape[0]; first += perPart {
		rows := min(perPart, shape[0]-first)
		b, err := v.dev.Alloc(int((rows*rowBytes+3)/4), false)
		if err != nil {
			m.Free()
			return nil, err
		}
		m.parts = append(m.parts, b)
	}
	return m, nil
}

// partedTensor is a program's view of a persistent buffer held in parts.
type partedTensor struct {
	mem  vkMem
	rows int64 // the buffer's rows (its first axis), partRows of them to a part
	row  int64 // bytes of a row
}

func (p partedTensor) partRows() int64 { return p.mem.partBytes / p.row }

// part is part i's rows [first, first+n) as an [n, row values] operand (quantised encodings
// address words; see vulkan.Encoding).
func (p partedTensor) part(i int, cols int64) (t vulkan.Tensor, first, n int64) {
	first = int64(i) * p.partRows()
	n = min(p.partRows(), p.rows-first)
	return vulkan.Contiguous(p.mem.parts[i], n, cols), first, n
}

// inOnePart maps an F32 or I32 view of the parted buffer into the part that holds all its
// values, if one does.
func (p partedTensor) inOnePart(t vulkan.Tensor) (vulkan.Tensor, bool) {
	words := p.mem.partBytes / 4
	lo, hi := int64(t.Off), int64(t.Off)+1
	for i, d := range t.Shape {
		if d == 0 {
			return t, false
		}
		hi += (d - 1) * t.Stride[i]
	}
	i := lo / words
	if (hi-1)/words != i {
		return t, false
	}
	t.Buf, t.Off = p.mem.parts[i], int(lo-i*words)
	return t, true
}

// lowerPartedNode lowers nd when one of its sources is a view that no part of a parted
// buffer holds (ok false: nd reads no such view).
func lowerPartedNode(g *Graph, nd node, root []int, parted map[int]partedTensor, operand func(int) vulkan.Tensor) (ds []vulkan.Dispatch, ok bool, err error) {
	touches := false
	for _, s := range append([]int{nd.dst}, nd.src...) {
		_, p := parted[root[s]]
		touches = touches || p
	}
	if !touches {
		return nil, false, nil
	}
	n := vulkanOperands(g, nd, operand)
	at := -1
	for i, s := range nd.src {
		if _, p := parted[root[s]]; p && n.Src[i].Buf == nil && at < 0 {
			at = i
		}
	}
	if pt, ok := parted[root[nd.dst]]; ok && n.Dst.Buf == nil {
		return nil, true, fmt.Errorf("%s writes buffer %q (%d bytes in %d parts: larger than the device binds at once) across its parts; only GatherRows and Linear read such a buffer, and nothing writes it",
			opName(nd.op), g.tensors[root[nd.dst]].persist.name, pt.mem.Bytes(), len(pt.mem.parts))
	}
	if at < 0 {
		return nil, false, nil
	}
	pt := parted[root[nd.src[at]]]
	ds, err = lowerParted(nd.op, n, at, pt, g.tensors[root[nd.src[at]]].persist.name)
	return ds, true, err
}

// lowerParted lowers a node that reads a buffer held in parts (src, its operand index, whose
// whole rows no single part holds): GatherRows from such a table and Linear with such a
// weight, one dispatch per part, each declaring what it reads and writes. Other ops are
// refused, naming the buffer.
func lowerParted(op cgo.Op, n vulkanNode, src int, pt partedTensor, name string) ([]vulkan.Dispatch, error) {
	refuse := func(why string) ([]vulkan.Dispatch, error) {
		return nil, fmt.Errorf("%s reads buffer %q (%d bytes in %d parts: larger than the device binds at once) %s; only GatherRows from its rows and Linear by it read such a buffer",
			opName(op), name, pt.mem.Bytes(), len(pt.mem.parts), why)
	}
	t := n.Src[src]
	whole := t.Off == 0 && len(t.Shape) >= 2 && t.Shape[len(t.Shape)-2] == pt.rows
	var ds []vulkan.Dispatch
	switch {
	case op == cgo.OpGatherRows && src == 0 && whole && len(n.Src[0].Shape) == 2:
		for i := range pt.mem.parts {
			m := n
			m.Src = append([]vulkan.Tensor(nil), n.Src...)
			var first int64
			m.Src[0], first, _ = pt.part(i, n.Src[0].Shape[1])
			d, err := lqGather(m, first, pt.rows)
			if err != nil {
				return nil, err
			}
			ds = append(ds, d)
		}
	case (op == cgo.OpLinearQ || op == cgo.OpMatmul && n.IP[0] == 1) && src == 1 && whole && broadcastRows(n.Src[1]):
		k := n.Src[1].Shape[len(n.Src[1].Shape)-1]
		for i := range pt.mem.parts {
			m := n
			m.Src = append([]vulkan.Tensor(nil), n.Src...)
			w, first, rows := pt.part(i, k)
			if op == cgo.OpMatmul { // the weight's batch axes broadcast (stride 0)
				w.Shape = append(append([]int64(nil), n.Src[1].Shape[:len(n.Src[1].Shape)-2]...), rows, k)
				w.Stride = append(append([]int64(nil), n.Src[1].Stride[:len(n.Src[1].Stride)-2]...), k, 1)
			}
			m.Src[1] = w
			m.Dst = columns(n.Dst, first, rows)
			if len(n.Src) > 2 {
				m.Src[2] = vulkan.Tensor{Buf: n.Src[2].Buf, Off: n.Src[2].Off + int(first), Shape: []int64{rows}, Stride: []int64{1}}
			}
			var d vulkan.Dispatch
			var err error
			if op == cgo.OpLinearQ {
				var more []vulkan.Dispatch
				if more, err = lqLowerLinear(m); err == nil {
					d = more[0]
				}
			} else {
				var bias *vulkan.Tensor
				if len(m.Src) > 2 {
					bias = &m.Src[2]
				}
				if d, err = vulkan.MatmulOp(m.Src[0], m.Src[1], bias, m.Dst, true); err == nil {
					d = d.WithAccess(m.Src, []vulkan.Tensor{m.Dst})
				}
			}
			if err != nil {
				return nil, err
			}
			ds = append(ds, d)
		}
	default:
		return refuse(fmt.Sprintf("as operand %d", src))
	}
	return ds, nil
}

// broadcastRows reports whether a weight operand is its buffer's [N, K] rows as stored, any
// leading axes broadcast over them (stride 0).
func broadcastRows(t vulkan.Tensor) bool {
	r := len(t.Shape)
	if r < 2 || t.Stride[r-1] != 1 || t.Stride[r-2] != t.Shape[r-1] {
		return false
	}
	for _, s := range t.Stride[:r-2] {
		if s != 0 {
			return false
		}
	}
	return true
}

// columns is the view of y's last-axis values [first, first+n).
func columns(y vulkan.Tensor, first, n int64) vulkan.Tensor {
	r := len(y.Shape)
	y.Shape = append(append([]int64(nil), y.Shape[:r-1]...), n)
	y.Off += int(first * y.Stride[r-1])
	return y
}
