package gguf

import (
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

	infos := make([]TensorInfo, len(tensors))
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
		infos[i] = TensorInfo{Name: t.Name, Dims: dims, Type: t.Type, Offset: off, Size: size}
		off = (off + size + align - 1) / align * align
	}

	bw := NewEncoder(w, 1<<16)
	if err := bw.WriteHeader(kv, infos, align); err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	for i, t := range tensors {
		switch {
		case t.Raw != nil:
			bw.Bytes(t.Raw)
		case t.Type == F32:
			for _, x := range t.Data {
				bw.U32(math.Float32bits(x))
			}
		case t.Type == F16:
			for _, x := range t.Data {
				bw.u16(Float32ToHalf(x))
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
				bw.Bytes(q)
			}
		}
		if i < len(tensors)-1 {
			bw.Pad(align)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	return nil
}
