package engine

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine/gguf"
)

// Buffer is persistent tensor memory (outside any arena): weights, KV caches, streaming
// state, per-shape constants such as a relative-position-bias table. The backend whose
// programs read it allocates it (Allocator), so a device backend keeps it on the device. One
// Buffer can serve any number of graphs and plans; it lives until Free.
type Buffer struct {
	name  string
	shape []int64
	dtype DType
	mem   Memory
}

// Allocator allocates zeroed persistent buffers. Every Backend is one; Host is the host
// memory the CPU backend reads.
type Allocator interface {
	Alloc(name string, dtype DType, shape ...int64) (*Buffer, error)
}

// EncodingChecker is an Allocator whose programs read only some weight encodings (a GPU
// backend today reads F32 only). Weight loaders keep a file's encoding, or pack F32 into
// F32P, only where Accepts says so, and upload F32 values otherwise.
type EncodingChecker interface {
	Accepts(dtype DType) bool
}

// Accepts reports whether a's programs read dtype: true unless a is an EncodingChecker that
// says no.
func Accepts(a Allocator, dtype DType) bool {
	if c, ok := a.(EncodingChecker); ok {
		return c.Accepts(dtype)
	}
	return true
}

// Memory is one allocation of a backend.
type Memory interface {
	Bytes() int64
	// Write copies p into the memory from byte offset off; Read copies from it into p.
	Write(off int64, p []byte) error
	Read(off int64, p []byte) error
	Free()
}

// hostMem is host memory: the CPU backend's buffers, and any Buffer's views (Raw, Float32s).
type hostMem struct{ b *cgo.Buffer }

func (h hostMem) Bytes() int64 { return int64(h.b.Bytes()) }
func (h hostMem) Free()        { h.b.Free() }
func (h hostMem) bytes() []byte {
	return unsafe.Slice((*byte)(h.b.Ptr()), h.b.Bytes())
}

func (h hostMem) Write(off int64, p []byte) error {
	if off < 0 || off+int64(len(p)) > h.Bytes() {
		return fmt.Errorf("engine: write of %d bytes at %d into %d", len(p), off, h.Bytes())
	}
	copy(h.bytes()[off:], p)
	return nil
}

func (h hostMem) Read(off int64, p []byte) error {
	if off < 0 || off+int64(len(p)) > h.Bytes() {
		return fmt.Errorf("engine: read of %d bytes at %d from %d", len(p), off, h.Bytes())
	}
	copy(p, h.bytes()[off:])
	return nil
}

func hostAlloc(bytes int64) (Memory, error) {
	b, err := cgo.Alloc(int(bytes))
	if err != nil {
		return nil, err
	}
	return hostMem{b}, nil
}

type hostAllocator struct{}

func (hostAllocator) Alloc(name string, dtype DType, shape ...int64) (*Buffer, error) {
	return AllocBuffer(hostAlloc, name, dtype, shape...)
}

// Host allocates buffers in host memory, the CPU backend's.
var Host Allocator = hostAllocator{}

// AllocBuffer is a zeroed buffer of dtype and shape in memory from alloc: what a backend's
// Alloc does with its own memory. For Q8_0 the innermost dimension must be a whole number of
// 32-value blocks.
func AllocBuffer(alloc func(bytes int64) (Memory, error), name string, dtype DType, shape ...int64) (*Buffer, error) {
	if !validShape(shape) {
		return nil, fmt.Errorf("engine: buffer %q: invalid shape %v", name, shape)
	}
	size := storageSize(dtype, shape)
	if size < 0 {
		return nil, fmt.Errorf("engine: buffer %q: shape %v does not fit dtype %s (Q8_0 rows are blocks of 32)", name, shape, dtypeName(dtype))
	}
	mem, err := alloc(size)
	if err != nil {
		return nil, fmt.Errorf("engine: buffer %q: %w", name, err)
	}
	return &Buffer{name: name, shape: slices.Clone(shape), dtype: dtype, mem: mem}, nil
}

// NewBuffer allocates a zeroed persistent buffer in host memory (Host).
func NewBuffer(name string, dtype DType, shape ...int64) (*Buffer, error) {
	return Host.Alloc(name, dtype, shape...)
}

// NewBufferFrom is Upload to host memory.
func NewBufferFrom(name string, data []float32, shape ...int64) (*Buffer, error) {
	return Upload(Host, name, data, shape...)
}

// NewBufferRaw is UploadRaw to host memory.
func NewBufferRaw(name string, dtype DType, raw []byte, shape ...int64) (*Buffer, error) {
	return UploadRaw(Host, name, dtype, raw, shape...)
}

// Upload copies float32 data of the given shape into a new F32 buffer from a.
func Upload(a Allocator, name string, data []float32, shape ...int64) (*Buffer, error) {
	if int64(len(data)) != numel(shape) {
		return nil, fmt.Errorf("engine: buffer %q: %d values for shape %v", name, len(data), shape)
	}
	b, err := a.Alloc(name, F32, shape...)
	if err != nil {
		return nil, err
	}
	if err := b.mem.Write(0, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(data))), 4*len(data))); err != nil {
		b.Free()
		return nil, fmt.Errorf("engine: buffer %q: %w", name, err)
	}
	return b, nil
}

// UploadRaw copies already-encoded data (a GGUF tensor's bytes: Q8_0 blocks, F16 halves, or
// F32/I32 little-endian values) into a new buffer of that dtype and shape from a. For Q8_0R8
// (a 2-D weight) raw is GGUF Q8_0 and is repacked into the decode kernel's layout; for F32P
// raw is F32, and for F16P (a 2-D weight) F16, repacked into the small-matrix kernel's panels.
func UploadRaw(a Allocator, name string, dtype DType, raw []byte, shape ...int64) (*Buffer, error) {
	if !validShape(shape) {
		return nil, fmt.Errorf("engine: buffer %q: invalid shape %v", name, shape)
	}
	in := dtype
	switch dtype {
	case Q8_0R8:
		in = Q8_0 // given as GGUF Q8_0 blocks, repacked below
	case F32P:
		in = F32 // given as row-major F32, repacked below
		if len(shape) < 2 {
			return nil, fmt.Errorf("engine: buffer %q: an F32P weight has 2 or more dims, not %v", name, shape)
		}
	case F16P:
		in = F16 // given as row-major halves, repacked below
		if len(shape) != 2 {
			return nil, fmt.Errorf("engine: buffer %q: an F16P weight has 2 dims, not %v", name, shape)
		}
	}
	if want := storageSize(in, shape); want < 0 || int64(len(raw)) != want {
		return nil, fmt.Errorf("engine: buffer %q: %d bytes for %s %v (want %d)", name, len(raw), dtypeName(in), shape, want)
	}
	b, err := a.Alloc(name, dtype, shape...)
	if err != nil {
		return nil, err
	}
	if dtype == Q8_0R8 || dtype == F32P || dtype == F16P {
		packed := b.Raw() // host memory is repacked in place
		if packed == nil {
			packed = make([]byte, b.mem.Bytes())
		}
		var err error
		switch dtype {
		case F32P:
			err = cgo.RepackF32P(packed, raw, shape[0], numel(shape[1:]))
		case F16P:
			err = cgo.RepackF16P(packed, raw, shape[0], shape[1])
		default:
			err = cgo.RepackQ8_0R8(packed, raw, shape[0], shape[1])
		}
		if err != nil {
			b.Free()
			return nil, fmt.Errorf("engine: buffer %q: %w", name, err)
		}
		if b.Raw() != nil {
			return b, nil
		}
		raw = packed
	}
	if err := b.mem.Write(0, raw); err != nil {
		b.Free()
		return nil, fmt.Errorf("engine: buffer %q: %w", name, err)
	}
	return b, nil
}

// elemBytes is the size of one element of the types views exist for (F32, I32, F16).
func elemBytes(dtype DType) int64 {
	if dtype == F16 {
		return 2
	}
	return 4
}

// storageSize is the bytes of a row-major tensor of dtype and shape, -1 when the shape does
// not fit the dtype's blocks.
func storageSize(dtype DType, shape []int64) int64 {
	if len(shape) == 0 {
		if IsQuantized(dtype) {
			return -1
		}
		return 4
	}
	if dtype == Q8_0R8 || dtype == F32P || dtype == F16P {
		if len(shape) < 2 || dtype != F32P && len(shape) != 2 {
			return -1
		}
		// F32P: rows are the first axis, each the rest flattened (a convolution's kernel).
		if n := cgo.WeightBytes(dtype, shape[0], numel(shape[1:])); n > 0 {
			return n
		}
		return -1
	}
	row := cgo.RowBytes(dtype, shape[len(shape)-1])
	if row <= 0 {
		return -1
	}
	return numel(shape[:len(shape)-1]) * row
}

// IsQuantized reports whether dtype is a weight encoding (Q8_0, Q8_0R8, F16, Q4_K, BF16, F32P, F16P)
// rather than an element type the ops compute in: such buffers feed only Linear (as the
// weight), GatherRows (as the table; not Q8_0R8 or F32P) and, F32P, Conv2D without groups.
func IsQuantized(dtype DType) bool {
	return dtype == Q8_0 || dtype == F16 || dtype == Q8_0R8 || dtype == Q4_K || dtype == BF16 || dtype == F32P || dtype == F16P
}

// DTypeName names an element type or encoding ("F32", "F16", "Q8_0", ...).
func DTypeName(d DType) string { return dtypeName(d) }

func dtypeName(d DType) string {
	switch d {
	case F32:
		return "F32"
	case I32:
		return "I32"
	case Q8_0:
		return "Q8_0"
	case F16:
		return "F16"
	case Q8_0R8:
		return "Q8_0R8"
	case Q4_K:
		return "Q4_K"
	case BF16:
		return "BF16"
	case F32P:
		return "F32P"
	case F16P:
		return "F16P"
	}
	return fmt.Sprintf("DType(%d)", int32(d))
}

// Name is the buffer's label.
func (b *Buffer) Name() string { return b.name }

// Shape is the buffer's shape.
func (b *Buffer) Shape() []int64 { return slices.Clone(b.shape) }

// DType is the buffer's element type or encoding.
func (b *Buffer) DType() DType { return b.dtype }

// Bytes is the buffer's size (encoded size for Q8_0 and F16).
func (b *Buffer) Bytes() int64 { return storageSize(b.dtype, b.shape) }

// Raw views host memory as bytes (the encoded blocks of a Q8_0 or F16 buffer); nil for a
// device backend's memory, which is written through Write.
func (b *Buffer) Raw() []byte {
	if h, ok := b.mem.(hostMem); ok {
		return h.bytes()
	}
	return nil
}

// Write copies encoded bytes into the buffer from byte offset off (any backend's memory).
func (b *Buffer) Write(off int64, p []byte) error { return b.mem.Write(off, p) }

// Read copies the buffer's encoded bytes from byte offset off into p (any backend's memory:
// a GPU's is read back through a staging copy).
func (b *Buffer) Read(off int64, p []byte) error { return b.mem.Read(off, p) }

// Values is an F32 buffer's values: a view of host memory, or a copy read back from a
// device's. An F16 buffer's (a half-precision cache) are a widened copy.
func (b *Buffer) Values() ([]float32, error) {
	if b.dtype == F16 {
		raw := make([]byte, b.Bytes())
		if err := b.Read(0, raw); err != nil {
			return nil, err
		}
		v := make([]float32, len(raw)/2)
		if err := gguf.Dequantize(v, raw, gguf.F16); err != nil {
			return nil, err
		}
		return v, nil
	}
	if v := b.Float32s(); v != nil && b.dtype == F32 {
		return v, nil
	}
	if b.dtype != F32 {
		return nil, fmt.Errorf("engine: buffer %q holds %s, not F32 values", b.name, dtypeName(b.dtype))
	}
	v := make([]float32, b.Bytes()/4)
	if err := b.Read(0, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))); err != nil {
		return nil, err
	}
	return v, nil
}

// shapeOnly is a buffer with a shape and no memory: graphs built only to be planned (memory
// benchmarks of real-size models) use it instead of gigabytes of weights.
func shapeOnly(name string, shape ...int64) *Buffer {
	return &Buffer{name: name, shape: shape, dtype: F32}
}

// Float32s views host memory as float32s (F32 buffers); nil for device memory.
func (b *Buffer) Float32s() []float32 {
	if h, ok := b.mem.(hostMem); ok {
		return h.b.Float32s()
	}
	return nil
}

// Int32s views host memory as int32s; nil for device memory.
func (b *Buffer) Int32s() []int32 {
	if h, ok := b.mem.(hostMem); ok {
		return h.b.Int32s()
	}
	return nil
}

// Free releases the memory; plans using it must not run afterwards.
func (b *Buffer) Free() {
	if b != nil && b.mem != nil {
		b.mem.Free()
	}
}
