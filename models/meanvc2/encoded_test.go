package meanvc2

import (
	"math"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

// TestEncodedWeightsTrackF32 converts a stream with the golden model's matrices stored as F16
// and as Q8_0 (as files of those types hold them; the CPU packs F16 into F16P panels and Q8_0
// into its 8-row records) and compares each with the F32 model's output of the same stream:
// every step computes over weights rounded to 11 significant bits (F16), or to 8-bit values
// with a scale per 32 (Q8_0, whose products also round x to 8 bits). Measured, as max abs
// difference ÷ max |output|: F16 6.4e-4, Q8_0 2.1e-2. The bounds leave room and still fail on a
// wrong row, panel or scale.
func TestEncodedWeightsTrackF32(t *testing.T) {
	m32, target32, src := golden(t)
	want := byChunks(t, newStream(t, m32, target32), src)
	r := paritytest.Open(t, Family)
	f, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range []struct {
		dtype gguf.DType
		bound float64
	}{{gguf.F16, 1e-2}, {gguf.Q8_0, 1e-1}} {
		var ts []gguf.WriteTensor
		encoded := 0
		for _, mt := range f.Tensors() {
			data, shape, err := f.Get(mt.Name)
			if err != nil {
				t.Fatal(err)
			}
			wt := gguf.WriteTensor{Name: mt.Name, Shape: shape, Data: data}
			if len(shape) == 2 && (c.dtype != gguf.Q8_0 || shape[len(shape)-1]%32 == 0) {
				wt.Type = c.dtype
				encoded++
			}
			ts = append(ts, wt)
		}
		m, err := Load(writeTensors(t, f, ts, ""), cpu(t))
		if err != nil {
			t.Fatal(err)
		}
		got := byChunks(t, newStream(t, m, goldenTarget(t, r, m)), src)
		m.Close()
		if len(got) != len(want) {
			t.Fatalf("%v: %d samples, want %d", c.dtype, len(got), len(want))
		}
		var diff, peak float64
		for i := range want {
			diff = max(diff, math.Abs(float64(got[i])-float64(want[i])))
			peak = max(peak, math.Abs(float64(want[i])))
		}
		t.Logf("%d matrices as %v: output max abs difference %.3g, %.3g of the peak %.3g", encoded, c.dtype, diff, diff/peak, peak)
		if diff == 0 {
			t.Fatalf("the %v model gave the F32 model's output bit for bit: the matrices were not encoded", c.dtype)
		}
		if diff > c.bound*peak {
			t.Errorf("%v weights: output differs by %.3g of the peak (bound %g)", c.dtype, diff/peak, c.bound)
		}
	}
}
