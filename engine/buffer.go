package engine

import (
	"fmt"
	"slices"

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

// NewBuffer allocates a zeroed persistent buffer.
func NewBuffer(name string, dtype DType, shape ...int64) (*Buffer, error) {
	if !validShape(shape) {
		return nil, fmt.Errorf("engine: buffer %q: invalid shape %v", name, shape)
	}
	mem, err := cgo.Alloc(int(numel(shape)) * 4)
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

// Name is the buffer's label.
func (b *Buffer) Name() string { return b.name }

// Shape is the buffer's shape.
func (b *Buffer) Shape() []int64 { return slices.Clone(b.shape) }

// Bytes is the buffer's size.
func (b *Buffer) Bytes() int64 { return numel(b.shape) * 4 }

// shapeOnly is a buffer with a shape and no memory: graphs built only to be planned (memory
// benchmarks of real-size models) use it instead of gigabytes of weights.
func shapeOnly(name string, shape ...int64) *Buffer {
	return &Buffer{name: name, shape: shape, dtype: F32}
}

// Float32s views the memory as float32s.
func (b *Buffer) Float32s() []float32 { return b.mem.Float32s() }

// Int32s views the memory as int32s.
func (b *Buffer) Int32s() []int32 { return b.mem.Int32s() }

// Free releases the memory; plans using it must not run afterwards.
func (b *Buffer) Free() { b.mem.Free() }
