package cgo

/*
#include "vx.h"
*/
import "C"

import (
	"errors"
	"time"
)

// ReadBandwidth streams a buffer of mb megabytes (filled once, so its pages are mapped) on
// threads threads, each summing its own contiguous part, and returns the best read rate of
// rounds passes in bytes per second: the rate at which a product can fetch a weight that is
// not in cache. It also returns the last pass's sum (the buffer holds ones: the sum is the
// float count), so a caller can check every value was read.
func ReadBandwidth(threads, mb, rounds int) (bytesPerSec, sum float64, err error) {
	if threads < 1 || mb < 1 || rounds < 1 {
		return 0, 0, errors.New("cgo: read bandwidth: threads, size and rounds must be ≥ 1")
	}
	buf, err := Alloc(mb << 20)
	if err != nil {
		return 0, 0, err
	}
	defer buf.Free()
	f := buf.Float32s()
	for i := range f {
		f[i] = 1
	}
	ctx, err := NewContext(threads)
	if err != nil {
		return 0, 0, err
	}
	defer ctx.Close()
	best := time.Duration(1<<63 - 1)
	for range rounds {
		t0 := time.Now()
		sum = float64(C.vx_bench_read(ctx.c, (*C.float)(buf.Ptr()), C.int64_t(len(f))))
		best = min(best, time.Since(t0))
	}
	return float64(buf.Bytes()) / best.Seconds(), sum, nil
}
