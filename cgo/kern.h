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
