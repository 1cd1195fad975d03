/* Context and thread pool. PLACEHOLDER: serial until the pool lands. */
#include <stdlib.h>
#include "vx.h"

struct vx_ctx {
	int n_threads;
};

int vx_cpu_features;
static int detected = -1;

int vx_init(void) {
	if (detected < 0) {
		detected = 0;
		__builtin_cpu_init();
		if (__builtin_cpu_supports("avx2"))
			detected |= VX_CPU_AVX2;
		if (__builtin_cpu_supports("fma"))
			detected |= VX_CPU_FMA;
		if (__builtin_cpu_supports("avx512f"))
			detected |= VX_CPU_AVX512F;
		vx_cpu_features = detected;
	}
	return detected;
}

void vx_force_portable(int on) { vx_cpu_features = on ? 0 : detected; }

vx_ctx *vx_ctx_new(int n_threads) {
	vx_ctx *c = calloc(1, sizeof *c);
	if (c)
		c->n_threads = n_threads < 1 ? 1 : n_threads;
	return c;
}

void vx_ctx_free(vx_ctx *ctx) { free(ctx); }

int vx_ctx_threads(const vx_ctx *ctx) { return ctx->n_threads; }

void vx_parallel_for(vx_ctx *ctx, int64_t n, vx_task_fn fn, void *arg) {
	(void)ctx;
	for (int64_t i = 0; i < n; i++)
		fn(arg, i);
}
