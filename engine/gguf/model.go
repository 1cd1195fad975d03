package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
)

// Metadata keys of the audio.cpp packaging (the converter audiocpp_gguf writes them; see
// shared/reference/audiocpp.md §3.8).
const (
	// KeyTensorNames is the logical name of every tensor, in tensor-info order.
	KeyTensorNames = "audiocpp.tensor_names"
	// KeyTensorRanks is the PyTorch rank of every tensor, in tensor-info order.
	KeyTensorRanks = "audiocpp.tensor_ranks"
	// KeyTensorShapes is every tensor's PyTorch shape, concatenated (sum of the ranks).
	KeyTensorShapes = "audiocpp.tensor_shapes"
	// KeyEmbeddedNames, KeyEmbeddedOffsets (n+1 entries) and KeyEmbeddedData (one uint8
	// blob) hold the sidecar files (config.json, vocab.json, …) packed into the file.
	KeyEmbeddedNames   = "audiocpp.embedded_files.names"
	KeyEmbeddedOffsets = "audiocpp.embedded_files.offsets"
	KeyEmbeddedData    = "audiocpp.embedded_files.data"

	// PhysicalPrefix starts the stored name of a tensor whose logical name is too long for
	// ggml (64 bytes or more) or duplicated: "_audiocpp.<tensor index>".
	PhysicalPrefix = "_audiocpp."

	maxLogicalRank = 16
)

// ModelTensor is one tensor of a Model.
type ModelTensor struct {
	// Name is the logical name relative to the view (a Sub view strips its namespace).
	Name string
	// FullName is the logical name in the file, namespace included.
	FullName string
	// Shape is the logical shape in PyTorch order (outermost first); empty for a scalar.
	Shape []int
	// Info is the tensor as stored: physical name, ggml dims, dtype, size.
	Info *TensorInfo
}

// Namespace is the part of a logical name before its first '/', or "" when it has none.
func Namespace(name string) string {
	if i := strings.IndexByte(name, '/'); i >= 0 {
		return name[:i]
	}
	return ""
}

// Model is a view of a File by logical tensor names and PyTorch-order shapes, in the
// packaging of the audio.cpp model files: logical names come from audiocpp.tensor_names
// (stored names that ggml could not hold, "_audiocpp.<index>", map back through it) and
// shapes from audiocpp.tensor_shapes/ranks. Without those keys the stored names and the
// reversed ggml dims are used, so a plain GGUF file works too.
//
// Logical names are "<namespace>/<name>" ("vc/transformer_blocks.0.attn.to_q.weight"),
// or have no namespace (MioTTS keeps its Hugging Face names at the root). Sub gives the view
// of one namespace with the prefix stripped. Embedded files and metadata belong to the whole
// file and are visible from every view.
//
// A Model is safe for concurrent use; it reads the File's data, so it is valid until the
// File is closed.
type Model struct {
	File *File

	prefix  string // "" or "ns/" (full names of this view start with it)
	tensors []ModelTensor
	byName  map[string]int
	emb     *embedded
}

type embedded struct {
	names []string
	data  map[string][]byte
}

// OpenModel opens a GGUF file and builds its Model view. Close the model to release the
// file.
func OpenModel(path string) (*Model, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	m, err := NewModel(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return m, nil
}

// Close closes the underlying File.
func (m *Model) Close() error { return m.File.Close() }

// NewModel builds the Model view of f, validating the audio.cpp metadata: one logical name
// and rank per tensor, shapes that add up to the ranks and hold as many elements as the
// stored tensor, no logical name twice, embedded-file offsets within the blob.
func NewModel(f *File) (*Model, error) {
	n := len(f.Tensors)
	logical := make([]string, n)
	shapes := make([][]int, n)
	for i := range f.Tensors {
		logical[i] = f.Tensors[i].Name
		shapes[i] = f.Tensors[i].Shape()
	}
	if _, ok := f.KV[KeyTensorNames]; ok {
		names, err := f.KV.Strings(KeyTensorNames)
		if err != nil {
			return nil, err
		}
		if len(names) != n {
			return nil, fmt.Errorf("gguf: %s has %d names for %d tensors", KeyTensorNames, len(names), n)
		}
		for i, name := range names {
			phys := f.Tensors[i].Name
			if name == "" {
				return nil, fmt.Errorf("gguf: %s[%d] (tensor %q) is empty", KeyTensorNames, i, phys)
			}
			if idx, ok := strings.CutPrefix(phys, PhysicalPrefix); ok {
				if k, err := strconv.Atoi(idx); err != nil || k != i {
					return nil, fmt.Errorf("gguf: tensor %d is stored as %q, want %s%d", i, phys, PhysicalPrefix, i)
				}
			} else if phys != name {
				return nil, fmt.Errorf("gguf: tensor %d is stored as %q but %s[%d] is %q", i, phys, KeyTensorNames, i, name)
			}
			logical[i] = name
		}
	}
	_, hasRanks := f.KV[KeyTensorRanks]
	_, hasShapes := f.KV[KeyTensorShapes]
	if hasRanks != hasShapes {
		return nil, fmt.Errorf("gguf: %s and %s must be given together", KeyTensorRanks, KeyTensorShapes)
	}
	if hasRanks {
		ranks, err := f.KV.Ints(KeyTensorRanks)
		if err != nil {
			return nil, err
		}
		dims, err := f.KV.Ints(KeyTensorShapes)
		if err != nil {
			return nil, err
		}
		if len(ranks) != n {
			return nil, fmt.Errorf("gguf: %s has %d ranks for %d tensors", KeyTensorRanks, len(ranks), n)
		}
		off := 0
		for i, r := range ranks {
			if r < 0 || r > maxLogicalRank {
				return nil, fmt.Errorf("gguf: %s[%d] (tensor %q) is %d, want 0..%d", KeyTensorRanks, i, logical[i], r, maxLogicalRank)
			}
			if int(r) > len(dims)-off {
				return nil, fmt.Errorf("gguf: %s ends at tensor %d (%q): %d dims for ranks that need more",
					KeyTensorShapes, i, logical[i], len(dims))
			}
			shape := make([]int, r)
			elems := uint64(1)
			for j := range shape {
				d := dims[off+j]
				if d < 0 || d > int64(math.MaxInt) {
					return nil, fmt.Errorf("gguf: tensor %q: logical shape %v has a dimension out of range", logical[i], dims[off:off+int(r)])
				}
				hi, lo := bits.Mul64(elems, uint64(d))
				if hi != 0 || lo > math.MaxInt64 {
					return nil, fmt.Errorf("gguf: tensor %q: logical shape %v overflows", logical[i], dims[off:off+int(r)])
				}
				elems = lo
				shape[j] = int(d)
			}
			off += int(r)
			if want := f.Tensors[i].NumElements(); elems != want {
				return nil, fmt.Errorf("gguf: tensor %q: logical shape %v has %d elements, the stored dims %v have %d",
					logical[i], shape, elems, f.Tensors[i].Dims, want)
			}
			shapes[i] = shape
		}
		if off != len(dims) {
			return nil, fmt.Errorf("gguf: %s has %d dims, the ranks add up to %d", KeyTensorShapes, len(dims), off)
		}
	}

	m := &Model{File: f, tensors: make([]ModelTensor, n), byName: make(map[string]int, n)}
	for i := range f.Tensors {
		name := logical[i]
		if j, dup := m.byName[name]; dup {
			return nil, fmt.Errorf("gguf: logical tensor name %q is used by tensors %d and %d", name, j, i)
		}
		m.byName[name] = i
		m.tensors[i] = ModelTensor{Name: name, FullName: name, Shape: shapes[i], Info: &f.Tensors[i]}
	}
	emb, err := readEmbedded(f.KV)
	if err != nil {
		return nil, err
	}
	m.emb = emb
	return m, nil
}

func readEmbedded(kv KV) (*embedded, error) {
	e := &embedded{data: map[string][]byte{}}
	_, hn := kv[KeyEmbeddedNames]
	_, ho := kv[KeyEmbeddedOffsets]
	_, hd := kv[KeyEmbeddedData]
	if !hn && !ho && !hd {
		return e, nil
	}
	if !hn || !ho || !hd {
		return nil, fmt.Errorf("gguf: %s, %s and %s must be given together", KeyEmbeddedNames, KeyEmbeddedOffsets, KeyEmbeddedData)
	}
	names, err := kv.Strings(KeyEmbeddedNames)
	if err != nil {
		return nil, err
	}
	offs, err := kv.Ints(KeyEmbeddedOffsets)
	if err != nil {
		return nil, err
	}
	blob, ok := kv[KeyEmbeddedData].Any().([]uint8)
	if !ok || kv[KeyEmbeddedData].Type() != TypeArray {
		return nil, typeErr(KeyEmbeddedData, kv[KeyEmbeddedData], "array of uint8")
	}
	if len(offs) != len(names)+1 {
		return nil, fmt.Errorf("gguf: %s has %d entries for %d files, want %d", KeyEmbeddedOffsets, len(offs), len(names), len(names)+1)
	}
	if offs[0] != 0 || offs[len(names)] != int64(len(blob)) {
		return nil, fmt.Errorf("gguf: %s run from %d to %d, want 0 to %d (the size of %s)",
			KeyEmbeddedOffsets, offs[0], offs[len(names)], len(blob), KeyEmbeddedData)
	}
	for i, name := range names {
		if name == "" {
			return nil, fmt.Errorf("gguf: embedded file %d has no name", i)
		}
		if _, dup := e.data[name]; dup {
			return nil, fmt.Errorf("gguf: embedded file %q appears twice", name)
		}
		a, b := offs[i], offs[i+1]
		if a > b || b > int64(len(blob)) {
			return nil, fmt.Errorf("gguf: embedded file %q: offsets %d..%d are not an ordered range within the %d-byte %s",
				name, a, b, len(blob), KeyEmbeddedData)
		}
		e.data[name] = blob[a:b:b]
	}
	e.names = names
	return e, nil
}

// Sub returns the view of namespace ns: the tensors named "ns/…", with "ns/" stripped.
// Sub("") is the view of the tensors without a namespace. Nested namespaces work
// ("a/b/c" is "c" in Sub("a").Sub("b")). A namespace without tensors gives an empty view.
func (m *Model) Sub(ns string) *Model {
	v := &Model{File: m.File, prefix: m.prefix, byName: map[string]int{}, emb: m.emb}
	if ns != "" {
		v.prefix += ns + "/"
	}
	for _, t := range m.tensors {
		if Namespace(t.Name) != ns {
			continue
		}
		if ns != "" {
			t.Name = t.Name[len(ns)+1:]
		}
		v.byName[t.Name] = len(v.tensors)
		v.tensors = append(v.tensors, t)
	}
	return v
}

// Prefix is what this view strips from full logical names ("" for the whole file,
// "vc/" for Sub("vc")).
func (m *Model) Prefix() string { return m.prefix }

// Namespaces returns the namespaces of the view's tensor names, sorted; "" stands for
// names without a namespace and is listed only when there are such names.
func (m *Model) Namespaces() []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range m.tensors {
		ns := Namespace(t.Name)
		if !seen[ns] {
			seen[ns] = true
			out = append(out, ns)
		}
	}
	sort.Strings(out)
	return out
}

// Names returns the view's logical tensor names in file order.
func (m *Model) Names() []string {
	out := make([]string, len(m.tensors))
	for i, t := range m.tensors {
		out[i] = t.Name
	}
	return out
}

// Tensors returns the view's tensors in file order (shared; do not modify).
func (m *Model) Tensors() []ModelTensor { return m.tensors }

// Len is the number of tensors in the view.
func (m *Model) Len() int { return len(m.tensors) }

// Has reports whether the view has a tensor of that logical name.
func (m *Model) Has(name string) bool {
	_, ok := m.byName[name]
	return ok
}

// Tensor looks up a tensor by logical name.
func (m *Model) Tensor(name string) (*ModelTensor, bool) {
	i, ok := m.byName[name]
	if !ok {
		return nil, false
	}
	return &m.tensors[i], true
}

// Shape is a tensor's logical shape (PyTorch order), read from the metadata only.
func (m *Model) Shape(name string) ([]int, bool) {
	t, ok := m.Tensor(name)
	if !ok {
		return nil, false
	}
	return append([]int{}, t.Shape...), true
}

// Get returns a tensor's values dequantised to float32 (a new slice, row-major in the
// shape) and its logical shape in PyTorch order (a new slice; empty for a scalar).
func (m *Model) Get(name string) ([]float32, []int, error) {
	t, ok := m.Tensor(name)
	if !ok {
		return nil, nil, fmt.Errorf("gguf: tensor %q not found", m.prefix+name)
	}
	raw, _, err := m.File.TensorData(t.Info.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("gguf: tensor %q: %w", t.FullName, err)
	}
	data, err := dequantTensor(raw, t.Info)
	if m.File.unmap != nil {
		dropPages(raw) // the values are copied out: the file's pages need not stay resident
	}
	if err != nil {
		if t.Info.Name != t.FullName {
			return nil, nil, fmt.Errorf("%w (logical name %q)", err, t.FullName)
		}
		return nil, nil, err
	}
	return data, append([]int{}, t.Shape...), nil
}

// Raw returns a tensor's data as stored (a view of the file, valid until Close; do not
// modify), its dtype and its logical shape: for loaders that keep weights in their encoding.
func (m *Model) Raw(name string) ([]byte, DType, []int, error) {
	t, ok := m.Tensor(name)
	if !ok {
		return nil, 0, nil, fmt.Errorf("gguf: tensor %q not found", m.prefix+name)
	}
	raw, _, err := m.File.TensorData(t.Info.Name)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("gguf: tensor %q: %w", t.FullName, err)
	}
	return raw, t.Info.Type, append([]int{}, t.Shape...), nil
}

// Done tells the model a loader has copied a tensor returned by Raw: its file pages leave
// the process's resident memory (reading raw again still works; it is read back from the
// file).
func (m *Model) Done(raw []byte) {
	if m.File.unmap != nil {
		dropPages(raw)
	}
}

// GetInt32 returns an I32 tensor's values (token ids, positions in test cases) and its shape.
func (m *Model) GetInt32(name string) ([]int32, []int, error) {
	t, ok := m.Tensor(name)
	if !ok {
		return nil, nil, fmt.Errorf("gguf: tensor %q not found", m.prefix+name)
	}
	raw, info, err := m.File.TensorData(t.Info.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("gguf: tensor %q: %w", t.FullName, err)
	}
	if info.Type != I32 {
		return nil, nil, fmt.Errorf("gguf: tensor %q is %s, not I32", t.FullName, info.Type)
	}
	out := make([]int32, len(raw)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out, append([]int{}, t.Shape...), nil
}

// EmbeddedFiles returns the names of the embedded files in stored order (shared; do not
// modify). Names may contain '/' ("wavlm-base-plus-mlx/config.json").
func (m *Model) EmbeddedFiles() []string { return m.emb.names }

// EmbeddedFile returns the contents of an embedded file. The bytes are shared with the
// parsed metadata (they stay valid after Close): do not modify them.
func (m *Model) EmbeddedFile(name string) ([]byte, bool) {
	b, ok := m.emb.data[name]
	return b, ok
}
