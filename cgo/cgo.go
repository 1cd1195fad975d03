// Package cgo is the CPU engine's C: the inference engine's kernels, thread pool and plan
// executor (vx.h), with a thin Go wrapper. Plans, tensor tables and tensor memory live in C
// memory, so one Execute is one cgo call and C never holds a Go pointer.
package cgo

/*
#cgo CFLAGS: -std=c11 -O3 -Wall -Wno-unused-function
#cgo LDFLAGS: -lopenblas -lm -lpthread
#include <stdlib.h>
#include <string.h>
#include "vx.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// Limits of the C side.
const (
	MaxDims = C.VX_MAX_DIMS
	MaxSrc  = C.VX_MAX_SRC
)

// DType is a tensor element type.
type DType int32

// Element types.
const (
	F32 DType = C.VX_F32
	I32 DType = C.VX_I32
	// Q8_0 and F16 are GGUF weight encodings (see vx.h), read only by OpLinearQ and
	// OpGatherRows.
	Q8_0 DType = C.VX_Q8_0
	F16  DType = C.VX_F16
	// Q8_0R8 is Q8_0 repacked with rows interleaved by 8 (RepackQ8_0R8), the layout the
	// decode kernel reads fastest; only OpLinearQ takes it.
	Q8_0R8 DType = C.VX_Q8_0_R8
	// Q4_K and BF16 are GGUF weight encodings kept for their size: Linear widens panels of
	// them to f32, GatherRows the rows it picks.
	Q4_K DType = C.VX_Q4_K
	BF16 DType = C.VX_BF16
	// F32P is an F32 Linear weight packed at load (RepackF32P) into the panels the
	// small-matrix kernel streams; only OpLinearQ takes it.
	F32P DType = C.VX_F32_P
	// F16P is an F16 Linear weight in the same panels (RepackF16P), widened by the same
	// tiles; only OpLinearQ takes it.
	F16P DType = C.VX_F16_P
)

// WeightBytes is the size of an [n, k] weight of type d (0 when k does not fit d's blocks).
func WeightBytes(d DType, n, k int64) int64 {
	switch d {
	case Q8_0, F16, Q8_0R8, Q4_K, BF16, F32P, F16P:
		return int64(C.vx_qbytes(C.int(d), C.int64_t(n), C.int64_t(k)))
	}
	return n * RowBytes(d, k)
}

// RepackQ8_0R8 writes [n, k] GGUF Q8_0 blocks (src) in the Q8_0R8 layout to dst, which must
// hold WeightBytes(Q8_0R8, n, k) bytes.
func RepackQ8_0R8(dst []byte, src []byte, n, k int64) error {
	if len(src) == 0 || int64(len(src)) != WeightBytes(Q8_0, n, k) || int64(len(dst)) != WeightBytes(Q8_0R8, n, k) {
		return fmt.Errorf("cgo: repack Q8_0 [%d, %d]: %d bytes in, %d out", n, k, len(src), len(dst))
	}
	C.vx_repack_q8_0_r8(unsafe.Pointer(&src[0]), unsafe.Pointer(&dst[0]), C.int64_t(n), C.int64_t(k))
	return nil
}

// F32PRows is the rows of one F32P panel; F32P weights are padded to twice that.
const F32PRows = C.VX_F32P_ROWS

// RepackF32P writes an [n, k] row-major F32 weight (src, little-endian bytes) in the F32P
// layout to dst, which must hold WeightBytes(F32P, n, k) bytes (the kernel reads it from a
// 64-byte aligned buffer).
func RepackF32P(dst []byte, src []byte, n, k int64) error {
	if n <= 0 || k <= 0 || int64(len(src)) != 4*n*k || int64(len(dst)) != WeightBytes(F32P, n, k) {
		return fmt.Errorf("cgo: repack F32 [%d, %d] into panels: %d bytes in, %d out", n, k, len(src), len(dst))
	}
	// src may be Go memory: C reads it during the call only.
	C.vx_repack_f32p((*C.float)(unsafe.Pointer(&src[0])), (*C.float)(unsafe.Pointer(&dst[0])), C.int64_t(n), C.int64_t(k))
	return nil
}

// RepackF16P writes an [n, k] row-major F16 weight (src, little-endian halves) in the F16P
// layout to dst, which must hold WeightBytes(F16P, n, k) bytes (read from a 64-byte aligned
// buffer).
func RepackF16P(dst []byte, src []byte, n, k int64) error {
	if n <= 0 || k <= 0 || int64(len(src)) != 2*n*k || int64(len(dst)) != WeightBytes(F16P, n, k) {
		return fmt.Errorf("cgo: repack F16 [%d, %d] into panels: %d bytes in, %d out", n, k, len(src), len(dst))
	}
	C.vx_repack_f16p((*C.uint16_t)(unsafe.Pointer(&src[0])), (*C.uint16_t)(unsafe.Pointer(&dst[0])), C.int64_t(n), C.int64_t(k))
	return nil
}

// UnpackF32P returns rows [r0, r0+nr) of an F32P weight of k columns as row-major floats.
func UnpackF32P(w []byte, k, r0, nr int64) []float32 {
	out := make([]float32, nr*k)
	if nr > 0 && k > 0 {
		C.vx_unpack_f32p((*C.float)(unsafe.Pointer(&w[0])), C.int64_t(k), C.int64_t(r0), C.int64_t(nr), (*C.float)(unsafe.Pointer(&out[0])))
	}
	return out
}

// SetF32PNativeRows sets the row count up to which F32P products run the native kernel
// (larger ones widen W back to row-major for OpenBLAS) and returns the previous value; for benchmarks
// and tests that compare the two.
func SetF32PNativeRows(rows int64) int64 {
	old := int64(C.vx_f32p_native_rows)
	C.vx_f32p_native_rows = C.int64_t(rows)
	return old
}

// RowBytes is the size of one row of k values of type d (0 when k does not fit d's blocks).
func RowBytes(d DType, k int64) int64 {
	switch d {
	case F32, I32:
		return 4 * k
	case Q8_0, F16, Q4_K, BF16:
		return int64(C.vx_qrow_bytes(C.int(d), C.int64_t(k)))
	}
	return 0
}

// Op is a kernel (see vx.h for each one's sources and parameters).
type Op int32

// Operations.
const (
	OpCopy            Op = C.VX_OP_COPY
	OpConcat          Op = C.VX_OP_CONCAT
	OpPad             Op = C.VX_OP_PAD
	OpGatherRows      Op = C.VX_OP_GATHER_ROWS
	OpInterpLinear    Op = C.VX_OP_INTERP_LINEAR
	OpUnary           Op = C.VX_OP_UNARY
	OpBinary          Op = C.VX_OP_BINARY
	OpSnakeBeta       Op = C.VX_OP_SNAKE_BETA
	OpLayerNorm       Op = C.VX_OP_LAYER_NORM
	OpRMSNorm         Op = C.VX_OP_RMS_NORM
	OpGroupNorm       Op = C.VX_OP_GROUP_NORM
	OpChannelAffine   Op = C.VX_OP_CHANNEL_AFFINE
	OpSoftmax         Op = C.VX_OP_SOFTMAX
	OpReduce          Op = C.VX_OP_REDUCE
	OpCumsum          Op = C.VX_OP_CUMSUM
	OpMatmul          Op = C.VX_OP_MATMUL
	OpConv1D          Op = C.VX_OP_CONV1D
	OpConv2D          Op = C.VX_OP_CONV2D
	OpConvTranspose1D Op = C.VX_OP_CONV_TRANSPOSE1D
	OpRoPE            Op = C.VX_OP_ROPE
	OpAttention       Op = C.VX_OP_ATTENTION
	OpScatterRows     Op = C.VX_OP_SCATTER_ROWS
	OpLinearQ         Op = C.VX_OP_LINEAR_Q
)

// Unary functions for OpUnary (ip[0]).
const (
	UNeg = iota
	UExp
	ULog
	USin
	UCos
	USqrt
	UTanh
	USigmoid
	UReLU
	USiLU
	UGELUErf
	UGELUTanh
	UAbs
	UClamp
	UScale
	USquare
	URecip
)

// Binary functions for OpBinary (ip[0]).
const (
	BAdd = iota
	BSub
	BMul
	BDiv
	BMax
	BMin
)

// Epilogues of OpLinearQ and OpLayerNorm (vx.h): IP[EpiIP] steps, step s in IP[EpiIP+1+s]
// as kind<<8 | function, the binary steps' operands the node's last sources.
const (
	EpiIP    = C.VX_EPI_IP
	EpiSteps = C.VX_EPI_STEPS
	EpiUnary = C.VX_EPI_UNARY // y = f(y), f's parameters in FP[2], FP[3]
	EpiLeft  = C.VX_EPI_LEFT  // y = y op operand
	EpiRight = C.VX_EPI_RIGHT // y = operand op y
)

// Reductions for OpReduce (ip[1]).
const (
	RSum = iota
	RMean
	RMax
	RVar
)

// CPU features.
const (
	CPUAVX2    = C.VX_CPU_AVX2
	CPUFMA     = C.VX_CPU_FMA
	CPUAVX512F = C.VX_CPU_AVX512F
)

var initOnce sync.Once
var features int

// Init detects the CPU and pins OpenBLAS to one thread (the engine's pool owns the cores).
// It returns the CPU feature mask. Safe to call many times.
func Init() int {
	initOnce.Do(func() { features = int(C.vx_init()) })
	return features
}

// ForcePortable makes every kernel take its portable (non-SIMD) path; for tests.
func ForcePortable(on bool) {
	Init()
	v := 0
	if on {
		v = 1
	}
	C.vx_force_portable(C.int(v))
}

// LimitCPUFeatures makes kernels use only the detected features in mask (e.g. CPUAVX2|CPUFMA
// to test the AVX2 paths on an AVX-512 machine) and returns the features in use. Init's mask
// restores everything.
func LimitCPUFeatures(mask int) int {
	Init()
	return int(C.vx_limit_cpu_features(C.int(mask)))
}

// LinearQVNNI says whether Q8_0R8 products now run the int8 VNNI kernels, which take any
// number of rows without widening W (under the features LimitCPUFeatures left in use).
func LinearQVNNI() bool { return C.vx_linear_q_vnni() != 0 }

// Buffer is tensor memory allocated in C (64-byte aligned), so plans can point at it.
type Buffer struct {
	ptr   unsafe.Pointer
	bytes int
}

// Alloc returns a zeroed buffer of n bytes.
func Alloc(n int) (*Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("cgo: alloc %d bytes", n)
	}
	p := C.vx_alloc(C.size_t(n))
	if p == nil {
		return nil, fmt.Errorf("cgo: out of memory allocating %d bytes", n)
	}
	return &Buffer{ptr: p, bytes: n}, nil
}

// allocSlabs is how many slabs hold buffers from 256 KiB to 2 MiB (tests).
func allocSlabs() int { return int(C.vx_alloc_slabs()) }

// Free releases the buffer; it must not be used afterwards.
func (b *Buffer) Free() {
	if b != nil && b.ptr != nil {
		C.vx_free(b.ptr, C.size_t(b.bytes))
		b.ptr = nil
	}
}

// Bytes is the buffer's size.
func (b *Buffer) Bytes() int { return b.bytes }

// Ptr is the start of the buffer.
func (b *Buffer) Ptr() unsafe.Pointer { return b.ptr }

// Float32s views the buffer as float32s (valid until Free).
func (b *Buffer) Float32s() []float32 { return unsafe.Slice((*float32)(b.ptr), b.bytes/4) }

// Int32s views the buffer as int32s (valid until Free).
func (b *Buffer) Int32s() []int32 { return unsafe.Slice((*int32)(b.ptr), b.bytes/4) }

// Tensor describes one tensor of a plan: its memory (pointer + element offset), type, shape
// and strides in elements (0 broadcasts).
type Tensor struct {
	Data   unsafe.Pointer
	DType  DType
	Shape  []int64
	Stride []int64
}

// Contiguous returns row-major strides for shape.
func Contiguous(shape []int64) []int64 {
	st := make([]int64, len(shape))
	s := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = s
		s *= shape[i]
	}
	return st
}

// Node is one kernel call of a plan.
type Node struct {
	Op  Op
	Src []int // tensor indices
	Dst int
	IP  [8]int64
	FP  [4]float32
}

// Plan is a compiled node list and tensor table in C memory.
type Plan struct {
	nodes    *C.vx_node
	tensors  *C.vx_tensor
	nNodes   int
	nTensors int
	plan     *C.vx_plan
	ran      time.Duration // the last Execute's time, not counting the wait for the context
}

// LastRun is how long the plan's last Execute computed, after it had the context.
func (p *Plan) LastRun() time.Duration { return p.ran }

// NewPlan copies nodes and tensors into C memory.
func NewPlan(nodes []Node, tensors []Tensor) (*Plan, error) {
	p := &Plan{nNodes: len(nodes), nTensors: len(tensors)}
	p.nodes = (*C.vx_node)(C.calloc(C.size_t(max(len(nodes), 1)), C.size_t(unsafe.Sizeof(C.vx_node{}))))
	p.tensors = (*C.vx_tensor)(C.calloc(C.size_t(max(len(tensors), 1)), C.size_t(unsafe.Sizeof(C.vx_tensor{}))))
	p.plan = (*C.vx_plan)(C.calloc(1, C.size_t(unsafe.Sizeof(C.vx_plan{}))))
	if p.nodes == nil || p.tensors == nil || p.plan == nil {
		p.Free()
		return nil, errors.New("cgo: out of memory for a plan")
	}
	cn := unsafe.Slice(p.nodes, max(len(nodes), 1))
	for i, n := range nodes {
		if len(n.Src) > MaxSrc {
			p.Free()
			return nil, fmt.Errorf("cgo: node %d has %d sources (max %d)", i, len(n.Src), MaxSrc)
		}
		c := &cn[i]
		c.op = C.int32_t(n.Op)
		c.n_src = C.int32_t(len(n.Src))
		for j := range MaxSrc {
			c.src[j] = -1
			if j < len(n.Src) {
				if n.Src[j] < 0 || n.Src[j] >= len(tensors) {
					p.Free()
					return nil, fmt.Errorf("cgo: node %d source %d out of range", i, n.Src[j])
				}
				c.src[j] = C.int32_t(n.Src[j])
			}
		}
		if n.Dst < 0 || n.Dst >= len(tensors) {
			p.Free()
			return nil, fmt.Errorf("cgo: node %d destination %d out of range", i, n.Dst)
		}
		c.dst = C.int32_t(n.Dst)
		for j, v := range n.IP {
			c.ip[j] = C.int64_t(v)
		}
		for j, v := range n.FP {
			c.fp[j] = C.float(v)
		}
	}
	for i, t := range tensors {
		if err := p.SetTensor(i, t); err != nil {
			p.Free()
			return nil, err
		}
	}
	p.plan.n_nodes = C.int32_t(len(nodes))
	p.plan.nodes = p.nodes
	p.plan.n_tensors = C.int32_t(len(tensors))
	p.plan.tensors = p.tensors
	return p, nil
}

// SetTensor replaces tensor i's description (e.g. to point an input at new memory).
func (p *Plan) SetTensor(i int, t Tensor) error {
	if i < 0 || i >= p.nTensors {
		return fmt.Errorf("cgo: tensor %d out of range", i)
	}
	if len(t.Shape) > MaxDims || len(t.Stride) != len(t.Shape) {
		return fmt.Errorf("cgo: tensor %d: %d dims with %d strides (max %d dims)", i, len(t.Shape), len(t.Stride), MaxDims)
	}
	c := &unsafe.Slice(p.tensors, p.nTensors)[i]
	c.data = t.Data
	c.dtype = C.int32_t(t.DType)
	c.ndim = C.int32_t(len(t.Shape))
	for j := range MaxDims {
		c.shape[j], c.stride[j] = 1, 0
		if j < len(t.Shape) {
			c.shape[j], c.stride[j] = C.int64_t(t.Shape[j]), C.int64_t(t.Stride[j])
		}
	}
	return nil
}

// Free releases the plan's C memory.
func (p *Plan) Free() {
	for _, q := range []unsafe.Pointer{unsafe.Pointer(p.nodes), unsafe.Pointer(p.tensors), unsafe.Pointer(p.plan)} {
		if q != nil {
			C.free(q)
		}
	}
	p.nodes, p.tensors, p.plan = nil, nil, nil
}

// Context runs plans on its own threads.
type Context struct {
	c *C.vx_ctx
	// mu makes Execute safe from several goroutines: a context's thread pool and scratch
	// serve one plan at a time, so concurrent callers take turns (each run already uses
	// every thread of the context).
	mu      sync.Mutex
	failed  C.int32_t     // the failing node of the last run (a field, so calls do not allocate)
	profile *C.vx_profile // StartProfile's, until StopProfile
}

// NewContext returns a context with n threads (the calling thread included).
func NewContext(threads int) (*Context, error) {
	Init()
	c := C.vx_ctx_new(C.int(threads))
	if c == nil {
		return nil, errors.New("cgo: cannot create an execution context")
	}
	return &Context{c: c}, nil
}

// Threads is the context's thread count.
func (c *Context) Threads() int { return int(C.vx_ctx_threads(c.c)) }

// Close stops the context's threads.
func (c *Context) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		C.vx_ctx_free(c.c)
		c.c = nil
	}
	if c.profile != nil {
		C.free(unsafe.Pointer(c.profile))
		c.profile = nil
	}
}

// ExecError is a kernel failure, naming the node.
type ExecError struct {
	Node int
	Code int
}

func (e *ExecError) Error() string {
	what := map[int]string{C.VX_ERR_BAD_OP: "unknown op", C.VX_ERR_BAD_SHAPE: "bad shape",
		C.VX_ERR_UNIMPLEMENTED: "not implemented", C.VX_ERR_NOMEM: "out of memory"}[e.Code]
	return fmt.Sprintf("cgo: node %d: %s (code %d)", e.Node, what, e.Code)
}

// OpTime is the time a context's runs spent in one op while it was profiled.
type OpTime struct {
	Op    Op
	Calls int64
	Time  time.Duration
}

// ShapeTime is the time a profiled context spent in one op with given operand shapes (its
// first two sources; nil when absent).
type ShapeTime struct {
	Op       Op
	In0, In1 []int64
	Calls    int64
	Time     time.Duration
}

// StartProfile makes the following runs time every node (a clock read around each; off, no
// cost). StopProfile ends it and returns the time per op, most first; StopProfileShapes
// also the time per op and operand shapes (the first 512 distinct ones), most first.
func (c *Context) StartProfile() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil || c.profile != nil {
		return
	}
	c.profile = (*C.vx_profile)(C.calloc(1, C.sizeof_vx_profile))
	C.vx_ctx_set_profile(c.c, c.profile)
}

// StopProfile: see StartProfile (nil when no profile ran).
func (c *Context) StopProfile() []OpTime {
	ops, _ := c.StopProfileShapes()
	return ops
}

// StopProfileShapes: see StartProfile (nil when no profile ran).
func (c *Context) StopProfileShapes() ([]OpTime, []ShapeTime) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.profile == nil {
		return nil, nil
	}
	if c.c != nil {
		C.vx_ctx_set_profile(c.c, nil)
	}
	var out []OpTime
	for op := range int(C.VX_OP_COUNT) {
		if n := int64(c.profile.calls[op]); n > 0 {
			out = append(out, OpTime{Op: Op(op), Calls: n, Time: time.Duration(c.profile.ns[op])})
		}
	}
	var shapes []ShapeTime
	for i := range int(c.profile.n_shapes) {
		e := &c.profile.shapes[i]
		st := ShapeTime{Op: Op(e.op), Calls: int64(e.calls), Time: time.Duration(e.ns)}
		for d := range int(e.ndim0) {
			st.In0 = append(st.In0, int64(e.shape0[d]))
		}
		for d := range int(e.ndim1) {
			st.In1 = append(st.In1, int64(e.shape1[d]))
		}
		shapes = append(shapes, st)
	}
	C.free(unsafe.Pointer(c.profile))
	c.profile = nil
	slices.SortFunc(out, func(a, b OpTime) int { return int(b.Time - a.Time) })
	slices.SortFunc(shapes, func(a, b ShapeTime) int { return int(b.Time - a.Time) })
	return out, shapes
}

// Execute runs the whole plan in one call.
func (c *Context) Execute(p *Plan) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		return errors.New("cgo: execute on a closed context")
	}
	t0 := time.Now()
	rc := C.vx_execute(c.c, p.plan, &c.failed)
	p.ran = time.Since(t0)
	if rc != C.VX_OK {
		return &ExecError{Node: int(c.failed), Code: int(rc)}
	}
	return nil
}
