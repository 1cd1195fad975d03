/* Memory read bandwidth (`voxpipe bench gemm`): the roofline's other side. A streaming model
 * step reads every weight it multiplies once, so a product whose weight lives in DRAM takes at
 * least its bytes over this rate, however fast the kernel. */
#include <stddef.h>
#include "kern.h"

typedef struct {
	const float *p;
	int64_t n, parts;
	double *sums;
} read_job;

/* Sum of p[0..n): independent accumulators so the loads, not an add chain, set the pace. */
static double sum_portable(const float *p, int64_t n) {
	float s[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int l = 0; l < 8; l++)
			s[l] += p[i + l];
	double t = 0;
	for (; i < n; i++)
		t += p[i];
	for (int l = 0; l < 8; l++)
		t += s[l];
	return t;
}

#ifdef VX_X86
#include <immintrin.h>
static AVX512_FN double sum_avx512(const float *p, int64_t n) {
	__m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
	int64_t i = 0;
	for (; i + 64 <= n; i += 64) {
		a = _mm512_add_ps(a, _mm512_loadu_ps(p + i));
		b = _mm512_add_ps(b, _mm512_loadu_ps(p + i + 16));
		c = _mm512_add_ps(c, _mm512_loadu_ps(p + i + 32));
		d = _mm512_add_ps(d, _mm512_loadu_ps(p + i + 48));
	}
	return (double)_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d))) + sum_portable(p + i, n - i);
}
static AVX2_FN double sum_avx2(const float *p, int64_t n) {
	__m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
	int64_t i = 0;
	for (; i + 32 <= n; i += 32) {
		a = _mm256_add_ps(a, _mm256_loadu_ps(p + i));
		b = _mm256_add_ps(b, _mm256_loadu_ps(p + i + 8));
		c = _mm256_add_ps(c, _mm256_loadu_ps(p + i + 16));
		d = _mm256_add_ps(d, _mm256_loadu_ps(p + i + 24));
	}
	float t[8];
	_mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
	double s = sum_portable(p + i, n - i);
	for (int l = 0; l < 8; l++)
		s += t[l];
	return s;
}
#endif

static void read_task(void *arg, int64_t i) {
	read_job *j = arg;
	int64_t lo = j->n * i / j->parts, hi = j->n * (i + 1) / j->parts;
	double s;
#ifdef VX_X86
	if (vx_use_avx512())
		s = sum_avx512(j->p + lo, hi - lo);
	else if (vx_use_avx2())
		s = sum_avx2(j->p + lo, hi - lo);
	else
#endif
		s = sum_portable(j->p + lo, hi - lo);
	j->sums[i] = s;
}

/* One contiguous part per thread, so each streams its own pages. */
double vx_bench_read(vx_ctx *ctx, const float *p, int64_t n) {
	double sums[256]; /* a context has at most 256 threads */
	int64_t parts = vx_ctx_threads(ctx);
	read_job j = {.p = p, .n = n, .parts = parts, .sums = sums};
	vx_parallel_for(ctx, parts, read_task, &j);
	double t = 0;
	for (int64_t i = 0; i < parts; i++)
		t += sums[i];
	return t;
}
