package ggufpack

import (
	"bytes"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// appendQ8_0 writes gguf.QuantizeQ8_0's bytes for every kind of block: random values,
// products that land exactly on a half (rounded away from zero), zeros, subnormals, ±Inf
// and NaN.
func TestAppendQ8_0MatchesQuantize(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var src []float32
	for range 4096 {
		src = append(src, float32(rng.NormFloat64()*math.Pow(10, float64(rng.IntN(12)-6))))
	}
	halves := make([]float32, 32) // amax 127 → id 1: v·id is v exactly
	halves[0] = 127
	for j := 1; j < 32; j++ {
		halves[j] = float32(j-16) + 0.5
	}
	src = append(src, halves...)
	for j := range halves {
		halves[j] = -halves[j]
	}
	src = append(src, halves...)
	src = append(src, make([]float32, 32)...)
	special := make([]float32, 32)
	special[0], special[1], special[2] = math.Float32frombits(1), -math.Float32frombits(5), 1e-40
	src = append(src, special...)
	special[3] = float32(math.Inf(1))
	src = append(src, special...)
	special[3] = float32(math.Inf(-1))
	src = append(src, special...)
	special[3] = float32(math.NaN())
	src = append(src, special...)
	want, err := gguf.QuantizeQ8_0(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := appendQ8_0([]byte("prefix"), src)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte("prefix")) || !bytes.Equal(got[6:], want) {
		for i := range want {
			if got[6+i] != want[i] {
				t.Fatalf("first difference at byte %d (block %d)", i, i/34)
			}
		}
		t.Fatalf("%d bytes, want %d", len(got)-6, len(want))
	}
	if _, err := appendQ8_0(nil, src[:33]); err == nil {
		t.Error("33 values: no error")
	}
}

// Encoding split over the CPUs gives Encode's bytes, after a prefix, for every type, in
// whole rows; an input that is not whole blocks is refused.
func TestEncodeParallel(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	rng := rand.New(rand.NewPCG(5, 6))
	src := make([]float32, 512*300)
	for i := range src {
		src[i] = float32(rng.NormFloat64())
	}
	for _, dt := range []gguf.DType{gguf.F32, gguf.F16, gguf.BF16, gguf.Q8_0, gguf.Q4_K} {
		for _, n := range []int{len(src), len(src) - 512, 512 * 7} {
			want, err := Encode([]byte("ab"), src[:n], dt)
			if err != nil {
				t.Fatal(err)
			}
			got, err := encodeParallel([]byte("ab"), src[:n], dt, 512)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%v, %d values: %d bytes (err %v), Encode %d", dt, n, len(got), err, len(want))
			}
		}
	}
	// Element types split anywhere: a chunk that is not whole rows.
	want, _ := Encode(nil, src[:len(src)-3], gguf.F16)
	if got, err := encodeParallel(nil, src[:len(src)-3], gguf.F16, 512); err != nil || !bytes.Equal(got, want) {
		t.Errorf("F16 over partial rows: err %v", err)
	}
	if _, err := encodeParallel(nil, src[:len(src)-32], gguf.Q4_K, 512); err == nil {
		t.Error("Q4_K of a partial block: no error")
	}
}
