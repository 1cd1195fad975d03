package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
)

// Dequantisation of tensor data to float32. Supported types: F32, F16, BF16, Q8_0 and Q4_K.
// Every decoder reproduces ggml's reference dequantiser bit for bit: each result is computed
// with the same float32 operations in the same order, and no multiply-add is fused (the Go
// compiler may fuse x*y+z on some architectures, arm64 among them, even across statements;
// an explicit float32 conversion of the product forbids it, see the Go specification on
// floating-point operators).

// CanDequantize reports whether Dequantize supports type t.
func CanDequantize(t DType) bool {
	switch t {
	case F32, F16, BF16, Q8_0, Q4_K:
		return true
	}
	return false
}

// Dequantize decodes src, the raw data of len(dst) elements of type t, into dst. len(dst)
// must be a multiple of t's block size and src must be exactly the encoded size.
func Dequantize(dst []float32, src []byte, t DType) error {
	info, ok := dtypes[t]
	if !ok {
		return fmt.Errorf("gguf: dequantize: unknown dtype %d", uint32(t))
	}
	n := uint64(len(dst))
	if n%info.blockSize != 0 {
		return fmt.Errorf("gguf: dequantize %s: %d elements is not a multiple of the block size %d", t, n, info.blockSize)
	}
	if want := n / info.blockSize * info.blockLen; uint64(len(src)) != want {
		return fmt.Errorf("gguf: dequantize %s: %d bytes for %d elements, want %d", t, len(src), n, want)
	}
	switch t {
	case F32:
		dequantF32(dst, src)
	case F16:
		dequantF16(dst, src)
	case BF16:
		dequantBF16(dst, src)
	case Q8_0:
		dequantQ8_0(dst, src)
	case Q4_K:
		dequantQ4_K(dst, src)
	default:
		return fmt.Errorf("gguf: dequantize: dtype %s not supported (supported: F32, F16, BF16, Q8_0, Q4_K)", t)
	}
	return nil
}

func dequantF32(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// halfTable maps every binary16 bit pattern to its float32 value (256 KiB, built on first
// use): a table lookup is several times faster than decoding the fields.
var halfTable = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for h := range t {
		t[h] = HalfToFloat32(uint16(h))
	}
	return t
})

func dequantF16(dst []float32, src []byte) {
	tab := halfTable()
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = tab[uint16(src[2*i])|uint16(src[2*i+1])<<8]
	}
}

// BF16ToFloat32 converts a bfloat16 (the upper half of a float32) to float32 exactly.
func BF16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

func dequantBF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(src[2*i])<<16 | uint32(src[2*i+1])<<24)
	}
}

// Q8_0: blocks of 32 values, 34 bytes: half d, then 32 int8 quants; value = q·d.
func dequantQ8_0(dst []float32, src []byte) {
	tab := halfTable()
	for b := 0; b < len(dst)/32; b++ {
		blk := src[34*b : 34*b+34]
		d := tab[binary.LittleEndian.Uint16(blk)]
		qs := blk[2:34]
		out := dst[32*b : 32*b+32]
		for j := range out {
			out[j] = float32(int8(qs[j])) * d
		}
	}
}

// Q4_K: super-blocks of 256 values, 144 bytes: half d, half dmin, 12 bytes holding eight
// 6-bit scales and eight 6-bit mins, 128 bytes of 4-bit quants. The values form four chunks
// of 64; chunk c takes quant bytes 32c..32c+31, their low nibbles with sub-block 2c and
// their high nibbles with sub-block 2c+1. Value = (d·sc)·q − (dmin·m), each product
// rounded to float32.
func dequantQ4_K(dst []float32, src []byte) {
	tab := halfTable()
	for b := 0; b < len(dst)/256; b++ {
		blk := src[144*b : 144*b+144]
		d := tab[binary.LittleEndian.Uint16(blk[0:])]
		dmin := tab[binary.LittleEndian.Uint16(blk[2:])]
		sc := blk[4:16]
		qs := blk[16:144]
		out := dst[256*b : 256*b+256]
		for c := 0; c < 4; c++ {
			s0, m0 := q4kScaleMin(sc, 2*c)
			s1, m1 := q4kScaleMin(sc, 2*c+1)
			// Every product is wrapped in float32(…): an explicit conversion rounds, which
			// keeps the compiler from fusing it with the subtraction (even across
			// statements), so each value is rounded three times as ggml's is.
			d0, o0 := float32(d*float32(s0)), float32(dmin*float32(m0))
			d1, o1 := float32(d*float32(s1)), float32(dmin*float32(m1))
			q := qs[32*c : 32*c+32]
			lo := out[64*c : 64*c+32]
			hi := out[64*c+32 : 64*c+64]
			for l := range q {
				lo[l] = float32(d0*float32(q[l]&0xF)) - o0
				hi[l] = float32(d1*float32(q[l]>>4)) - o1
			}
		}
	}
}

// q4kScaleMin unpacks the 6-bit scale and min of sub-block j (0..7) from the 12 packed
// bytes: sub-blocks 0..3 take the low 6 bits of bytes j and j+4; sub-blocks 4..7 take a
// nibble of byte j+4 for their low 4 bits and the top 2 bits of bytes j-4 and j.
func q4kScaleMin(q []byte, j int) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0x0F | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}
