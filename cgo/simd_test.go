package cgo

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestBinaryEverySIMDLevel runs the binary kernels on the portable, AVX2 and AVX-512 paths
// (those the CPU has) over lengths that exercise every tail, with scalar broadcasts and NaNs,
// and requires the same results from each.
func TestBinaryEverySIMDLevel(t *testing.T) {
	all := Init()
	defer LimitCPUFeatures(all)
	levels := []int{0, CPUAVX2 | CPUFMA, CPUAVX2 | CPUFMA | CPUAVX512F}
	ctx, err := NewContext(1)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 7, 8, 15, 16, 17, 33, 100} {
		for op := BAdd; op <= BMin; op++ {
			for _, bScalar := range []bool{false, true} {
				a, _ := Alloc(n * 4)
				bn := n
				if bScalar {
					bn = 1
				}
				b, _ := Alloc(bn * 4)
				for i := range a.Float32s() {
					a.Float32s()[i] = float32(rng.NormFloat64())
				}
				for i := range b.Float32s() {
					b.Float32s()[i] = float32(rng.NormFloat64()) + 2
				}
				a.Float32s()[0] = float32(math.NaN())
				var ref []float32
				for _, lv := range levels {
					used := LimitCPUFeatures(lv)
					if used != lv&all {
						t.Fatalf("features %x in use, want %x", used, lv&all)
					}
					d, _ := Alloc(n * 4)
					shape := []int64{int64(n)}
					bst := []int64{1}
					if bScalar {
						bst = []int64{0}
					}
					p, err := NewPlan([]Node{{Op: OpBinary, Src: []int{0, 1}, Dst: 2, IP: [8]int64{int64(op)}}}, []Tensor{
						{Data: a.Ptr(), DType: F32, Shape: shape, Stride: []int64{1}},
						{Data: b.Ptr(), DType: F32, Shape: shape, Stride: bst},
						{Data: d.Ptr(), DType: F32, Shape: shape, Stride: []int64{1}},
					})
					if err != nil {
						t.Fatal(err)
					}
					if err := ctx.Execute(p); err != nil {
						t.Fatal(err)
					}
					got := append([]float32(nil), d.Float32s()...)
					p.Free()
					d.Free()
					if ref == nil {
						ref = got
						continue
					}
					for i := range got {
						same := math.Float32bits(got[i]) == math.Float32bits(ref[i]) || got[i] != got[i] && ref[i] != ref[i]
						if !same {
							t.Fatalf("n %d op %d scalar %v level %x: [%d] = %v, portable %v", n, op, bScalar, lv, i, got[i], ref[i])
						}
					}
				}
				a.Free()
				b.Free()
			}
		}
	}
}
