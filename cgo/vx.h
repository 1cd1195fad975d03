/* voxpipe inference engine: the C side. One plan is a list of nodes over a table of tensors;
 * vx_execute runs the whole plan in one call. Tensors are float32 (or int32 for indices),
 * shapes in PyTorch order (outermost first), strides in elements. The Go side (engine/)
 * resolves every tensor's data pointer (arena offset, persistent buffer, input, output)
 * before execution; C never allocates tensor memory and never sees Go memory. */
#ifndef VX_H
#define VX_H

#include <stdint.h>

#define VX_MAX_DIMS 5
#define VX_MAX_SRC 8

/* VX_Q8_0 and VX_F16 are GGUF weight layouts, only for persistent weights read by
 * VX_OP_LINEAR_Q and VX_OP_GATHER_ROWS: Q8_0 rows are blocks of 32 values (34 bytes: a
 * binary16 scale d, then 32 int8 q; value = q*d); F16 is IEEE binary16. Strides are ignored
 * for them (always row-major). */
/* VX_Q8_0_R8 is Q8_0 repacked for the decode kernel (vx_repack_q8_0_r8): rows in groups of 8
 * (the last group zero-padded), each group a run of per-block records of 272 bytes: the 8 rows'
 * f16 scales, then for k-chunk c = 0..3 the 8 rows' quants k = 8c..8c+7 (8 bytes each), stored
 * as q+128 (unsigned). Same bytes per weight as Q8_0; one vector load feeds 8 rows. */
/* VX_Q4_K (GGUF's 256-value super-blocks) and VX_BF16 are weight layouts read like VX_F16:
 * Linear widens W panels to f32 for sgemm (their point is memory, not speed), GatherRows
 * widens the rows it picks. */
/* VX_F32_P is an F32 Linear weight [n, k] packed at load for the small-matrix kernel
 * (vx_repack_f32p, k_f32p.c): panels of VX_F32P_ROWS rows, rows zero-padded to a multiple of
 * 2 * VX_F32P_ROWS (vx_f32p_rows), panel p being k runs of its rows' values at one k. */
/* VX_F16_P is an F16 Linear weight in the same panels, each value a binary16: half the bytes,
 * widened in registers by the same tiles (the sums are those of VX_F32_P over the widened
 * values, bit for bit). */
typedef enum {
	VX_F32 = 0, VX_I32 = 1, VX_Q8_0 = 2, VX_F16 = 3, VX_Q8_0_R8 = 4, VX_Q4_K = 5, VX_BF16 = 6, VX_F32_P = 7,
	VX_F16_P = 8
} vx_dtype;
#define VX_F32P_ROWS 16

typedef struct {
	void *data;                      /* first element (already offset for views) */
	int32_t dtype;                   /* vx_dtype */
	int32_t ndim;                    /* 0..VX_MAX_DIMS */
	int64_t shape[VX_MAX_DIMS];      /* PyTorch order */
	int64_t stride[VX_MAX_DIMS];     /* elements; 0 = broadcast along that dim */
} vx_tensor;

/* Operations. The comment gives sources (by index), destination and parameters.
 * Unless a comment says "strided", sources and destination are contiguous (row-major).
 * "last" = the innermost dimension. ip = iparams, fp = fparams. */
typedef enum {
	VX_OP_NONE = 0,
	/* data movement */
	VX_OP_COPY,        /* dst = src0 (strided, same shape; stride 0 broadcasts: repeat/expand) */
	VX_OP_CONCAT,      /* dst = cat(src0..src[n-1]) along ip[0]=axis */
	VX_OP_PAD,         /* dst = pad src0 on axis ip[0] by ip[1] before, ip[2] after; ip[3] mode
	                      0 constant fp[0], 1 reflect, 2 replicate */
	VX_OP_GATHER_ROWS, /* src0 table [N, D] f32 (or q8_0/f16: rows dequantised to f32),
	                      src1 idx [M] i32 -> dst [M, D] */
	VX_OP_INTERP_LINEAR, /* src0 [..., T] -> dst [..., T'] linear along last, align_corners=false */
	/* elementwise */
	VX_OP_UNARY,       /* dst = f(src0), ip[0] = vx_unary; fp[0], fp[1] params (clamp min/max,
	                      scale: dst = fp[0]*x + fp[1]) ; dst may alias src0 */
	VX_OP_BINARY,      /* dst = src0 (op) src1, ip[0] = vx_binary; both strided with broadcast
	                      strides (0), dst contiguous with the broadcast shape; may alias src0 */
	VX_OP_SNAKE_BETA,  /* src0 x [B, C, T], src1 alpha [C], src2 beta [C] (log scale):
	                      x + 1/(exp(beta)+1e-9) * sin(x*exp(alpha))^2 */
	/* normalisation */
	VX_OP_LAYER_NORM,  /* over last; src1 weight, src2 bias optional (n_src 1..3); fp[0] eps */
	VX_OP_RMS_NORM,    /* over last; src1 weight optional; fp[0] eps */
	VX_OP_GROUP_NORM,  /* src0 [B, C, T...], ip[0] groups; src1 weight [C], src2 bias [C] optional;
	                      fp[0] eps (instance norm = groups C) */
	VX_OP_CHANNEL_AFFINE, /* src0 [B, C, T...]: dst = x*src1[c] + src2[c] (batch norm, folded) */
	VX_OP_SOFTMAX,     /* over last; src1 additive mask optional, strided/broadcast to src0;
	                      fp[0] scale applied to x before the mask (1 = none) */
	/* reductions and scans */
	VX_OP_REDUCE,      /* reduce axis ip[0] of src0, ip[1] = vx_reduce, keepdim in dst shape */
	VX_OP_CUMSUM,      /* cumulative sum along axis ip[0] */
	/* linear algebra */
	VX_OP_MATMUL,      /* src0 A [.., M, K] strided batch, src1 B [.., K, N] or, ip[0]=1,
	                      B^T given as [.., N, K]; batch dims broadcast (stride 0);
	                      src2 bias [N] optional; dst [.., M, N] */
	VX_OP_CONV1D,      /* src0 x [B, Cin, T], src1 w [Cout, Cin/g, K], src2 bias [Cout] opt;
	                      ip: 0 stride, 1 pad_left, 2 pad_right, 3 dilation, 4 groups */
	VX_OP_CONV2D,      /* src0 x [B, Cin, H, W], src1 w [Cout, Cin/g, KH, KW], src2 bias opt;
	                      ip: 0 stride_h, 1 stride_w, 2 pad_h, 3 pad_w, 4 dil_h, 5 dil_w, 6 groups */
	VX_OP_CONV_TRANSPOSE1D, /* src0 x [B, Cin, T], src1 w [Cin, Cout/g, K], src2 bias opt;
	                      ip: 0 stride, 1 padding, 2 output_padding, 3 dilation, 4 groups */
	VX_OP_ROPE,        /* src0 x [B, H, T, D], src1 positions [T] i32; ip[0] rotary dims
	                      (<= D, rest passed through), ip[1] 0 = interleaved pairs, 1 = rotate-half;
	                      fp[0] theta */
	VX_OP_ATTENTION,   /* src0 q [B, H, Tq, D], src1 k [B, Hk, Tk, D], src2 v [B, Hk, Tk, Dv]
	                      (H % Hk == 0: grouped-query), src3 additive mask [Tq, Tk] optional,
	                      src4 additive bias [H, Tq, Tk] optional (strided/broadcast);
	                      fp[0] scale; ip[0] = has mask, ip[1] = has bias; dst [B, H, Tq, Dv] */
	VX_OP_SCATTER_ROWS, /* dst table [L, N, D] (written in place, usually a persistent cache),
	                      src0 rows [L, M, D], src1 idx [M] i32: table[l, idx[i], :] = rows[l, i, :]
	                      (L may be absent: [N, D] and [M, D]); indices bounds-checked */
	VX_OP_LINEAR_Q,    /* src0 x [.., K] f32 contiguous, src1 W [N, K] q8_0, q8_0_r8 or f16, src2 bias [N]
	                      f32 optional; dst [.., N] = x W^T + bias (k_quant.c); ip[0] > 1: the rows are
                      that many equal independent groups, and the kernel is chosen by one group's
                      rows (each group's results are then those it gets alone) */
	VX_OP_COUNT
} vx_op;

/* Epilogues. A LINEAR_Q or LAYER_NORM node may carry up to VX_EPI_STEPS elementwise steps
 * that run on its output in place, block by block, before anyone reads it (the engine folds
 * single-reader UNARY/BINARY chains into their producer): ip[VX_EPI_IP] = the number of steps,
 * ip[VX_EPI_IP+1+s] = step s as kind << 8 | op, kind VX_EPI_UNARY (op a vx_unary; one such
 * step at most, its parameters in fp[2], fp[3]), VX_EPI_LEFT (y = y op src) or VX_EPI_RIGHT
 * (y = src op y), op a vx_binary. The binary steps' operands are the node's last sources, in
 * step order, each with the output's number of elements and last dim (broadcast by stride 0)
 * and its rows (leading dims flattened) one stride apart. */
#define VX_EPI_IP 4
#define VX_EPI_STEPS 3
enum { VX_EPI_UNARY = 1, VX_EPI_LEFT = 2, VX_EPI_RIGHT = 3 };

typedef enum {
	VX_U_NEG = 0, VX_U_EXP, VX_U_LOG, VX_U_SIN, VX_U_COS, VX_U_SQRT, VX_U_TANH, VX_U_SIGMOID,
	VX_U_RELU, VX_U_SILU, VX_U_GELU_ERF, VX_U_GELU_TANH, VX_U_ABS, VX_U_CLAMP, VX_U_SCALE,
	VX_U_SQUARE, VX_U_RECIP, VX_U_COUNT
} vx_unary;

typedef enum { VX_B_ADD = 0, VX_B_SUB, VX_B_MUL, VX_B_DIV, VX_B_MAX, VX_B_MIN, VX_B_COUNT } vx_binary;

typedef enum { VX_R_SUM = 0, VX_R_MEAN, VX_R_MAX, VX_R_VAR, VX_R_COUNT } vx_reduce;

typedef struct {
	int32_t op;                /* vx_op */
	int32_t n_src;
	int32_t src[VX_MAX_SRC];   /* tensor indices, -1 unused */
	int32_t dst;               /* tensor index */
	int64_t ip[8];
	float fp[4];
} vx_node;

typedef struct {
	int32_t n_nodes;
	const vx_node *nodes;
	int32_t n_tensors;
	const vx_tensor *tensors;
} vx_plan;

/* Errors: 0 ok; otherwise the failing node index is written to *failed_node. */
enum { VX_OK = 0, VX_ERR_BAD_OP = 1, VX_ERR_BAD_SHAPE = 2, VX_ERR_UNIMPLEMENTED = 3, VX_ERR_NOMEM = 4 };

/* One context per executing session: its thread count and scratch. */
typedef struct vx_ctx vx_ctx;

/* vx_init sets up the process: CPU feature detection, OpenBLAS pinned to one thread (our
 * pool owns the cores). Idempotent. Returns a bitmask of vx_cpu features. */
enum { VX_CPU_AVX2 = 1, VX_CPU_FMA = 2, VX_CPU_AVX512F = 4 };
int vx_init(void);
/* vx_force_portable(1) makes every kernel take its portable path (tests compare both). */
void vx_force_portable(int on);
/* vx_limit_cpu_features uses only the detected features in mask (tests run every SIMD level);
 * it returns the features now in use. */
int vx_limit_cpu_features(int mask);
/* vx_linear_q_vnni says whether Q8_0R8 products now run the int8 VNNI kernels at any M (it
 * needs AVX-512 BW, VL and VNNI in use). */
int vx_linear_q_vnni(void);

vx_ctx *vx_ctx_new(int n_threads);
void vx_ctx_free(vx_ctx *ctx);
int vx_ctx_threads(const vx_ctx *ctx);

int vx_execute(vx_ctx *ctx, const vx_plan *plan, int32_t *failed_node);

/* Profiling: while a context has a profile, vx_execute adds each node's wall time (ns) and
 * one call to its op's entry (NULL: off, no clock read), and to the entry of its op and
 * operand shapes (its first two sources', ndim 0 when absent) while there is room for a
 * new one. */
#define VX_PROFILE_SHAPES 512
typedef struct {
	int32_t op, ndim0, ndim1, pad;
	int64_t shape0[VX_MAX_DIMS], shape1[VX_MAX_DIMS];
	int64_t ns, calls;
} vx_profile_shape;
typedef struct {
	int64_t ns[VX_OP_COUNT];
	int64_t calls[VX_OP_COUNT];
	int32_t n_shapes;
	vx_profile_shape shapes[VX_PROFILE_SHAPES];
} vx_profile;
void vx_ctx_set_profile(vx_ctx *ctx, vx_profile *p);
vx_profile *vx_ctx_profile_of(const vx_ctx *ctx);

/* The RoPE kernel's cos/sin tables by position (k_rope.c), kept by the context between runs
 * and freed with it. */
typedef struct vx_rope_memo vx_rope_memo;
vx_rope_memo **vx_ctx_rope_memo(vx_ctx *ctx);
void vx_rope_memo_free(vx_rope_memo *m);

/* ---- internal: kernels and the thread pool (implemented across the .c files here) ---- */

/* Run fn(arg, i) for i in [0, n) on the context's threads; returns when all are done. */
typedef void (*vx_task_fn)(void *arg, int64_t i);
void vx_parallel_for(vx_ctx *ctx, int64_t n, vx_task_fn fn, void *arg);

/* Every kernel has this signature; t is the plan's tensor table. */
typedef int (*vx_kernel_fn)(vx_ctx *ctx, const vx_node *node, const vx_tensor *t);

int vx_k_copy(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_concat(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_pad(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_gather_rows(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_scatter_rows(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_interp_linear(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_unary(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_binary(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_snake_beta(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_layer_norm(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_rms_norm(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_group_norm(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_channel_affine(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_softmax(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_reduce(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_cumsum(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_matmul(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_conv1d(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_conv2d(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_conv_transpose1d(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_rope(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_attention(vx_ctx *, const vx_node *, const vx_tensor *);
int vx_k_linear_q(vx_ctx *, const vx_node *, const vx_tensor *);
/* Row bytes of a q8_0/f16 row of k values (0 if k does not fit the type's blocks). */
int64_t vx_qrow_bytes(int dtype, int64_t k);
/* Bytes of an [n, k] weight of a q8_0/f16/q8_0_r8 dtype (0 if k does not fit its blocks). */
int64_t vx_qbytes(int dtype, int64_t n, int64_t k);
/* Repacks [n, k] GGUF Q8_0 blocks (src) into the VX_Q8_0_R8 layout (dst, vx_qbytes bytes). */
void vx_repack_q8_0_r8(const void *src, void *dst, int64_t n, int64_t k);
/* VX_F32_P: rows of an [n, k] weight once padded; repacks row-major f32 src into dst
 * (vx_f32p_rows(n) * k floats); unpacks rows [r0, r0+nr) back to row-major dst [nr, k]. */
int64_t vx_f32p_rows(int64_t n);
void vx_repack_f32p(const float *src, float *dst, int64_t n, int64_t k);
void vx_unpack_f32p(const float *w, int64_t k, int64_t r0, int64_t nr, float *dst);
/* VX_F16_P: repacks row-major binary16 src (little-endian) into dst (vx_f32p_rows(n) * k halves). */
void vx_repack_f16p(const uint16_t *src, uint16_t *dst, int64_t n, int64_t k);
/* VX_OP_CONV2D with a VX_F32_P kernel [Cout, Cin, KH, KW] (no groups). */
int vx_conv2d_f32p(vx_ctx *ctx, const vx_node *node, const vx_tensor *X, const vx_tensor *Wt, const vx_tensor *bias,
                   const vx_tensor *Y);
/* VX_OP_CONV1D with a VX_F32_P kernel [Cout, Cin, K] (no groups). */
int vx_conv1d_f32p(vx_ctx *ctx, const vx_node *node, const vx_tensor *X, const vx_tensor *Wt, const vx_tensor *bias,
                   const vx_tensor *Y);
/* Products of up to this many rows run the native kernel, larger ones OpenBLAS (tunable for
 * bench gemm's comparison). */
extern int64_t vx_f32p_native_rows;
/* Dequantises one row of k values of a q8_0/f16 table into dst. */
void vx_dequant_row(int dtype, const void *src, float *dst, int64_t k);
/* Converts n values, little-endian bytes of type from (VX_F32, VX_F16, VX_BF16), to type to
 * (VX_F32, VX_F16, VX_BF16, VX_Q8_0 with n a multiple of 32) at dst, bit for bit as
 * engine/ggufpack encodes the floats engine/ckpt decodes. Returns the bytes written
 * (vx_encode_bytes), -1 for a pair it does not convert. */
int64_t vx_encode(int from, int to, const void *src, void *dst, int64_t n);
int64_t vx_encode_bytes(int to, int64_t n);

/* Shared helpers (vx_util.c). */
int64_t vx_numel(const vx_tensor *t);
int vx_is_contiguous(const vx_tensor *t);
extern int vx_cpu_features; /* set by vx_init, masked by vx_force_portable */

/* ==== Added for the thread pool and linear-algebra kernels (pool.c, k_linalg.c) ==== */

/* Index of the calling thread within its context while inside vx_parallel_for: 0 for the
 * calling thread, 1..n_threads-1 for the workers. */
int vx_thread_id(void);
/* Zeroed tensor memory, 64-byte aligned (alloc.c): buffers of 256 KiB and more are on
 * transparent huge pages where the kernel has them (their own mapping from 2 MiB, shared
 * slabs below). Release with vx_free and the same size. */
void *vx_alloc(size_t bytes);
void vx_free(void *p, size_t bytes);
/* Slabs mapped for buffers from 256 KiB to 2 MiB (tests). */
int vx_alloc_slabs(void);

/* Growable scratch memory owned by the context, 64-byte aligned, contents not preserved
 * between calls. slot 0..n_threads-1 is a thread's own (use vx_thread_id() inside tasks),
 * VX_SCRATCH_SHARED is a further buffer for the caller. Growing may reallocate, so grow a
 * slot only from the thread that owns it (grow every thread slot before vx_parallel_for).
 * Returns NULL when out of memory. */
#define VX_SCRATCH_SHARED (-1)
void *vx_scratch(vx_ctx *ctx, int slot, int64_t bytes);

/* Test and benchmark hooks (cgo/openblas.go wraps them for the Go tests). */
/* counts[i] += reps for every i in [0, n), via reps back-to-back vx_parallel_for calls. */
void vx_test_parallel_for(vx_ctx *ctx, int64_t n, int32_t *counts, int32_t reps);
/* One vx_parallel_for over n small tasks; by_thread[vx_thread_id()] counts the tasks each
 * thread ran (by_thread has vx_ctx_threads entries). */
void vx_test_parallel_threads(vx_ctx *ctx, int64_t n, int32_t *by_thread);
/* iters back-to-back vx_parallel_for calls over n empty tasks (dispatch overhead). */
void vx_bench_parallel_for(vx_ctx *ctx, int64_t n, int64_t iters);
/* The sum of p[0..n), one contiguous part per thread of ctx (membw.c: read bandwidth). */
double vx_bench_read(vx_ctx *ctx, const float *p, int64_t n);
extern int vx_attn_decode_kernel; /* 1 (default): decode attention's own kernel; 0: the GEMM path */
/* iters calls of cblas_sgemm (row-major, C = A[M,K] x B, B given as [N,K] when trans_b) with
 * OpenBLAS's own threading set to `threads`; call i reads copy (first + i) % copies of B
 * (copies of N·K floats one after another), as a model reads a distinct weight per layer;
 * OpenBLAS is set back to 1 thread afterwards. */
void vx_bench_openblas_sgemm(int threads, int64_t m, int64_t n, int64_t k, int trans_b,
                             const float *a, const float *b, int64_t copies, int64_t first, float *c,
                             int64_t iters);

#endif
