package ggufpack

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// appendQ8_0 appends src (a whole number of 32-value blocks) as Q8_0 blocks, bit for bit
// what gguf.QuantizeQ8_0 (ggml's quantize_row_q8_0_ref) writes, without its allocation and
// math.Round: half away from zero is trunc(x ± 0.5) in float64, exact for every float32
// product (|x| < 2^52), and NaN comes out as 0 either way. About twice as fast.
func appendQ8_0(dst []byte, src []float32) ([]byte, error) {
	if len(src)%32 != 0 {
		return dst, fmt.Errorf("quantize Q8_0: %d values is not a multiple of 32", len(src))
	}
	n := len(dst)
	need := len(src) / 32 * 34
	if cap(dst)-n < need {
		grown := make([]byte, n, n+need)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:n+need]
	out := dst[n:]
	for b := 0; b < len(src)/32; b++ {
		x := (*[32]float32)(src[32*b : 32*b+32])
		blk := (*[34]byte)(out[34*b : 34*b+34])
		var amax float32
		for _, v := range x {
			amax = max(amax, math.Float32frombits(math.Float32bits(v)&0x7fffffff))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		binary.LittleEndian.PutUint16(blk[:2], gguf.Float32ToHalf(d))
		for j, v := range x {
			f := float64(v * id) // rounded to float32 first, as ggml's float code does
			half := math.Float64frombits(math.Float64bits(f)&(1<<63) | math.Float64bits(0.5))
			blk[2+j] = byte(int8(int32(f + half)))
		}
	}
	return dst, nil
}

// parallelMin is the fewest values a worker of encodeParallel gets.
const parallelMin = 32 << 10

// encodeParallel is Encode(dst, src, t) with the work split over the CPUs: block types in
// runs of whole rows of row values (the encodings are row-local, so the bytes are the
// same), element types anywhere. Small inputs and single-CPU machines encode in one go.
func encodeParallel(dst []byte, src []float32, t gguf.DType, row int) ([]byte, error) {
	bs, bb := t.BlockSize(), t.BlockBytes()
	if bs <= 1 {
		row = 1
	}
	row = max(row, bs, 1)
	rows := len(src) / row
	workers := min(runtime.GOMAXPROCS(0), len(src)/parallelMin, rows)
	if workers < 2 || len(src)%row != 0 || row%bs != 0 {
		return Encode(dst, src, t)
	}
	n := len(dst)
	need := len(src) / bs * bb
	if cap(dst)-n < need {
		grown := make([]byte, n, n+need)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:n+need]
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for k := range workers {
		r0, r1 := rows*k/workers, rows*(k+1)/workers
		part := src[r0*row : r1*row]
		at := n + r0*row/bs*bb
		size := len(part) / bs * bb
		wg.Go(func() {
			// Appending to a zero-length window with exactly the room it needs writes in place.
			got, err := Encode(dst[at:at:at+size], part, t)
			if err == nil && len(got) != size {
				err = fmt.Errorf("encoding %d values to %v gave %d bytes, not %d", len(part), t, len(got), size)
			}
			errs[k] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return dst[:n], err
		}
	}
	return dst, nil
}
