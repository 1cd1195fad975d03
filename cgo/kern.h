/* Helpers shared by the kernel files: argument checks, shape padding, SIMD dispatch and work
 * splitting. */
#ifndef VX_KERN_H
#define VX_KERN_H

#include "vx.h"

/* fn handles elements [lo, hi) of one row. */
typedef void (*vx_seg_fn)(void *arg, int64_t row, int64_t lo, int64_t hi);

/* vx_run_segs runs fn over `rows` rows of `len` elements on the context's threads, grouped
 * into at most 4 tasks per thread; jobs under ~32k units of work (cost = rough work per
 * element, 1 = a load and a store) stay on the calling thread. With min_part > 0, rows too few
 * to keep the threads busy are cut into parts of at least min_part elements. */
void vx_run_segs(vx_ctx *ctx, int64_t rows, int64_t len, double cost, int64_t min_part, vx_seg_fn fn, void *arg);

/* A fused epilogue (vx.h, VX_EPI_IP): up to VX_EPI_STEPS elementwise steps applied to each
 * block of a producer's output while that block is in cache. */
typedef struct {
	int n;
	int kind[VX_EPI_STEPS]; /* VX_EPI_UNARY, VX_EPI_LEFT or VX_EPI_RIGHT */
	int op[VX_EPI_STEPS];   /* vx_unary or vx_binary */
	int avx[VX_EPI_STEPS];  /* the code path the UNARY or BINARY kernel takes for it */
	float p0, p1;           /* the unary's parameters */
	const float *o[VX_EPI_STEPS];
	int64_t rs[VX_EPI_STEPS], cs[VX_EPI_STEPS]; /* operand at row m, column n: o[m*rs + n*cs] */
} vx_epi;

/* vx_epi_parse reads node's epilogue for its destination y; *n_src is then the count of the
 * producer's own sources (the operands follow them). e->n = 0: none. */
int vx_epi_parse(const vx_node *node, const vx_tensor *t, const vx_tensor *y, int *n_src, vx_epi *e);
/* vx_epi_cost is the epilogue's work per value in vx_run_segs' units (0 for none). */
double vx_epi_cost(const vx_epi *e);
/* vx_epi_apply runs the epilogue on rows [m0, m1), columns [n0, n1) of y [M, N] (e may be NULL). */
void vx_epi_apply(const vx_epi *e, float *y, int64_t N, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

/* y[M, N] = x[M, K] W^T (+ bias), then the epilogue (NULL: none), for a VX_F32_P or VX_F16_P
 * (wtype) weight W (the VX_OP_LINEAR_Q kernel for them). */
int vx_linear_f32p(vx_ctx *ctx, const float *x, const void *w, int wtype, const float *bias, float *y, int64_t M,
                   int64_t N, int64_t K, int64_t groups, const vx_epi *epi);

/* VX_X86: the x86-64 SIMD paths (AVX2/FMA, AVX-512, chosen at run time by CPU detection) are
 * compiled in. Elsewhere (arm64, ...) they are left out, vx_cpu_features stays 0 and every
 * kernel takes its portable C path, which -O3 auto-vectorises (NEON on arm64); there are no
 * hand-written NEON kernels. VX_NO_SIMD (CFLAGS) builds the portable-only code on x86 too. */
#if defined(__x86_64__) && !defined(VX_NO_SIMD)
#define VX_X86 1
#endif

/* Functions compiled for AVX2 + FMA, called only when vx_use_avx2() says the CPU has both. */
#define AVX2_FN __attribute__((target("avx2,fma")))
int vx_use_avx2(void);
/* Functions compiled for AVX-512 (F), called only when vx_use_avx512() says so. */
#define AVX512_FN __attribute__((target("avx512f,avx2,fma")))
int vx_use_avx512(void);
/* Whether AVX2 + FMA code may also convert halves (F16C): f16 caches read in registers. */
int vx_use_f16c(void);
/* One binary16 value as a float (exact). */
float vx_half_to_float(uint16_t h);

/* vx_src is source i of a node, or NULL when absent. */
const vx_tensor *vx_src(const vx_node *n, const vx_tensor *t, int i);
/* vx_tensor_ok: rank in range, sizes sane, data present when there are elements, and the
 * dtype is dtype (-1: either f32 or i32; an f16 tensor, a half-precision cache, only when
 * asked for by VX_F16). */
int vx_tensor_ok(const vx_tensor *x, int dtype);
/* vx_pad5 is the shape padded on the left with ones to 5 dims, strides 0 on the padding. */
void vx_pad5(const vx_tensor *x, int64_t sh[5], int64_t st[5]);
/* vx_same_shape compares shapes after padding to 5 dims. */
int vx_same_shape(const vx_tensor *a, const vx_tensor *b);

#endif
