// Package ckpt reads the checkpoint formats published models come in — safetensors (single
// files and sharded folders), PyTorch zip checkpoints (torch.save), TorchScript archives
// (torch.jit.save) and legacy torch.save files — without executing anything: pickles are
// read by a Go stack machine that turns an allow-list of globals into tensor records and
// refuses every other global (see Unpickle). Tensors are located, checked against their
// storage and the file, and read one at a time as a stream of little-endian bytes, so a
// converter holds one tensor (or less) in memory, never the file.
//
// Every input is treated as hostile: zip entries with ".." or absolute paths, sizes beyond
// the file, oversized headers, deep nesting, huge memo indices and unknown opcodes are
// errors, never a panic or an allocation larger than the file.
package ckpt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// DType is a checkpoint element type.
type DType int

// Element types. Only F32, F16 and BF16 tensors can be read as floats; the others are
// listed (so a converter can skip them, like BatchNorm's num_batches_tracked) and refused
// when read.
const (
	Unknown DType = iota
	F32
	F16
	BF16
	F64
	I64
	I32
	I16
	I8
	U8
	Bool
)

var dtypeNames = [...]string{Unknown: "unknown", F32: "F32", F16: "F16", BF16: "BF16", F64: "F64",
	I64: "I64", I32: "I32", I16: "I16", I8: "I8", U8: "U8", Bool: "BOOL"}

var dtypeSizes = [...]int{Unknown: 0, F32: 4, F16: 2, BF16: 2, F64: 8, I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, Bool: 1}

func (d DType) String() string {
	if d >= 0 && int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// Size is the bytes per element (0 for Unknown).
func (d DType) Size() int {
	if d >= 0 && int(d) < len(dtypeSizes) {
		return dtypeSizes[d]
	}
	return 0
}

// IsFloat reports whether tensors of d can be read as float32 (F32, F16, BF16).
func (d DType) IsFloat() bool { return d == F32 || d == F16 || d == BF16 }

// Tensor is one tensor of a checkpoint: its name, element type and shape, and where its
// bytes are. Nothing is read until Open.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	// Where names the bytes' location for messages ("vocos.pt: archive/data/3").
	Where string

	size int64                         // bytes: elements × DType.Size()
	open func() (io.ReadCloser, error) // a reader of exactly size bytes
	err  error                         // why the tensor cannot be read (reported by Open)
}

// NumElements is the product of the shape (1 for a scalar).
func (t *Tensor) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Bytes is the tensor's size in bytes.
func (t *Tensor) Bytes() int64 { return t.size }

// Err reports why the tensor cannot be read (a dtype other than F32/F16/BF16 is not such
// a reason: Open returns the raw bytes of any dtype), or nil.
func (t *Tensor) Err() error { return t.err }

// Open returns the tensor's bytes, little-endian, row-major, exactly Bytes() long.
func (t *Tensor) Open() (io.ReadCloser, error) {
	if t.err != nil {
		return nil, fmt.Errorf("%s (%s): %w", t.Name, t.Where, t.err)
	}
	rc, err := t.open()
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w", t.Name, t.Where, err)
	}
	return &exactReader{r: rc, left: t.size, name: t.Name, where: t.Where}, nil
}

// exactReader reads exactly left bytes and reports a short source as an error.
type exactReader struct {
	r           io.ReadCloser
	left        int64
	name, where string
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		return n, fmt.Errorf("%s (%s): data ends %d bytes early (truncated file?)", e.name, e.where, e.left)
	}
	if err == io.EOF {
		err = nil
	}
	return n, err
}

func (e *exactReader) Close() error { return e.r.Close() }

// ReadFloat32 reads the whole tensor as float32 values (F32, F16 or BF16 only).
func (t *Tensor) ReadFloat32() ([]float32, error) {
	fr, err := t.Floats()
	if err != nil {
		return nil, err
	}
	defer fr.Close()
	out := make([]float32, t.NumElements())
	for got := 0; got < len(out); {
		n, err := fr.Read(out[got:])
		if err != nil {
			return nil, err
		}
		got += n
	}
	return out, nil
}

// FloatReader decodes a tensor's elements to float32, a chunk at a time.
type FloatReader struct {
	t    *Tensor
	rc   io.ReadCloser
	buf  []byte
	left int64 // elements not yet returned
}

// chunkBytes is the read size of a FloatReader: memory per tensor stays this small.
const chunkBytes = 1 << 20

// Floats opens the tensor for reading as float32 values (F32, F16 or BF16).
func (t *Tensor) Floats() (*FloatReader, error) {
	if !t.DType.IsFloat() {
		return nil, fmt.Errorf("%s (%s): dtype %s cannot be read as floats (F32, F16 and BF16 can)", t.Name, t.Where, t.DType)
	}
	rc, err := t.Open()
	if err != nil {
		return nil, err
	}
	return &FloatReader{t: t, rc: rc, left: t.NumElements()}, nil
}

// Read fills dst with the next values; it returns io.EOF after the last one.
func (f *FloatReader) Read(dst []float32) (int, error) {
	if f.left == 0 {
		return 0, io.EOF
	}
	n := int64(len(dst))
	if n > f.left {
		n = f.left
	}
	es := int64(f.t.DType.Size())
	if max := int64(chunkBytes) / es; n > max {
		n = max
	}
	if cap(f.buf) < int(n*es) {
		f.buf = make([]byte, n*es)
	}
	b := f.buf[:n*es]
	if _, err := io.ReadFull(f.rc, b); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			err = fmt.Errorf("%s (%s): data ends early (truncated file?)", f.t.Name, f.t.Where)
		}
		return 0, err
	}
	decode(dst[:n], b, f.t.DType)
	f.left -= n
	return int(n), nil
}

// Close releases the source.
func (f *FloatReader) Close() error { return f.rc.Close() }

// decode converts little-endian elements of dt (F32, F16, BF16) to float32.
func decode(dst []float32, src []byte, dt DType) {
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = gguf.HalfToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = gguf.BF16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	}
}

// Checkpoint is an opened checkpoint: its tensors in the order the file lists them.
type Checkpoint struct {
	// Path is the file (or index) opened.
	Path string
	// Format is "safetensors", "safetensors-sharded", "torch" (torch.save zip),
	// "torchscript" (torch.jit.save) or "torch-legacy" (torch.save before 1.6).
	Format string
	// Tensors are the checkpoint's tensors (TorchScript constants as "__constants__.N").
	Tensors []*Tensor
	// Metadata is a safetensors file's __metadata__.
	Metadata map[string]string
	// Shards are the files a sharded checkpoint's index named, in the order read.
	Shards []string

	byName  map[string]*Tensor
	closers []io.Closer
}

// Tensor returns the tensor called name.
func (c *Checkpoint) Tensor(name string) (*Tensor, bool) {
	if c.byName == nil {
		c.byName = make(map[string]*Tensor, len(c.Tensors))
		for _, t := range c.Tensors {
			c.byName[t.Name] = t
		}
	}
	t, ok := c.byName[name]
	return t, ok
}

// Close closes the files behind the checkpoint.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, cl := range c.closers {
		errs = append(errs, cl.Close())
	}
	c.closers = nil
	return errors.Join(errs...)
}

// numel multiplies a shape, failing on negative dimensions and overflow past maxBytes
// elements of size es.
func numel(shape []int64, es int) (int64, error) {
	n := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64/8 {
			return 0, fmt.Errorf("shape %v has too many elements", shape)
		}
		n = lo
	}
	if es > 0 && n > uint64(math.MaxInt64/8)/uint64(es) {
		return 0, fmt.Errorf("shape %v is too large", shape)
	}
	return int64(n), nil
}

// intShape converts a checked shape to []int.
func intShape(s []int64) []int {
	out := make([]int, len(s))
	for i, d := range s {
		out[i] = int(d)
	}
	return out
}

// Names lists the tensor names in order.
func (c *Checkpoint) Names() []string {
	out := make([]string, len(c.Tensors))
	for i, t := range c.Tensors {
		out[i] = t.Name
	}
	return out
}
