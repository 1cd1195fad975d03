/* Elementwise kernels: UNARY, BINARY (N-d broadcasting), SNAKE_BETA.
 *
 * Every kernel has a portable C path and, when vx_cpu_features has AVX2 and FMA, an AVX2/FMA
 * path (functions compiled with a target attribute, chosen at run time); BINARY and the
 * activations (GELU, SiLU, sigmoid) also have an AVX-512 one. The vector
 * transcendental functions here are our own:
 *   exp:   range reduction x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor for e^r, 2^n applied
 *          in two halves so overflow gives inf and underflow gives (denormal) 0; < 3 ulp.
 *   tanh:  -expm1(-2|x|) / (2 + expm1(-2|x|)) with expm1 from the same reduction (no
 *          cancellation near 0); relative error < 3.5 ulp (measured 1.9e-7).
 *   sigmoid: from e = exp(-|x|), never overflowing: 1/(1+e) or e/(1+e); SiLU = x sigmoid(x),
 *          GELU(tanh) = x sigmoid(2u) (no 1 + tanh cancellation); < 4 ulp, plus for GELU(tanh)
 *          the float rounding of u itself (~1.5e-7 |2u| relative, as in any float evaluation).
 *   erfc:  |z| < 1: 1 - z P(z^2) (Taylor to z^21); |z| >= 1: exp(-z^2) / (z sqrt(pi)) k(1/z)
 *          with k a degree-12 Chebyshev fit (fitted by us against float64 math.Erfc, relative
 *          error 8e-8 in float); z^2 is carried as a double-float pair. GELU(erf) relative
 *          error < 1e-6 wherever |GELU(x)| > 1e-30 (measured 7.6e-7). The portable path
 *          uses double erfc.
 *   sin^2: reduction by pi in three parts (sin^2 has period pi), degree-13 Taylor; lanes with
 *          |a x| > 1e5 take libm sinf.
 * Work is split over the context's threads with vx_parallel_for. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "simd.h"

#ifndef VX_X86
/* No x86 SIMD on this target (kern.h): vx_use_avx2() is always 0, so the SIMD names are never
 * reached; they stand for the portable functions so that the dispatch below compiles as is. */
#define unary_avx2 unary_portable
#define act_avx512(f, s, d, n) ((void)0)
#define bin_avx2 bin_portable
#define bin_avx512 bin_portable
#define snake_row_avx2 snake_row_portable
#endif

#define SQRT_2_OVER_PI 0.79788456080286536f

#ifdef VX_X86
/* ---- vector math (AVX2 + FMA) ---- */

static inline AVX2_FN __m256 v_abs(__m256 x) {
	return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

static inline AVX2_FN __m256 v_tanh(__m256 x) {
	__m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
	__m256 y = _mm256_max_ps(_mm256_mul_ps(v_abs(x), _mm256_set1_ps(-2.0f)), _mm256_set1_ps(-40.0f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(LOG2E)),
	                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), y);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
	__m256 q = v_expm1_poly(r);
	__m256 s = _mm256_castsi256_ps(
	    _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
	__m256 em1 = _mm256_fmadd_ps(s, q, _mm256_sub_ps(s, _mm256_set1_ps(1.0f))); /* e^y - 1 */
	__m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_setzero_ps(), em1), _mm256_add_ps(em1, _mm256_set1_ps(2.0f)));
	t = _mm256_or_ps(t, sign);
	return _mm256_blendv_ps(t, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* 1 / (1 + e^-x) from e = e^-|x| (never overflows): 1/(1+e) for x >= 0, e/(1+e) below. */
static inline AVX2_FN __m256 v_sigmoid(__m256 x) {
	__m256 e = v_exp(_mm256_or_ps(x, _mm256_set1_ps(-0.0f)));
	__m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
	return _mm256_blendv_ps(r, _mm256_mul_ps(e, r), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

/* Taylor coefficients of erf(z)/z in z^2: 2/sqrt(pi) (-1)^n / (n! (2n+1)). */
static const float erf_taylor[11] = {
    1.128379167e+00f, -3.761263890e-01f, 1.128379167e-01f, -2.686617065e-02f,
    5.223977625e-03f, -8.548327023e-04f, 1.205533298e-04f, -1.492565036e-05f,
    1.646211437e-06f, -1.636584469e-07f, 1.480719282e-08f,
};
/* k(u) = sqrt(pi) z e^{z^2} erfc(z), u = 1/z in (0, 1], as a polynomial in v = 2u - 1
 * (Chebyshev interpolation, degree 12, our own fit). */
static const float erfc_fit[13] = {
    9.053541000e-01f, -1.481868734e-01f, -1.623280175e-02f, 2.635633076e-02f,
    -1.204479971e-02f, 2.357292994e-03f, 1.103040666e-03f, -1.446537706e-03f,
    9.125926791e-04f, -3.200083188e-04f, -9.632242213e-05f, 1.758829430e-04f,
    -5.974209536e-05f,
};

/* Phi(x) = P(N(0,1) <= x) = 0.5 erfc(-x / sqrt 2), computed without cancellation. */
static inline AVX2_FN __m256 v_phi(__m256 x) {
	const float rsqrt2 = 0.70710678118654752f;
	__m256 ax = v_abs(x);
	__m256 z = _mm256_mul_ps(ax, _mm256_set1_ps(rsqrt2));
	/* |z| < 1: erfc = 1 - z P(z^2) */
	__m256 z2 = _mm256_mul_ps(z, z);
	__m256 p = _mm256_set1_ps(erf_taylor[10]);
	for (int i = 9; i >= 0; i--)
		p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(erf_taylor[i]));
	__m256 ec_small = _mm256_fnmadd_ps(z, p, _mm256_set1_ps(1.0f));
	/* |z| >= 1: erfc = exp(-z^2) u/sqrt(pi) k(u) */
	const float sqrt2 = 1.41421356237309505f;
	__m256 axc = _mm256_min_ps(_mm256_max_ps(ax, _mm256_set1_ps(sqrt2)), _mm256_set1_ps(10.0f * sqrt2));
	__m256 u = _mm256_div_ps(_mm256_set1_ps(sqrt2), axc);
	__m256 v = _mm256_fmsub_ps(u, _mm256_set1_ps(2.0f), _mm256_set1_ps(1.0f));
	__m256 k = _mm256_set1_ps(erfc_fit[12]);
	for (int i = 11; i >= 0; i--)
		k = _mm256_fmadd_ps(k, v, _mm256_set1_ps(erfc_fit[i]));
	__m256 hi = _mm256_mul_ps(axc, axc); /* x^2 = hi + lo exactly; z^2 = x^2 / 2 */
	__m256 lo = _mm256_fmsub_ps(axc, axc, hi);
	__m256 half = _mm256_set1_ps(0.5f);
	__m256 e = v_exp(_mm256_mul_ps(hi, _mm256_set1_ps(-0.5f)));
	e = _mm256_fnmadd_ps(e, _mm256_mul_ps(lo, half), e); /* e^{-lo/2} ~ 1 - lo/2 */
	__m256 ec_large = _mm256_mul_ps(_mm256_mul_ps(e, k), _mm256_mul_ps(u, _mm256_set1_ps(0.56418958354775629f)));
	ec_large = _mm256_blendv_ps(ec_large, _mm256_setzero_ps(), _mm256_cmp_ps(ax, _mm256_set1_ps(10.0f * sqrt2), _CMP_GT_OQ));
	__m256 ec = _mm256_blendv_ps(ec_small, ec_large, _mm256_cmp_ps(ax, _mm256_set1_ps(sqrt2), _CMP_GE_OQ));
	__m256 hec = _mm256_mul_ps(ec, half);
	/* x >= 0: 1 - erfc/2; x < 0: erfc/2 */
	return _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), hec), hec, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

/* The activations over 16 lanes (AVX-512F), as the AVX2 ones: masks instead of blends, and
 * 2^n applied by vscalefps (one rounding where the AVX2 exp splits n in two halves). GELU is
 * the vocoder's and the DiT's activation, SiLU the conformer's: 16 lanes per instruction
 * halve their instruction count (GELU(erf) 1.7-2.0 -> 1.0-1.1 ns a value on one core). */
static inline AVX512_FN __m512 v_exp512(__m512 x) {
	__m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
	__m512 p = _mm512_set1_ps(expm1_taylor[0]);
	for (int i = 1; i < 7; i++)
		p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(expm1_taylor[i]));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f)); /* e^r = 1 + r(1 + r/2 + ...) */
	__m512 y = _mm512_scalef_ps(p, n);
	return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x); /* NaN stays NaN */
}

static inline AVX512_FN __m512 v_phi512(__m512 x) {
	const float rsqrt2 = 0.70710678118654752f, sqrt2 = 1.41421356237309505f;
	__m512 ax = _mm512_abs_ps(x);
	__m512 z = _mm512_mul_ps(ax, _mm512_set1_ps(rsqrt2));
	__m512 z2 = _mm512_mul_ps(z, z);
	__m512 p = _mm512_set1_ps(erf_taylor[10]);
	for (int i = 9; i >= 0; i--)
		p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(erf_taylor[i]));
	__m512 ec_small = _mm512_fnmadd_ps(z, p, _mm512_set1_ps(1.0f));
	__m512 axc = _mm512_min_ps(_mm512_max_ps(ax, _mm512_set1_ps(sqrt2)), _mm512_set1_ps(10.0f * sqrt2));
	__m512 u = _mm512_div_ps(_mm512_set1_ps(sqrt2), axc);
	__m512 v = _mm512_fmsub_ps(u, _mm512_set1_ps(2.0f), _mm512_set1_ps(1.0f));
	__m512 k = _mm512_set1_ps(erfc_fit[12]);
	for (int i = 11; i >= 0; i--)
		k = _mm512_fmadd_ps(k, v, _mm512_set1_ps(erfc_fit[i]));
	__m512 hi = _mm512_mul_ps(axc, axc);
	__m512 lo = _mm512_fmsub_ps(axc, axc, hi);
	__m512 half = _mm512_set1_ps(0.5f);
	__m512 e = v_exp512(_mm512_mul_ps(hi, _mm512_set1_ps(-0.5f)));
	e = _mm512_fnmadd_ps(e, _mm512_mul_ps(lo, half), e);
	__m512 ec_large = _mm512_mul_ps(_mm512_mul_ps(e, k), _mm512_mul_ps(u, _mm512_set1_ps(0.56418958354775629f)));
	ec_large = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(10.0f * sqrt2), _CMP_GT_OQ), ec_large, _mm512_setzero_ps());
	__m512 ec = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(sqrt2), _CMP_GE_OQ), ec_small, ec_large);
	__m512 hec = _mm512_mul_ps(ec, half);
	return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_sub_ps(_mm512_set1_ps(1.0f), hec), hec);
}

static inline AVX512_FN __m512 v_sigmoid512(__m512 x) {
	__m512 e = v_exp512(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)))); /* -|x| */
	__m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
	return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), r, _mm512_mul_ps(e, r));
}

static inline AVX512_FN __m512 unary512(int f, __m512 x) {
	switch (f) {
	case VX_U_GELU_ERF: return _mm512_mul_ps(x, v_phi512(x));
	case VX_U_GELU_TANH: {
		__m512 u = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), _mm512_mul_ps(x, x), x);
		return _mm512_mul_ps(x, v_sigmoid512(_mm512_mul_ps(_mm512_set1_ps(2.0f * SQRT_2_OVER_PI), u)));
	}
	case VX_U_SILU: return _mm512_mul_ps(x, v_sigmoid512(x));
	default: return v_sigmoid512(x); /* VX_U_SIGMOID */
	}
}

/* The activations (GELU, SiLU, sigmoid) over n values, 16 at a time, the tail masked. */
AVX512_FN static void act_avx512(int f, const float *s, float *d, int64_t n) {
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(d + i, unary512(f, _mm512_loadu_ps(s + i)));
	if (i < n) {
		__mmask16 m = (__mmask16)((1u << (n - i)) - 1);
		_mm512_mask_storeu_ps(d + i, m, unary512(f, _mm512_maskz_loadu_ps(m, s + i)));
	}
}
#endif /* VX_X86 */

/* ---- UNARY ---- */

static float sigmoid_f(float x) {
	float e = expf(-fabsf(x)), r = 1.0f / (1.0f + e);
	return x >= 0 ? r : e * r;
}

static float gelu_tanh_f(float x) {
	/* 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
	return x * sigmoid_f(2.0f * SQRT_2_OVER_PI * (x + 0.044715f * x * x * x));
}

static float gelu_erf_f(float x) {
	/* in double: x / sqrt 2 rounded to float would cost 2 z^2 ulp of relative accuracy in
	 * the negative tail */
	return (float)(0.5 * (double)x * erfc(-(double)x * 0.70710678118654752));
}

#define ULOOP(EXPR)                                                                                \
	for (int64_t i = 0; i < n; i++) {                                                          \
		float x = s[i];                                                                    \
		d[i] = (EXPR);                                                                     \
	}                                                                                          \
	break;

static void unary_portable(int f, const float *s, float *d, int64_t n, float p0, float p1) {
	switch (f) {
	case VX_U_NEG: ULOOP(-x)
	case VX_U_EXP: ULOOP(expf(x))
	case VX_U_LOG: ULOOP(logf(x))
	case VX_U_SIN: ULOOP(sinf(x))
	case VX_U_COS: ULOOP(cosf(x))
	case VX_U_SQRT: ULOOP(sqrtf(x))
	case VX_U_TANH: ULOOP(tanhf(x))
	case VX_U_SIGMOID: ULOOP(sigmoid_f(x))
	case VX_U_RELU: ULOOP(x < 0 ? 0.0f : x)
	case VX_U_SILU: ULOOP(x * sigmoid_f(x))
	case VX_U_GELU_ERF: ULOOP(gelu_erf_f(x))
	case VX_U_GELU_TANH: ULOOP(gelu_tanh_f(x))
	case VX_U_ABS: ULOOP(fabsf(x))
	case VX_U_CLAMP: ULOOP(x < p0 ? p0 : (x > p1 ? p1 : x))
	case VX_U_SCALE: ULOOP(p0 * x + p1)
	case VX_U_SQUARE: ULOOP(x * x)
	case VX_U_RECIP: ULOOP(1.0f / x)
	}
}

#ifdef VX_X86
#define UVLOOP(EXPR)                                                                               \
	do {                                                                                       \
		int64_t i = 0;                                                                     \
		for (; i + 8 <= n; i += 8) {                                                       \
			__m256 x = _mm256_loadu_ps(s + i);                                         \
			_mm256_storeu_ps(d + i, (EXPR));                                           \
		}                                                                                  \
		if (i < n) {                                                                       \
			__m256i m = tail_mask(n - i);                                              \
			__m256 x = _mm256_maskload_ps(s + i, m);                                   \
			_mm256_maskstore_ps(d + i, m, (EXPR));                                     \
		}                                                                                  \
	} while (0);                                                                               \
	break;

AVX2_FN static void unary_avx2(int f, const float *s, float *d, int64_t n, float p0, float p1) {
	const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
	const __m256 a = _mm256_set1_ps(p0), b = _mm256_set1_ps(p1);
	switch (f) {
	case VX_U_NEG: UVLOOP(_mm256_sub_ps(zero, x))
	case VX_U_EXP: UVLOOP(v_exp(x))
	case VX_U_SQRT: UVLOOP(_mm256_sqrt_ps(x))
	case VX_U_TANH: UVLOOP(v_tanh(x))
	case VX_U_SIGMOID: UVLOOP(v_sigmoid(x))
	case VX_U_RELU: UVLOOP(_mm256_max_ps(zero, x)) /* NaN passes through */
	case VX_U_SILU: UVLOOP(_mm256_mul_ps(x, v_sigmoid(x)))
	case VX_U_GELU_ERF: UVLOOP(_mm256_mul_ps(x, v_phi(x)))
	case VX_U_GELU_TANH:
		UVLOOP(_mm256_mul_ps(x, v_sigmoid(_mm256_mul_ps(_mm256_set1_ps(2.0f * SQRT_2_OVER_PI),
		                                                _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x),
		                                                                _mm256_mul_ps(x, x), x)))))
	case VX_U_ABS: UVLOOP(v_abs(x))
	case VX_U_CLAMP: UVLOOP(_mm256_min_ps(b, _mm256_max_ps(a, x))) /* NaN passes through */
	case VX_U_SCALE: UVLOOP(_mm256_fmadd_ps(a, x, b))
	case VX_U_SQUARE: UVLOOP(_mm256_mul_ps(x, x))
	case VX_U_RECIP: UVLOOP(_mm256_div_ps(one, x))
	default: unary_portable(f, s, d, n, p0, p1); /* log, sin, cos: libm */
	}
}
#endif /* VX_X86 */

typedef struct {
	int f, avx; /* 2: act_avx512, 1: unary_avx2, 0: portable */
	float p0, p1;
	const float *s;
	float *d;
} unary_job;

/* The code path for unary f on this CPU: the same for a UNARY node and a fused epilogue, so
 * both give the same bits. */
static int unary_level(int f) {
	if (vx_use_avx512() && (f == VX_U_GELU_ERF || f == VX_U_GELU_TANH || f == VX_U_SILU || f == VX_U_SIGMOID))
		return 2; /* the activations act_avx512 has */
	return vx_use_avx2();
}

/* Rough work per value of unary f for splitting jobs (vx_run_segs): 1 for a compare or a
 * multiply-add, 8 for the transcendental ones. */
static double unary_cost(int f) {
	int cheap = f == VX_U_NEG || f == VX_U_RELU || f == VX_U_ABS || f == VX_U_CLAMP || f == VX_U_SCALE ||
	            f == VX_U_SQUARE;
	return cheap ? 1.0 : 8.0;
}

static void unary_span(int avx, int f, const float *s, float *d, int64_t n, float p0, float p1) {
	if (avx == 2)
		act_avx512(f, s, d, n);
	else if (avx)
		unary_avx2(f, s, d, n, p0, p1);
	else
		unary_portable(f, s, d, n, p0, p1);
}

static void unary_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const unary_job *j = arg;
	(void)row;
	unary_span(j->avx, j->f, j->s + lo, j->d + lo, hi - lo, j->p0, j->p1);
}

int vx_k_unary(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	if (node->n_src != 1 || !vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || !vx_same_shape(x, y) || !vx_is_contiguous(x) ||
	    !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	if (node->ip[0] < 0 || node->ip[0] >= VX_U_COUNT)
		return VX_ERR_BAD_OP;
	unary_job j = {.f = (int)node->ip[0], .avx = unary_level((int)node->ip[0]), .p0 = node->fp[0], .p1 = node->fp[1],
	               .s = x->data, .d = y->data};
	vx_run_segs(ctx, 1, vx_numel(x), unary_cost(j.f), 2048, unary_seg, &j);
	return VX_OK;
}

/* ---- BINARY ---- */

static inline float maxf_nan(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float minf_nan(float a, float b) { return (a != a || a < b) ? a : b; }

static inline float bin_scalar(int op, float a, float b) {
	switch (op) {
	case VX_B_ADD: return a + b;
	case VX_B_SUB: return a - b;
	case VX_B_MUL: return a * b;
	case VX_B_DIV: return a / b;
	case VX_B_MAX: return maxf_nan(a, b);
	default: return minf_nan(a, b);
	}
}

/* d[i] = a[i*sa] op b[i*sb] for general strides (portable, and the AVX2 fallback). */
static void bin_strided(int op, int64_t n, const float *a, int64_t sa, const float *b, int64_t sb, float *d) {
	switch (op) {
#define SL(EXPR)                                                                                   \
	for (int64_t i = 0; i < n; i++) {                                                          \
		float x = a[i * sa], y = b[i * sb];                                                \
		d[i] = (EXPR);                                                                     \
	}                                                                                          \
	break;
	case VX_B_ADD: SL(x + y)
	case VX_B_SUB: SL(x - y)
	case VX_B_MUL: SL(x * y)
	case VX_B_DIV: SL(x / y)
	case VX_B_MAX: SL(maxf_nan(x, y))
	case VX_B_MIN: SL(minf_nan(x, y))
#undef SL
	}
}

/* Portable contiguous/scalar inner loops: ma, mb = 1 contiguous, 0 scalar. Written per case so
 * the compiler vectorises them at the baseline ISA. */
static void bin_portable(int op, int64_t n, const float *a, int ma, const float *b, int mb, float *d) {
	if (ma && mb)
		bin_strided(op, n, a, 1, b, 1, d);
	else if (ma)
		bin_strided(op, n, a, 1, b, 0, d);
	else
		bin_strided(op, n, a, 0, b, mb ? 1 : 0, d);
}

#ifdef VX_X86
static inline AVX2_FN __m256 vmax_nan(__m256 x, __m256 y) {
	return _mm256_blendv_ps(_mm256_max_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
static inline AVX2_FN __m256 vmin_nan(__m256 x, __m256 y) {
	return _mm256_blendv_ps(_mm256_min_ps(x, y), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

AVX2_FN static void bin_avx2(int op, int64_t n, const float *a, int ma, const float *b, int mb, float *d) {
	const __m256 va = _mm256_set1_ps(*a), vb = _mm256_set1_ps(*b);
	const float sa = *a, sb = *b;
	int64_t i = 0;
	switch (op) {
#define VL(VEXPR, SEXPR)                                                                           \
	for (; i + 8 <= n; i += 8) {                                                               \
		__m256 x = ma ? _mm256_loadu_ps(a + i) : va;                                       \
		__m256 y = mb ? _mm256_loadu_ps(b + i) : vb;                                       \
		_mm256_storeu_ps(d + i, (VEXPR));                                                  \
	}                                                                                          \
	for (; i < n; i++) {                                                                       \
		float x = ma ? a[i] : sa, y = mb ? b[i] : sb;                                      \
		d[i] = (SEXPR);                                                                    \
	}                                                                                          \
	break;
	case VX_B_ADD: VL(_mm256_add_ps(x, y), x + y)
	case VX_B_SUB: VL(_mm256_sub_ps(x, y), x - y)
	case VX_B_MUL: VL(_mm256_mul_ps(x, y), x * y)
	case VX_B_DIV: VL(_mm256_div_ps(x, y), x / y)
	case VX_B_MAX: VL(vmax_nan(x, y), maxf_nan(x, y))
	case VX_B_MIN: VL(vmin_nan(x, y), minf_nan(x, y))
#undef VL
	}
}

static inline AVX512_FN __m512 vmax_nan512(__m512 x, __m512 y) {
	return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_max_ps(x, y), x);
}
static inline AVX512_FN __m512 vmin_nan512(__m512 x, __m512 y) {
	return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_min_ps(x, y), x);
}

/* The AVX-512 path: 16 lanes, the tail done with a lane mask instead of scalar code. */
AVX512_FN static void bin_avx512(int op, int64_t n, const float *a, int ma, const float *b, int mb, float *d) {
	const __m512 va = _mm512_set1_ps(*a), vb = _mm512_set1_ps(*b);
	switch (op) {
#define VL(VEXPR)                                                                                  \
	for (int64_t i = 0; i < n; i += 16) {                                                      \
		__mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);      \
		__m512 x = ma ? _mm512_maskz_loadu_ps(m, a + i) : va;                              \
		__m512 y = mb ? _mm512_maskz_loadu_ps(m, b + i) : vb;                              \
		_mm512_mask_storeu_ps(d + i, m, (VEXPR));                                          \
	}                                                                                          \
	break;
	case VX_B_ADD: VL(_mm512_add_ps(x, y))
	case VX_B_SUB: VL(_mm512_sub_ps(x, y))
	case VX_B_MUL: VL(_mm512_mul_ps(x, y))
	case VX_B_DIV: VL(_mm512_div_ps(x, y))
	case VX_B_MAX: VL(vmax_nan512(x, y))
	case VX_B_MIN: VL(vmin_nan512(x, y))
#undef VL
	}
}
#endif /* VX_X86 */

/* Drop size-1 dims and merge dims that are contiguous in every one of the k stride sets.
 * shape/st are 5-d on entry; returns the new rank (>= 1), outermost first. */
static int collapse(int64_t shape[5], int64_t st[][5], int k) {
	int64_t sh[5], s[4][5];
	int nd = 0;
	for (int i = 0; i < 5; i++) {
		if (shape[i] == 1)
			continue;
		if (nd > 0) {
			int ok = 1;
			for (int j = 0; j < k; j++)
				ok &= s[j][nd - 1] == st[j][i] * shape[i];
			if (ok) {
				sh[nd - 1] *= shape[i];
				for (int j = 0; j < k; j++)
					s[j][nd - 1] = st[j][i];
				continue;
			}
		}
		sh[nd] = shape[i];
		for (int j = 0; j < k; j++)
			s[j][nd] = st[j][i];
		nd++;
	}
	if (nd == 0) {
		sh[0] = 1;
		for (int j = 0; j < k; j++)
			s[j][0] = 0;
		nd = 1;
	}
	for (int i = 0; i < nd; i++) {
		shape[i] = sh[i];
		for (int j = 0; j < k; j++)
			st[j][i] = s[j][i];
	}
	return nd;
}

/* Strides of src broadcast to the 5-d output shape (right-aligned, numpy rules: a size-1 or
 * stride-0 dim broadcasts). Returns 0 when the shapes are incompatible. */
static int bcast_strides(const vx_tensor *x, const int64_t out[5], int64_t st[5]) {
	int64_t sh[5];
	vx_pad5(x, sh, st);
	for (int i = 0; i < 5; i++) {
		if (sh[i] == out[i])
			continue;
		if (sh[i] != 1)
			return 0;
		st[i] = 0;
	}
	for (int i = 0; i < 5; i++)
		if (out[i] == 1 || st[i] == 0)
			st[i] = 0;
	return 1;
}

static int bin_level(void) { return vx_use_avx512() ? 2 : vx_use_avx2(); }

/* d[i] = a[i*sa] op b[i*sb], on the vector paths where each side is contiguous or one value. */
static void bin_span(int avx, int op, int64_t n, const float *a, int64_t sa, const float *b, int64_t sb, float *d) {
	if ((sa == 1 || sa == 0) && (sb == 1 || sb == 0) && (sa | sb)) {
		if (avx == 2)
			bin_avx512(op, n, a, sa == 1, b, sb == 1, d);
		else if (avx)
			bin_avx2(op, n, a, sa == 1, b, sb == 1, d);
		else
			bin_portable(op, n, a, sa == 1, b, sb == 1, d);
	} else {
		bin_strided(op, n, a, sa, b, sb, d);
	}
}

typedef struct {
	int op, avx, nd;
	int64_t shape[5];
	int64_t st[3][5]; /* dst, a, b */
	const float *a, *b;
	float *d;
} bin_job;

static void bin_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const bin_job *j = arg;
	int64_t oa = 0, ob = 0, od = 0, r = row;
	for (int k = j->nd - 2; k >= 0; k--) {
		int64_t ix = r % j->shape[k];
		r /= j->shape[k];
		od += ix * j->st[0][k];
		oa += ix * j->st[1][k];
		ob += ix * j->st[2][k];
	}
	int in = j->nd - 1;
	int64_t sa = j->st[1][in], sb = j->st[2][in];
	const float *a = j->a + oa + lo * sa, *b = j->b + ob + lo * sb;
	float *d = j->d + od + lo;
	bin_span(j->avx, j->op, hi - lo, a, sa, b, sb, d);
}

int vx_k_binary(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *a = vx_src(node, t, 0), *b = vx_src(node, t, 1), *y = &t[node->dst];
	if (node->n_src != 2 || !vx_tensor_ok(a, VX_F32) || !vx_tensor_ok(b, VX_F32) || !vx_tensor_ok(y, VX_F32) ||
	    !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	if (node->ip[0] < 0 || node->ip[0] >= VX_B_COUNT)
		return VX_ERR_BAD_OP;
	bin_job j = {.op = (int)node->ip[0], .avx = bin_level(), .a = a->data, .b = b->data, .d = y->data};
	int64_t dummy[5];
	vx_pad5(y, j.shape, dummy);
	if (!bcast_strides(a, j.shape, j.st[1]) || !bcast_strides(b, j.shape, j.st[2]))
		return VX_ERR_BAD_SHAPE;
	int64_t n = vx_numel(y);
	if (n == 0)
		return VX_OK;
	int64_t s = 1;
	for (int i = 4; i >= 0; i--) {
		j.st[0][i] = s;
		s *= j.shape[i];
	}
	j.nd = collapse(j.shape, j.st, 3);
	int64_t len = j.shape[j.nd - 1];
	vx_run_segs(ctx, n / len, len, 1.0, 2048, bin_seg, &j);
	return VX_OK;
}

/* ---- SNAKE_BETA ---- */

#define PI_A ((float)3.14159265358979323846)
#define PI_B ((float)(3.14159265358979323846 - (double)PI_A))
#define PI_C ((float)(3.14159265358979323846 - (double)PI_A - (double)PI_B))

typedef struct {
	int avx;
	int64_t C, T;
	const float *x, *alpha, *beta;
	float *y;
} snake_job;

static void snake_row_portable(const float *x, float *y, int64_t n, float a, float ib) {
	for (int64_t i = 0; i < n; i++) {
		float s = sinf(a * x[i]);
		y[i] = x[i] + ib * (s * s);
	}
}

#ifdef VX_X86
/* sin(r)^2 after reduction of y by multiples of pi. */
static inline AVX2_FN __m256 v_sin2(__m256 y) {
	__m256 k = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps((float)(1.0 / 3.14159265358979323846))),
	                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(PI_A), y);
	r = _mm256_fnmadd_ps(k, _mm256_set1_ps(PI_B), r);
	r = _mm256_fnmadd_ps(k, _mm256_set1_ps(PI_C), r);
	__m256 r2 = _mm256_mul_ps(r, r);
	__m256 p = _mm256_set1_ps(1.0f / 6227020800.0f);
	p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(-1.0f / 39916800.0f));
	p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(1.0f / 362880.0f));
	p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(-1.0f / 5040.0f));
	p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(1.0f / 120.0f));
	p = _mm256_fmadd_ps(p, r2, _mm256_set1_ps(-1.0f / 6.0f));
	p = _mm256_mul_ps(p, r2);
	__m256 s = _mm256_fmadd_ps(p, r, r);
	return _mm256_mul_ps(s, s);
}

AVX2_FN static void snake_row_avx2(const float *x, float *y, int64_t n, float a, float ib) {
	const __m256 va = _mm256_set1_ps(a), vib = _mm256_set1_ps(ib), big = _mm256_set1_ps(1e5f);
	int64_t i = 0;
	for (; i < n; i += 8) {
		int64_t m = n - i < 8 ? n - i : 8;
		__m256i mask = tail_mask(m);
		__m256 xv = _mm256_maskload_ps(x + i, mask);
		__m256 yv = _mm256_mul_ps(va, xv);
		/* out of the reduction's range, or NaN: libm */
		if (_mm256_movemask_ps(_mm256_cmp_ps(v_abs(yv), big, _CMP_LE_OQ)) != 0xff) {
			float tmp[8];
			_mm256_storeu_ps(tmp, xv);
			snake_row_portable(tmp, tmp, m, a, ib);
			memcpy(y + i, tmp, (size_t)m * sizeof(float));
			continue;
		}
		_mm256_maskstore_ps(y + i, mask, _mm256_fmadd_ps(vib, v_sin2(yv), xv));
	}
}
#endif /* VX_X86 */

static void snake_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const snake_job *j = arg;
	int64_t c = row % j->C;
	float a = expf(j->alpha[c]);
	float ib = 1.0f / (expf(j->beta[c]) + 1e-9f);
	const float *x = j->x + row * j->T + lo;
	float *y = j->y + row * j->T + lo;
	if (j->avx)
		snake_row_avx2(x, y, hi - lo, a, ib);
	else
		snake_row_portable(x, y, hi - lo, a, ib);
}

int vx_k_snake_beta(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *al = vx_src(node, t, 1), *be = vx_src(node, t, 2);
	const vx_tensor *y = &t[node->dst];
	if (node->n_src != 3 || !vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(al, VX_F32) || !vx_tensor_ok(be, VX_F32) ||
	    !vx_tensor_ok(y, VX_F32))
		return VX_ERR_BAD_SHAPE;
	if (x->ndim < 2 || !vx_same_shape(x, y) || !vx_is_contiguous(x) || !vx_is_contiguous(y) ||
	    !vx_is_contiguous(al) || !vx_is_contiguous(be))
		return VX_ERR_BAD_SHAPE;
	int64_t C = x->shape[1];
	if (vx_numel(al) != C || vx_numel(be) != C)
		return VX_ERR_BAD_SHAPE;
	int64_t n = vx_numel(x);
	if (n == 0)
		return VX_OK;
	snake_job j = {.avx = vx_use_avx2(), .C = C, .T = n / (x->shape[0] * C), .x = x->data,
	               .alpha = al->data, .beta = be->data, .y = y->data};
	vx_run_segs(ctx, x->shape[0] * C, j.T, 8.0, 2048, snake_seg, &j);
	return VX_OK;
}

/* ---- epilogues: elementwise steps fused into the node that produces their input ---- */

/* Strides (rs, cs) that address operand o at row m, column n of the output y seen as [M, N]:
 * o[m*rs + n*cs]. o has y's number of elements and last dim, broadcast by stride 0 (its
 * leading dims may group the rows differently); 0 when its rows are not one stride apart. */
static int epi_strides(const vx_tensor *o, const vx_tensor *y, int64_t *rs, int64_t *cs) {
	if (o->ndim < 1 || y->ndim < 1 || vx_numel(o) != vx_numel(y) || o->shape[o->ndim - 1] != y->shape[y->ndim - 1])
		return 0;
	int64_t r = -1, inner = 1;
	for (int d = o->ndim - 2; d >= 0; d--) {
		if (o->shape[d] > 1) {
			if (r < 0) {
				if (o->stride[d] % inner != 0)
					return 0;
				r = o->stride[d] / inner;
			} else if (o->stride[d] != r * inner) {
				return 0;
			}
		}
		inner *= o->shape[d];
	}
	*rs = r < 0 ? 0 : r;
	*cs = o->shape[o->ndim - 1] > 1 ? o->stride[o->ndim - 1] : 0;
	return 1;
}

int vx_epi_parse(const vx_node *node, const vx_tensor *t, const vx_tensor *y, int *n_src, vx_epi *e) {
	memset(e, 0, sizeof *e);
	*n_src = node->n_src;
	e->n = (int)node->ip[VX_EPI_IP];
	if (e->n == 0)
		return VX_OK;
	if (e->n < 0 || e->n > VX_EPI_STEPS || !vx_is_contiguous(y))
		return VX_ERR_BAD_OP;
	e->p0 = node->fp[2];
	e->p1 = node->fp[3];
	int nbin = 0;
	for (int s = 0; s < e->n; s++) {
		int64_t code = node->ip[VX_EPI_IP + 1 + s];
		e->kind[s] = (int)(code >> 8);
		e->op[s] = (int)(code & 255);
		if (e->kind[s] == VX_EPI_UNARY) {
			if (e->op[s] >= VX_U_COUNT)
				return VX_ERR_BAD_OP;
			e->avx[s] = unary_level(e->op[s]);
		} else if (e->kind[s] == VX_EPI_LEFT || e->kind[s] == VX_EPI_RIGHT) {
			if (e->op[s] >= VX_B_COUNT)
				return VX_ERR_BAD_OP;
			e->avx[s] = bin_level();
			nbin++;
		} else {
			return VX_ERR_BAD_OP;
		}
	}
	/* The binary steps' operands are the node's last sources, in step order. */
	int first = node->n_src - nbin;
	if (first < 1)
		return VX_ERR_BAD_SHAPE;
	for (int s = 0, k = first; s < e->n; s++) {
		if (e->kind[s] == VX_EPI_UNARY)
			continue;
		const vx_tensor *o = vx_src(node, t, k++);
		if (!vx_tensor_ok(o, VX_F32) || !epi_strides(o, y, &e->rs[s], &e->cs[s]))
			return VX_ERR_BAD_SHAPE;
		e->o[s] = o->data;
	}
	*n_src = first;
	return VX_OK;
}

double vx_epi_cost(const vx_epi *e) {
	double c = 0;
	for (int s = 0; e && s < e->n; s++)
		c += e->kind[s] == VX_EPI_UNARY ? unary_cost(e->op[s]) : 1.0;
	return c;
}

void vx_epi_apply(const vx_epi *e, float *y, int64_t N, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
	if (!e || e->n == 0 || n1 <= n0)
		return;
	for (int64_t m = m0; m < m1; m++) {
		float *row = y + m * N + n0;
		int64_t len = n1 - n0;
		for (int s = 0; s < e->n; s++) {
			if (e->kind[s] == VX_EPI_UNARY) {
				unary_span(e->avx[s], e->op[s], row, row, len, e->p0, e->p1);
				continue;
			}
			const float *o = e->o[s] + m * e->rs[s] + n0 * e->cs[s];
			if (e->kind[s] == VX_EPI_LEFT)
				bin_span(e->avx[s], e->op[s], len, row, 1, o, e->cs[s], row);
			else
				bin_span(e->avx[s], e->op[s], len, o, e->cs[s], row, 1, row);
		}
	}
}
