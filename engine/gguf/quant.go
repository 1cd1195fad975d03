package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
)

// QuantizeQ8_0 encodes src (a whole number of 32-value blocks) as Q8_0 blocks, the way ggml's
// reference quantiser does, so a converted file matches one that ggml writes byte for byte:
// per block amax = max|x|, d = amax/127, q = round-half-away(x·(1/d)) (0 when d is 0), and the
// stored scale is d rounded to binary16 (the quants use the unrounded d).
func QuantizeQ8_0(src []float32) ([]byte, error) {
	if len(src)%32 != 0 {
		return nil, fmt.Errorf("gguf: quantize Q8_0: %d values is not a multiple of 32", len(src))
	}
	dst := make([]byte, len(src)/32*34)
	for b := 0; b < len(src)/32; b++ {
		x := src[32*b : 32*b+32]
		blk := dst[34*b : 34*b+34]
		var amax float32
		for _, v := range x {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		binary.LittleEndian.PutUint16(blk, Float32ToHalf(d))
		for j, v := range x {
			// float32(…) rounds the product before Round, as ggml's float code does.
			blk[2+j] = byte(int8(math.Round(float64(float32(v * id)))))
		}
	}
	return dst, nil
}

// EncodeF16 encodes src as IEEE binary16 (round to nearest even), little-endian.
func EncodeF16(src []float32) []byte {
	dst := make([]byte, 2*len(src))
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], Float32ToHalf(v))
	}
	return dst
}

// EncodeF32 encodes src as little-endian float32 (GGUF's F32).
func EncodeF32(src []float32) []byte {
	dst := make([]byte, 4*len(src))
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
	return dst
}
