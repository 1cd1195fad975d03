package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Encoder writes GGUF's little-endian encoding through a buffer. It counts the bytes
// written so Pad can align without the caller tracking offsets, and keeps the first error
// so a caller checks once (Err or Flush) rather than after every write.
type Encoder struct {
	w   *bufio.Writer
	n   uint64
	err error
}

// NewEncoder buffers writes to w in bufSize bytes; call Flush when done.
func NewEncoder(w io.Writer, bufSize int) *Encoder {
	return &Encoder{w: bufio.NewWriterSize(w, bufSize)}
}

// Err is the first write error, if any.
func (e *Encoder) Err() error { return e.err }

// Flush writes out the buffer and reports the first error.
func (e *Encoder) Flush() error {
	if e.err == nil {
		e.err = e.w.Flush()
	}
	return e.err
}

// Bytes writes b as is.
func (e *Encoder) Bytes(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.n += uint64(n)
	e.err = err
}

func (e *Encoder) u8(x uint8) { e.Bytes([]byte{x}) }

func (e *Encoder) u16(x uint16) {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], x)
	e.Bytes(b[:])
}

// U32 writes x little-endian.
func (e *Encoder) U32(x uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], x)
	e.Bytes(b[:])
}

// U64 writes x little-endian.
func (e *Encoder) U64(x uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], x)
	e.Bytes(b[:])
}

// String writes s as GGUF does: a u64 length, then the bytes.
func (e *Encoder) String(s string) {
	e.U64(uint64(len(s)))
	e.Bytes([]byte(s))
}

// Pad writes zeros up to the next multiple of align (a power of two) of the bytes written.
func (e *Encoder) Pad(align uint64) {
	var zero [64]byte
	for e.n%align != 0 && e.err == nil {
		n := align - e.n%align
		if n > uint64(len(zero)) {
			n = uint64(len(zero))
		}
		e.Bytes(zero[:n])
	}
}

// WriteHeader writes the magic, version 3, the metadata kv (keys sorted) and the tensor
// infos (Name, Dims, Type and Offset; Size is not stored), then pads to align, where the
// data section starts.
func (e *Encoder) WriteHeader(kv KV, tensors []TensorInfo, align uint64) error {
	e.Bytes([]byte(Magic))
	e.U32(3)
	e.U64(uint64(len(tensors)))
	e.U64(uint64(len(kv)))
	for _, k := range kv.Keys() {
		v := kv[k]
		e.String(k)
		e.U32(uint32(v.typ))
		if err := e.value(v, 0); err != nil {
			return fmt.Errorf("metadata key %q: %w", k, err)
		}
	}
	for _, t := range tensors {
		e.String(t.Name)
		e.U32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.U64(d)
		}
		e.U32(uint32(t.Type))
		e.U64(t.Offset)
	}
	e.Pad(align)
	return e.err
}

func (e *Encoder) scalar(x any) error {
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
		e.U32(v)
	case int32:
		e.U32(uint32(v))
	case float32:
		e.U32(math.Float32bits(v))
	case uint64:
		e.U64(v)
	case int64:
		e.U64(uint64(v))
	case float64:
		e.U64(math.Float64bits(v))
	case string:
		e.String(v)
	default:
		return fmt.Errorf("cannot encode %T", x)
	}
	return nil
}

// value writes v without its type tag (the caller writes that, as for a KV entry).
func (e *Encoder) value(v Value, depth int) error {
	if depth > maxNesting {
		return errors.New("arrays nested too deep")
	}
	if v.typ != TypeArray {
		if !v.typ.valid() || v.v == nil {
			return fmt.Errorf("invalid value of type %s", v.typ)
		}
		return e.scalar(v.v)
	}
	e.U32(uint32(v.elem))
	e.U64(uint64(v.Len()))
	var err error
	each := func(n int, at func(int) any) {
		for i := 0; i < n && err == nil; i++ {
			err = e.scalar(at(i))
		}
	}
	switch a := v.v.(type) {
	case []uint8:
		e.Bytes(a)
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
