package dsp

import (
	"fmt"
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

// RealFFT gives the bins a complex FFT of the same real signal gives, and its inverse the
// real part of the complex inverse of the full Hermitian spectrum (DC's and Nyquist's
// imaginary parts ignored), for power-of-two, smooth and odd-half sizes.
func TestRealFFT(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{2, 4, 6, 10, 14, 18, 400, 512, 640} {
		r, c := NewRealFFT(n), NewFFT(n)
		x := make([]float64, n)
		xc := make([]complex128, n)
		for i := range x {
			x[i] = rng.NormFloat64()
			xc[i] = complex(x[i], 0)
		}
		got, want := make([]complex128, n/2+1), make([]complex128, n)
		r.Forward(got, x)
		c.Forward(want, xc)
		for k := range got {
			if cmplx.Abs(got[k]-want[k]) > 1e-9*float64(n) {
				t.Fatalf("n %d: forward bin %d = %v, want %v", n, k, got[k], want[k])
			}
		}
		// Inverse of bins with arbitrary imaginary parts at DC and Nyquist.
		bins := make([]complex128, n/2+1)
		full := make([]complex128, n)
		for k := range bins {
			bins[k] = complex(rng.NormFloat64(), rng.NormFloat64())
		}
		for k := range full {
			switch {
			case k == 0 || k == n/2:
				full[k] = complex(real(bins[k]), 0)
			case k < n/2:
				full[k] = bins[k]
			default:
				full[k] = cmplx.Conj(bins[n-k])
			}
		}
		inv, ref := make([]float64, n), make([]complex128, n)
		r.Inverse(inv, bins)
		c.Inverse(ref, full)
		for j := range inv {
			if math.Abs(inv[j]-real(ref[j])) > 1e-9*float64(n) {
				t.Fatalf("n %d: inverse sample %d = %v, want %v", n, j, inv[j], real(ref[j]))
			}
		}
	}
}

// BenchmarkRealFFT: fbank's 512-point forward and the vocoder's 640-point inverse.
func BenchmarkRealFFT(b *testing.B) {
	for _, n := range []int{512, 640} {
		r := NewRealFFT(n)
		x, bins := make([]float64, n), make([]complex128, n/2+1)
		b.Run(fmt.Sprintf("forward-%d", n), func(b *testing.B) {
			for b.Loop() {
				r.Forward(bins, x)
			}
		})
		b.Run(fmt.Sprintf("inverse-%d", n), func(b *testing.B) {
			for b.Loop() {
				r.Inverse(x, bins)
			}
		})
	}
}
