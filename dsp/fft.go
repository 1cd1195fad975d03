package dsp

import "math"

// FFT is a mixed-radix complex FFT of one size (decimation in time over the size's prime
// factors: O(n·Σp), so O(n log n) for the smooth sizes audio uses — 400, 512, 640 — and
// exact for any n). Its tables and scratch are made once; it is not safe for concurrent use.
type FFT struct {
	n       int
	factors []int
	tw      []complex128 // tw[i] = exp(+2πi·i/n)
	tmp     []complex128 // one butterfly's inputs (largest factor)
	conj    bool         // the transform in progress is the forward one
}

// NewFFT plans transforms of n points.
func NewFFT(n int) *FFT {
	p := &FFT{n: n, tw: make([]complex128, n)}
	for r := n; r > 1; {
		f := 2
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
	return p
}

// Len is the transform size.
func (p *FFT) Len() int { return p.n }

// Forward sets out[k] = Σ_j in[j]·exp(−2πi·jk/n). out and in must not overlap.
func (p *FFT) Forward(out, in []complex128) {
	p.conj = true
	p.rec(out, in, 0, 1, p.n, 0)
}

// Inverse sets out[k] = Σ_j in[j]·exp(+2πi·jk/n), without the 1/n scaling. out and in must
// not overlap.
func (p *FFT) Inverse(out, in []complex128) {
	p.conj = false
	p.rec(out, in, 0, 1, p.n, 0)
}

func (p *FFT) twiddle(i int) complex128 {
	if p.conj {
		return complex(real(p.tw[i]), -imag(p.tw[i]))
	}
	return p.tw[i]
}

// rec transforms the n inputs in[off + j·stride] into out[0:n] using factors[fi:].
func (p *FFT) rec(out, in []complex128, off, stride, n, fi int) {
	if n == 1 {
		out[0] = in[off]
		return
	}
	r := p.factors[fi]
	m := n / r
	// r interleaved sub-transforms of size m, written to consecutive blocks of out.
	for j := range r {
		p.rec(out[j*m:(j+1)*m], in, off+j*stride, stride*r, m, fi+1)
	}
	step := p.n / n // tw index of exp(2πi/n)
	for k := range m {
		for j := range r {
			p.tmp[j] = out[j*m+k] * p.twiddle((j*k*step)%p.n)
		}
		// Size-r DFT of tmp into the same r positions k + q·m.
		for q := range r {
			var acc complex128
			for j := range r {
				acc += p.tmp[j] * p.twiddle(((j*q)%r)*(p.n/r))
			}
			out[k+q*m] = acc
		}
	}
}
