package gguf

import "math"

// HalfToFloat32 converts an IEEE 754 binary16 value to float32 exactly (subnormals,
// infinities and NaNs included).
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		// Zero or subnormal: mant · 2^-24, exact in float32.
		f := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(f) | sign)
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	default:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
}

// Float32ToHalf converts a float32 to IEEE 754 binary16, rounding to nearest even;
// values beyond the half range become ±Inf, NaNs stay NaN.
func Float32ToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign // below half the smallest subnormal: rounds to zero
		}
		m := mant | 0x800000
		shift := uint(14 - e) // 14..24
		h := m >> shift
		rem := m & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || (rem == halfway && h&1 == 1) {
			h++ // may carry into the smallest normal, which is the right encoding
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, up to Inf, which is the right encoding
	}
	return sign | uint16(h)
}
