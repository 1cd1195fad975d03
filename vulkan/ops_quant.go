package vulkan

import (
	"fmt"
	"math"
	"strings"
)

// Encoding is how a weight or table stores its values; the numbers are the engine's
// (cgo.DType), so a dtype converts as Encoding(dtype).
type Encoding int32

// Encodings the quantised shaders read. A quantised operand's Tensor.Off counts 4-byte
// words into its buffer, its Shape is the logical [N, K] and its Stride is ignored (rows are
// row-major, RowBytes each, at any byte alignment the encoding allows).
const (
	EncF32  Encoding = 0
	EncI32  Encoding = 1
	EncQ8_0 Encoding = 2 // blocks of 32 values: binary16 scale d, 32 int8 q; value q·d
	EncF16  Encoding = 3
	EncQ4_K Encoding = 5 // GGUF's 256-value super-blocks of 144 bytes
	EncBF16 Encoding = 6
)

func (e Encoding) String() string {
	switch e {
	case EncF32:
		return "F32"
	case EncI32:
		return "I32"
	case EncQ8_0:
		return "Q8_0"
	case EncF16:
		return "F16"
	case EncQ4_K:
		return "Q4_K"
	case EncBF16:
		return "BF16"
	}
	return fmt.Sprintf("encoding %d", int32(e))
}

// BlockValues is the values per block of e (1 for element types), 0 for an unknown one.
func (e Encoding) BlockValues() int64 {
	switch e {
	case EncF32, EncI32, EncF16, EncBF16:
		return 1
	case EncQ8_0:
		return 32
	case EncQ4_K:
		return 256
	}
	return 0
}

// RowBytes is the bytes of a row of k values in e, 0 when k is not a positive multiple of
// e's block.
func (e Encoding) RowBytes(k int64) int64 {
	bv := e.BlockValues()
	if k <= 0 || bv == 0 || k%bv != 0 {
		return 0
	}
	switch e {
	case EncQ8_0:
		return k / 32 * 34
	case EncQ4_K:
		return k / 256 * 144
	case EncF16, EncBF16:
		return 2 * k
	}
	return 4 * k
}

// Geometry of linearq.comp (its R and MC), and the passes over x one workgroup makes: its
// W rows stay in cache from one pass to the next, so up to 64 rows of x (decode, small
// batches) read W from memory once.
const (
	lqRows   = 2 // W rows per workgroup
	lqXRows  = 8 // x rows per pass
	lqPasses = 8
)

// lqDense checks a row-major f32/i32 operand: contiguous, in its buffer, 32-bit indexable.
func lqDense(op, role string, t Tensor) error {
	switch {
	case t.Buf == nil || t.Buf.b == nil:
		return fmt.Errorf("vulkan: %s: %s has no buffer", op, role)
	case len(t.Stride) != len(t.Shape) || len(t.Shape) == 0 || !t.contiguous():
		return fmt.Errorf("vulkan: %s: %s of shape %v (strides %v) must be contiguous", op, role, t.Shape, t.Stride)
	}
	for _, d := range t.Shape {
		if d <= 0 {
			return fmt.Errorf("vulkan: %s: %s of shape %v is empty", op, role, t.Shape)
		}
	}
	end := int64(t.Off) + numel(t.Shape)
	switch {
	case t.Off < 0 || end > int64(t.Buf.Len()):
		return fmt.Errorf("vulkan: %s: %s %v at offset %d reaches past its buffer of %d values", op, role, t.Shape, t.Off, t.Buf.Len())
	case end > math.MaxUint32:
		return fmt.Errorf("vulkan: %s: %s %v at offset %d is past the shaders' 32-bit indices", op, role, t.Shape, t.Off)
	}
	return nil
}

// lqRowStride checks an f32 operand whose rows (its last axis) are contiguous and whose leading
// axes are row-major over rows ld values apart (ld ≥ the row length), and returns ld.
func lqRowStride(op, role string, t Tensor) (ld int64, err error) {
	r := len(t.Shape)
	if t.Buf == nil || t.Buf.b == nil || r == 0 || len(t.Stride) != r {
		return 0, lqDense(op, role, t)
	}
	ld = t.Shape[r-1]
	if r > 1 && t.Shape[r-2] > 1 {
		ld = t.Stride[r-2]
	}
	rows := t
	rows.Shape = append(append([]int64(nil), t.Shape[:r-1]...), ld)
	rows.Stride = append(append([]int64(nil), t.Stride[:r-1]...), 1)
	if t.Stride[r-1] != 1 && t.Shape[r-1] > 1 || ld < t.Shape[r-1] || !rows.contiguous() {
		return 0, fmt.Errorf("vulkan: %s: %s of shape %v (strides %v) must be rows of contiguous values", op, role, t.Shape, t.Stride)
	}
	// The last row ends at its own length, not at ld: check the values it touches.
	if err := lqDense(op, role, Tensor{Buf: t.Buf, Off: t.Off, Shape: []int64{t.span() - int64(t.Off)}, Stride: []int64{1}}); err != nil {
		return 0, err
	}
	for _, d := range t.Shape {
		if d <= 0 {
			return 0, fmt.Errorf("vulkan: %s: %s of shape %v is empty", op, role, t.Shape)
		}
	}
	return ld, nil
}

// lqEncoded checks an encoded [N, K] operand and returns N, K, its row bytes and its words
// as a flat view (what the dispatch reads).
func lqEncoded(op, role string, t Tensor, enc Encoding) (n, k, rb int64, words Tensor, err error) {
	if t.Buf == nil || t.Buf.b == nil {
		return 0, 0, 0, Tensor{}, fmt.Errorf("vulkan: %s: %s has no buffer", op, role)
	}
	if len(t.Shape) != 2 || t.Shape[0] <= 0 || t.Shape[1] <= 0 {
		return 0, 0, 0, Tensor{}, fmt.Errorf("vulkan: %s: %s of shape %v, want [N, K] (N, K > 0)", op, role, t.Shape)
	}
	n, k = t.Shape[0], t.Shape[1]
	if rb = enc.RowBytes(k); rb == 0 {
		return 0, 0, 0, Tensor{}, fmt.Errorf("vulkan: %s: %s %s [%d, %d]: %d values per row is not a multiple of %s's block of %d",
			op, role, enc, n, k, k, enc, enc.BlockValues())
	}
	lo, hi := 4*int64(t.Off), 4*int64(t.Off)+n*rb
	switch {
	case t.Off < 0 || hi > 4*int64(t.Buf.Len()):
		return 0, 0, 0, Tensor{}, fmt.Errorf("vulkan: %s: %s %s [%d, %d] (%d bytes) at byte %d reaches past its buffer of %d bytes",
			op, role, enc, n, k, n*rb, lo, 4*t.Buf.Len())
	case hi > math.MaxUint32:
		return 0, 0, 0, Tensor{}, fmt.Errorf("vulkan: %s: %s %s [%d, %d] at byte %d ends past the shaders' 32-bit byte addresses", op, role, enc, n, k, lo)
	}
	nw := (hi - lo + 3) / 4
	return n, k, rb, Tensor{Buf: t.Buf, Off: t.Off, Shape: []int64{nw}, Stride: []int64{1}}, nil
}

// lqOverlap reports an output that shares values with an input (every workgroup reads all
// of x and W while others write y).
func lqOverlap(op string, y Tensor, roles []string, ins []Tensor) error {
	a := span{y.Buf, int64(y.Off), y.span()} // y's rows may be apart (a slice of columns)
	for i, t := range ins {
		if a.overlaps(span{t.Buf, int64(t.Off), int64(t.Off) + numel(t.Shape)}) {
			return fmt.Errorf("vulkan: %s: y overlaps %s in its buffer", op, roles[i])
		}
	}
	return nil
}

// Linear's shaders: linearq sums by a shared-memory tree; linearq_sg by subgroup additions,
// where the device has subgroup arithmetic; linearq_sg8 in workgroups of one subgroup of 8,
// without barriers, on software devices (their subgroups are at least 8 wide: a workgroup
// is then one subgroup; lavapipe, 4096×4096, one row: 0.31 s → 0.045 s); linearq_dot also
// multiplies a Q8_0 weight by x rounded to int8 in integer dot products, for up to lqDotRows
// x rows (as the CPU's Q8_0 kernel does for decode-sized batches: larger ones keep x in
// fp32), where the device takes it (Device.Int8Dot). From lqTiledRows x rows on, on GPUs
// (Device.tileRow: tileRowsPolicy), linearq_tiled computes 64×64 tiles of y
// (linearq_tiled_f16 with binary16 tiles where the device takes them: Device.HalfTiles): on
// lavapipe the tiles cost the same from 16 rows to 64, linearq_sg 0.03 s more a row from
// 0.14 s; they cross near 19 rows.
const (
	lqDotRows   = 8
	lqTiledRows = 24
	lqTile      = 64
)

// lqTestShader, when set, is the shader Linear takes (linearq_dot only where it applies):
// tests run each on one device.
var lqTestShader string

// lqShader is the shader for a Linear over enc with m x rows on dev.
func lqShader(dev *Device, enc Encoding, m int64) string {
	dot := enc == EncQ8_0 && m <= lqDotRows
	switch {
	case lqTestShader == "linearq_dot" && !dot:
		return "linearq_sg"
	case lqTestShader != "":
		return lqTestShader
	case dev.tileRow > 0 && m >= dev.tileRow && dev.half:
		return "linearq_tiled_f16"
	case dev.tileRow > 0 && m >= dev.tileRow:
		return "linearq_tiled"
	case dot && dev.int8Dot:
		return "linearq_dot"
	case lqOneSubgroup(dev.Info):
		return "linearq_sg8"
	case dev.Info.SubgroupArith:
		return "linearq_sg"
	}
	return "linearq"
}

// lqOneSubgroup reports whether Linear runs linearq_sg8 on a device: a software device with
// subgroup arithmetic in subgroups of at least 8.
func lqOneSubgroup(info DeviceInfo) bool {
	return info.Type == CPU && info.SubgroupArith && info.SubgroupSize >= 8
}

// lqTiled reports whether shader is one of the tiled Linear shaders.
func lqTiled(shader string) bool { return strings.HasPrefix(shader, "linearq_tiled") }

// lqMaxGroups caps a dispatch axis (Vulkan guarantees 65 535); tests lower it to reach the
// shaders' loops over the rest.
var lqMaxGroups int64 = 65535

// lqGroups is a dispatch axis for items, per to a group.
func lqGroups(items, per int64) uint32 { return uint32(min((items+per-1)/per, lqMaxGroups)) }

// LinearQOp is y[.., N] = x[.., K]·Wᵀ (+ bias[N]) with W [N, K] in its file encoding (Q8_0,
// F16, BF16 or Q4_K; see Encoding for how w is addressed), dequantised on the fly and summed
// in fp32. x and bias (N values, any shape) are contiguous f32; y has x's leading axes and
// is contiguous or a slice of columns of a wider output (its rows any stride apart, as when
// a weight held in parts writes one part's columns). The dispatch declares what it reads
// and writes (WithAccess).
func LinearQOp(x Tensor, w Tensor, enc Encoding, bias *Tensor, y Tensor) (Dispatch, error) {
	const op = "linearq"
	switch enc {
	case EncQ8_0, EncF16, EncBF16, EncQ4_K:
	default:
		return Dispatch{}, fmt.Errorf("vulkan: %s: weights in %s are not supported (Q8_0, F16, BF16, Q4_K)", op, enc)
	}
	n, k, rb, wv, err := lqEncoded(op, "W", w, enc)
	if err != nil {
		return Dispatch{}, err
	}
	if err := lqDense(op, "x", x); err != nil {
		return Dispatch{}, err
	}
	ldy, err := lqRowStride(op, "y", y)
	if err != nil {
		return Dispatch{}, err
	}
	r := len(x.Shape)
	if x.Shape[r-1] != k || len(y.Shape) != r || y.Shape[r-1] != n {
		return Dispatch{}, fmt.Errorf("vulkan: %s: x %v, y %v for W [%d, %d]: want x [.., %d], y [.., %d]", op, x.Shape, y.Shape, n, k, k, n)
	}
	for i := range r - 1 {
		if x.Shape[i] != y.Shape[i] {
			return Dispatch{}, fmt.Errorf("vulkan: %s: x %v and y %v differ in their leading axes", op, x.Shape, y.Shape)
		}
	}
	m := numel(x.Shape) / k
	reads, roles := []Tensor{x, wv}, []string{"x", "W"}
	biasBuf, boff, has := y.Buf, uint32(0), uint32(0)
	if bias != nil {
		if err := lqDense(op, "bias", *bias); err != nil {
			return Dispatch{}, err
		}
		if numel(bias.Shape) != n {
			return Dispatch{}, fmt.Errorf("vulkan: %s: bias of shape %v for %d outputs", op, bias.Shape, n)
		}
		biasBuf, boff, has = bias.Buf, uint32(bias.Off), 1
		reads, roles = append(reads, *bias), append(roles, "bias")
	}
	if err := lqOverlap(op, y, roles, reads); err != nil {
		return Dispatch{}, err
	}
	push := []uint32{uint32(m), uint32(n), uint32(k), uint32(enc),
		uint32(4 * w.Off), uint32(rb), uint32(x.Off), uint32(y.Off), boff, has, uint32(ldy)}
	shader := lqShader(x.Buf.dev, enc, m)
	groups := [3]uint32{lqGroups(n, lqRows), lqGroups(m, lqXRows*lqPasses), 1}
	if lqTiled(shader) {
		groups = [3]uint32{lqGroups(n, lqTile), lqGroups(m, lqTile), 1}
	}
	d := Dispatch{op: op, shader: shader, nbuf: 4, bufs: []*Buffer{x.Buf, w.Buf, biasBuf, y.Buf}, push: push, groups: groups}
	return d.WithAccess(reads, []Tensor{y}), nil
}

// GatherRowsOp is y[i, :] = table[idx[i], :] for a table [N, D] in enc: F32 or I32 (a
// contiguous tensor; y of the same type, copied bit for bit) or Q8_0, F16, BF16, Q4_K
// (addressed as Encoding says; y f32, each value as the CPU dequantises it). idx holds M
// int32 (contiguous, any shape), y is contiguous with M·D values and D last. An index
// outside [0, N) gives a row of zeros, where the CPU backend fails the run.
func GatherRowsOp(table Tensor, enc Encoding, idx, y Tensor) (Dispatch, error) {
	return GatherRowsPartOp(table, enc, 0, 0, idx, y)
}

// GatherRowsPartOp is GatherRowsOp for one part of a table held in parts (too large for one
// buffer): table holds its rows [first, first+N) of all. The dispatch writes the rows of y
// whose index falls in the part, and the part at first = 0 the zero rows of indices outside
// [0, all); one dispatch per part gathers the whole table. all = 0 means the table is whole.
func GatherRowsPartOp(table Tensor, enc Encoding, first, all int64, idx, y Tensor) (Dispatch, error) {
	const op = "gather"
	var n, d, rb int64
	var tv Tensor
	switch enc {
	case EncF32, EncI32:
		if err := lqDense(op, "table", table); err != nil {
			return Dispatch{}, err
		}
		if len(table.Shape) != 2 {
			return Dispatch{}, fmt.Errorf("vulkan: %s: table of shape %v, want [N, D]", op, table.Shape)
		}
		n, d, tv = table.Shape[0], table.Shape[1], table
		rb = 4 * d
		if 4*(int64(table.Off)+n*d) > math.MaxUint32 {
			return Dispatch{}, fmt.Errorf("vulkan: %s: table %v at offset %d ends past the shaders' 32-bit byte addresses", op, table.Shape, table.Off)
		}
	case EncQ8_0, EncF16, EncBF16, EncQ4_K:
		var err error
		if n, d, rb, tv, err = lqEncoded(op, "table", table, enc); err != nil {
			return Dispatch{}, err
		}
	default:
		return Dispatch{}, fmt.Errorf("vulkan: %s: tables in %s are not supported (F32, I32, Q8_0, F16, BF16, Q4_K)", op, enc)
	}
	if all == 0 {
		all = n
	}
	if first < 0 || first+n > all || all > math.MaxInt32 {
		return Dispatch{}, fmt.Errorf("vulkan: %s: a part of %d rows from row %d of a table of %d", op, n, first, all)
	}
	if err := lqDense(op, "idx", idx); err != nil {
		return Dispatch{}, err
	}
	if err := lqDense(op, "y", y); err != nil {
		return Dispatch{}, err
	}
	m := numel(idx.Shape)
	if y.Shape[len(y.Shape)-1] != d || numel(y.Shape) != m*d {
		return Dispatch{}, fmt.Errorf("vulkan: %s: y of shape %v for %d indices into a table [%d, %d]: want [%d, %d]", op, y.Shape, m, n, d, m, d)
	}
	if err := lqOverlap(op, y, []string{"table", "idx"}, []Tensor{tv, idx}); err != nil {
		return Dispatch{}, err
	}
	total := m * d
	push := []uint32{uint32(total), uint32(d), uint32(n), uint32(enc),
		uint32(4 * table.Off), uint32(rb), uint32(idx.Off), uint32(y.Off), uint32(first), uint32(all)}
	ds := Dispatch{op: op, shader: "gather", nbuf: 3, bufs: []*Buffer{table.Buf, idx.Buf, y.Buf}, push: push, groups: elementGroups(total)}
	return ds.WithAccess([]Tensor{tv, idx}, []Tensor{y}), nil
}
