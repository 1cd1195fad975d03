package cgo

/*
#include "vx.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// encodeMinPart is the fewest values one goroutine of EncodeWeights converts: below it the
// start of a goroutine costs more than the work.
const encodeMinPart = 64 << 10

// EncodeBytes is the size of n values stored as to (F32, F16, BF16 or Q8_0), or -1 when n
// does not fit to's blocks or to is none of those.
func EncodeBytes(to DType, n int) int {
	return int(C.vx_encode_bytes(C.int(to), C.int64_t(n)))
}

// EncodeWeights converts n values, the little-endian bytes of type from (F32, F16 or BF16)
// in src, to type to (F32, F16, BF16, or Q8_0 with n a multiple of 32) in dst, and returns
// the bytes written (EncodeBytes). The bytes are those engine/ggufpack's Go encoders write
// for the float32 values engine/ckpt decodes from src (ggml's rounding, Q8_0 as ggml's
// quantize_row_q8_0_ref, NaN and Inf included), without decoding to float32 first. Up to
// threads goroutines (at least 1) each convert a run of whole blocks.
func EncodeWeights(dst, src []byte, from, to DType, n, threads int) (int, error) {
	es := 0
	switch from {
	case F32:
		es = 4
	case F16, BF16:
		es = 2
	default:
		return 0, fmt.Errorf("cgo: encode: source type %d is not F32, F16 or BF16", from)
	}
	out := EncodeBytes(to, n)
	if out < 0 {
		return 0, fmt.Errorf("cgo: encode: %d values cannot be stored as type %d (F32, F16, BF16, Q8_0 in blocks of 32)", n, to)
	}
	if len(src) < n*es || len(dst) < out {
		return 0, fmt.Errorf("cgo: encode %d values: %d bytes in (want %d), %d out (want %d)", n, len(src), n*es, len(dst), out)
	}
	if n == 0 {
		return 0, nil
	}
	Init()
	block := 32 // parts start on a block (and 32-byte) boundary
	blocks := (n + block - 1) / block
	parts := max(1, min(threads, n/encodeMinPart, blocks))
	if parts == 1 {
		C.vx_encode(C.int(from), C.int(to), unsafe.Pointer(&src[0]), unsafe.Pointer(&dst[0]), C.int64_t(n))
		return out, nil
	}
	var wg sync.WaitGroup
	for k := range parts {
		v0, v1 := blocks*k/parts*block, min(n, blocks*(k+1)/parts*block)
		o0 := EncodeBytes(to, v0)
		wg.Go(func() {
			C.vx_encode(C.int(from), C.int(to), unsafe.Pointer(&src[v0*es]), unsafe.Pointer(&dst[o0]), C.int64_t(v1-v0))
		})
	}
	wg.Wait()
	return out, nil
}

// DecodeFloats is EncodeWeights to float32 values: dst[i] is value i of src (little-endian
// F32, F16 or BF16 bytes), exactly as engine/ckpt decodes it.
func DecodeFloats(dst []float32, src []byte, from DType, threads int) error {
	if len(dst) == 0 {
		return nil
	}
	_, err := EncodeWeights(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src, from, F32, len(dst), threads)
	return err
}
