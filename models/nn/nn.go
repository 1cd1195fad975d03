// Package nn holds the layer types models bind their weights to: each tensor is declared once,
// as a field whose gguf struct tag is its name (see engine/weights for the tag rules), and
// is loaded straight into a buffer of the backend that runs the model. Quantised matrices
// that only feed Linear or an embedding lookup stay in their file encoding (Q8_0, F16);
// everything else is F32. The tensor table of a declaration (Specs) is what random-weight
// generators write, so names and shapes are never listed a second time.
//
//	type block struct {
//		Norm nn.LayerNorm `gguf:"norm"`
//		FF   nn.Linear    `gguf:"ff"`
//	}
//	w := block{Norm: nn.NewLayerNorm(d), FF: nn.NewLinear(d, 4*d, true)} // expected shapes
//	err := nn.Bind(src, backend, &w)
package nn

import (
	"reflect"
	"slices"
	"unsafe"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
)

// encoding is what a tensor may be kept as.
type encoding uint8

const (
	f32Only   encoding = iota // any op reads it: F32
	linearEnc                 // a Linear weight: Q8_0 (repacked for the decode kernel) or F16 (packed: F16P)
	rowsEnc                   // a GatherRows table: Q8_0 or F16 rows
	kernelEnc                 // a Conv2d or ungrouped Conv1d weight: F32 packed (F32P)
)

// Tensor is one weight in a backend buffer. Before Bind, Shape is the expected shape (-1 a
// wildcard dimension; nil: any); after it, the file's.
type Tensor struct {
	Shape    []int
	Buf      *engine.Buffer
	enc      encoding
	required bool // a bias the layer was declared with: its ",optional" tag does not apply
}

// Shaped is a tensor of the expected shape.
func Shaped(shape ...int) Tensor { return Tensor{Shape: shape} }

// Want implements weights.Leaf.
func (t *Tensor) Want() []int { return t.Shape }

// Load implements weights.Leaf: raw copies for encodings the engine computes with (F32, and
// for Linear and GatherRows also F16, Q8_0, BF16 and Q4_K), float32 conversion otherwise
// (other K-quants, or a quantised tensor an F32-only op reads).
func (t *Tensor) Load(src weights.Source, name string, shape []int, a engine.Allocator) error {
	s := make([]int64, len(shape))
	for i, v := range shape {
		s[i] = int64(v)
	}
	if t.enc == linearEnc && len(s) == 3 && s[2] == 1 {
		s = s[:2] // a 1×1 convolution's weight [out, in, 1] is stored as the matrix it is
	}
	var b *engine.Buffer
	var err error
	if r, ok := weights.AsRaw(src); ok {
		raw, dt, _, rerr := r.Raw(name)
		if rerr != nil {
			return rerr
		}
		if edt, keep := t.keep(dt, s); keep {
			switch {
			case engine.Accepts(a, edt):
				b, err = engine.UploadRaw(a, name, edt, raw, s...)
			case edt == engine.Q8_0R8 && engine.Accepts(a, engine.Q8_0):
				b, err = engine.UploadRaw(a, name, engine.Q8_0, raw, s...) // a GPU reads the file's blocks
			case edt == engine.F32P:
				b, err = engine.UploadRaw(a, name, engine.F32, raw, s...) // the file's F32 values, unpacked
			case edt == engine.F16P && engine.Accepts(a, engine.F16):
				b, err = engine.UploadRaw(a, name, engine.F16, raw, s...) // a GPU reads the file's halves
			}
			weights.Done(r, raw) // an encoding the backend does not read is decoded below
		}
	}
	if b == nil && err == nil {
		var data []float32
		if data, _, err = src.Get(name); err == nil {
			if t.packsF32(s) && engine.Accepts(a, engine.F32P) {
				b, err = engine.UploadRaw(a, name, engine.F32P, f32Bytes(data), s...)
			} else {
				b, err = engine.Upload(a, name, data, s...)
			}
		}
	}
	if err != nil {
		return err
	}
	t.Buf.Free() // a rebind replaces the buffer
	t.Shape, t.Buf = slices.Clone(shape), b
	return nil
}

// keep reports the engine dtype a file tensor of dtype dt is uploaded as without conversion.
func (t *Tensor) keep(dt gguf.DType, shape []int64) (engine.DType, bool) {
	switch {
	case dt == gguf.F32 && t.packsF32(shape):
		return engine.F32P, true
	case dt == gguf.F32:
		return engine.F32, true
	case t.enc == f32Only || len(shape) != 2:
		return 0, false
	case dt == gguf.F16 && t.enc == linearEnc:
		return engine.F16P, true
	case dt == gguf.F16:
		return engine.F16, true
	case dt == gguf.Q8_0 && t.enc == linearEnc && cgo.WeightBytes(engine.Q8_0R8, shape[0], shape[1]) > 0:
		return engine.Q8_0R8, true
	case dt == gguf.Q8_0:
		return engine.Q8_0, true
	case dt == gguf.BF16:
		return engine.BF16, true
	case dt == gguf.Q4_K && cgo.RowBytes(engine.Q4_K, shape[1]) > 0:
		return engine.Q4_K, true
	}
	return 0, false
}

// Matrix is a Linear weight [out, in]: F32 or F16 packed into the small-matrix kernel's
// panels (F32P, F16P), or kept as Q8_0 (repacked for the decode kernel), BF16 or Q4_K when
// the file holds it so.
type Matrix struct{ Tensor }

// Encoded implements weights.Encoder.
func (m *Matrix) Encoded() bool { return true }

// Load implements weights.Leaf.
func (m *Matrix) Load(src weights.Source, name string, shape []int, a engine.Allocator) error {
	m.enc = linearEnc
	return m.Tensor.Load(src, name, shape, a)
}

// Kernel is a Conv2d weight [out, in, kh, kw] without groups: F32 is packed into the
// small-matrix kernel's panels (F32P, each output channel's in·kh·kw values a row) when a
// row has 64 values or more (the first conv of a spectrogram, 1·3·3, runs faster unpacked).
type Kernel struct{ Tensor }

// packsF32 reports whether t keeps F32 values of this (storage) shape packed (F32P): a Linear
// weight [out, in], or a convolution kernel ([out, in, kh, kw] or [out, in, k]) whose rows
// have 64 values or more.
func (t *Tensor) packsF32(shape []int64) bool {
	if t.enc == linearEnc {
		return len(shape) == 2
	}
	if t.enc != kernelEnc || len(shape) != 4 && !(len(shape) == 3 && shape[2] > 1) {
		return false // a 1-wide Conv1d runs as a plain product over its input, unpacked
	}
	row := int64(1)
	for _, d := range shape[1:] {
		row *= d
	}
	return row >= 64
}

// Load implements weights.Leaf.
func (k *Kernel) Load(src weights.Source, name string, shape []int, a engine.Allocator) error {
	k.enc = kernelEnc
	return k.Tensor.Load(src, name, shape, a)
}

// Rows is an embedding table [n, dim] that GatherRows reads: kept as Q8_0 or F16 rows when
// the file holds it so.
type Rows struct{ Tensor }

// Encoded implements weights.Encoder.
func (r *Rows) Encoded() bool { return true }

// Load implements weights.Leaf.
func (r *Rows) Load(src weights.Source, name string, shape []int, a engine.Allocator) error {
	r.enc = rowsEnc
	return r.Tensor.Load(src, name, shape, a)
}

// Required implements weights.Requirer: a layer declared with a bias needs it in the file.
func (t *Tensor) Required() bool { return t.required }

// declaredBias is the bias of n values of a layer made with one.
func declaredBias(n int) Tensor { return Tensor{Shape: shapeOr(n), required: true} }

// Present reports whether the tensor is bound (an optional one the file lacks is not).
func (t *Tensor) Present() bool { return t.Buf != nil }

// Dim is dimension i of the shape; negative i counts from the end.
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.Shape)
	}
	return t.Shape[i]
}

// In is the tensor in graph g.
func (t *Tensor) In(g *engine.Graph) engine.Tensor { return g.Persistent(t.Buf) }

// Opt is the tensor in graph g, nil when it is not bound (an optional bias).
func (t *Tensor) Opt(g *engine.Graph) *engine.Tensor {
	if t.Buf == nil {
		return nil
	}
	x := g.Persistent(t.Buf)
	return &x
}

// Bind loads every tensor the struct dst points to declares from src into buffers of
// backend a, reporting every missing or misshapen tensor at once (a *weights.BindError).
// On error nothing stays allocated.
func Bind(src weights.Source, a engine.Allocator, dst any) error {
	if err := weights.BindTo(src, a, dst); err != nil {
		Free(dst)
		return err
	}
	return nil
}

// Specs is the tensor table of a declaration with its expected shapes set (weights.Specs).
func Specs(dst any) []weights.Spec {
	s, err := weights.Specs(dst)
	if err != nil {
		panic(err) // a mistake in a model's declaration, not in data
	}
	return s
}

var tensorType = reflect.TypeFor[Tensor]()

// Free releases every buffer bound in the struct dst points to.
func Free(dst any) {
	each(dst, func(t *Tensor) {
		t.Buf.Free()
		t.Buf = nil
	})
}

// ShapeOnly gives every tensor of dst with a fully declared shape a buffer of that shape
// and no memory (engine.ShapeBuffer): graphs built from it can be planned, not run, so a
// real-size model is measured without its weights in memory.
func ShapeOnly(dst any) {
	each(dst, func(t *Tensor) {
		if t.Shape == nil || slices.Contains(t.Shape, -1) {
			return
		}
		s := make([]int64, len(t.Shape))
		for i, v := range t.Shape {
			s[i] = int64(v)
		}
		t.Buf = engine.ShapeBuffer("shape-only", s...)
	})
}

// each calls fn on every Tensor in the struct dst points to.
func each(dst any, fn func(*Tensor)) {
	v := reflect.ValueOf(dst)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		walk(v.Elem(), fn)
	}
}

func walk(v reflect.Value, fn func(*Tensor)) {
	switch {
	case v.Type() == tensorType:
		fn(v.Addr().Interface().(*Tensor))
	case v.Kind() == reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				walk(v.Field(i), fn)
			}
		}
	case v.Kind() == reflect.Slice || v.Kind() == reflect.Array:
		for i := 0; i < v.Len(); i++ {
			walk(v.Index(i), fn)
		}
	case v.Kind() == reflect.Pointer && !v.IsNil():
		walk(v.Elem(), fn)
	}
}

// f32Bytes views float32 values as their little-endian bytes (the engine's F32 encoding).
func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}
