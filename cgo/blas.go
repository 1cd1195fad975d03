package cgo

import (
	"time"
)

// SgemmBench times OpenBLAS's sgemm called directly on C = A·Bᵀ (A [m, k], B [n, k]): the
// yardstick for the engine's matmul.
type SgemmBench struct {
	a, b, c *Buffer
	m, n, k int
	copies  int
	next    int // the copy the next call starts from
}

// NewSgemmBench allocates the matrices: copies distinct Bs, read in turn (1: one B, which
// then stays in cache).
func NewSgemmBench(m, n, k, copies int) (*SgemmBench, error) {
	s := &SgemmBench{m: m, n: n, k: k, copies: max(copies, 1)}
	var err error
	if s.a, err = Alloc(m * k * 4); err == nil {
		if s.b, err = Alloc(s.copies * n * k * 4); err == nil {
			s.c, err = Alloc(m * n * 4)
		}
	}
	if err != nil {
		s.Free()
		return nil, err
	}
	return s, nil
}

// Run makes calls separate cgo calls of perCall sgemms each, with OpenBLAS's own threading set
// to threads, and returns the mean time of one sgemm: the same calling pattern as an engine
// program of perCall matmul nodes.
func (s *SgemmBench) Run(threads, calls, perCall int) time.Duration {
	Init()
	t0 := time.Now()
	for range calls {
		benchOpenBLASSgemmCopies(threads, s.m, s.n, s.k, true, s.a, s.b, s.copies, s.next, s.c, perCall)
		s.next = (s.next + perCall) % s.copies
	}
	return time.Since(t0) / time.Duration(max(calls*perCall, 1))
}

// Free releases the matrices.
func (s *SgemmBench) Free() {
	s.a.Free()
	s.b.Free()
	s.c.Free()
}
