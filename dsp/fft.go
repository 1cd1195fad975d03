package dsp

import (
	"math"
	"math/cmplx"
)

// FFT is a mixed-radix complex FFT of one size (decimation in time over the size's prime
// factors: O(n·Σp), so O(n log n) for the smooth sizes audio uses — 400, 512, 640 — and
// exact for any n). Its tables and scratch are made once; it is not safe for concurrent use.
type FFT struct {
	n       int
	factors []int
	tw      []complex128 // tw[i] = exp(+2πi·i/n)
	twf     []complex128 // twf[i] = exp(−2πi·i/n), the forward transform's
	tmp     []complex128 // one butterfly's inputs (largest factor)
	// Powers of two (fbank's 512) run an iterative radix-2 transform: rev is the
	// bit-reversed order of the inputs. Other sizes (the vocoder's 640 = 4·4·4·2·5) recurse
	// over their factors, with written-out butterflies for 2, 4 and 5 and a direct DFT for
	// other primes.
	rev []int32
}

// NewFFT plans transforms of n points.
func NewFFT(n int) *FFT {
	p := &FFT{n: n, tw: make([]complex128, n)}
	for r := n; r > 1; {
		f := 4 // radix-4 butterflies where 4 divides, then 2, then the odd primes
		if r%4 != 0 {
			f = 2
		}
		for r%f != 0 {
			if f*f > r {
				f = r
				break
			}
			f++
		}
		p.factors = append(p.factors, f)
		r /= f
	}
	big := 1
	for _, f := range p.factors {
		big = max(big, f)
	}
	p.tmp = make([]complex128, big)
	for i := range p.tw {
		a := 2 * math.Pi * float64(i) / float64(n)
		p.tw[i] = complex(math.Cos(a), math.Sin(a))
	}
	if n >= 4 && n&(n-1) == 0 {
		bits := 0
		for 1<<bits < n {
			bits++
		}
		p.rev = make([]int32, n)
		for i := range p.rev {
			r := 0
			for b := range bits {
				r |= (i >> b & 1) << (bits - 1 - b)
			}
			p.rev[i] = int32(r)
		}
	}
	p.twf = make([]complex128, n)
	for i := range p.twf {
		p.twf[i] = complex(real(p.tw[i]), -imag(p.tw[i]))
	}
	return p
}

// Len is the transform size.
func (p *FFT) Len() int { return p.n }

// Forward sets out[k] = Σ_j in[j]·exp(−2πi·jk/n). out and in must not overlap.
func (p *FFT) Forward(out, in []complex128) {
	if p.rev != nil {
		p.radix2(out, in, p.twf)
		return
	}
	p.rec(out, in, 0, 1, p.n, 0, p.twf)
}

// Inverse sets out[k] = Σ_j in[j]·exp(+2πi·jk/n), without the 1/n scaling. out and in must
// not overlap.
func (p *FFT) Inverse(out, in []complex128) {
	if p.rev != nil {
		p.radix2(out, in, p.tw)
		return
	}
	p.rec(out, in, 0, 1, p.n, 0, p.tw)
}

// radix2 is the iterative decimation-in-time transform of a power-of-two size with the
// twiddles tw[k] = exp(±2πi·k/n): the inputs in bit-reversed order, then log2(n) passes of
// butterflies, each over spans twice the last.
func (p *FFT) radix2(out, in []complex128, tw []complex128) {
	n := p.n
	out = out[:n]
	for i, r := range p.rev {
		out[r] = in[i]
	}
	for h := 1; h < n; h <<= 1 {
		step := n / (2 * h)
		for s := 0; s < n; s += 2 * h {
			lo, hi := out[s:s+h], out[s+h:s+2*h]
			for k := range lo {
				b := hi[k] * tw[k*step]
				a := lo[k]
				lo[k], hi[k] = a+b, a-b
			}
		}
	}
}

// rec transforms the n inputs in[off + j·stride] into out[0:n] using factors[fi:], with the
// twiddles tw[i] = exp(±2πi·i/N) of the whole size N.
func (p *FFT) rec(out, in []complex128, off, stride, n, fi int, tw []complex128) {
	if n == 1 {
		out[0] = in[off]
		return
	}
	r := p.factors[fi]
	m := n / r
	if m == 1 { // the last factor: its DFT straight from the strided inputs
		for j := range r {
			out[j] = in[off+j*stride]
		}
		p.butterfly(out, 1, r, 0, 1, tw)
		return
	}
	// r interleaved sub-transforms of size m, written to consecutive blocks of out.
	for j := range r {
		p.rec(out[j*m:(j+1)*m], in, off+j*stride, stride*r, m, fi+1, tw)
	}
	for k := range m {
		p.butterfly(out[k:], m, r, k, p.n/n, tw)
	}
}

// butterfly replaces the r values x[q·m], q < r, by their size-r DFT after twiddling input j
// by tw[j·k·step] (step = N/n, n = r·m the size being combined).
func (p *FFT) butterfly(x []complex128, m, r, k, step int, tw []complex128) {
	switch r {
	case 2:
		a, b := x[0], x[m]*tw[k*step]
		x[0], x[m] = a+b, a-b
	case 4:
		a0, a1, a2, a3 := x[0], x[m]*tw[k*step], x[2*m]*tw[2*k*step], x[3*m]*tw[3*k*step]
		t0, t1, t2, d := a0+a2, a0-a2, a1+a3, a1-a3
		// d·W₄ with W₄ = ±i exactly (tw[N/4] is only ±i to rounding)
		t3 := complex(-imag(d), real(d))
		if imag(tw[p.n/4]) < 0 {
			t3 = -t3
		}
		x[0], x[m], x[2*m], x[3*m] = t0+t2, t1+t3, t0-t2, t1-t3
	case 5:
		a0, a1, a2, a3, a4 := x[0], x[m]*tw[k*step], x[2*m]*tw[2*k*step], x[3*m]*tw[3*k*step], x[4*m]*tw[4*k*step]
		w1, w2 := tw[p.n/5], tw[2*p.n/5] // W₅ and W₅²: cos and ±sin of 2π/5, 4π/5
		b1, b2, d1, d2 := a1+a4, a2+a3, a1-a4, a2-a3
		scale := func(c float64, z complex128) complex128 { return complex(c*real(z), c*imag(z)) }
		t1 := a0 + scale(real(w1), b1) + scale(real(w2), b2)
		t2 := a0 + scale(real(w2), b1) + scale(real(w1), b2)
		u1 := scale(imag(w1), d1) + scale(imag(w2), d2)
		u2 := scale(imag(w2), d1) - scale(imag(w1), d2)
		iu1, iu2 := complex(-imag(u1), real(u1)), complex(-imag(u2), real(u2)) // i·u
		x[0], x[m], x[2*m], x[3*m], x[4*m] = a0+b1+b2, t1+iu1, t2+iu2, t2-iu2, t1-iu1
	default:
		for j := range r {
			p.tmp[j] = x[j*m] * tw[j*k*step]
		}
		// Size-r DFT of tmp into the same r positions q·m.
		rstep := p.n / r
		for q := range r {
			var acc complex128
			for j, jq := 0, 0; j < r; j, jq = j+1, jq+q {
				if jq >= r {
					jq -= r
				}
				acc += p.tmp[j] * tw[jq*rstep]
			}
			x[q*m] = acc
		}
	}
}

// RealFFT transforms real signals of one even size n through a complex FFT of n/2 points:
// the samples pair up as z[j] = x[2j] + i·x[2j+1], and with E and O the spectra of the
// even and odd samples, X[k] = E[k] + exp(−2πik/n)·O[k] while Z[k] = E[k] + i·O[k]. About
// half the work of a complex transform of n points. Not safe for concurrent use.
type RealFFT struct {
	n    int
	half *FFT
	tw   []complex128 // exp(−2πi·k/n), k < n/2
	z, y []complex128 // the half-length transform's input and output
}

// NewRealFFT plans real transforms of n points; n must be even and at least 2.
func NewRealFFT(n int) *RealFFT {
	m := n / 2
	r := &RealFFT{n: n, half: NewFFT(m), tw: make([]complex128, m), z: make([]complex128, m), y: make([]complex128, m)}
	for k := range r.tw {
		a := -2 * math.Pi * float64(k) / float64(n)
		r.tw[k] = complex(math.Cos(a), math.Sin(a))
	}
	return r
}

// Forward sets out[k] = Σ_j in[j]·exp(−2πi·jk/n) for k = 0..n/2 (the other bins are their
// conjugates). in has n values, out room for n/2+1.
func (r *RealFFT) Forward(out []complex128, in []float64) {
	m := r.n / 2
	for j := range m {
		r.z[j] = complex(in[2*j], in[2*j+1])
	}
	r.half.Forward(r.y, r.z)
	for k := range m {
		a, b := r.y[k], cmplx.Conj(r.y[(m-k)%m])
		even, odd := halve(a+b), (a-b)*complex(0, -0.5)
		out[k] = even + r.tw[k]*odd
	}
	out[m] = complex(real(r.y[0])-imag(r.y[0]), 0)
}

// Inverse sets out[j] = Σ_k X[k]·exp(+2πi·jk/n) over all n bins of the Hermitian spectrum
// whose bins 0..n/2 are in, without the 1/n scaling; the imaginary parts of DC and Nyquist
// are ignored, as a C2R transform does. out has room for n values.
func (r *RealFFT) Inverse(out []float64, in []complex128) {
	m := r.n / 2
	bin := func(k int) complex128 {
		if k == 0 || k == m {
			return complex(real(in[k]), 0)
		}
		return in[k]
	}
	for k := range m {
		a, b := bin(k), cmplx.Conj(bin(m-k))
		r.z[k] = halve(a + b + complex(0, 1)*(a-b)*cmplx.Conj(r.tw[k]))
	}
	r.half.Inverse(r.y, r.z)
	for j := range m {
		out[2*j], out[2*j+1] = 2*real(r.y[j]), 2*imag(r.y[j])
	}
}

// halve is c/2 without a complex division (the runtime's is a call that guards against
// infinities; this is exact and the same bits).
func halve(c complex128) complex128 { return complex(real(c)*0.5, imag(c)*0.5) }
