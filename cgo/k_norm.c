/* Normalisation: LAYER_NORM, RMS_NORM, GROUP_NORM, CHANNEL_AFFINE, SOFTMAX.
 *
 * Statistics are accumulated in double, variance two-pass (mean, then mean squared deviation;
 * population variance as PyTorch's norms use); the normalised output is computed in float.
 * Optional weight/bias follow n_src (LAYER_NORM, GROUP_NORM: 1 none, 2 weight, 3 weight and
 * bias; RMS_NORM: 2 weight; CHANNEL_AFFINE: src2 shift optional). AVX2/FMA paths for layer/rms
 * norm, channel affine and softmax; the vector exp is the one described in k_elem.c. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "simd.h"

#ifndef VX_X86
/* No x86 SIMD on this target (kern.h): vx_use_avx2() is always 0, so the SIMD names are never
 * reached; they stand for the portable functions so that the dispatch below compiles as is. */
#define moments_avx2 moments_portable
#define sumsq_avx2 sumsq_portable
#define norm_apply_avx2 norm_apply_portable
#define affine_row_avx2 affine_row_portable
#define sm_pre_avx2 sm_pre_portable
#define sm_post_avx2 sm_post_portable
#endif

/* A contiguous f32 vector of exactly n elements (per-channel or per-feature parameters). */
static int param_ok(const vx_tensor *p, int64_t n) {
	return vx_tensor_ok(p, VX_F32) && vx_is_contiguous(p) && vx_numel(p) == n;
}

/* ---- vector helpers ---- */

#ifdef VX_X86
static inline AVX2_FN double hsum_pd(__m256d v) {
	__m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
	return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
#endif

/* ---- row statistics ---- */

static void moments_portable(const float *x, int64_t n, double *mean, double *var) {
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += x[i];
	double m = n ? s / (double)n : 0;
	double v = 0;
	for (int64_t i = 0; i < n; i++) {
		double d = (double)x[i] - m;
		v += d * d;
	}
	*mean = m;
	*var = n ? v / (double)n : 0;
}

#ifdef VX_X86
AVX2_FN static void moments_avx2(const float *x, int64_t n, double *mean, double *var) {
	__m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
		s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
	}
	double s = hsum_pd(_mm256_add_pd(s0, s1));
	for (; i < n; i++)
		s += x[i];
	double m = n ? s / (double)n : 0;
	__m256d vm = _mm256_set1_pd(m);
	s0 = _mm256_setzero_pd();
	s1 = _mm256_setzero_pd();
	for (i = 0; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		__m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vm);
		__m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vm);
		s0 = _mm256_fmadd_pd(d0, d0, s0);
		s1 = _mm256_fmadd_pd(d1, d1, s1);
	}
	double q = hsum_pd(_mm256_add_pd(s0, s1));
	for (; i < n; i++) {
		double d = (double)x[i] - m;
		q += d * d;
	}
	*mean = m;
	*var = n ? q / (double)n : 0;
}
#endif

static double sumsq_portable(const float *x, int64_t n) {
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	return s;
}

#ifdef VX_X86
AVX2_FN static double sumsq_avx2(const float *x, int64_t n) {
	__m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		__m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
		__m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
		s0 = _mm256_fmadd_pd(d0, d0, s0);
		s1 = _mm256_fmadd_pd(d1, d1, s1);
	}
	double s = hsum_pd(_mm256_add_pd(s0, s1));
	for (; i < n; i++)
		s += (double)x[i] * x[i];
	return s;
}
#endif

/* y = (x - m) * r * w + b; w, b may be NULL. */
static void norm_apply_portable(const float *x, float *y, int64_t n, float m, float r, const float *w,
                                const float *b) {
	for (int64_t i = 0; i < n; i++) {
		float v = (x[i] - m) * r;
		if (w)
			v *= w[i];
		if (b)
			v += b[i];
		y[i] = v;
	}
}

#ifdef VX_X86
AVX2_FN static void norm_apply_avx2(const float *x, float *y, int64_t n, float m, float r, const float *w,
                                    const float *b) {
	__m256 vm = _mm256_set1_ps(m), vr = _mm256_set1_ps(r);
	for (int64_t i = 0; i < n; i += 8) {
		__m256i mask = tail_mask(n - i);
		int full = n - i >= 8;
		__m256 v = full ? _mm256_loadu_ps(x + i) : _mm256_maskload_ps(x + i, mask);
		v = _mm256_mul_ps(_mm256_sub_ps(v, vm), vr);
		if (w && b)
			v = _mm256_fmadd_ps(v, full ? _mm256_loadu_ps(w + i) : _mm256_maskload_ps(w + i, mask),
			                    full ? _mm256_loadu_ps(b + i) : _mm256_maskload_ps(b + i, mask));
		else if (w)
			v = _mm256_mul_ps(v, full ? _mm256_loadu_ps(w + i) : _mm256_maskload_ps(w + i, mask));
		else if (b)
			v = _mm256_add_ps(v, full ? _mm256_loadu_ps(b + i) : _mm256_maskload_ps(b + i, mask));
		if (full)
			_mm256_storeu_ps(y + i, v);
		else
			_mm256_maskstore_ps(y + i, mask, v);
	}
}
#endif

/* ---- LAYER_NORM, RMS_NORM ---- */

typedef struct {
	int avx, rms;
	int64_t D;
	float eps;
	const float *x, *w, *b;
	float *y;
	const vx_epi *epi;
} ln_job;

static void ln_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const ln_job *j = arg;
	(void)lo;
	(void)hi;
	const float *x = j->x + row * j->D;
	float *y = j->y + row * j->D;
	double mean = 0, var;
	if (j->rms)
		var = (j->avx ? sumsq_avx2(x, j->D) : sumsq_portable(x, j->D)) / (double)j->D;
	else if (j->avx)
		moments_avx2(x, j->D, &mean, &var);
	else
		moments_portable(x, j->D, &mean, &var);
	float r = (float)(1.0 / sqrt(var + (double)j->eps));
	if (j->avx)
		norm_apply_avx2(x, y, j->D, (float)mean, r, j->w, j->b);
	else
		norm_apply_portable(x, y, j->D, (float)mean, r, j->w, j->b);
	vx_epi_apply(j->epi, j->y, j->D, row, row + 1, 0, j->D);
}

static int row_norm(vx_ctx *ctx, const vx_node *node, const vx_tensor *t, int rms) {
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	/* y's leading dims may group the rows differently (a fused epilogue's output) */
	if (!vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || x->ndim < 1 || y->ndim < 1 ||
	    vx_numel(x) != vx_numel(y) || x->shape[x->ndim - 1] != y->shape[y->ndim - 1] || !vx_is_contiguous(x) ||
	    !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	int64_t D = x->shape[x->ndim - 1];
	vx_epi epi;
	int n_src, rc = vx_epi_parse(node, t, y, &n_src, &epi);
	if (rc != VX_OK)
		return rc;
	const vx_tensor *w = n_src > 1 ? vx_src(node, t, 1) : NULL, *b = !rms && n_src > 2 ? vx_src(node, t, 2) : NULL;
	if (n_src > (rms ? 2 : 3) || (w && !param_ok(w, D)) || (b && !param_ok(b, D)))
		return VX_ERR_BAD_SHAPE;
	if (vx_numel(x) == 0)
		return VX_OK;
	ln_job j = {.avx = vx_use_avx2(), .rms = rms, .D = D, .eps = node->fp[0], .x = x->data,
	            .w = w ? w->data : NULL, .b = b ? b->data : NULL, .y = y->data, .epi = epi.n ? &epi : NULL};
	/* per value: the statistics and the normalisation, then the epilogue's steps */
	vx_run_segs(ctx, vx_numel(x) / D, D, 3.0 + vx_epi_cost(&epi), 0, ln_seg, &j);
	return VX_OK;
}

int vx_k_layer_norm(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) { return row_norm(ctx, node, t, 0); }

int vx_k_rms_norm(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) { return row_norm(ctx, node, t, 1); }

/* ---- GROUP_NORM ---- */

typedef struct {
	int avx;
	int64_t C, G, S; /* channels, groups, spatial size */
	float eps;
	const float *x, *w, *b;
	float *y;
	float *stat; /* [B*G][2]: mean, rstd */
} gn_job;

static void gn_stats_seg(void *arg, int64_t bg, int64_t lo, int64_t hi) {
	const gn_job *j = arg;
	(void)lo;
	(void)hi;
	int64_t n = (j->C / j->G) * j->S;
	double mean, var;
	if (j->avx)
		moments_avx2(j->x + bg * n, n, &mean, &var);
	else
		moments_portable(j->x + bg * n, n, &mean, &var);
	j->stat[2 * bg] = (float)mean;
	j->stat[2 * bg + 1] = (float)(1.0 / sqrt(var + (double)j->eps));
}

/* y = (x - m) * sc + sh */
static void affine_row_portable(const float *x, float *y, int64_t n, float m, float sc, float sh) {
	for (int64_t i = 0; i < n; i++)
		y[i] = (x[i] - m) * sc + sh;
}

#ifdef VX_X86
AVX2_FN static void affine_row_avx2(const float *x, float *y, int64_t n, float m, float sc, float sh) {
	__m256 vm = _mm256_set1_ps(m), a = _mm256_set1_ps(sc), b = _mm256_set1_ps(sh);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), a, b));
	for (; i < n; i++)
		y[i] = (x[i] - m) * sc + sh;
}
#endif

static void gn_apply_seg(void *arg, int64_t bc, int64_t lo, int64_t hi) {
	const gn_job *j = arg;
	int64_t c = bc % j->C, bg = (bc / j->C) * j->G + c / (j->C / j->G);
	float m = j->stat[2 * bg], r = j->stat[2 * bg + 1];
	float sc = r * (j->w ? j->w[c] : 1.0f);
	float sh = j->b ? j->b[c] : 0.0f;
	const float *x = j->x + bc * j->S + lo;
	float *y = j->y + bc * j->S + lo;
	if (j->avx)
		affine_row_avx2(x, y, hi - lo, m, sc, sh);
	else
		affine_row_portable(x, y, hi - lo, m, sc, sh);
}

int vx_k_group_norm(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	if (!vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || x->ndim < 2 || !vx_same_shape(x, y) ||
	    !vx_is_contiguous(x) || !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	int64_t B = x->shape[0], C = x->shape[1], G = node->ip[0];
	if (G <= 0 || C % G != 0)
		return VX_ERR_BAD_SHAPE;
	const vx_tensor *w = vx_src(node, t, 1), *b = vx_src(node, t, 2);
	if (node->n_src > 3 || (w && !param_ok(w, C)) || (b && !param_ok(b, C)))
		return VX_ERR_BAD_SHAPE;
	int64_t n = vx_numel(x);
	if (n == 0)
		return VX_OK;
	gn_job j = {.avx = vx_use_avx2(), .C = C, .G = G, .S = n / (B * C), .eps = node->fp[0], .x = x->data,
	            .w = w ? w->data : NULL, .b = b ? b->data : NULL, .y = y->data};
	j.stat = malloc((size_t)(B * G) * 2 * sizeof(float));
	if (!j.stat)
		return VX_ERR_NOMEM;
	vx_run_segs(ctx, B * G, (C / G) * j.S, 2.0, 0, gn_stats_seg, &j);
	/* y = (x - mean) * (rstd w) + b, per channel */
	vx_run_segs(ctx, B * C, j.S, 1.0, 2048, gn_apply_seg, &j);
	free(j.stat);
	return VX_OK;
}

/* ---- CHANNEL_AFFINE ---- */

typedef struct {
	int avx;
	int64_t C, S;
	const float *x, *sc, *sh;
	float *y;
} ca_job;

static void ca_seg(void *arg, int64_t bc, int64_t lo, int64_t hi) {
	const ca_job *j = arg;
	int64_t c = bc % j->C;
	float sc = j->sc[c], sh = j->sh ? j->sh[c] : 0.0f;
	if (j->avx)
		affine_row_avx2(j->x + bc * j->S + lo, j->y + bc * j->S + lo, hi - lo, 0.0f, sc, sh);
	else
		affine_row_portable(j->x + bc * j->S + lo, j->y + bc * j->S + lo, hi - lo, 0.0f, sc, sh);
}

int vx_k_channel_affine(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	if (!vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || x->ndim < 2 || !vx_same_shape(x, y) ||
	    !vx_is_contiguous(x) || !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	int64_t B = x->shape[0], C = x->shape[1];
	const vx_tensor *sc = vx_src(node, t, 1), *sh = vx_src(node, t, 2);
	if (node->n_src > 3 || !sc || !param_ok(sc, C) || (sh && !param_ok(sh, C)))
		return VX_ERR_BAD_SHAPE;
	int64_t n = vx_numel(x);
	if (n == 0)
		return VX_OK;
	ca_job j = {.avx = vx_use_avx2(), .C = C, .S = n / (B * C), .x = x->data, .sc = sc->data,
	            .sh = sh ? sh->data : NULL, .y = y->data};
	vx_run_segs(ctx, B * C, j.S, 1.0, 2048, ca_seg, &j);
	return VX_OK;
}

/* ---- SOFTMAX ---- */

typedef struct {
	int avx, nd;
	int64_t N;
	int64_t shape[5];  /* x shape, 5-d */
	int64_t mst[5];    /* mask strides broadcast to x (0 where broadcast) */
	float scale;
	const float *x, *mask;
	float *y;
} sm_job;

/* y = x*scale (+ mask), returns the max. mask stride ms (any). */
static float sm_pre_portable(const float *x, const float *m, int64_t ms, float *y, int64_t n, float scale) {
	float mx = -INFINITY;
	for (int64_t i = 0; i < n; i++) {
		float v = x[i] * scale;
		if (m)
			v += m[i * ms];
		y[i] = v;
		if (v > mx)
			mx = v;
	}
	return mx;
}

static void sm_post_portable(float *y, int64_t n, float mx) {
	double s = 0;
	for (int64_t i = 0; i < n; i++) {
		float e = expf(y[i] - mx);
		y[i] = e;
		s += e;
	}
	float inv = (float)(1.0 / s);
	for (int64_t i = 0; i < n; i++)
		y[i] *= inv;
}

#ifdef VX_X86
AVX2_FN static float sm_pre_avx2(const float *x, const float *m, int64_t ms, float *y, int64_t n, float scale) {
	if (m && ms != 0 && ms != 1)
		return sm_pre_portable(x, m, ms, y, n, scale);
	__m256 vs = _mm256_set1_ps(scale), vmx = _mm256_set1_ps(-INFINITY);
	__m256 vm0 = _mm256_set1_ps(m ? m[0] : 0.0f);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
		if (m)
			v = _mm256_add_ps(v, ms ? _mm256_loadu_ps(m + i) : vm0);
		_mm256_storeu_ps(y + i, v);
		vmx = _mm256_max_ps(vmx, v);
	}
	float t[8];
	_mm256_storeu_ps(t, vmx);
	float mx = -INFINITY;
	for (int k = 0; k < 8; k++)
		if (t[k] > mx)
			mx = t[k];
	for (; i < n; i++) {
		float v = x[i] * scale;
		if (m)
			v += m[i * ms];
		y[i] = v;
		if (v > mx)
			mx = v;
	}
	return mx;
}
#endif

#ifdef VX_X86
AVX2_FN static void sm_post_avx2(float *y, int64_t n, float mx) {
	__m256 vmx = _mm256_set1_ps(mx), s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	__m256d acc = _mm256_setzero_pd(); /* float lane sums flushed every 1024 elements */
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m256 e0 = v_exp(_mm256_sub_ps(_mm256_loadu_ps(y + i), vmx));
		__m256 e1 = v_exp(_mm256_sub_ps(_mm256_loadu_ps(y + i + 8), vmx));
		_mm256_storeu_ps(y + i, e0);
		_mm256_storeu_ps(y + i + 8, e1);
		s0 = _mm256_add_ps(s0, e0);
		s1 = _mm256_add_ps(s1, e1);
		if ((i & 1023) == 1008) {
			__m256 s = _mm256_add_ps(s0, s1);
			acc = _mm256_add_pd(acc, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(s)),
			                                       _mm256_cvtps_pd(_mm256_extractf128_ps(s, 1))));
			s0 = s1 = _mm256_setzero_ps();
		}
	}
	for (; i < n; i += 8) {
		__m256i mask = tail_mask(n - i);
		__m256 e = v_exp(_mm256_sub_ps(_mm256_maskload_ps(y + i, mask), vmx));
		e = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
		_mm256_maskstore_ps(y + i, mask, e);
		s0 = _mm256_add_ps(s0, e);
	}
	__m256 s = _mm256_add_ps(s0, s1);
	__m256d sd = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(s)), _mm256_cvtps_pd(_mm256_extractf128_ps(s, 1)));
	sd = _mm256_add_pd(sd, acc);
	__m256 inv = _mm256_set1_ps((float)(1.0 / hsum_pd(sd)));
	for (i = 0; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), inv));
	if (i < n) {
		__m256i mask = tail_mask(n - i);
		_mm256_maskstore_ps(y + i, mask, _mm256_mul_ps(_mm256_maskload_ps(y + i, mask), inv));
	}
}
#endif

static void sm_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const sm_job *j = arg;
	(void)lo;
	(void)hi;
	const float *x = j->x + row * j->N;
	float *y = j->y + row * j->N;
	const float *m = NULL;
	if (j->mask) {
		int64_t off = 0, r = row;
		for (int k = 3; k >= 0; k--) {
			off += (r % j->shape[k]) * j->mst[k];
			r /= j->shape[k];
		}
		m = j->mask + off;
	}
	float mx = j->avx ? sm_pre_avx2(x, m, j->mst[4], y, j->N, j->scale)
	                  : sm_pre_portable(x, m, j->mst[4], y, j->N, j->scale);
	if (mx == -INFINITY) { /* every entry masked out: zeros rather than NaN */
		memset(y, 0, (size_t)j->N * sizeof(float));
		return;
	}
	if (j->avx)
		sm_post_avx2(y, j->N, mx);
	else
		sm_post_portable(y, j->N, mx);
}

/* fp[0] = 0 is taken as 1 (no scaling): a zero scale is never meant and is the default of an
 * unset parameter. */
int vx_k_softmax(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst], *m = vx_src(node, t, 1);
	if (node->n_src > 2 || !vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || x->ndim < 1 || !vx_same_shape(x, y) ||
	    !vx_is_contiguous(x) || !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	sm_job j = {.avx = vx_use_avx2(), .N = x->shape[x->ndim - 1], .scale = node->fp[0] == 0 ? 1.0f : node->fp[0],
	            .x = x->data, .y = y->data};
	int64_t st[5];
	vx_pad5(x, j.shape, st);
	if (m) {
		int64_t msh[5];
		if (!vx_tensor_ok(m, VX_F32) || m->ndim > x->ndim)
			return VX_ERR_BAD_SHAPE;
		vx_pad5(m, msh, j.mst);
		for (int i = 0; i < 5; i++) {
			if (msh[i] == 1)
				j.mst[i] = 0;
			else if (msh[i] != j.shape[i])
				return VX_ERR_BAD_SHAPE;
		}
		j.mask = m->data;
	}
	int64_t n = vx_numel(x);
	if (n == 0)
		return VX_OK;
	vx_run_segs(ctx, n / j.N, j.N, 6.0, 0, sm_seg, &j);
	return VX_OK;
}
