/* AVX2/FMA vector helpers shared by the elementwise and normalisation kernels (static inline:
 * they must inline into their AVX2 callers); empty off x86-64 (VX_X86, kern.h). */
#ifndef VX_SIMD_H
#define VX_SIMD_H

#include "kern.h"

#ifdef VX_X86 /* x86-64 only: see kern.h */
#include <immintrin.h>

static inline AVX2_FN __m256i tail_mask(int64_t r) {
	return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#define LN2_HI 0.693147182464599609375f /* (float)ln 2 */
#define LN2_LO -1.904654299957768e-09f  /* ln 2 - LN2_HI */
#define LOG2E 1.44269504088896341f

/* (e^r - 1) / r = 1 + r/2 + ... + r^6/7!, highest power first (every vector width's exp). */
static const float expm1_taylor[7] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f};

/* e^r - 1 for |r| <= ~0.35, degree-7 Taylor without the constant term. */
static inline AVX2_FN __m256 v_expm1_poly(__m256 r) {
	__m256 p = _mm256_set1_ps(expm1_taylor[0]);
	for (int i = 1; i < 7; i++)
		p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(expm1_taylor[i]));
	return _mm256_mul_ps(p, r);
}

static inline AVX2_FN __m256 v_exp(__m256 x) {
	__m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0f)), _mm256_set1_ps(89.0f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)),
	                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
	__m256 p = _mm256_add_ps(v_expm1_poly(r), _mm256_set1_ps(1.0f));
	__m256i ni = _mm256_cvtps_epi32(n);
	__m256i n1 = _mm256_srai_epi32(ni, 1);
	__m256i n2 = _mm256_sub_epi32(ni, n1);
	__m256i bias = _mm256_set1_epi32(127);
	__m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
	__m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
	__m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
	return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

#endif /* VX_X86 */

#endif
