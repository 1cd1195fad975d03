package miocodec

import (
	"fmt"
	"math"
)

// fsq is MioCodec's finite scalar quantizer index ↔ code arithmetic.
type fsq struct {
	levels []int
	basis  []int
}

func newFSQ(levels []int) fsq {
	f := fsq{levels: levels, basis: make([]int, len(levels))}
	b := 1
	for i, l := range levels {
		f.basis[i] = b
		b *= l
	}
	return f
}

func (f fsq) size() int { return f.basis[len(f.basis)-1] * f.levels[len(f.levels)-1] }

// codes writes the code of index idx: digit_i = (idx / basis_i) mod L_i, code = (digit − ⌊L/2⌋)/⌊L/2⌋.
func (f fsq) codes(idx int, dst []float32) {
	for i, l := range f.levels {
		half := l / 2
		d := (idx / f.basis[i]) % l
		dst[i] = float32(d-half) / float32(half)
	}
}

// table is the code of every index, [size, len(levels)] row-major.
func (f fsq) table() []float32 {
	n, k := f.size(), len(f.levels)
	out := make([]float32, n*k)
	for i := range n {
		f.codes(i, out[i*k:(i+1)*k])
	}
	return out
}

// quantize bounds and rounds one latent vector z (proj_in output) and returns the token
// index, writing the codes to dst: bound = tanh(z + shift)·half_l − offset with
// half_l = (L−1)(1−1e-3)/2, offset 0.5 for even L, shift = tan(offset/half_l); round half to
// even as torch.round; code = round/⌊L/2⌋.
func (f fsq) quantize(z []float32, dst []float32) int {
	idx := 0
	for i, l := range f.levels {
		halfL := float64(l-1) * (1 - 1e-3) / 2
		offset := 0.0
		if l%2 == 0 {
			offset = 0.5
		}
		shift := math.Tan(offset / halfL)
		// float32 steps as in the reference (z is float32 there too).
		bounded := float32(float32(math.Tanh(float64(z[i])+shift))*float32(halfL)) - float32(offset)
		r := math.RoundToEven(float64(bounded))
		half := l / 2
		dst[i] = float32(r) / float32(half)
		idx += (int(r) + half) * f.basis[i]
	}
	return idx
}

func (f fsq) check(tokens []int32) error {
	n := int32(f.size())
	for i, t := range tokens {
		if t < 0 || t >= n {
			return fmt.Errorf("miocodec: token %d at position %d outside [0, %d)", t, i, n)
		}
	}
	return nil
}
