package ckpt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// safetensors: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets are relative to the byte after the header.

// maxSafetensorsHeader is the largest header accepted (the format's own limit is 100 MB).
const maxSafetensorsHeader = 100 << 20

var safetensorsDTypes = map[string]DType{
	"F32": F32, "F16": F16, "BF16": BF16, "F64": F64, "I64": I64, "I32": I32, "I16": I16,
	"I8": I8, "U8": U8, "BOOL": Bool,
}

// OpenSafetensors opens a .safetensors file.
func OpenSafetensors(path string) (*Checkpoint, error) { return openFile(path, readSafetensors) }

// ParseSafetensors reads a safetensors file held in memory (tests, fuzzing).
func ParseSafetensors(data []byte) (*Checkpoint, error) {
	c, err := readSafetensors(bytes.NewReader(data), int64(len(data)), "safetensors")
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	return c, nil
}

type stEntry struct {
	DType       string        `json:"dtype"`
	Shape       []json.Number `json:"shape"`
	DataOffsets []json.Number `json:"data_offsets"`
}

func readSafetensors(r io.ReaderAt, size int64, label string) (*Checkpoint, error) {
	var hdr [8]byte
	if size < 8 {
		return nil, fmt.Errorf("safetensors: %d bytes, too short for the header length", size)
	}
	if _, err := r.ReadAt(hdr[:], 0); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(hdr[:])
	if n > maxSafetensorsHeader {
		return nil, fmt.Errorf("safetensors: header of %d bytes (at most %d)", n, maxSafetensorsHeader)
	}
	if n > uint64(size-8) {
		return nil, fmt.Errorf("safetensors: header of %d bytes, but the file has %d after the length", n, size-8)
	}
	head := make([]byte, n)
	if _, err := r.ReadAt(head, 8); err != nil {
		return nil, err
	}
	dataStart := 8 + int64(n)
	dataSize := size - dataStart
	c := &Checkpoint{Format: "safetensors"}
	dec := json.NewDecoder(bytes.NewReader(head))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("safetensors: header is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("safetensors: header: %w", err)
		}
		name, _ := tok.(string)
		if seen[name] {
			return nil, fmt.Errorf("safetensors: tensor %q listed twice", name)
		}
		seen[name] = true
		if name == "__metadata__" {
			var md map[string]string
			if err := dec.Decode(&md); err != nil {
				return nil, fmt.Errorf("safetensors: __metadata__: %w", err)
			}
			c.Metadata = md
			continue
		}
		var e stEntry
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("safetensors: tensor %q: %w", name, err)
		}
		t, err := stTensor(name, e, dataSize)
		if err != nil {
			return nil, fmt.Errorf("safetensors: tensor %q: %w", name, err)
		}
		begin := dataStart + stBegin(e)
		t.Where = label
		t.open = func() (io.ReadCloser, error) {
			return io.NopCloser(io.NewSectionReader(r, begin, t.size)), nil
		}
		c.Tensors = append(c.Tensors, t)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}
	return c, nil
}

func stBegin(e stEntry) int64 { b, _ := e.DataOffsets[0].Int64(); return b }

// stTensor checks one header entry against the data section's size.
func stTensor(name string, e stEntry, dataSize int64) (*Tensor, error) {
	if name == "" {
		return nil, errors.New("empty tensor name")
	}
	dt, ok := safetensorsDTypes[e.DType]
	if !ok {
		dt = Unknown
	}
	if len(e.Shape) > 16 {
		return nil, fmt.Errorf("%d dimensions", len(e.Shape))
	}
	shape := make([]int64, len(e.Shape))
	for i, d := range e.Shape {
		v, err := d.Int64()
		if err != nil {
			return nil, fmt.Errorf("shape entry %q: %w", d, err)
		}
		shape[i] = v
	}
	if len(e.DataOffsets) != 2 {
		return nil, fmt.Errorf("data_offsets has %d values, want 2", len(e.DataOffsets))
	}
	begin, err1 := e.DataOffsets[0].Int64()
	end, err2 := e.DataOffsets[1].Int64()
	if err1 != nil || err2 != nil || begin < 0 || end < begin {
		return nil, fmt.Errorf("bad data_offsets %v", e.DataOffsets)
	}
	if end > dataSize {
		return nil, fmt.Errorf("data_offsets [%d, %d] run past the end of the data (%d bytes): truncated or corrupt file", begin, end, dataSize)
	}
	es := dt.Size()
	n, err := numel(shape, max(es, 1))
	if err != nil {
		return nil, err
	}
	if dt == Unknown {
		// Unknown dtypes are listed with their byte range, and refused when read.
		return &Tensor{Name: name, DType: dt, Shape: intShape(shape), size: end - begin,
			err: fmt.Errorf("dtype %s is not supported", e.DType)}, nil
	}
	if n*int64(es) != end-begin {
		return nil, fmt.Errorf("shape %v of %s needs %d bytes, data_offsets give %d", shape, e.DType, n*int64(es), end-begin)
	}
	return &Tensor{Name: name, DType: dt, Shape: intShape(shape), size: end - begin}, nil
}

// OpenSafetensorsIndex opens a sharded checkpoint through its index
// (model.safetensors.index.json: {"weight_map": {"tensor": "model-00001-of-00002.safetensors"}};
// a pytorch_model.bin.index.json naming torch.save shards works the same way). Shards are
// looked up next to the index; a shard path that leaves that folder is refused.
// Tensors come shard by shard (in the order the index first names them), each shard in its
// own order; every tensor the index maps must be in its shard.
func OpenSafetensorsIndex(path string) (*Checkpoint, error) {
	raw, err := readSmallFile(path, 64<<20)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	var idx struct {
		WeightMap json.RawMessage `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &idx); err != nil || len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("ckpt: %s: not a safetensors index (no weight_map)", path)
	}
	// The weight map in file order.
	dec := json.NewDecoder(bytes.NewReader(idx.WeightMap))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("ckpt: %s: weight_map is not an object", path)
	}
	var shards []string
	want := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("ckpt: %s: weight_map: %w", path, err)
		}
		name := tok.(string)
		var shard string
		if err := dec.Decode(&shard); err != nil {
			return nil, fmt.Errorf("ckpt: %s: weight_map[%q]: %w", path, name, err)
		}
		if !localPath(shard) {
			return nil, fmt.Errorf("ckpt: %s: shard %q of %q is not a file next to the index", path, shard, name)
		}
		if _, ok := want[name]; ok {
			return nil, fmt.Errorf("ckpt: %s: tensor %q mapped twice", path, name)
		}
		if !containsString(shards, shard) {
			shards = append(shards, shard)
		}
		want[name] = shard
	}
	c := &Checkpoint{Path: path, Format: "safetensors-sharded"}
	from := map[string]string{}
	dir := filepath.Dir(path)
	for _, s := range shards {
		sp := filepath.Join(dir, filepath.FromSlash(s))
		if strings.HasSuffix(s, ".json") {
			c.Close()
			return nil, fmt.Errorf("ckpt: %s: shard %s is an index", path, s)
		}
		sc, err := Open(sp)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Shards = append(c.Shards, sp)
		c.closers = append(c.closers, sc)
		for _, t := range sc.Tensors {
			if _, dup := c.Tensor(t.Name); dup {
				c.Close()
				return nil, fmt.Errorf("ckpt: %s: tensor %q is in more than one shard", path, t.Name)
			}
			c.Tensors = append(c.Tensors, t)
			c.byName[t.Name] = t
			from[t.Name] = s
		}
		if c.Metadata == nil {
			c.Metadata = sc.Metadata
		}
	}
	for name, shard := range want {
		if from[name] != shard {
			c.Close()
			return nil, fmt.Errorf("ckpt: %s: tensor %q is not in its shard %s", path, name, shard)
		}
	}
	return c, nil
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// localPath reports whether p (slash-separated) names a file inside the folder it is
// relative to: not absolute, no ".." element, no backslash or drive letter.
func localPath(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || strings.ContainsAny(p, "\\\x00") || strings.Contains(p, ":") {
		return false
	}
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return false
		}
	}
	return true
}

// readSmallFile reads a file of at most limit bytes.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}
