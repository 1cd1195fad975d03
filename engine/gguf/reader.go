package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/bits"
	"os"
	"sort"
)

const (
	// Magic is the first four bytes of every GGUF file.
	Magic = "GGUF"
	// DefaultAlignment is the data alignment when general.alignment is absent.
	DefaultAlignment = 32
	// KeyAlignment is the metadata key that overrides the data alignment.
	KeyAlignment = "general.alignment"
	// MaxDims is the largest number of tensor dimensions accepted (ggml's limit).
	MaxDims = 4

	maxAlignment = 1 << 30
	maxNesting   = 16 // arrays of arrays
)

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name string
	// Dims are the dimensions as stored: ggml order, innermost (fastest varying) first.
	Dims []uint64
	Type DType
	// Offset is the start of the tensor's data relative to the file's data section.
	Offset uint64
	// Size is the length of the tensor's data in bytes.
	Size uint64
}

// NumElements is the product of the dims.
func (t *TensorInfo) NumElements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d // validated by the parser not to overflow
	}
	return n
}

// Shape returns the dims in PyTorch order (outermost first), the reverse of Dims.
func (t *TensorInfo) Shape() []int {
	s := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		s[len(s)-1-i] = int(d)
	}
	return s
}

// File is a parsed GGUF file. Tensor data is read lazily from the underlying bytes, which
// for a file from Open are memory-mapped until Close.
type File struct {
	Version uint32
	KV      KV
	// Tensors are in the order the file lists them.
	Tensors []TensorInfo
	// Alignment is the data alignment in bytes.
	Alignment uint64
	// DataOffset is the absolute offset of the data section in the file.
	DataOffset uint64

	data   []byte
	byName map[string]int
	unmap  func() error
	closed bool
}

// Open maps (or, where mapping is unavailable, reads) the file at path and parses it. Call
// Close to release the mapping; tensor data returned by TensorData is only valid until then.
func Open(path string) (*File, error) {
	data, unmap, err := mapFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in the message
		}
		return nil, fmt.Errorf("gguf: open %s: %w", path, err)
	}
	f, err := Parse(data)
	if err != nil {
		if unmap != nil {
			_ = unmap()
		}
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	f.unmap = unmap
	return f, nil
}

// Close releases the file's memory mapping. It is safe to call more than once.
func (f *File) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	f.data = nil
	if f.unmap != nil {
		u := f.unmap
		f.unmap = nil
		return u()
	}
	return nil
}

// Parse parses a GGUF file held in memory. The returned File refers to data (tensor data is
// not copied), so data must not be modified while the File is in use.
func Parse(data []byte) (*File, error) {
	p := &parser{b: data}
	f, err := p.parse()
	if err != nil {
		return nil, err
	}
	f.data = data
	return f, nil
}

// Tensor looks up a tensor by name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns the raw bytes of a tensor. They alias the file's memory: do not
// modify them, and do not use them after Close.
func (f *File) TensorData(name string) ([]byte, *TensorInfo, error) {
	if f.closed {
		return nil, nil, fmt.Errorf("gguf: tensor %q: file is closed", name)
	}
	t, ok := f.Tensor(name)
	if !ok {
		return nil, nil, fmt.Errorf("gguf: tensor %q not found", name)
	}
	start := f.DataOffset + t.Offset
	return f.data[start : start+t.Size : start+t.Size], t, nil
}

// Float32 returns a copy of a tensor's data converted to float32, and its shape in PyTorch
// order (outermost first, so the data is row-major in that shape) as the ggml dims give it.
// F32, F16, BF16, Q8_0 and Q4_K are supported (see Dequantize); other types return an error
// naming the type.
func (f *File) Float32(name string) ([]float32, []int, error) {
	raw, t, err := f.TensorData(name)
	if err != nil {
		return nil, nil, err
	}
	out, err := dequantTensor(raw, t)
	if err != nil {
		return nil, nil, err
	}
	return out, t.Shape(), nil
}

func dequantTensor(raw []byte, t *TensorInfo) ([]float32, error) {
	if !CanDequantize(t.Type) {
		return nil, fmt.Errorf("gguf: tensor %q: dtype %s not supported (supported: F32, F16, BF16, Q8_0, Q4_K)", t.Name, t.Type)
	}
	n := t.NumElements()
	if n > uint64(math.MaxInt) {
		return nil, fmt.Errorf("gguf: tensor %q: %d elements is too many", t.Name, n)
	}
	out := make([]float32, n)
	if err := Dequantize(out, raw, t.Type); err != nil {
		return nil, fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
	}
	return out, nil
}

// parser reads the header of a GGUF file, checking every read against the data length.
type parser struct {
	b   []byte
	off int
}

var errTruncated = errors.New("unexpected end of file")

func (p *parser) left() int { return len(p.b) - p.off }

func (p *parser) take(n int, what string) ([]byte, error) {
	if n < 0 || n > p.left() {
		return nil, fmt.Errorf("%s at offset %d: need %d bytes, %d left: %w", what, p.off, n, p.left(), errTruncated)
	}
	s := p.b[p.off : p.off+n]
	p.off += n
	return s, nil
}

func (p *parser) u32(what string) (uint32, error) {
	s, err := p.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(s), nil
}

func (p *parser) u64(what string) (uint64, error) {
	s, err := p.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(s), nil
}

func (p *parser) str(what string) (string, error) {
	start := p.off
	n, err := p.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(p.left()) {
		return "", fmt.Errorf("%s at offset %d: length %d exceeds the %d bytes left: %w", what, start, n, p.left(), errTruncated)
	}
	s, _ := p.take(int(n), what)
	return string(s), nil
}

// count reads an element count and checks that count elements of at least minSize bytes
// each fit in what is left, so nothing is allocated for data that is not there.
func (p *parser) count(what string, minSize int) (int, error) {
	start := p.off
	n, err := p.u64(what)
	if err != nil {
		return 0, err
	}
	if minSize < 1 {
		minSize = 1
	}
	if n > uint64(p.left()/minSize) {
		return 0, fmt.Errorf("%s at offset %d: %d entries of at least %d bytes cannot fit in the %d bytes left: %w",
			what, start, n, minSize, p.left(), errTruncated)
	}
	return int(n), nil
}

func (p *parser) parse() (*File, error) {
	if len(p.b) < 4 || string(p.b[:4]) != Magic {
		if len(p.b) < 4 {
			return nil, fmt.Errorf("gguf: file too short (%d bytes) for the magic", len(p.b))
		}
		return nil, fmt.Errorf("gguf: not a GGUF file: bad magic %q, want %q", p.b[:4], Magic)
	}
	p.off = 4
	version, err := p.u32("version")
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return nil, errors.New("gguf: version 1 files (32-bit counts) are not supported; convert to v3")
	case bits.ReverseBytes32(version) >= 1 && bits.ReverseBytes32(version) <= 3:
		return nil, fmt.Errorf("gguf: big-endian file (version %d byte-swapped) is not supported", bits.ReverseBytes32(version))
	default:
		return nil, fmt.Errorf("gguf: unsupported version %d", version)
	}
	nTensors, err := p.u64("tensor count")
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	nKV, err := p.u64("metadata count")
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	// A key-value takes at least 8+4+1 bytes, a tensor info at least 8+4+4+8.
	if nKV > uint64(p.left()/13) {
		return nil, fmt.Errorf("gguf: metadata count %d cannot fit in a %d-byte file", nKV, len(p.b))
	}
	f := &File{Version: version, KV: make(KV, int(nKV)), Alignment: DefaultAlignment}
	for i := 0; i < int(nKV); i++ {
		key, err := p.str("metadata key")
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata entry %d: %w", i, err)
		}
		if _, dup := f.KV[key]; dup {
			return nil, fmt.Errorf("gguf: metadata key %q appears twice", key)
		}
		t, err := p.u32("value type")
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata key %q: %w", key, err)
		}
		v, err := p.value(ValueType(t), 0)
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata key %q: %w", key, err)
		}
		f.KV[key] = v
	}
	if v, ok := f.KV[KeyAlignment]; ok {
		a, ok := v.AsUint()
		if !ok || a == 0 || a > maxAlignment || a&(a-1) != 0 {
			return nil, fmt.Errorf("gguf: %s = %v (%s): want a power of two between 1 and %d",
				KeyAlignment, v.v, v.describe(), maxAlignment)
		}
		f.Alignment = a
	}

	if nTensors > uint64(p.left()/24) {
		return nil, fmt.Errorf("gguf: tensor count %d cannot fit in the %d bytes left after the metadata", nTensors, p.left())
	}
	f.Tensors = make([]TensorInfo, int(nTensors))
	f.byName = make(map[string]int, int(nTensors))
	for i := range f.Tensors {
		t, err := p.tensorInfo()
		if err != nil {
			if t.Name != "" {
				return nil, fmt.Errorf("gguf: tensor %d (%q): %w", i, t.Name, err)
			}
			return nil, fmt.Errorf("gguf: tensor %d: %w", i, err)
		}
		if _, dup := f.byName[t.Name]; dup {
			return nil, fmt.Errorf("gguf: tensor %q appears twice", t.Name)
		}
		if t.Offset%f.Alignment != 0 {
			return nil, fmt.Errorf("gguf: tensor %q: offset %d is not a multiple of the alignment %d", t.Name, t.Offset, f.Alignment)
		}
		f.byName[t.Name] = i
		f.Tensors[i] = t
	}

	headerEnd := uint64(p.off)
	f.DataOffset = (headerEnd + f.Alignment - 1) / f.Alignment * f.Alignment
	fileSize := uint64(len(p.b))
	if len(f.Tensors) > 0 && f.DataOffset > fileSize {
		return nil, fmt.Errorf("gguf: data section starts at %d, beyond end of file (%d bytes)", f.DataOffset, fileSize)
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		start := f.DataOffset + t.Offset
		end := start + t.Size
		if start < t.Offset || end < start || end > fileSize {
			return nil, fmt.Errorf("gguf: tensor %q: data [%d,%d) beyond end of file (%d bytes)",
				t.Name, f.DataOffset+t.Offset, f.DataOffset+t.Offset+t.Size, fileSize)
		}
	}
	if err := checkOverlap(f.Tensors); err != nil {
		return nil, err
	}
	return f, nil
}

func checkOverlap(ts []TensorInfo) error {
	idx := make([]int, 0, len(ts))
	for i := range ts {
		if ts[i].Size > 0 {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return ts[idx[a]].Offset < ts[idx[b]].Offset })
	for k := 1; k < len(idx); k++ {
		a, b := &ts[idx[k-1]], &ts[idx[k]]
		if a.Offset+a.Size > b.Offset {
			return fmt.Errorf("gguf: tensors %q [%d,%d) and %q [%d,%d) overlap in the data section",
				a.Name, a.Offset, a.Offset+a.Size, b.Name, b.Offset, b.Offset+b.Size)
		}
	}
	return nil
}

func (p *parser) tensorInfo() (TensorInfo, error) {
	var t TensorInfo
	name, err := p.str("tensor name")
	if err != nil {
		return t, err
	}
	if name == "" {
		return t, errors.New("empty tensor name")
	}
	t.Name = name
	nd, err := p.u32("dimension count")
	if err != nil {
		return t, err
	}
	if nd > MaxDims {
		return t, fmt.Errorf("%d dimensions, at most %d are supported", nd, MaxDims)
	}
	t.Dims = make([]uint64, nd)
	elems := uint64(1)
	for i := range t.Dims {
		d, err := p.u64("dimension")
		if err != nil {
			return t, err
		}
		if d > math.MaxInt64 || d > uint64(math.MaxInt) {
			return t, fmt.Errorf("dimension %d is %d, too large", i, d)
		}
		t.Dims[i] = d
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 || lo > math.MaxInt64 {
			return t, fmt.Errorf("dims %v: element count overflows", t.Dims[:i+1])
		}
		elems = lo
	}
	typ, err := p.u32("tensor type")
	if err != nil {
		return t, err
	}
	t.Type = DType(typ)
	info, ok := dtypes[t.Type]
	if !ok {
		return t, fmt.Errorf("unknown tensor type %d", typ)
	}
	if nd > 0 && t.Dims[0]%info.blockSize != 0 {
		return t, fmt.Errorf("innermost dimension %d is not a multiple of the %s block size %d", t.Dims[0], t.Type, info.blockSize)
	}
	if nd == 0 && info.blockSize != 1 {
		return t, fmt.Errorf("a scalar cannot have block type %s", t.Type)
	}
	hi, size := bits.Mul64(elems/info.blockSize, info.blockLen)
	if hi != 0 || size > math.MaxInt64 {
		return t, fmt.Errorf("dims %v of %s: byte size overflows", t.Dims, t.Type)
	}
	t.Size = size
	if t.Offset, err = p.u64("tensor offset"); err != nil {
		return t, err
	}
	return t, nil
}

// value reads one value of type t.
func (p *parser) value(t ValueType, depth int) (Value, error) {
	if !t.valid() {
		return Value{}, fmt.Errorf("unknown value type %d at offset %d", uint32(t), p.off-4)
	}
	if t == TypeArray {
		return p.array(depth)
	}
	if t == TypeString {
		s, err := p.str("string")
		return Value{typ: TypeString, v: s}, err
	}
	s, err := p.take(t.fixedSize(), t.String())
	if err != nil {
		return Value{}, err
	}
	v := Value{typ: t}
	switch t {
	case TypeUint8:
		v.v = s[0]
	case TypeInt8:
		v.v = int8(s[0])
	case TypeBool:
		if s[0] > 1 {
			return Value{}, fmt.Errorf("bool value %d at offset %d is neither 0 nor 1", s[0], p.off-1)
		}
		v.v = s[0] == 1
	case TypeUint16:
		v.v = binary.LittleEndian.Uint16(s)
	case TypeInt16:
		v.v = int16(binary.LittleEndian.Uint16(s))
	case TypeUint32:
		v.v = binary.LittleEndian.Uint32(s)
	case TypeInt32:
		v.v = int32(binary.LittleEndian.Uint32(s))
	case TypeFloat32:
		v.v = math.Float32frombits(binary.LittleEndian.Uint32(s))
	case TypeUint64:
		v.v = binary.LittleEndian.Uint64(s)
	case TypeInt64:
		v.v = int64(binary.LittleEndian.Uint64(s))
	case TypeFloat64:
		v.v = math.Float64frombits(binary.LittleEndian.Uint64(s))
	}
	return v, nil
}

func (p *parser) array(depth int) (Value, error) {
	if depth >= maxNesting {
		return Value{}, fmt.Errorf("arrays nested more than %d deep", maxNesting)
	}
	et, err := p.u32("array element type")
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	if !elem.valid() {
		return Value{}, fmt.Errorf("array of unknown value type %d", et)
	}
	n, err := p.count("array length", elem.minSize())
	if err != nil {
		return Value{}, err
	}
	size := elem.fixedSize()
	var raw []byte
	if size > 0 {
		raw, _ = p.take(n*size, "array") // fits: checked by count
	}
	v := Value{typ: TypeArray, elem: elem}
	le := binary.LittleEndian
	switch elem {
	case TypeUint8:
		v.v = append([]uint8(nil), raw...)
	case TypeInt8:
		a := make([]int8, n)
		for i := range a {
			a[i] = int8(raw[i])
		}
		v.v = a
	case TypeBool:
		a := make([]bool, n)
		for i := range a {
			if raw[i] > 1 {
				return Value{}, fmt.Errorf("bool array element %d is %d, neither 0 nor 1", i, raw[i])
			}
			a[i] = raw[i] == 1
		}
		v.v = a
	case TypeUint16:
		v.v = decode(n, func(i int) uint16 { return le.Uint16(raw[2*i:]) })
	case TypeInt16:
		v.v = decode(n, func(i int) int16 { return int16(le.Uint16(raw[2*i:])) })
	case TypeUint32:
		v.v = decode(n, func(i int) uint32 { return le.Uint32(raw[4*i:]) })
	case TypeInt32:
		v.v = decode(n, func(i int) int32 { return int32(le.Uint32(raw[4*i:])) })
	case TypeFloat32:
		v.v = decode(n, func(i int) float32 { return math.Float32frombits(le.Uint32(raw[4*i:])) })
	case TypeUint64:
		v.v = decode(n, func(i int) uint64 { return le.Uint64(raw[8*i:]) })
	case TypeInt64:
		v.v = decode(n, func(i int) int64 { return int64(le.Uint64(raw[8*i:])) })
	case TypeFloat64:
		v.v = decode(n, func(i int) float64 { return math.Float64frombits(le.Uint64(raw[8*i:])) })
	case TypeString:
		a := make([]string, n)
		for i := range a {
			if a[i], err = p.str("string"); err != nil {
				return Value{}, fmt.Errorf("array element %d: %w", i, err)
			}
		}
		v.v = a
	case TypeArray:
		a := make([]Value, n)
		for i := range a {
			if a[i], err = p.array(depth + 1); err != nil {
				return Value{}, fmt.Errorf("array element %d: %w", i, err)
			}
		}
		v.v = a
	}
	return v, nil
}

func decode[T any](n int, at func(int) T) []T {
	a := make([]T, n)
	for i := range a {
		a[i] = at(i)
	}
	return a
}

// readWhole is the fallback when a file cannot be memory-mapped.
func readWhole(path string) ([]byte, func() error, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	return b, nil, nil
}
