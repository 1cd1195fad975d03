package cgo

// Test and benchmark hooks into the C side (pool.c, k_linalg.c). Test files cannot use cgo,
// so these thin unexported wrappers live here.

/*
#include "vx.h"
*/
import "C"

// benchOpenBLASSgemm runs iters row-major cblas_sgemm calls (C[m,n] = A[m,k] x B, B given as
// [n,k] when transB) with OpenBLAS's own threading set to threads, then pins it back to 1.
func benchOpenBLASSgemm(threads, m, n, k int, transB bool, a, b, c *Buffer, iters int) {
	benchOpenBLASSgemmCopies(threads, m, n, k, transB, a, b, 1, 0, c, iters)
}

// benchOpenBLASSgemmCopies is benchOpenBLASSgemm cycling through copies weights held one
// after another in b, from copy first on.
func benchOpenBLASSgemmCopies(threads, m, n, k int, transB bool, a, b *Buffer, copies, first int, c *Buffer, iters int) {
	Init()
	tb := 0
	if transB {
		tb = 1
	}
	C.vx_bench_openblas_sgemm(C.int(threads), C.int64_t(m), C.int64_t(n), C.int64_t(k), C.int(tb),
		(*C.float)(a.Ptr()), (*C.float)(b.Ptr()), C.int64_t(copies), C.int64_t(first), (*C.float)(c.Ptr()), C.int64_t(iters))
}

// testParallelFor adds reps to counts[i] (int32s in C memory) for every i in [0, n), through
// reps back-to-back vx_parallel_for calls on the context.
func (c *Context) testParallelFor(n int, counts *Buffer, reps int) {
	C.vx_test_parallel_for(c.c, C.int64_t(n), (*C.int32_t)(counts.Ptr()), C.int32_t(reps))
}

// testParallelThreads runs one vx_parallel_for over n small tasks and counts, in byThread
// (Threads() int32s), how many tasks each thread of the context ran.
func (c *Context) testParallelThreads(n int, byThread *Buffer) {
	C.vx_test_parallel_threads(c.c, C.int64_t(n), (*C.int32_t)(byThread.Ptr()))
}

// benchParallelFor runs iters back-to-back vx_parallel_for calls over n empty tasks.
func (c *Context) benchParallelFor(n, iters int) {
	C.vx_bench_parallel_for(c.c, C.int64_t(n), C.int64_t(iters))
}

// setAttentionDecodeKernel turns decode attention's own kernel on (the default) or off (the
// blocked-GEMM path it replaced), for a benchmark comparing the two; not safe while a plan runs.
func setAttentionDecodeKernel(on bool) {
	v := 0
	if on {
		v = 1
	}
	C.vx_attn_decode_kernel = C.int(v)
}
