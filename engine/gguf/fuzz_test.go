package gguf

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// miniature rebuilds a small valid file in the packaging of a golden model: all its
// metadata but a cut-down embedded-file blob, and a few small tensors (those stored as
// _audiocpp.<index> first) with their logical names, ranks and shapes renumbered.
func miniature(tb testing.TB, m *Model, maxTensors int) []byte {
	var pick []ModelTensor
	for pass := 0; pass < 2; pass++ {
		for _, mt := range m.Tensors() {
			if len(pick) == maxTensors {
				break
			}
			stored := strings.HasPrefix(mt.Info.Name, PhysicalPrefix)
			if stored == (pass == 0) && mt.Info.NumElements() <= 64 {
				pick = append(pick, mt)
			}
		}
	}
	kv := KV{}
	for k, v := range m.File.KV {
		kv[k] = v
	}
	var names []string
	var shapes [][]int
	var ts []WriteTensor
	for i, mt := range pick {
		raw, _, err := m.File.TensorData(mt.Info.Name)
		if err != nil {
			tb.Fatal(err)
		}
		phys := mt.FullName
		if len(phys) >= 64 {
			phys = fmt.Sprintf("%s%d", PhysicalPrefix, i)
		}
		ts = append(ts, WriteTensor{Name: phys, Shape: mt.Info.Shape(), Type: mt.Info.Type, Raw: raw})
		names = append(names, mt.FullName)
		shapes = append(shapes, mt.Shape)
	}
	for k, v := range audiocppKV(tb, names, shapes) {
		kv[k] = v
	}
	if files := m.EmbeddedFiles(); len(files) > 0 {
		var blob []byte
		offs := []uint64{0}
		for _, n := range files {
			b, _ := m.EmbeddedFile(n)
			blob = append(blob, b[:min(len(b), 16)]...)
			offs = append(offs, uint64(len(blob)))
		}
		_ = kv.Set(KeyEmbeddedOffsets, offs)
		_ = kv.Set(KeyEmbeddedData, blob)
	}
	var buf bytes.Buffer
	if err := Write(&buf, kv, ts); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// quantMiniature holds the first block of each golden quantised matrix (F16, BF16, Q8_0,
// Q4_K; 32 elements for the plain types and Q8_0, 256 for Q4_K).
func quantMiniature(tb testing.TB, dir string) []byte {
	var ts []WriteTensor
	for _, q := range []string{"f16", "bf16", "q8_0", "q4_k"} {
		f, err := Open(filepath.Join(dir, "quant", q+".gguf"))
		if err != nil {
			tb.Fatal(err)
		}
		raw, ti, err := f.TensorData("mat_b")
		if err != nil {
			tb.Fatal(err)
		}
		n := max(32, ti.Type.BlockSize())
		size := n / ti.Type.BlockSize() * ti.Type.BlockBytes()
		ts = append(ts, WriteTensor{Name: "mat_b." + q, Shape: []int{1, n}, Type: ti.Type,
			Raw: append([]byte(nil), raw[:size]...)})
		f.Close()
	}
	kv := KV{}
	_ = kv.Set(KeyAlignment, uint32(32))
	var buf bytes.Buffer
	if err := Write(&buf, kv, ts); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// goldenSeeds returns fuzz seeds made from the golden files, or nothing when they are absent.
func goldenSeeds(tb testing.TB) [][]byte {
	dir := goldenDir(tb)
	if _, err := os.Stat(filepath.Join(dir, "quant", "q4_k.gguf")); err != nil {
		return nil
	}
	seeds := [][]byte{quantMiniature(tb, dir)}
	for _, fam := range []string{"meanvc2", "miocodec", "miotts"} {
		path := filepath.Join(dir, fam, "model.gguf")
		m, err := OpenModel(path)
		if err != nil {
			tb.Fatal(err)
		}
		mini := miniature(tb, m, 4)
		seeds = append(seeds, mini, mini[:len(mini)/2], mini[:len(mini)*9/10])
		m.Close()
		// The real header, cut at 2 KiB: metadata parsing up to an error. (Seeds are kept
		// small: the fuzzer minimises every new input, which is slow for large ones.)
		b, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		seeds = append(seeds, b[:2<<10])
	}
	return seeds
}

func TestGoldenSeedsValid(t *testing.T) {
	seeds := goldenSeeds(t)
	if seeds == nil {
		t.Skip("golden data not available; set VOXPIPE_GOLDEN_DIR to the golden folder")
	}
	for i, s := range seeds {
		f, err := Parse(s)
		if i == 0 || (i-1)%4 == 0 { // the quant and model miniatures parse and load
			if err != nil {
				t.Fatalf("seed %d: %v", i, err)
			}
			m, err := NewModel(f)
			if err != nil {
				t.Fatalf("seed %d: %v", i, err)
			}
			for _, n := range m.Names() {
				if _, _, err := m.Get(n); err != nil {
					t.Fatalf("seed %d: %v", i, err)
				}
			}
			t.Logf("seed %d: %d bytes, %d tensors %q, embedded %q", i, len(s), m.Len(), m.Names(), m.EmbeddedFiles())
		} else if err == nil {
			t.Fatalf("seed %d (truncated) parsed", i)
		}
	}
}

func FuzzParse(f *testing.F) {
	var small bytes.Buffer
	kv := KV{}
	_ = kv.Set("general.name", "fuzz")
	_ = kv.Set("a", []string{"x", "yz"})
	_ = kv.Set("n", []int32{1, 2, 3})
	nested, _ := ValueOf([]uint8{9})
	_ = kv.Set("nest", []Value{nested})
	if err := Write(&small, kv, []WriteTensor{
		{Name: "w", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}},
		{Name: "h", Shape: []int{3}, Type: F16, Data: []float32{1, 2, 3}},
	}); err != nil {
		f.Fatal(err)
	}
	f.Add(small.Bytes())
	f.Add(new(builder).header(3, 0, 0).Bytes())
	for _, s := range goldenSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(fuzzOne)
}

// fuzzOne is the body of FuzzParse: whatever parses must load, dequantise and re-encode
// without panicking, and every error must carry the package prefix.
func fuzzOne(t *testing.T, data []byte) {
	g, err := Parse(data)
	if err != nil {
		if !strings.HasPrefix(err.Error(), "gguf: ") {
			t.Fatalf("error without prefix: %v", err)
		}
		return
	}
	for i := range g.Tensors {
		ti := &g.Tensors[i]
		raw, _, err := g.TensorData(ti.Name)
		if err != nil || uint64(len(raw)) != ti.Size {
			t.Fatalf("tensor %q: %d bytes, %v", ti.Name, len(raw), err)
		}
		if ti.NumElements() <= 1<<20 {
			d, _, err := g.Float32(ti.Name)
			if CanDequantize(ti.Type) && (err != nil || uint64(len(d)) != ti.NumElements()) {
				t.Fatalf("tensor %q: %v", ti.Name, err)
			}
		}
	}
	for _, k := range g.KV.Keys() {
		v := g.KV[k]
		_ = v.Len()
		_, _ = g.KV.Ints(k)
		_, _ = g.KV.Floats(k)
	}
	if m, err := NewModel(g); err == nil {
		for _, mt := range m.Tensors() {
			if mt.Info.NumElements() > 1<<20 {
				continue
			}
			d, shape, err := m.Get(mt.Name)
			if err != nil {
				if CanDequantize(mt.Info.Type) {
					t.Fatalf("tensor %q: %v", mt.Name, err)
				}
				continue
			}
			n := 1
			for _, s := range shape {
				n *= s
			}
			if n != len(d) {
				t.Fatalf("tensor %q: shape %v for %d values", mt.Name, shape, len(d))
			}
		}
		for _, ns := range m.Namespaces() {
			_ = m.Sub(ns).Names()
		}
		for _, n := range m.EmbeddedFiles() {
			if _, ok := m.EmbeddedFile(n); !ok {
				t.Fatalf("embedded file %q listed but missing", n)
			}
		}
	} else if !strings.HasPrefix(err.Error(), "gguf: ") {
		t.Fatalf("model error without prefix: %v", err)
	}
	// What parsed re-encodes, and the metadata survives a second round.
	var out bytes.Buffer
	if err := Write(&out, g.KV, nil); err != nil {
		t.Fatalf("rewrite: %v", err)
	}
	h, err := Parse(out.Bytes())
	if err != nil {
		t.Fatalf("reparse: %v", err)
	}
	if len(h.KV) != len(g.KV) {
		t.Fatalf("reparse: %d keys, want %d", len(h.KV), len(g.KV))
	}
}
