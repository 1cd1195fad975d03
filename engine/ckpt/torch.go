package ckpt

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// PyTorch checkpoints.
//
// torch.save (zip, torch ≥ 1.6): PREFIX/data.pkl pickles the object (a state dict, or a dict
// holding one); every tensor is torch._utils._rebuild_tensor_v2(storage, offset, size,
// stride, requires_grad, hooks) whose storage is a persistent id ('storage', torch.XStorage,
// key, location, numel) with its bytes in PREFIX/data/KEY. torch.jit.save writes the same
// zip layout with the module tree in data.pkl as __torch__.* objects (NEWOBJ + BUILD with a
// dict of attributes: parameters, buffers, submodules), tensor constants in constants.pkl
// (storages under PREFIX/constants/), and TorchScript source under PREFIX/code/ (ignored).
// Legacy torch.save files are a sequence of pickles (magic number, protocol, system info,
// the object, the storage keys) followed by the raw storages, each after its 8-byte
// element count.

// TensorRef is a tensor record built by the allowed rebuild functions.
type TensorRef struct {
	storage *storageRef
	offset  int64 // elements into the storage
	shape   []int64
	stride  []int64
}

// storageRef is a storage a persistent id named: its element type, its element count, and
// where its bytes are.
type storageRef struct {
	key   string
	dtype DType
	numel int64
	where string
	open  func(off, n int64) (io.ReadCloser, error)
}

// storageType is the marker a torch.XStorage global resolves to.
type storageType struct{ dtype DType }

var storageTypes = map[string]DType{
	"FloatStorage": F32, "HalfStorage": F16, "BFloat16Storage": BF16, "DoubleStorage": F64,
	"LongStorage": I64, "IntStorage": I32, "ShortStorage": I16, "CharStorage": I8,
	"ByteStorage": U8, "BoolStorage": Bool,
}

// torchResolver is the allow-list of globals in torch pickles.
func torchResolver(module, name string) (any, error) {
	full := module + "." + name
	switch {
	case module == "collections" && name == "OrderedDict":
		return &Callable{Name: full, Call: newOrderedDict}, nil
	case module == "torch._utils" && name == "_rebuild_tensor_v2":
		return &Callable{Name: full, Call: rebuildTensorV2}, nil
	case module == "torch._utils" && (name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state"):
		return &Callable{Name: full, Call: func(args Tuple) (any, error) {
			if len(args) < 1 {
				return nil, errors.New("no arguments")
			}
			t, ok := args[0].(*TensorRef)
			if !ok {
				return nil, fmt.Errorf("data is %s, not a tensor", describe(args[0]))
			}
			return t, nil
		}}, nil
	case module == "torch._tensor" && name == "_rebuild_from_type_v2":
		return &Callable{Name: full, Call: func(args Tuple) (any, error) {
			if len(args) != 4 {
				return nil, fmt.Errorf("%d arguments, want 4", len(args))
			}
			f, ok := args[0].(*Callable)
			if !ok || f.Name != "torch._utils._rebuild_tensor_v2" {
				return nil, fmt.Errorf("rebuilds with %s", describe(args[0]))
			}
			inner, ok := args[2].(Tuple)
			if !ok {
				return nil, fmt.Errorf("arguments %s, not a tuple", describe(args[2]))
			}
			return f.Call(inner)
		}}, nil
	case (module == "torch" || module == "torch.cuda") && storageTypes[name] != Unknown:
		return storageType{storageTypes[name]}, nil
	case module == "torch" && (name == "Tensor" || name == "device" || name == "Size"):
		if name == "Tensor" {
			return Global{module, name}, nil
		}
		return &Callable{Name: full, Call: func(args Tuple) (any, error) {
			if name == "Size" && len(args) == 1 {
				return args[0], nil
			}
			return Global{module, name}, nil // a device: where the tensor lived, not needed
		}}, nil
	case module == "torch.nn.parameter" && name == "Parameter":
		return Global{module, name}, nil
	case module == "torch.jit._pickle":
		switch name {
		case "build_intlist", "build_doublelist", "build_boollist", "build_tensorlist", "build_strlist":
			return &Callable{Name: full, Call: func(args Tuple) (any, error) {
				if len(args) != 1 {
					return nil, fmt.Errorf("%d arguments, want 1", len(args))
				}
				return args[0], nil
			}}, nil
		case "restore_type_tag":
			return &Callable{Name: full, Call: func(args Tuple) (any, error) {
				if len(args) < 1 {
					return nil, errors.New("no arguments")
				}
				return args[0], nil
			}}, nil
		}
	case module == "_codecs" && name == "encode":
		// Protocol 2 spells bytes as _codecs.encode(text, "latin1").
		return &Callable{Name: full, Call: func(args Tuple) (any, error) {
			s, ok := args0[string](args)
			if !ok || len(args) != 2 || args[1] != "latin1" {
				return nil, fmt.Errorf("arguments %s", describe(args))
			}
			b := make([]byte, 0, len(s))
			for _, r := range s {
				if r > 0xff {
					return nil, errors.New("not latin-1 text")
				}
				b = append(b, byte(r))
			}
			return b, nil
		}}, nil
	case (module == "builtins" || module == "__builtin__") && (name == "set" || name == "frozenset"):
		return &Callable{Name: full, Call: func(args Tuple) (any, error) {
			if len(args) == 0 {
				return &List{}, nil
			}
			if l, ok := args0[*List](args); ok {
				return &List{Items: append([]any(nil), l.Items...)}, nil
			}
			return nil, fmt.Errorf("arguments %s", describe(args))
		}}, nil
	case strings.HasPrefix(module, "__torch__") && name != "":
		// A TorchScript class: instances are inert records of their attributes.
		return &Class{Name: full}, nil
	}
	return nil, fmt.Errorf("global %s is not allowed (a checkpoint may only hold tensors, storages, containers and TorchScript module records)", full)
}

// args0 is the first argument as a T.
func args0[T any](args Tuple) (T, bool) {
	var zero T
	if len(args) == 0 {
		return zero, false
	}
	v, ok := args[0].(T)
	return v, ok
}

func newOrderedDict(args Tuple) (any, error) {
	d := &Dict{}
	if len(args) == 0 {
		return d, nil
	}
	items, ok := args[0].(*List)
	if len(args) != 1 || !ok {
		return nil, fmt.Errorf("arguments %s", describe(args))
	}
	for _, it := range items.Items {
		kv, ok := it.(Tuple)
		if !ok || len(kv) != 2 {
			return nil, fmt.Errorf("item %s is not a (key, value) pair", describe(it))
		}
		d.Keys = append(d.Keys, kv[0])
		d.Values = append(d.Values, kv[1])
	}
	return d, nil
}

func intTuple(v any, what string) ([]int64, error) {
	t, ok := v.(Tuple)
	if !ok {
		return nil, fmt.Errorf("%s is %s, not a tuple", what, describe(v))
	}
	if len(t) > 16 {
		return nil, fmt.Errorf("%s has %d dimensions", what, len(t))
	}
	out := make([]int64, len(t))
	for i, x := range t {
		n, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("%s[%d] is %s, not an integer", what, i, describe(x))
		}
		out[i] = n
	}
	return out, nil
}

// rebuildTensorV2 checks a tensor record against its storage.
func rebuildTensorV2(args Tuple) (any, error) {
	if len(args) < 4 {
		return nil, fmt.Errorf("%d arguments, want at least 4", len(args))
	}
	st, ok := args[0].(*storageRef)
	if !ok {
		return nil, fmt.Errorf("storage is %s", describe(args[0]))
	}
	off, ok := args[1].(int64)
	if !ok || off < 0 {
		return nil, fmt.Errorf("storage offset %s", describe(args[1]))
	}
	shape, err := intTuple(args[2], "size")
	if err != nil {
		return nil, err
	}
	stride, err := intTuple(args[3], "stride")
	if err != nil {
		return nil, err
	}
	if len(stride) != len(shape) {
		return nil, fmt.Errorf("size %v and stride %v differ in rank", shape, stride)
	}
	n, err := numel(shape, max(st.dtype.Size(), 1))
	if err != nil {
		return nil, err
	}
	// The last element's index: offset + Σ (size−1)·stride.
	last := off
	if n > 0 {
		for i, d := range shape {
			if stride[i] < 0 {
				return nil, fmt.Errorf("negative stride %v", stride)
			}
			if d > 0 {
				if stride[i] > 0 && d-1 > (1<<62)/stride[i] {
					return nil, fmt.Errorf("stride %v overflows", stride)
				}
				last += (d - 1) * stride[i]
				if last < 0 || last > 1<<62 {
					return nil, fmt.Errorf("stride %v overflows", stride)
				}
			}
		}
		if last >= st.numel {
			return nil, fmt.Errorf("tensor of size %v, stride %v at offset %d reaches element %d of storage %s, which holds %d",
				shape, stride, off, last, st.key, st.numel)
		}
	} else if off > st.numel {
		return nil, fmt.Errorf("offset %d beyond storage %s (%d elements)", off, st.key, st.numel)
	}
	return &TensorRef{storage: st, offset: off, shape: shape, stride: stride}, nil
}

// contiguous reports whether the record is row-major without gaps.
func (t *TensorRef) contiguous() bool {
	want := int64(1)
	for i := len(t.shape) - 1; i >= 0; i-- {
		if t.shape[i] != 1 && t.stride[i] != want {
			return false
		}
		want *= t.shape[i]
	}
	return true
}

// tensor turns a record into a Tensor.
func (t *TensorRef) tensor(name string) *Tensor {
	st := t.storage
	es := int64(st.dtype.Size())
	n, _ := numel(t.shape, int(max(es, 1)))
	out := &Tensor{Name: name, DType: st.dtype, Shape: intShape(t.shape), size: n * es, Where: st.where}
	switch {
	case st.dtype == Unknown:
		out.err = errors.New("unknown storage type")
	case !t.contiguous():
		out.err = fmt.Errorf("not contiguous (size %v, stride %v): save it with .contiguous()", t.shape, t.stride)
	default:
		off := t.offset * es
		out.open = func() (io.ReadCloser, error) { return st.open(off, out.size) }
	}
	return out
}

// maxTensors bounds the tensors of one checkpoint.
const maxTensors = 1 << 20

// flatten names every tensor reachable from root the way a state dict names them: dict
// keys and object attributes joined by dots, list and tuple items by their index.
func flatten(root any, prefix string) ([]*Tensor, error) {
	var out []*Tensor
	seen := map[any]bool{}
	visits := 0
	var walk func(v any, name string, depth int) error
	walk = func(v any, name string, depth int) error {
		if depth > maxDepth {
			return fmt.Errorf("objects nested deeper than %d levels (at %q)", maxDepth, name)
		}
		if visits++; visits > 1<<22 {
			return errors.New("too many objects")
		}
		join := func(k string) string {
			if name == "" {
				return k
			}
			return name + "." + k
		}
		switch x := v.(type) {
		case *TensorRef:
			if name == "" {
				name = "tensor"
			}
			if len(out) >= maxTensors {
				return fmt.Errorf("more than %d tensors", maxTensors)
			}
			out = append(out, x.tensor(name))
		case *Dict:
			if seen[x] {
				return nil
			}
			seen[x] = true
			for i, k := range x.Keys {
				var ks string
				switch kk := k.(type) {
				case string:
					ks = kk
				case int64:
					ks = strconv.FormatInt(kk, 10)
				default:
					continue
				}
				if err := walk(x.Values[i], join(ks), depth+1); err != nil {
					return err
				}
			}
		case *Object:
			if seen[x] {
				return nil
			}
			seen[x] = true
			return walk(x.State, name, depth+1)
		case *List:
			if seen[x] {
				return nil
			}
			seen[x] = true
			for i, it := range x.Items {
				if err := walk(it, join(strconv.Itoa(i)), depth+1); err != nil {
					return err
				}
			}
		case Tuple:
			// A tuple memoised once and referenced many times is walked once (its first
			// element's address identifies it), so a DAG cannot blow up the walk.
			if len(x) > 0 {
				if seen[&x[0]] {
					return nil
				}
				seen[&x[0]] = true
			}
			for i, it := range x {
				if err := walk(it, join(strconv.Itoa(i)), depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, prefix, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// OpenTorch opens a PyTorch checkpoint: a torch.save zip, a TorchScript archive, or a
// legacy (pre-1.6) torch.save file.
func OpenTorch(path string) (*Checkpoint, error) { return openFile(path, readTorch) }

// ParseTorch reads a torch checkpoint held in memory (tests, fuzzing).
func ParseTorch(data []byte) (*Checkpoint, error) {
	c, err := readTorch(bytes.NewReader(data), int64(len(data)), "torch")
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	return c, nil
}

// readTorch reads a zip archive (torch.save, TorchScript) or a legacy torch.save file.
func readTorch(r io.ReaderAt, size int64, label string) (*Checkpoint, error) {
	var magic [4]byte
	if _, err := r.ReadAt(magic[:], 0); err != nil {
		return nil, err
	}
	if bytes.Equal(magic[:], []byte("PK\x03\x04")) {
		return readTorchZip(r, size, label)
	}
	return readTorchLegacy(r, size, label)
}

// maxPickle is the largest data.pkl/constants.pkl read (they hold records, not data).
const maxPickle = 512 << 20

func readTorchZip(r io.ReaderAt, size int64, label string) (*Checkpoint, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("not a readable zip archive: %w", err)
	}
	entries := map[string]*zip.File{}
	prefix := ""
	for _, zf := range zr.File {
		if !localPath(zf.Name) {
			return nil, fmt.Errorf("archive entry %q is not a relative path inside the archive (absolute, \"..\" or a drive): refused", zf.Name)
		}
		if _, dup := entries[zf.Name]; dup {
			return nil, fmt.Errorf("archive entry %q appears twice", zf.Name)
		}
		entries[zf.Name] = zf
		if dir, ok := strings.CutSuffix(zf.Name, "/data.pkl"); ok && !strings.Contains(dir, "/") {
			if prefix != "" {
				return nil, fmt.Errorf("archive has two data.pkl (%s/ and %s/)", prefix, dir)
			}
			prefix = dir
		}
	}
	if prefix == "" {
		return nil, errors.New("zip archive without PREFIX/data.pkl: not a PyTorch checkpoint")
	}
	if bo, ok := entries[prefix+"/byteorder"]; ok {
		b, err := readEntry(bo, 16)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", bo.Name, err)
		}
		if s := strings.TrimSpace(string(b)); s != "little" {
			return nil, fmt.Errorf("byte order %q: only little-endian checkpoints are read", s)
		}
	}
	c := &Checkpoint{Format: "torch"}
	_, hasConst := entries[prefix+"/constants.pkl"]
	for name := range entries {
		if strings.HasPrefix(name, prefix+"/code/") {
			hasConst = true
		}
	}
	if hasConst {
		c.Format = "torchscript"
	}
	load := func(pkl string, dirs []string, tprefix string) error {
		zf := entries[pkl]
		storages := map[string]*storageRef{}
		persist := func(pid any) (any, error) {
			return zipStorage(pid, storages, func(key string) (*zip.File, string) {
				for _, d := range dirs {
					if e, ok := entries[prefix+"/"+d+"/"+key]; ok {
						return e, e.Name
					}
				}
				return nil, prefix + "/" + dirs[0] + "/" + key
			}, r, size, label)
		}
		rc, err := zf.Open()
		if err != nil {
			return fmt.Errorf("%s: %w", pkl, err)
		}
		defer rc.Close()
		root, _, err := Unpickle(rc, min(int64(zf.UncompressedSize64), maxPickle), torchResolver, persist)
		if err != nil {
			return fmt.Errorf("archive entry %s: %w", pkl, err)
		}
		ts, err := flatten(root, tprefix)
		if err != nil {
			return fmt.Errorf("archive entry %s: %w", pkl, err)
		}
		c.Tensors = append(c.Tensors, ts...)
		return nil
	}
	if err := load(prefix+"/data.pkl", []string{"data"}, ""); err != nil {
		return nil, err
	}
	if _, ok := entries[prefix+"/constants.pkl"]; ok {
		if err := load(prefix+"/constants.pkl", []string{"constants", "data"}, "__constants__"); err != nil {
			return nil, err
		}
	}
	if err := uniqueNames(c.Tensors); err != nil {
		return nil, err
	}
	return c, nil
}

// uniqueNames refuses two tensors with one name.
func uniqueNames(ts []*Tensor) error {
	seen := make(map[string]bool, len(ts))
	for _, t := range ts {
		if seen[t.Name] {
			return fmt.Errorf("two tensors are named %q", t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}

// readEntry reads a small zip entry.
func readEntry(zf *zip.File, limit int64) ([]byte, error) {
	rc, err := zf.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

// storagePID checks a persistent id ('storage', torch.XStorage, key, location, numel[, view]).
func storagePID(pid any) (dtype DType, key string, numel int64, err error) {
	t, ok := pid.(Tuple)
	if !ok || len(t) < 5 {
		return 0, "", 0, fmt.Errorf("persistent id %s is not a storage record", describe(pid))
	}
	if s, _ := t[0].(string); s != "storage" {
		return 0, "", 0, fmt.Errorf("persistent id of kind %s (only storages are read)", describe(t[0]))
	}
	typ, ok := t[1].(storageType)
	if !ok {
		return 0, "", 0, fmt.Errorf("storage type %s", describe(t[1]))
	}
	key, ok = t[2].(string)
	if !ok || !localPath(key) || strings.Contains(key, "/") {
		return 0, "", 0, fmt.Errorf("storage key %s", describe(t[2]))
	}
	numel, ok = t[4].(int64)
	if !ok || numel < 0 {
		return 0, "", 0, fmt.Errorf("storage size %s", describe(t[4]))
	}
	if _, err := numelCheck(numel, typ.dtype); err != nil {
		return 0, "", 0, err
	}
	return typ.dtype, key, numel, nil
}

func numelCheck(n int64, dt DType) (int64, error) {
	es := int64(max(dt.Size(), 1))
	if n > (1<<62)/es {
		return 0, fmt.Errorf("storage of %d elements is too large", n)
	}
	return n * es, nil
}

// zipStorage resolves a storage persistent id to its archive entry, checking that the
// entry holds the bytes the id claims.
func zipStorage(pid any, storages map[string]*storageRef, find func(key string) (*zip.File, string),
	r io.ReaderAt, fileSize int64, label string) (any, error) {
	dtype, key, n, err := storagePID(pid)
	if err != nil {
		return nil, err
	}
	if s, ok := storages[key]; ok {
		if s.dtype != dtype || s.numel != n {
			return nil, fmt.Errorf("storage %s is named twice with different types or sizes", key)
		}
		return s, nil
	}
	zf, name := find(key)
	if zf == nil {
		return nil, fmt.Errorf("storage %s: no archive entry %s", key, name)
	}
	need, _ := numelCheck(n, dtype)
	have := int64(zf.UncompressedSize64)
	if have < 0 || have < need {
		return nil, fmt.Errorf("storage %s claims %d bytes, but archive entry %s holds %d (truncated storage)", key, need, name, have)
	}
	s := &storageRef{key: key, dtype: dtype, numel: n, where: label + ": " + name}
	if zf.Method == zip.Store {
		off, err := zf.DataOffset()
		if err != nil {
			return nil, fmt.Errorf("storage %s: %w", key, err)
		}
		if int64(zf.CompressedSize64) != have || off < 0 || off > fileSize || have > fileSize-off {
			return nil, fmt.Errorf("archive entry %s claims %d bytes at offset %d, past the end of the file (%d bytes): truncated storage", name, have, off, fileSize)
		}
		s.open = func(o, n int64) (io.ReadCloser, error) {
			return io.NopCloser(io.NewSectionReader(r, off+o, n)), nil
		}
	} else {
		s.open = func(o, n int64) (io.ReadCloser, error) {
			rc, err := zf.Open()
			if err != nil {
				return nil, err
			}
			if _, err := io.CopyN(io.Discard, rc, o); err != nil {
				rc.Close()
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			return struct {
				io.Reader
				io.Closer
			}{io.LimitReader(rc, n), rc}, nil
		}
	}
	storages[key] = s
	return s, nil
}

// legacyMagic is torch's MAGIC_NUMBER (0x1950a86a20f9469cfc6c), little-endian.
var legacyMagic = []byte{0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19}

func readTorchLegacy(r io.ReaderAt, size int64, label string) (*Checkpoint, error) {
	off := int64(0)
	next := func(what string, persist PersistentLoader) (any, error) {
		v, n, err := Unpickle(io.NewSectionReader(r, off, size-off), min(size-off, maxPickle), torchResolver, persist)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		off += n
		return v, nil
	}
	magic, err := next("magic number", nil)
	if err != nil {
		return nil, fmt.Errorf("not a PyTorch checkpoint (neither a zip archive nor a legacy torch.save file): %w", err)
	}
	if b, ok := magic.(BigInt); !ok || !bytes.Equal(b, legacyMagic) {
		return nil, errors.New("not a PyTorch checkpoint (neither a zip archive nor a legacy torch.save file)")
	}
	proto, err := next("protocol version", nil)
	if err != nil {
		return nil, err
	}
	if p, _ := proto.(int64); p != 1001 {
		return nil, fmt.Errorf("legacy torch.save protocol %s (1001 is read)", describe(proto))
	}
	info, err := next("system info", nil)
	if err != nil {
		return nil, err
	}
	if d, ok := info.(*Dict); ok {
		if le, ok := d.Get("little_endian"); ok && le != true {
			return nil, errors.New("big-endian checkpoint: only little-endian ones are read")
		}
	}
	storages := map[string]*storageRef{}
	persist := func(pid any) (any, error) {
		t, ok := pid.(Tuple)
		if ok && len(t) >= 6 {
			if _, isNone := t[5].(None); !isNone {
				return nil, errors.New("storage views (pre-1.0 checkpoints) are not supported")
			}
		}
		dtype, key, n, err := storagePID(pid)
		if err != nil {
			return nil, err
		}
		if s, ok := storages[key]; ok {
			if s.dtype != dtype || s.numel != n {
				return nil, fmt.Errorf("storage %s is named twice with different types or sizes", key)
			}
			return s, nil
		}
		s := &storageRef{key: key, dtype: dtype, numel: n, where: label + ": storage " + key}
		storages[key] = s
		return s, nil
	}
	root, err := next("object", persist)
	if err != nil {
		return nil, err
	}
	keysV, err := next("storage keys", nil)
	if err != nil {
		return nil, err
	}
	keys, ok := keysV.(*List)
	if !ok {
		return nil, fmt.Errorf("storage keys are %s, not a list", describe(keysV))
	}
	for _, k := range keys.Items {
		key, _ := k.(string)
		s, ok := storages[key]
		if !ok {
			return nil, fmt.Errorf("storage key %s was not used by the object", describe(k))
		}
		var hdr [8]byte
		if off > size-8 {
			return nil, fmt.Errorf("storage %s: the file ends before its size (truncated storage)", key)
		}
		if _, err := r.ReadAt(hdr[:], off); err != nil {
			return nil, err
		}
		n := int64(binary.LittleEndian.Uint64(hdr[:]))
		if n != s.numel {
			return nil, fmt.Errorf("storage %s holds %d elements, its record says %d", key, n, s.numel)
		}
		bytes, _ := numelCheck(n, s.dtype)
		start := off + 8
		if bytes > size-start {
			return nil, fmt.Errorf("storage %s needs %d bytes at offset %d, past the end of the file (%d bytes): truncated storage", key, bytes, start, size)
		}
		s.open = func(o, n int64) (io.ReadCloser, error) {
			return io.NopCloser(io.NewSectionReader(r, start+o, n)), nil
		}
		off = start + bytes
	}
	for key, s := range storages {
		if s.open == nil {
			return nil, fmt.Errorf("storage %s has no data in the file", key)
		}
	}
	ts, err := flatten(root, "")
	if err != nil {
		return nil, err
	}
	if err := uniqueNames(ts); err != nil {
		return nil, err
	}
	return &Checkpoint{Format: "torch-legacy", Tensors: ts}, nil
}
