package dsp

import (
	"math"
	"math/cmplx"
	"math/rand/v2"
	"testing"
)

// TestFFT checks both directions against the direct DFT, for powers of two, the smooth
// sizes audio uses and primes.
func TestFFT(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 2, 3, 6, 7, 8, 12, 25, 49, 392, 400, 512, 640} {
		p := NewFFT(n)
		in, out := make([]complex128, n), make([]complex128, n)
		for i := range in {
			in[i] = complex(rng.NormFloat64(), rng.NormFloat64())
		}
		for _, sign := range []float64{-1, 1} {
			if sign < 0 {
				p.Forward(out, in)
			} else {
				p.Inverse(out, in)
			}
			for k := range n {
				var want complex128
				for j := range n {
					want += in[j] * cmplx.Exp(complex(0, sign*2*math.Pi*float64(j*k%n)/float64(n)))
				}
				if d := cmplx.Abs(out[k] - want); d > 1e-9*float64(n) {
					t.Fatalf("n=%d sign %v bin %d: %v, want %v", n, sign, k, out[k], want)
				}
			}
		}
	}
}

func BenchmarkFFT512(b *testing.B) {
	p := NewFFT(512)
	in, out := make([]complex128, 512), make([]complex128, 512)
	for i := range in {
		in[i] = complex(float64(i%7), 0)
	}
	for b.Loop() {
		p.Forward(out, in)
	}
}

func BenchmarkFFT640(b *testing.B) { // MeanVC2's vocoder: 2⁷·5
	p := NewFFT(640)
	in, out := make([]complex128, 640), make([]complex128, 640)
	for i := range in {
		in[i] = complex(float64(i%7), 0)
	}
	for b.Loop() {
		p.Inverse(out, in)
	}
}
