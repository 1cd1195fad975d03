package gguf

import (
	"bytes"
	"encoding/binary"
	"github.com/voxpipe/voxpipe/internal/golden"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sampleKV(t testing.TB) KV {
	t.Helper()
	kv := KV{}
	must := func(k string, v any) {
		if err := kv.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	must("general.name", "tiny")
	must("u8", uint8(200))
	must("i8", int8(-100))
	must("u16", uint16(60000))
	must("i16", int16(-30000))
	must("u32", uint32(4000000000))
	must("i32", int32(-2000000000))
	must("u64", uint64(math.MaxUint64))
	must("i64", int64(math.MinInt64))
	must("f32", float32(1.5))
	must("f64", math.Pi)
	must("yes", true)
	must("no", false)
	must("empty", "")
	must("unicode", "héllo ✓")
	must("a.u8", []uint8{1, 2, 3})
	must("a.i8", []int8{-1, 2})
	must("a.u16", []uint16{1, 65535})
	must("a.i16", []int16{-5, 5})
	must("a.u32", []uint32{7, 8, 9})
	must("a.i32", []int32{-7, 8})
	must("a.u64", []uint64{1 << 40})
	must("a.i64", []int64{-1 << 40, 3})
	must("a.f32", []float32{0.25, -2})
	must("a.f64", []float64{1e300, -1e-300})
	must("a.bool", []bool{true, false, true})
	must("a.str", []string{"a", "", "ccc"})
	must("a.empty", []string{})
	inner1, _ := ValueOf([]int32{1, 2})
	inner2, _ := ValueOf([]string{"x"})
	must("a.nested", []Value{inner1, inner2})
	return kv
}

func sampleTensors() []WriteTensor {
	ramp := func(n int) []float32 {
		d := make([]float32, n)
		for i := range d {
			d[i] = float32(i)*0.5 - 3
		}
		return d
	}
	return []WriteTensor{
		{Name: "scalar", Shape: nil, Data: []float32{42}},
		{Name: "vec", Shape: []int{5}, Data: ramp(5)},
		{Name: "mat", Shape: []int{3, 4}, Data: ramp(12)},
		{Name: "empty", Shape: []int{0, 7}, Data: nil},
		{Name: "half", Shape: []int{2, 3}, Type: F16, Data: []float32{1, -2, 0.5, 65504, 1e-7, 3.14159}},
		{Name: "q8", Shape: []int{32}, Type: Q8_0, Raw: bytes.Repeat([]byte{1}, 34)},
		{Name: "q4", Shape: []int{32}, Type: Q4_0, Raw: bytes.Repeat([]byte{2}, 18)},
		{Name: "four.d", Shape: []int{2, 1, 3, 2}, Data: ramp(12)},
	}
}

func writeSample(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, sampleKV(t), sampleTensors()); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	data := writeSample(t)
	path := filepath.Join(t.TempDir(), "x.gguf")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	if f.Version != 3 || f.Alignment != 32 || f.DataOffset%32 != 0 {
		t.Errorf("version %d alignment %d data offset %d", f.Version, f.Alignment, f.DataOffset)
	}
	want := sampleKV(t)
	if len(f.KV) != len(want) {
		t.Fatalf("%d keys, want %d", len(f.KV), len(want))
	}
	for k, v := range want {
		got, ok := f.KV[k]
		if !ok {
			t.Errorf("key %q missing", k)
			continue
		}
		if got.Type() != v.Type() || got.ElemType() != v.ElemType() || !reflect.DeepEqual(got.Any(), v.Any()) {
			t.Errorf("key %q: got %s %#v, want %s %#v", k, got.describe(), got.Any(), v.describe(), v.Any())
		}
	}

	// Typed getters.
	if s, err := f.KV.String("general.name"); err != nil || s != "tiny" {
		t.Errorf("String: %q %v", s, err)
	}
	if i, err := f.KV.Int("i32"); err != nil || i != -2000000000 {
		t.Errorf("Int: %d %v", i, err)
	}
	if i, err := f.KV.Int("u8"); err != nil || i != 200 {
		t.Errorf("Int(u8): %d %v", i, err)
	}
	if _, err := f.KV.Int("u64"); err == nil {
		t.Error("Int of MaxUint64 should fail")
	}
	if u, err := f.KV.Uint("u64"); err != nil || u != math.MaxUint64 {
		t.Errorf("Uint: %d %v", u, err)
	}
	if _, err := f.KV.Uint("i8"); err == nil {
		t.Error("Uint of a negative value should fail")
	}
	if x, err := f.KV.Float("f32"); err != nil || x != 1.5 {
		t.Errorf("Float: %v %v", x, err)
	}
	if b, err := f.KV.Bool("yes"); err != nil || !b {
		t.Errorf("Bool: %v %v", b, err)
	}
	if s, err := f.KV.Strings("a.str"); err != nil || !reflect.DeepEqual(s, []string{"a", "", "ccc"}) {
		t.Errorf("Strings: %q %v", s, err)
	}
	if a, err := f.KV.Ints("a.u16"); err != nil || !reflect.DeepEqual(a, []int64{1, 65535}) {
		t.Errorf("Ints: %v %v", a, err)
	}
	if a, err := f.KV.Floats("a.f32"); err != nil || !reflect.DeepEqual(a, []float64{0.25, -2}) {
		t.Errorf("Floats: %v %v", a, err)
	}
	if _, err := f.KV.String("missing"); err == nil || !strings.Contains(err.Error(), `"missing" not found`) {
		t.Errorf("missing key error: %v", err)
	}
	if _, err := f.KV.String("u8"); err == nil || !strings.Contains(err.Error(), "is uint8, want string") {
		t.Errorf("type error: %v", err)
	}
	if _, err := f.KV.Strings("a.u8"); err == nil || !strings.Contains(err.Error(), "array of uint8") {
		t.Errorf("array type error: %v", err)
	}

	// Tensors.
	wts := sampleTensors()
	if len(f.Tensors) != len(wts) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(wts))
	}
	for i, wt := range wts {
		ti := f.Tensors[i]
		if ti.Name != wt.Name || ti.Type != wt.Type {
			t.Errorf("tensor %d: %q %s, want %q %s", i, ti.Name, ti.Type, wt.Name, wt.Type)
		}
		shape := ti.Shape()
		if len(shape) != len(wt.Shape) || (len(shape) > 0 && !reflect.DeepEqual(shape, wt.Shape)) {
			t.Errorf("tensor %q: shape %v, want %v", wt.Name, shape, wt.Shape)
		}
		if ti.Offset%f.Alignment != 0 {
			t.Errorf("tensor %q: misaligned offset %d", wt.Name, ti.Offset)
		}
		if wt.Raw != nil {
			raw, _, err := f.TensorData(wt.Name)
			if err != nil || !bytes.Equal(raw, wt.Raw) {
				t.Errorf("tensor %q raw data: %v", wt.Name, err)
			}
			got, _, err := f.Float32(wt.Name)
			switch wt.Type {
			case Q8_0: // d = half 0x0101, every quant 1
				if err != nil || len(got) != 32 || got[0] != HalfToFloat32(0x0101) || got[31] != got[0] {
					t.Errorf("tensor %q: %v, %v", wt.Name, got, err)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), "dtype "+wt.Type.String()+" not supported") {
					t.Errorf("tensor %q: want a not-supported error, got %v", wt.Name, err)
				}
			}
			continue
		}
		got, gshape, err := f.Float32(wt.Name)
		if err != nil {
			t.Errorf("tensor %q: %v", wt.Name, err)
			continue
		}
		if !reflect.DeepEqual(gshape, shape) || len(got) != len(wt.Data) {
			t.Errorf("tensor %q: shape %v len %d", wt.Name, gshape, len(got))
			continue
		}
		for j, x := range wt.Data {
			w := x
			if wt.Type == F16 {
				w = HalfToFloat32(Float32ToHalf(x))
			}
			if got[j] != w {
				t.Errorf("tensor %q[%d] = %v, want %v", wt.Name, j, got[j], w)
			}
		}
	}
	// ggml order of dims.
	if ti, ok := f.Tensor("mat"); !ok || !reflect.DeepEqual(ti.Dims, []uint64{4, 3}) || ti.Size != 48 {
		t.Errorf("mat: %+v", ti)
	}
	if _, ok := f.Tensor("nope"); ok {
		t.Error("found a tensor that does not exist")
	}
	if _, _, err := f.Float32("nope"); err == nil || !strings.Contains(err.Error(), `"nope" not found`) {
		t.Errorf("missing tensor error: %v", err)
	}

	// Parse of the same bytes gives the same result as Open.
	g, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.Tensors, f.Tensors) {
		t.Error("Parse and Open disagree")
	}
	// Writing what was read gives identical bytes.
	var again bytes.Buffer
	if err := Write(&again, g.KV, sampleTensors()); err != nil || !bytes.Equal(again.Bytes(), data) {
		t.Errorf("rewrite differs (err %v)", err)
	}

	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, _, err := f.Float32("vec"); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("use after close: %v", err)
	}
}

func TestCustomAlignment(t *testing.T) {
	kv := KV{}
	_ = kv.Set(KeyAlignment, uint32(64))
	var buf bytes.Buffer
	ts := []WriteTensor{{Name: "a", Shape: []int{3}, Data: []float32{1, 2, 3}}, {Name: "b", Shape: []int{1}, Data: []float32{4}}}
	if err := Write(&buf, kv, ts); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if f.Alignment != 64 || f.DataOffset%64 != 0 || f.Tensors[1].Offset != 64 {
		t.Errorf("alignment %d data offset %d second offset %d", f.Alignment, f.DataOffset, f.Tensors[1].Offset)
	}
	b, _, err := f.Float32("b")
	if err != nil || b[0] != 4 {
		t.Errorf("b = %v, %v", b, err)
	}
}

func TestEveryTruncationFails(t *testing.T) {
	data := writeSample(t)
	for n := 0; n < len(data); n++ {
		if _, err := Parse(data[:n]); err == nil {
			t.Fatalf("truncation to %d of %d bytes parsed without error", n, len(data))
		}
	}
	// Without tensors the header is followed only by padding, which may be cut; anything
	// shorter than the header must fail.
	var buf bytes.Buffer
	kv := sampleKV(t)
	_ = kv.Set("zzz.last", "end!")
	if err := Write(&buf, kv, nil); err != nil {
		t.Fatal(err)
	}
	data = buf.Bytes()
	if _, err := Parse(data); err != nil {
		t.Fatal(err)
	}
	headerEnd := bytes.LastIndex(data, []byte("end!")) + 4
	if _, err := Parse(data[:headerEnd]); err != nil {
		t.Fatalf("header without trailing padding: %v", err)
	}
	for n := 0; n < headerEnd; n++ {
		if _, err := Parse(data[:n]); err == nil {
			t.Fatalf("metadata-only file truncated to %d of %d bytes parsed without error", n, len(data))
		}
	}
}

// builder assembles raw GGUF bytes for hostile-input tests.
type builder struct{ bytes.Buffer }

func (b *builder) u32(x uint32) *builder {
	_ = binary.Write(&b.Buffer, binary.LittleEndian, x)
	return b
}
func (b *builder) u64(x uint64) *builder {
	_ = binary.Write(&b.Buffer, binary.LittleEndian, x)
	return b
}
func (b *builder) str(s string) *builder {
	b.u64(uint64(len(s)))
	b.WriteString(s)
	return b
}
func (b *builder) header(version uint32, nTensors, nKV uint64) *builder {
	b.WriteString("GGUF")
	return b.u32(version).u64(nTensors).u64(nKV)
}
func (b *builder) tensor(name string, dims []uint64, typ uint32, off uint64) *builder {
	b.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		b.u64(d)
	}
	return b.u32(typ).u64(off)
}
func (b *builder) padTo(n int) *builder {
	for b.Len()%n != 0 {
		b.WriteByte(0)
	}
	return b
}

func TestHostile(t *testing.T) {
	oneF32 := func(dims []uint64, typ uint32, off uint64, dataLen int) []byte {
		b := new(builder).header(3, 1, 0).tensor("x", dims, typ, off)
		b.padTo(32)
		b.Write(make([]byte, dataLen))
		return b.Bytes()
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"bad magic", []byte("GGML\x03\x00\x00\x00"), "bad magic"},
		{"version 1", new(builder).header(1, 0, 0).Bytes(), "version 1"},
		{"big endian", append([]byte("GGUF"), 0, 0, 0, 3), "big-endian"},
		{"version 99", new(builder).header(99, 0, 0).Bytes(), "unsupported version 99"},
		{"huge kv count", new(builder).header(3, 0, 1<<62).Bytes(), "metadata count"},
		{"huge tensor count", new(builder).header(3, 1<<40, 0).Bytes(), "tensor count"},
		{"huge key length", new(builder).header(3, 0, 1).u64(1 << 60).u64(0).u64(0).Bytes(), "exceeds"},
		{"unknown value type", new(builder).header(3, 0, 1).str("k").u32(13).Bytes(), "unknown value type 13"},
		{"huge string", new(builder).header(3, 0, 1).str("k").u32(8).u64(math.MaxUint64).Bytes(), "exceeds"},
		{"huge array", new(builder).header(3, 0, 1).str("k").u32(9).u32(0).u64(1 << 50).Bytes(), "cannot fit"},
		{"huge string array", new(builder).header(3, 0, 1).str("k").u32(9).u32(8).u64(1 << 20).Bytes(), "cannot fit"},
		{"array of unknown", new(builder).header(3, 0, 1).str("k").u32(9).u32(77).u64(0).Bytes(), "unknown value type 77"},
		{"duplicate key", func() []byte {
			b := new(builder).header(3, 0, 2)
			b.str("k").u32(4).u32(1)
			b.str("k").u32(4).u32(2)
			return b.Bytes()
		}(), "appears twice"},
		{"bad alignment", new(builder).header(3, 0, 1).str(KeyAlignment).u32(4).u32(48).Bytes(), "power of two"},
		{"zero alignment", new(builder).header(3, 0, 1).str(KeyAlignment).u32(4).u32(0).Bytes(), "power of two"},
		{"string alignment", new(builder).header(3, 0, 1).str(KeyAlignment).u32(8).str("32").Bytes(), "power of two"},
		{"too many dims", oneF32([]uint64{1, 1, 1, 1, 1}, 0, 0, 4), "5 dimensions"},
		{"dim overflow", oneF32([]uint64{1 << 40, 1 << 40}, 0, 0, 4), "overflows"},
		{"huge dim", oneF32([]uint64{1 << 63}, 0, 0, 4), "too large"},
		{"unknown dtype", oneF32([]uint64{1}, 4, 0, 4), "unknown tensor type 4"},
		{"block mismatch", oneF32([]uint64{31}, uint32(Q8_0), 0, 34), "block size"},
		{"data beyond end", oneF32([]uint64{100}, 0, 0, 4), `tensor "x": data [64,464) beyond end of file (68 bytes)`},
		{"offset beyond end", oneF32([]uint64{1}, 0, 1<<62, 4), "beyond end of file"},
		{"offset wraps", oneF32([]uint64{1}, 0, math.MaxUint64-31, 4), "beyond end of file"},
		{"misaligned offset", oneF32([]uint64{1}, 0, 4, 8), "not a multiple of the alignment"},
		{"empty name", new(builder).header(3, 1, 0).tensor("", []uint64{1}, 0, 0).padTo(32).u32(0).Bytes(), "empty tensor name"},
		{"duplicate tensor", func() []byte {
			b := new(builder).header(3, 2, 0).tensor("x", []uint64{1}, 0, 0).tensor("x", []uint64{1}, 0, 32)
			b.padTo(32)
			b.Write(make([]byte, 64))
			return b.Bytes()
		}(), "appears twice"},
		{"overlap", func() []byte {
			b := new(builder).header(3, 2, 0).tensor("a", []uint64{16}, 0, 0).tensor("b", []uint64{1}, 0, 32)
			b.padTo(32)
			b.Write(make([]byte, 64))
			return b.Bytes()
		}(), "overlap"},
		{"deep nesting", func() []byte {
			b := new(builder).header(3, 0, 1).str("k").u32(9)
			for i := 0; i < 40; i++ {
				b.u32(9).u64(1)
			}
			b.u32(0).u64(0)
			return b.Bytes()
		}(), "nested"},
		{"bool not 0/1", new(builder).header(3, 0, 1).str("k").u32(7).Bytes(), "need 1 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.data)
			if err == nil {
				t.Fatalf("parsed without error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "gguf: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
	// A bool of 2.
	b := new(builder).header(3, 0, 1).str("k").u32(7)
	b.WriteByte(2)
	if _, err := Parse(b.Bytes()); err == nil || !strings.Contains(err.Error(), "neither 0 nor 1") {
		t.Errorf("bool 2: %v", err)
	}
}

func TestWriteErrors(t *testing.T) {
	cases := []struct {
		name string
		ts   []WriteTensor
		want string
	}{
		{"no name", []WriteTensor{{Shape: []int{1}, Data: []float32{1}}}, "no name"},
		{"dup", []WriteTensor{{Name: "a", Data: []float32{1}}, {Name: "a", Data: []float32{1}}}, "twice"},
		{"count", []WriteTensor{{Name: "a", Shape: []int{2}, Data: []float32{1}}}, "1 values for shape [2]"},
		{"neg", []WriteTensor{{Name: "a", Shape: []int{-1}}}, "negative"},
		{"dims", []WriteTensor{{Name: "a", Shape: []int{1, 1, 1, 1, 1}, Data: []float32{1}}}, "5 dims"},
		{"quant", []WriteTensor{{Name: "a", Shape: []int{256}, Type: Q4_K, Data: make([]float32, 256)}}, "pass Raw"},
		{"raw size", []WriteTensor{{Name: "a", Shape: []int{32}, Type: Q8_0, Raw: make([]byte, 33)}}, "needs 34"},
		{"dtype", []WriteTensor{{Name: "a", Shape: []int{1}, Type: 5, Raw: []byte{1}}}, "unknown dtype"},
	}
	for _, c := range cases {
		err := Write(&bytes.Buffer{}, nil, c.ts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to mention %q", c.name, err, c.want)
		}
	}
	if _, err := ValueOf(struct{}{}); err == nil {
		t.Error("ValueOf(struct{}) should fail")
	}
}

func TestHalf(t *testing.T) {
	// Every half converts to float32 and back unchanged (NaNs stay NaN).
	for h := 0; h < 1<<16; h++ {
		f := HalfToFloat32(uint16(h))
		back := Float32ToHalf(f)
		if f != f {
			if back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("half %#04x -> %v -> %#04x", h, f, back)
		}
	}
	// Midpoints between neighbouring halves round to the even one; just above rounds up.
	for h := 0; h < 0x7bff; h++ {
		lo, hi := float64(HalfToFloat32(uint16(h))), float64(HalfToFloat32(uint16(h+1)))
		mid := float32((lo + hi) / 2) // exact: halves have 11 significant bits
		want := uint16(h)
		if h&1 == 1 {
			want = uint16(h + 1)
		}
		if got := Float32ToHalf(mid); got != want {
			t.Fatalf("midpoint of %#04x and %#04x rounds to %#04x, want %#04x", h, h+1, got, want)
		}
		above := math.Nextafter32(mid, float32(math.Inf(1)))
		if got := Float32ToHalf(above); got != uint16(h+1) {
			t.Fatalf("just above midpoint of %#04x: %#04x", h, got)
		}
		if got := Float32ToHalf(-mid); got != want|0x8000 {
			t.Fatalf("negative midpoint of %#04x: %#04x", h, got)
		}
	}
	if Float32ToHalf(65520) != 0x7c00 || Float32ToHalf(65519) != 0x7bff || Float32ToHalf(1e-10) != 0 {
		t.Error("overflow/underflow rounding")
	}
	if HalfToFloat32(0x3c00) != 1 || HalfToFloat32(0xc000) != -2 || HalfToFloat32(1) != float32(math.Ldexp(1, -24)) {
		t.Error("known values")
	}
}

// goldenDir is the golden folder (see internal/golden).
func goldenDir(testing.TB) string { return golden.Root() }

func TestGoldenResampleFile(t *testing.T) {
	dir := goldenDir(t)
	path := filepath.Join(dir, "resample", "cases.gguf")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("golden data not available (%v); set VOXPIPE_GOLDEN_DIR to the golden folder", err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	name, _ := f.KV.String("general.name")
	t.Logf("%s: GGUF v%d, %d keys, %d tensors, name %q, alignment %d", path, f.Version, len(f.KV), len(f.Tensors), name, f.Alignment)
	for _, ti := range f.Tensors {
		t.Logf("  %-22s %-4s dims %v offset %d size %d", ti.Name, ti.Type, ti.Dims, ti.Offset, ti.Size)
	}
	want := map[string]int{
		"r48000_16000.input": 17760, "r48000_16000.output": 5920,
		"r16000_48000.input": 6720, "r16000_48000.output": 20160,
		"r48000_44100.output": 25137, "r22050_16000.input": 15876,
	}
	for n, l := range want {
		d, shape, err := f.Float32(n)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		if len(shape) != 1 || shape[0] != l || len(d) != l {
			t.Errorf("%s: shape %v, want [%d]", n, shape, l)
		}
	}
	if len(f.Tensors) != 16 {
		t.Errorf("%d tensors, want 16", len(f.Tensors))
	}
}
