package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
)

// WriteTensor is one tensor for Write.
type WriteTensor struct {
	Name string
	// Shape in PyTorch order (outermost first); it is stored reversed, in ggml order.
	Shape []int
	// Type is F32 (the zero value), F16 or Q8_0 (QuantizeQ8_0) when Data is given, or any
	// known type with Raw.
	Type DType
	// Data holds the elements, row-major in Shape; they are converted to Type.
	Data []float32
	// Raw, when not nil, is written as is instead of Data and must have exactly the size
	// the shape and Type call for (for quantised types).
	Raw []byte
}

// Write writes a GGUF v3 file with the metadata kv (keys in sorted order) and tensors (in
// the given order). The data alignment is kv's general.alignment when present, else 32.
func Write(w io.Writer, kv KV, tensors []WriteTensor) error {
	align := uint64(DefaultAlignment)
	if v, ok := kv[KeyAlignment]; ok {
		a, ok := v.AsUint()
		if !ok || a == 0 || a > maxAlignment || a&(a-1) != 0 {
			return fmt.Errorf("gguf: write: %s must be a power of two up to %d", KeyAlignment, maxAlignment)
		}
		align = a
	}

	type plan struct {
		dims   []uint64
		size   uint64
		offset uint64
	}
	plans := make([]plan, len(tensors))
	seen := make(map[string]bool, len(tensors))
	var off uint64
	for i, t := range tensors {
		if t.Name == "" {
			return fmt.Errorf("gguf: write: tensor %d has no name", i)
		}
		if seen[t.Name] {
			return fmt.Errorf("gguf: write: tensor %q given twice", t.Name)
		}
		seen[t.Name] = true
		if len(t.Shape) > MaxDims {
			return fmt.Errorf("gguf: write: tensor %q: %d dims, at most %d", t.Name, len(t.Shape), MaxDims)
		}
		info, ok := dtypes[t.Type]
		if !ok {
			return fmt.Errorf("gguf: write: tensor %q: unknown dtype %d", t.Name, uint32(t.Type))
		}
		dims := make([]uint64, len(t.Shape))
		elems := uint64(1)
		for j, s := range t.Shape {
			if s < 0 {
				return fmt.Errorf("gguf: write: tensor %q: negative dimension in shape %v", t.Name, t.Shape)
			}
			dims[len(dims)-1-j] = uint64(s)
			hi, lo := bits.Mul64(elems, uint64(s))
			if hi != 0 || lo > math.MaxInt64 {
				return fmt.Errorf("gguf: write: tensor %q: shape %v overflows", t.Name, t.Shape)
			}
			elems = lo
		}
		if len(dims) > 0 && dims[0]%info.blockSize != 0 {
			return fmt.Errorf("gguf: write: tensor %q: innermost dim %d is not a multiple of the %s block size %d",
				t.Name, dims[0], t.Type, info.blockSize)
		}
		if len(dims) == 0 && info.blockSize != 1 {
			return fmt.Errorf("gguf: write: tensor %q: a scalar cannot have block type %s", t.Name, t.Type)
		}
		size := elems / info.blockSize * info.blockLen
		if t.Raw != nil {
			if uint64(len(t.Raw)) != size {
				return fmt.Errorf("gguf: write: tensor %q: raw data is %d bytes, shape %v of %s needs %d",
					t.Name, len(t.Raw), t.Shape, t.Type, size)
			}
		} else {
			if t.Type != F32 && t.Type != F16 && t.Type != Q8_0 {
				return fmt.Errorf("gguf: write: tensor %q: converting to %s not supported; pass Raw", t.Name, t.Type)
			}
			if uint64(len(t.Data)) != elems {
				return fmt.Errorf("gguf: write: tensor %q: %d values for shape %v (%d elements)", t.Name, len(t.Data), t.Shape, elems)
			}
		}
		plans[i] = plan{dims: dims, size: size, offset: off}
		off = (off + size + align - 1) / align * align
	}

	bw := &errWriter{w: bufio.NewWriterSize(w, 1<<16)}
	bw.bytes([]byte(Magic))
	bw.u32(3)
	bw.u64(uint64(len(tensors)))
	bw.u64(uint64(len(kv)))
	for _, k := range kv.Keys() {
		v := kv[k]
		bw.str(k)
		bw.u32(uint32(v.typ))
		if err := bw.value(v, 0); err != nil {
			return fmt.Errorf("gguf: write: metadata key %q: %w", k, err)
		}
	}
	for i, t := range tensors {
		bw.str(t.Name)
		bw.u32(uint32(len(plans[i].dims)))
		for _, d := range plans[i].dims {
			bw.u64(d)
		}
		bw.u32(uint32(t.Type))
		bw.u64(plans[i].offset)
	}
	bw.pad(align)
	var scratch [8]byte
	for i, t := range tensors {
		switch {
		case t.Raw != nil:
			bw.bytes(t.Raw)
		case t.Type == F32:
			for _, x := range t.Data {
				binary.LittleEndian.PutUint32(scratch[:], math.Float32bits(x))
				bw.bytes(scratch[:4])
			}
		case t.Type == F16:
			for _, x := range t.Data {
				binary.LittleEndian.PutUint16(scratch[:], Float32ToHalf(x))
				bw.bytes(scratch[:2])
			}
		case t.Type == Q8_0:
			// A row of blocks at a time keeps the encoded copy small.
			row := len(t.Data)
			if len(t.Shape) > 0 {
				row = t.Shape[len(t.Shape)-1]
			}
			for r := 0; r+row <= len(t.Data) && row > 0; r += row {
				q, err := QuantizeQ8_0(t.Data[r : r+row])
				if err != nil {
					return fmt.Errorf("gguf: write: tensor %q: %w", t.Name, err)
				}
				bw.bytes(q)
			}
		}
		if i < len(tensors)-1 {
			bw.pad(align)
		}
	}
	if bw.err != nil {
		return fmt.Errorf("gguf: write: %w", bw.err)
	}
	if err := bw.w.Flush(); err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	return nil
}

// errWriter keeps the first write error and counts the bytes written.
type errWriter struct {
	w   *bufio.Writer
	n   uint64
	err error
}

func (e *errWriter) bytes(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.n += uint64(n)
	e.err = err
}

func (e *errWriter) u8(x uint8) { e.bytes([]byte{x}) }

func (e *errWriter) u16(x uint16) {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], x)
	e.bytes(b[:])
}

func (e *errWriter) u32(x uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], x)
	e.bytes(b[:])
}

func (e *errWriter) u64(x uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], x)
	e.bytes(b[:])
}

func (e *errWriter) str(s string) {
	e.u64(uint64(len(s)))
	e.bytes([]byte(s))
}

func (e *errWriter) pad(align uint64) {
	var zero [64]byte
	for e.n%align != 0 && e.err == nil {
		n := align - e.n%align
		if n > uint64(len(zero)) {
			n = uint64(len(zero))
		}
		e.bytes(zero[:n])
	}
}

func (e *errWriter) scalar(x any) error {
	switch v := x.(type) {
	case uint8:
		e.u8(v)
	case int8:
		e.u8(uint8(v))
	case bool:
		if v {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case uint16:
		e.u16(v)
	case int16:
		e.u16(uint16(v))
	case uint32:
		e.u32(v)
	case int32:
		e.u32(uint32(v))
	case float32:
		e.u32(math.Float32bits(v))
	case uint64:
		e.u64(v)
	case int64:
		e.u64(uint64(v))
	case float64:
		e.u64(math.Float64bits(v))
	case string:
		e.str(v)
	default:
		return fmt.Errorf("cannot encode %T", x)
	}
	return nil
}

func (e *errWriter) value(v Value, depth int) error {
	if depth > maxNesting {
		return errors.New("arrays nested too deep")
	}
	if v.typ != TypeArray {
		if !v.typ.valid() || v.v == nil {
			return fmt.Errorf("invalid value of type %s", v.typ)
		}
		return e.scalar(v.v)
	}
	e.u32(uint32(v.elem))
	e.u64(uint64(v.Len()))
	var err error
	each := func(n int, at func(int) any) {
		for i := 0; i < n && err == nil; i++ {
			err = e.scalar(at(i))
		}
	}
	switch a := v.v.(type) {
	case []uint8:
		e.bytes(a)
	case []int8:
		each(len(a), func(i int) any { return a[i] })
	case []bool:
		each(len(a), func(i int) any { return a[i] })
	case []uint16:
		each(len(a), func(i int) any { return a[i] })
	case []int16:
		each(len(a), func(i int) any { return a[i] })
	case []uint32:
		each(len(a), func(i int) any { return a[i] })
	case []int32:
		each(len(a), func(i int) any { return a[i] })
	case []float32:
		each(len(a), func(i int) any { return a[i] })
	case []uint64:
		each(len(a), func(i int) any { return a[i] })
	case []int64:
		each(len(a), func(i int) any { return a[i] })
	case []float64:
		each(len(a), func(i int) any { return a[i] })
	case []string:
		each(len(a), func(i int) any { return a[i] })
	case []Value:
		for _, x := range a {
			if x.typ != TypeArray {
				return fmt.Errorf("array of arrays holds a %s", x.describe())
			}
			if err = e.value(x, depth+1); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("invalid array value %T", v.v)
	}
	return err
}
