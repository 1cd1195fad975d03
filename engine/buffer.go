package engine

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/voxpipe/voxpipe/cgo"
)

// Buffer is persistent tensor memory (C memory, outside any arena): weights, KV caches,
// streaming state, per-shape constants such as a relative-position-bias table. One Buffer can
// serve any number of graphs and plans; it lives until Free.
type Buffer struct {
	name  string
	shape []int64
	dtype DType
	mem   *cgo.Buffer
}

// NewBuffer allocates a zeroed persistent buffer. For Q8_0 the innermost dimension must be a
// whole number of 32-value blocks.
func NewBuffer(name string, dtype DType, shape ...int64) (*Buffer, error) {
	if !validShape(shape) {
		return nil, fmt.Errorf("engine: buffer %q: invalid shape %v", name, shape)
	}
	size := storageSize(dtype, shape)
	if size < 0 {
		return nil, fmt.Errorf("engine: buffer %q: shape %v does not fit dtype %s (Q8_0 rows are blocks of 32)", name, shape, dtypeName(dtype))
	}
	mem, err := cgo.Alloc(int(size))
	if err != nil {
		return nil, fmt.Errorf("engine: buffer %q: %w", name, err)
	}
	return &Buffer{name: name, shape: slices.Clone(shape), dtype: dtype, mem: mem}, nil
}

// NewBufferFrom copies float32 data of the given shape into a new persistent buffer.
func NewBufferFrom(name string, data []float32, shape ...int64) (*Buffer, error) {
	if int64(len(data)) != numel(shape) {
		return nil, fmt.Errorf("engine: buffer %q: %d values for shape %v", name, len(data), shape)
	}
	b, err := NewBuffer(name, F32, shape...)
	if err != nil {
		return nil, err
	}
	copy(b.Float32s(), data)
	return b, nil
}

// NewBufferRaw copies already-encoded data (a GGUF tensor's bytes: Q8_0 blocks, F16 halves,
// or F32/I32 little-endian values) into a new persistent buffer of that dtype and shape. For
// Q8_0R8 (a 2-D weight) raw is GGUF Q8_0 and is repacked into the decode kernel's layout.
func NewBufferRaw(name string, dtype DType, raw []byte, shape ...int64) (*Buffer, error) {
	if !validShape(shape) {
		return nil, fmt.Errorf("engine: buffer %q: invalid shape %v", name, shape)
	}
	in := dtype
	if dtype == Q8_0R8 {
		in = Q8_0 // given as GGUF Q8_0 blocks, repacked below
	}
	if want := storageSize(in, shape); want < 0 || int64(len(raw)) != want {
		return nil, fmt.Errorf("engine: buffer %q: %d bytes for %s %v (want %d)", name, len(raw), dtypeName(in), shape, want)
	}
	b, err := NewBuffer(name, dtype, shape...)
	if err != nil {
		return nil, err
	}
	if dtype == Q8_0R8 {
		if err := cgo.RepackQ8_0R8(b.Raw(), raw, shape[0], shape[1]); err != nil {
			b.Free()
			return nil, fmt.Errorf("engine: buffer %q: %w", name, err)
		}
		return b, nil
	}
	copy(b.Raw(), raw)
	return b, nil
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
	if dtype == Q8_0R8 {
		if len(shape) != 2 {
			return -1
		}
		if n := cgo.WeightBytes(dtype, shape[0], shape[1]); n > 0 {
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

// IsQuantized reports whether dtype is a weight encoding (Q8_0, Q8_0R8, F16) rather than an
// element type the ops compute in: such buffers feed only Linear (as the weight) and
// GatherRows (as the table; not Q8_0R8).
func IsQuantized(dtype DType) bool { return dtype == Q8_0 || dtype == F16 || dtype == Q8_0R8 }

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

// Raw views the memory as bytes (the encoded blocks of a Q8_0 or F16 buffer).
func (b *Buffer) Raw() []byte { return unsafe.Slice((*byte)(b.mem.Ptr()), b.mem.Bytes()) }

// shapeOnly is a buffer with a shape and no memory: graphs built only to be planned (memory
// benchmarks of real-size models) use it instead of gigabytes of weights.
func shapeOnly(name string, shape ...int64) *Buffer {
	return &Buffer{name: name, shape: shape, dtype: F32}
}

// Float32s views the memory as float32s (F32 buffers).
func (b *Buffer) Float32s() []float32 { return b.mem.Float32s() }

// Int32s views the memory as int32s.
func (b *Buffer) Int32s() []int32 { return b.mem.Int32s() }

// Free releases the memory; plans using it must not run afterwards.
func (b *Buffer) Free() { b.mem.Free() }
