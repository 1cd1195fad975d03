package gguf

import (
	"bytes"
	"testing"
)

// TestGoldenQuantizeQ8_0 quantises the golden source matrices and compares the block bytes
// with the ones ggml's reference quantiser wrote (edge rows included: all-zero blocks, ties).
func TestGoldenQuantizeQ8_0(t *testing.T) {
	src := openGolden(t, "quant", "source_f32.gguf")
	want := openGolden(t, "quant", "q8_0.gguf")
	for _, name := range []string{"mat_a", "mat_b"} {
		x, _, err := src.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := QuantizeQ8_0(x)
		if err != nil {
			t.Fatal(err)
		}
		raw, info, err := want.TensorData(name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Type != Q8_0 {
			t.Fatalf("%s: golden type %s", name, info.Type)
		}
		if !bytes.Equal(got, raw) {
			for i := range got {
				if got[i] != raw[i] {
					t.Fatalf("%s: byte %d (block %d, offset %d) = %#x, ggml wrote %#x", name, i, i/34, i%34, got[i], raw[i])
				}
			}
		}
	}
	if _, err := QuantizeQ8_0(make([]float32, 33)); err == nil {
		t.Error("33 values quantised without error")
	}
}

// TestGoldenEncodeF16 checks the F16 encoder against the golden F16 file.
func TestGoldenEncodeF16(t *testing.T) {
	src := openGolden(t, "quant", "source_f32.gguf")
	want := openGolden(t, "quant", "f16.gguf")
	for _, name := range []string{"mat_a", "mat_b"} {
		x, _, err := src.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		raw, _, err := want.TensorData(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(EncodeF16(x), raw) {
			t.Errorf("%s: F16 bytes differ from ggml's", name)
		}
	}
}

// TestWriteQ8_0 writes float data as Q8_0 and reads back the same blocks QuantizeQ8_0 makes.
func TestWriteQ8_0(t *testing.T) {
	x := make([]float32, 3*64)
	for i := range x {
		x[i] = float32(i%17) - 8.25
	}
	var buf bytes.Buffer
	if err := Write(&buf, KV{}, []WriteTensor{{Name: "w", Shape: []int{3, 64}, Type: Q8_0, Data: x}}); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	raw, info, err := f.TensorData("w")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := QuantizeQ8_0(x)
	if info.Type != Q8_0 || !bytes.Equal(raw, want) {
		t.Fatalf("written %s tensor differs from QuantizeQ8_0", info.Type)
	}
}
