package weights_test

import (
	"math"
	"slices"
	"testing"

	"github.com/voxpipe/voxpipe/engine/weights"
)

func TestRandom(t *testing.T) {
	specs := []weights.Spec{{Name: "w", Shape: []int{64, 256}}, {Name: "norm.weight", Shape: []int{64}}, {Name: "bn.running_var", Shape: []int{64}}}
	a, b := weights.Random(specs, 3), weights.Random(specs, 3)
	if !slices.Equal(a["w"].Data, b["w"].Data) {
		t.Error("same seed, different weights")
	}
	if slices.Equal(a["w"].Data, weights.Random(specs, 4)["w"].Data) {
		t.Error("different seeds, same weights")
	}
	var ss float64
	for _, v := range a["w"].Data {
		ss += float64(v) * float64(v)
	}
	if sd := math.Sqrt(ss / float64(len(a["w"].Data))); math.Abs(sd-1/16.0) > 0.005 {
		t.Errorf("matrix sd %.4f, want 1/sqrt(256)", sd)
	}
	for _, v := range a["bn.running_var"].Data {
		if v < 1 {
			t.Fatalf("variance %v below 1", v)
		}
	}
	data, shape, err := a.Get("norm.weight")
	if err != nil || len(data) != 64 || !slices.Equal(shape, []int{64}) || !a.Has("w") || a.Has("x") {
		t.Errorf("Get/Has: %v %v %v", len(data), shape, err)
	}
	if _, _, err := a.Get("x"); err == nil {
		t.Error("missing tensor: no error")
	}
}
