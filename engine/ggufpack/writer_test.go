package ggufpack

import (
	"bytes"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/golden"
)

// Quantising the golden source matrices reproduces the bytes ggml's own quantiser wrote:
// F16, BF16, Q8_0 and Q4_K (shared/golden/quant/MANIFEST.md).
func TestEncodeMatchesGgml(t *testing.T) {
	dir := golden.Path(t, "quant")
	src, err := gguf.Open(filepath.Join(dir, "source_f32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, c := range []struct {
		file string
		dt   gguf.DType
	}{{"f16.gguf", gguf.F16}, {"bf16.gguf", gguf.BF16}, {"q8_0.gguf", gguf.Q8_0}, {"q4_k.gguf", gguf.Q4_K}} {
		ref, err := gguf.Open(filepath.Join(dir, c.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"mat_a", "mat_b"} {
			vals, shape, err := src.Float32(name)
			if err != nil {
				t.Fatal(err)
			}
			want, info, err := ref.TensorData(name)
			if err != nil {
				t.Fatal(err)
			}
			if info.Type != c.dt {
				t.Fatalf("%s %s: golden type %v", c.file, name, info.Type)
			}
			// Row by row, as the writer encodes.
			var got []byte
			cols := shape[len(shape)-1]
			for r := 0; r < len(vals); r += cols {
				if got, err = Encode(got, vals[r:r+cols], c.dt); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, want) {
				bad := 0
				for bad < len(got) && got[bad] == want[bad] {
					bad++
				}
				t.Errorf("%s %s: %d bytes, first difference at byte %d of %d", c.file, name, len(got), bad, len(want))
			}
		}
		ref.Close()
	}
}

func randomTable(rng *rand.Rand) ([]Tensor, [][]float32) {
	table := []Tensor{
		{Name: "vc/a.weight", Shape: []int{3, 64}, Type: gguf.Q8_0},
		{Name: "vc/" + strings.Repeat("long.", 14) + "weight", Shape: []int{5}, Type: gguf.F32},
		{Name: "vc/scalar", Shape: []int{}, Type: gguf.F32},
		{Name: "vc/empty", Shape: []int{0, 4}, Type: gguf.F32},
		{Name: "vocos/h", Shape: []int{2, 3, 4}, Type: gguf.F16},
		{Name: "vocos/q", Shape: []int{2, 256}, Type: gguf.Q4_K},
		{Name: "vocos/b", Shape: []int{7}, Type: gguf.BF16},
	}
	data := make([][]float32, len(table))
	for i, t := range table {
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		data[i] = make([]float32, n)
		for j := range data[i] {
			data[i][j] = float32(rng.NormFloat64())
		}
	}
	return table, data
}

// The streamed file is byte for byte what gguf.WritePackaged writes for the same tensors
// (F32/F16/Q8_0, the types it converts itself; BF16 and Q4_K go in as raw blocks), however
// the data is split into Write calls.
func TestWriterMatchesWritePackaged(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	table, data := randomTable(rng)
	kv := gguf.KV{}
	for k, v := range map[string]any{"general.architecture": "audiocpp", "general.name": "x",
		"audiocpp.tensor_sources.names": []string{"vc", "vocos"}, "some.u32": uint32(7), "some.f64s": []float64{1.5, -2}} {
		if err := kv.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	files := []gguf.EmbeddedFile{{Name: "config.json", Data: []byte(`{"a":1}`)}, {Name: "b.txt", Data: []byte("hello")}}
	var ref bytes.Buffer
	wts := make([]gguf.WriteTensor, len(table))
	for i, tt := range table {
		wts[i] = gguf.WriteTensor{Name: tt.Name, Shape: tt.Shape, Type: tt.Type, Data: data[i]}
		if tt.Type == gguf.BF16 || tt.Type == gguf.Q4_K {
			raw, err := Encode(nil, data[i], tt.Type)
			if err != nil {
				t.Fatal(err)
			}
			wts[i].Raw, wts[i].Data = raw, nil
		}
	}
	if err := gguf.WritePackaged(&ref, kv, wts, files); err != nil {
		t.Fatal(err)
	}
	for _, split := range []int{1, 2, 1 << 20} {
		var got bytes.Buffer
		w, err := New(&got, kv, table, files)
		if err != nil {
			t.Fatal(err)
		}
		for i, tt := range table {
			cur, ok := w.Current()
			if len(data[i]) > 0 && (!ok || cur.Name != tt.Name) {
				t.Fatalf("current %q, want %q", cur.Name, tt.Name)
			}
			row := max(1, rowLenOf(tt))
			step := max(row, split/row*row)
			for j := 0; j < len(data[i]); j += step {
				if err := w.WriteFloat32(data[i][j:min(j+step, len(data[i]))]); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), ref.Bytes()) {
			t.Fatalf("split %d: %d bytes, WritePackaged %d; they differ", split, got.Len(), ref.Len())
		}
		m, err := gguf.NewModel(mustParse(t, got.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.Tensor(table[1].Name); !ok {
			t.Error("long name not readable")
		}
	}
}

func rowLenOf(t Tensor) int { return rowLen(t) }

func mustParse(t *testing.T, b []byte) *gguf.File {
	t.Helper()
	f, err := gguf.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Too much data, a partial row of a block type and an unfinished file are errors.
func TestWriterErrors(t *testing.T) {
	table := []Tensor{{Name: "a", Shape: []int{2, 32}, Type: gguf.Q8_0}}
	var buf bytes.Buffer
	w, err := New(&buf, gguf.KV{}, table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFloat32(make([]float32, 16)); err == nil {
		t.Error("half a row of Q8_0 accepted")
	}
	if err := w.WriteFloat32(make([]float32, 32)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("unfinished file: %v", err)
	}
	w, _ = New(&buf, gguf.KV{}, table, nil)
	if err := w.WriteFloat32(make([]float32, 96)); err == nil {
		t.Error("too much data accepted")
	}
	if _, err := New(&buf, gguf.KV{}, []Tensor{{Name: "q", Shape: []int{3, 100}, Type: gguf.Q4_K}}, nil); err == nil {
		t.Error("Q4_K rows of 100 accepted")
	}
}

// BF16 rounding: to nearest even, NaN stays NaN.
func TestBF16(t *testing.T) {
	for _, c := range []struct {
		in   float32
		want uint16
	}{{1, 0x3f80}, {float32(math.Float32frombits(0x3f808000)), 0x3f80}, {float32(math.Float32frombits(0x3f818000)), 0x3f82},
		{float32(math.Float32frombits(0x3f808001)), 0x3f81}, {float32(math.Inf(-1)), 0xff80}} {
		if got := Float32ToBF16(c.in); got != c.want {
			t.Errorf("%v: %#x, want %#x", c.in, got, c.want)
		}
	}
	if got := Float32ToBF16(float32(math.NaN())); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("NaN: %#x", got)
	}
}
