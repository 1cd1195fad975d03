// Package ggufpack writes a GGUF file in the audio.cpp packaging (gguf.WritePackaged's
// layout: logical names, PyTorch shapes, embedded files) one tensor at a time: the header is
// written from the tensor table alone, then each tensor's values are streamed in, encoded
// row by row to the tensor's stored type (F32, F16, BF16, Q8_0, Q4_K). A converter holds a
// chunk of one tensor in memory, never the model.
package ggufpack

import (
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine/gguf"
)

// Tensor is one entry of the table: logical name, PyTorch-order shape, stored type.
type Tensor struct {
	Name  string
	Shape []int
	Type  gguf.DType
}

// Writer streams the tensors' data after the header; Write calls fill the tensors in table
// order.
type Writer struct {
	enc    *gguf.Encoder
	align  uint64
	table  []Tensor
	sizes  []uint64
	cur    int    // tensor being written
	done   uint64 // its bytes written so far
	closed bool
	buf    []byte    // encoded values, reused across WriteFloat32 and WriteLE calls
	vals   []float32 // decoded values, reused across WriteLE calls to Q4_K
}

// rowLen is the innermost dimension (1 for a scalar).
func rowLen(t Tensor) int {
	if len(t.Shape) == 0 {
		return 1
	}
	return t.Shape[len(t.Shape)-1]
}

// Size is the stored size in bytes of a tensor of the table.
func Size(t Tensor) (uint64, error) {
	bs, bb := uint64(t.Type.BlockSize()), uint64(t.Type.BlockBytes())
	if bs == 0 {
		return 0, fmt.Errorf("ggufpack: tensor %q: unknown type %v", t.Name, t.Type)
	}
	n := uint64(1)
	for _, d := range t.Shape {
		if d < 0 {
			return 0, fmt.Errorf("ggufpack: tensor %q: negative dimension in %v", t.Name, t.Shape)
		}
		if d > 0 && n > math.MaxInt64/uint64(d) {
			return 0, fmt.Errorf("ggufpack: tensor %q: shape %v overflows", t.Name, t.Shape)
		}
		n *= uint64(d)
	}
	if uint64(rowLen(t))%bs != 0 {
		return 0, fmt.Errorf("ggufpack: tensor %q: rows of %d values are not whole %v blocks of %d", t.Name, rowLen(t), t.Type, bs)
	}
	return n / bs * bb, nil
}

// New writes the header of a packaged file with metadata kv (general.alignment, when set,
// is the data alignment; default 32), the tensor table and the embedded files; the tensor
// data follows through Write* calls.
func New(w io.Writer, kv gguf.KV, table []Tensor, files []gguf.EmbeddedFile) (*Writer, error) {
	out := make(gguf.KV, len(kv)+8)
	for k, v := range kv {
		out[k] = v
	}
	names := make([]string, len(table))
	ranks := make([]int32, len(table))
	shapes := []int64{}
	seen := map[string]bool{}
	for i, t := range table {
		if t.Name == "" || seen[t.Name] {
			return nil, fmt.Errorf("ggufpack: tensor %d: empty or repeated name %q", i, t.Name)
		}
		seen[t.Name] = true
		names[i] = t.Name
		ranks[i] = int32(len(t.Shape))
		for _, d := range t.Shape {
			shapes = append(shapes, int64(d))
		}
	}
	if err := errors.Join(out.Set(gguf.KeyTensorNames, names), out.Set(gguf.KeyTensorRanks, ranks),
		out.Set(gguf.KeyTensorShapes, shapes)); err != nil {
		return nil, err
	}
	if len(files) > 0 {
		fnames := make([]string, len(files))
		offsets := make([]uint64, len(files)+1)
		var blob []byte
		for i, f := range files {
			fnames[i] = f.Name
			blob = append(blob, f.Data...)
			offsets[i+1] = uint64(len(blob))
		}
		if err := errors.Join(out.Set(gguf.KeyEmbeddedNames, fnames), out.Set(gguf.KeyEmbeddedOffsets, offsets),
			out.Set(gguf.KeyEmbeddedData, blob)); err != nil {
			return nil, err
		}
	}
	align := uint64(gguf.DefaultAlignment)
	if v, ok := out[gguf.KeyAlignment]; ok {
		a, ok := v.AsUint()
		if !ok || a == 0 || a > 1<<16 || a&(a-1) != 0 {
			return nil, fmt.Errorf("ggufpack: %s must be a power of two", gguf.KeyAlignment)
		}
		align = a
	}
	pw := &Writer{enc: gguf.NewEncoder(w, 1<<20), align: align, table: table, sizes: make([]uint64, len(table))}
	infos := make([]gguf.TensorInfo, len(table))
	var off uint64
	for i, t := range table {
		s, err := Size(t)
		if err != nil {
			return nil, err
		}
		name := t.Name
		if len(name) >= 64 { // GGML_MAX_NAME; the logical name is in the metadata
			name = fmt.Sprintf("%s%d", gguf.PhysicalPrefix, i)
		}
		dims := make([]uint64, len(t.Shape))
		for j, d := range t.Shape {
			dims[len(dims)-1-j] = uint64(d)
		}
		infos[i] = gguf.TensorInfo{Name: name, Dims: dims, Type: t.Type, Offset: off, Size: s}
		pw.sizes[i] = s
		off = (off + s + align - 1) / align * align
	}
	if err := pw.enc.WriteHeader(out, infos, align); err != nil {
		return nil, fmt.Errorf("ggufpack: %w", err)
	}
	pw.skipEmpty()
	return pw, pw.enc.Err()
}

// Current is the tensor the next Write fills (false when all are written).
func (w *Writer) Current() (Tensor, bool) {
	if w.cur >= len(w.table) {
		return Tensor{}, false
	}
	return w.table[w.cur], true
}

// WriteRaw appends already-encoded bytes of the current tensor's type.
func (w *Writer) WriteRaw(b []byte) error {
	for len(b) > 0 {
		if err := w.enc.Err(); err != nil {
			return err
		}
		if w.cur >= len(w.table) {
			return errors.New("ggufpack: more data than the table holds")
		}
		n := min(uint64(len(b)), w.sizes[w.cur]-w.done)
		w.enc.Bytes(b[:n])
		w.done += n
		b = b[n:]
		w.advance()
	}
	return w.enc.Err()
}

// WriteFloat32 appends values of the current tensor (whole rows for block types), encoded
// to its stored type.
func (w *Writer) WriteFloat32(vals []float32) error {
	t, err := w.target()
	if err != nil {
		return err
	}
	if _, err := w.fits(t, len(vals)); err != nil {
		return err
	}
	w.buf, err = encodeParallel(w.buf[:0], vals, t.Type, rowLen(t))
	if err != nil {
		return fmt.Errorf("ggufpack: tensor %q: %w", t.Name, err)
	}
	return w.WriteRaw(w.buf)
}

// WriteLE appends values of the current tensor given as the little-endian bytes of a
// checkpoint's element type from (F32, F16 or BF16; whole rows for block types), encoded to
// its stored type: the same bytes WriteFloat32 writes for the decoded values, converted by
// the engine's C encoder straight from src on every CPU (Q4_K is decoded there and
// quantised in Go).
func (w *Writer) WriteLE(src []byte, from gguf.DType) error {
	t, err := w.target()
	if err != nil {
		return err
	}
	cf, ok := encodeType(from)
	if !ok || from == gguf.Q8_0 {
		return fmt.Errorf("ggufpack: tensor %q: source type %v (F32, F16 or BF16)", t.Name, from)
	}
	es := from.BlockBytes()
	if len(src)%es != 0 {
		return fmt.Errorf("ggufpack: tensor %q: %d bytes is not whole %v values", t.Name, len(src), from)
	}
	n := len(src) / es
	ct, ok := encodeType(t.Type)
	if !ok { // Q4_K: decoded in C, quantised by WriteFloat32
		if cap(w.vals) < n {
			w.vals = make([]float32, n)
		}
		vals := w.vals[:n]
		if err := cgo.DecodeFloats(vals, src, cf, runtime.GOMAXPROCS(0)); err != nil {
			return fmt.Errorf("ggufpack: tensor %q: %w", t.Name, err)
		}
		return w.WriteFloat32(vals)
	}
	need, err := w.fits(t, n)
	if err != nil {
		return err
	}
	if uint64(cap(w.buf)) < need {
		w.buf = make([]byte, need)
	}
	if _, err := cgo.EncodeWeights(w.buf[:need], src, cf, ct, n, runtime.GOMAXPROCS(0)); err != nil {
		return fmt.Errorf("ggufpack: tensor %q: %w", t.Name, err)
	}
	return w.WriteRaw(w.buf[:need])
}

// target is the tensor being written (an error once the encoder failed or the table is full).
func (w *Writer) target() (Tensor, error) {
	if err := w.enc.Err(); err != nil {
		return Tensor{}, err
	}
	if w.cur >= len(w.table) {
		return Tensor{}, errors.New("ggufpack: more data than the table holds")
	}
	return w.table[w.cur], nil
}

// fits checks that n values are whole rows (for block types) and fit what the current tensor
// t has left, and returns their encoded bytes.
func (w *Writer) fits(t Tensor, n int) (uint64, error) {
	bs, bb := uint64(t.Type.BlockSize()), uint64(t.Type.BlockBytes())
	if uint64(n)%uint64(max(rowLen(t), 1)) != 0 && bs > 1 {
		return 0, fmt.Errorf("ggufpack: tensor %q: %d values is not whole rows of %d", t.Name, n, rowLen(t))
	}
	need := uint64(n) / bs * bb
	if need > w.sizes[w.cur]-w.done {
		return 0, fmt.Errorf("ggufpack: tensor %q: %d values more than it holds", t.Name, n)
	}
	return need, nil
}

// encodeType is the C encoder's name for a file type it converts (F32, F16, BF16, Q8_0).
func encodeType(d gguf.DType) (cgo.DType, bool) {
	switch d {
	case gguf.F32:
		return cgo.F32, true
	case gguf.F16:
		return cgo.F16, true
	case gguf.BF16:
		return cgo.BF16, true
	case gguf.Q8_0:
		return cgo.Q8_0, true
	}
	return 0, false
}

// advance pads after a complete tensor and moves to the next one.
func (w *Writer) advance() {
	if w.cur < len(w.table) && w.done == w.sizes[w.cur] {
		w.cur++
		w.done = 0
		if w.cur < len(w.table) {
			w.enc.Pad(w.align)
		}
		w.skipEmpty()
	}
}

// skipEmpty passes over zero-byte tensors.
func (w *Writer) skipEmpty() {
	for w.cur < len(w.table) && w.sizes[w.cur] == 0 {
		w.cur++
		if w.cur < len(w.table) {
			w.enc.Pad(w.align)
		}
	}
}

// Close checks that every tensor was written and flushes.
func (w *Writer) Close() error {
	if w.closed {
		return w.enc.Err()
	}
	w.closed = true
	if err := w.enc.Err(); err != nil {
		return err
	}
	if w.cur < len(w.table) {
		return fmt.Errorf("ggufpack: tensor %q (%d of %d) has %d of its %d bytes", w.table[w.cur].Name, w.cur+1, len(w.table), w.done, w.sizes[w.cur])
	}
	return w.enc.Flush()
}
