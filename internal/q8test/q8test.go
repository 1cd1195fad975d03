// Package q8test is the tests' reference for how the Q8_0 decode kernels (the CPU's, and
// Vulkan's with integer dot products) round their activations: per block of 32 values, scale
// amax/127, each value times the float32 127/amax rounded to the nearest even integer.
package q8test

import "math"

// RoundX returns x as those kernels see it (len(x) a multiple of 32; a partial last block is
// kept as is).
func RoundX(x []float32) []float32 {
	r := append([]float32(nil), x...)
	for b := 0; b+32 <= len(r); b += 32 {
		amax := float32(0)
		for _, v := range r[b : b+32] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		id, dx := float32(0), amax/127
		if amax > 0 {
			id = 127 / amax
		}
		for l := b; l < b+32; l++ {
			r[l] = float32(math.RoundToEven(float64(r[l]*id))) * dx
		}
	}
	return r
}
