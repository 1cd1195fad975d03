package meanvc2

import (
	"math"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

// TestF16WeightsTrackF32 converts a stream with the golden model's matrices stored as F16
// (as an F16 file holds them; the CPU packs them into F16P panels) and compares it with the
// F32 model's output of the same stream: every step computes in f32 over weights rounded to
// 11 significant bits. Measured 6.4e-4 of the peak (max abs difference ÷ max |output|);
// 1e-2 leaves room and still fails on a wrong row, panel or scale.
func TestF16WeightsTrackF32(t *testing.T) {
	m32, target32, src := golden(t)
	r := paritytest.Open(t, Family)
	f, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []gguf.WriteTensor
	halves := 0
	for _, mt := range f.Tensors() {
		data, shape, err := f.Get(mt.Name)
		if err != nil {
			t.Fatal(err)
		}
		wt := gguf.WriteTensor{Name: mt.Name, Shape: shape, Data: data}
		if len(shape) == 2 {
			wt.Type = gguf.F16
			halves++
		}
		ts = append(ts, wt)
	}
	m16, err := Load(writeTensors(t, f, ts, ""), cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m16.Close()
	want := byChunks(t, newStream(t, m32, target32), src)
	got := byChunks(t, newStream(t, m16, goldenTarget(t, r, m16)), src)
	if len(got) != len(want) {
		t.Fatalf("%d samples, want %d", len(got), len(want))
	}
	var diff, peak float64
	for i := range want {
		diff = max(diff, math.Abs(float64(got[i])-float64(want[i])))
		peak = max(peak, math.Abs(float64(want[i])))
	}
	t.Logf("%d matrices as F16: output max abs difference %.3g, %.3g of the peak %.3g", halves, diff, diff/peak, peak)
	if diff == 0 {
		t.Fatal("the F16 model gave the F32 model's output bit for bit: the matrices were not F16")
	}
	if diff > 1e-2*peak {
		t.Errorf("F16 weights: output differs by %.3g of the peak (bound 1e-2)", diff/peak)
	}
}
