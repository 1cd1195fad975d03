/* Linear layers over weights kept in their GGUF encoding (VX_OP_LINEAR_Q): y = x W^T + bias
 * with W [N, K] in Q8_0, Q8_0_R8 (Q8_0 with rows interleaved by 8, see vx.h) or F16. Decoding
 * a token is bound by the weight bytes it reads, so W is never widened to f32 in memory there.
 *  - Q8_0/Q8_0_R8: each x row is quantised once to int8 blocks of 32 (f32 scale) and every
 *    output is a sum over blocks of an int8 dot times both scales (as ggml's q8_0 x q8_0).
 *    Widening W in registers instead costs what the F16 path costs per weight (convert + FMA
 *    per 16 weights: bench gemv, F16 28 GB/s = 14 G weights/s on this 2-core EPYC), while the
 *    Q8_0_R8 int8 kernel does 8 rows x 8 values per VNNI dpbusd: 56 GB/s (53 G weights/s).
 *    Plain Q8_0 rows (one dot per row, AVX2 maddubs or VNNI) reach only 15 GB/s: the per-block
 *    scale and sign work is not shared, hence the R8 layout for Linear weights.
 *  - F16 rows are widened in registers (vcvtph2ps) and FMA'd with x, 4 rows per pass.
 *  - Few x rows (M <= SMALL_M, decode), and any M for Q8_0_R8 on VNNI: threads split the rows
 *    of W; up to eight x rows share each load of an 8-row group (batched decode, prefill),
 *    two rows' sums scaled together (BenchmarkLinearQ at M 8: 2.31-2.38 ms one row at a time
 *    -> 1.39-1.61 in pairs with prefetch, against 0.76-0.86 for M 1). Otherwise (F16, plain
 *    Q8_0, or no VNNI): each task widens a panel of W rows into its scratch and runs
 *    single-threaded OpenBLAS sgemm on all of x.
 * Accuracy: the panel path and F16 give the f32 product of x and the dequantised W up to f32
 * rounding; the int8 paths add x's rounding, at most amax_b/254 per element of block b
 * (amax_b its largest magnitude): |err| <= sum_b amax_b/254 * sum|w| over the block, about
 * 1e-3..1e-2 of sum|x||w| per output on random rows (the tests check the bound). */
#include <math.h>
#include <string.h>
#include <cblas.h>
#include "kern.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(VX_NO_SIMD) /* VX_NO_SIMD: check the portable-only build */
#define VX_QX86 1
#include <immintrin.h>
#define QAVX2_FN __attribute__((target("avx2,fma,f16c")))
#define QVNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define QINLINE __attribute__((always_inline)) inline
#endif

#define QK 32     /* values per Q8_0 block */
#define QB 34     /* bytes per Q8_0 block: f16 scale + 32 int8 */
#define SMALL_M 8 /* up to this many x rows: the direct dot kernels */
#define ROWS 4    /* W rows per dot call */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static float half_f32(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
	float f;
	if (exp == 0) { /* zero or subnormal: mant * 2^-24 exactly */
		f = (float)mant * (1.0f / 16777216.0f);
		memcpy(&bits, &f, 4);
		bits |= sign;
	} else if (exp == 31) {
		bits = sign | 0x7f800000u | (mant << 13);
	} else {
		bits = sign | ((exp + 112) << 23) | (mant << 13);
	}
	memcpy(&f, &bits, 4);
	return f;
}

int64_t vx_qrow_bytes(int dtype, int64_t k) {
	if (k <= 0)
		return 0;
	if (dtype == VX_Q8_0)
		return k % QK ? 0 : k / QK * QB;
	if (dtype == VX_F16 || dtype == VX_BF16)
		return 2 * k;
	if (dtype == VX_Q4_K)
		return k % 256 ? 0 : k / 256 * 144;
	return 0;
}

#define RB (16 + 8 * QK) /* bytes of one 8-row block record of VX_Q8_0_R8 */
#ifndef PF_AHEAD
/* Decode prefetch distance, bytes (0, 2048, 6144 measured within noise; 6144 best), into L2:
 * into L1 each prefetch holds one of the core's few L1 miss buffers for a DRAM round trip
 * (BenchmarkStepBatch, medians of alternating runs: 8 sessions 35.5 -> 25.9 ms; 1 and 4
 * sessions 17.5 -> 16.8 and 22.8 -> 20.9 ms, within noise). */
#define PF_AHEAD 6144
#endif

int64_t vx_qbytes(int dtype, int64_t n, int64_t k) {
	if (n <= 0)
		return 0;
	if (dtype == VX_Q8_0_R8)
		return (n + 7) / 8 * 8 * vx_qrow_bytes(VX_Q8_0, k);
	if (dtype == VX_F32_P || dtype == VX_F16_P)
		return k > 0 ? vx_f32p_rows(n) * k * (dtype == VX_F16_P ? 2 : 4) : 0;
	return n * vx_qrow_bytes(dtype, k);
}

void vx_repack_q8_0_r8(const void *src, void *dst, int64_t n, int64_t k) {
	const uint8_t *s = src;
	uint8_t *d = dst;
	int64_t nb = k / QK, rb = nb * QB;
	for (int64_t g = 0; g < (n + 7) / 8; g++)
		for (int64_t b = 0; b < nb; b++) {
			uint8_t *rec = d + (g * nb + b) * RB;
			for (int r = 0; r < 8; r++) {
				int64_t row = g * 8 + r;
				if (row >= n) { /* padding rows: scale 0, quants 0 */
					rec[2 * r] = rec[2 * r + 1] = 0;
					for (int c = 0; c < 4; c++)
						memset(rec + 16 + c * 64 + r * 8, 0x80, 8);
					continue;
				}
				const uint8_t *blk = s + row * rb + b * QB;
				rec[2 * r] = blk[0];
				rec[2 * r + 1] = blk[1];
				for (int c = 0; c < 4; c++)
					for (int j = 0; j < 8; j++)
						rec[16 + c * 64 + r * 8 + j] = blk[2 + c * 8 + j] ^ 0x80;
			}
		}
}

/* Dequantises rows [r0, r0+nr) of one 8-row group (nb block records) into dst (row stride k). */
static void dequant_r8(const uint8_t *grp, int64_t nb, int r0, int nr, float *dst, int64_t k) {
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *rec = grp + b * RB;
		for (int r = r0; r < r0 + nr; r++) {
			float d = half_f32(rd16(rec + 2 * r));
			float *o = dst + (r - r0) * k + b * QK;
			for (int c = 0; c < 4; c++)
				for (int j = 0; j < 8; j++)
					o[c * 8 + j] = (float)((int)rec[16 + c * 64 + r * 8 + j] - 128) * d;
		}
	}
}

/* ---- SIMD level ---- */

enum { LV_PORTABLE = 0, LV_AVX2 = 1, LV_VNNI = 2 };

static int level(void) {
#ifdef VX_QX86
	/* 0 unknown, else 1 | 2 (f16c) | 4 (avx512 bw+vl+vnni); racing threads store the same value */
	static int feat;
	int f = __atomic_load_n(&feat, __ATOMIC_RELAXED);
	if (f == 0) {
		__builtin_cpu_init();
		f = 1 | (__builtin_cpu_supports("f16c") ? 2 : 0) |
		    (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
		             __builtin_cpu_supports("avx512vnni")
		         ? 4
		         : 0);
		__atomic_store_n(&feat, f, __ATOMIC_RELAXED);
	}
	if (vx_use_avx512() && (f & 6) == 6)
		return LV_VNNI;
	if (vx_use_avx2() && (f & 2))
		return LV_AVX2;
#endif
	return LV_PORTABLE;
}

int vx_linear_q_vnni(void) { return level() == LV_VNNI; }

int vx_use_f16c(void) { return level() >= LV_AVX2; }

float vx_half_to_float(uint16_t h) { return half_f32(h); }

/* ---- dequantising rows ---- */

/* Q4_K: 144-byte super-blocks of 256 values (half d, half dmin, 12 bytes of packed 6-bit
 * scales and mins, 128 bytes of nibbles); value = (d*sc)*q - dmin*m with each product
 * rounded to float, as ggml (and engine/gguf's Go dequantiser) computes it. */
static void q4k_scale_min(const uint8_t *q, int j, uint8_t *sc, uint8_t *m) {
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
	}
}

static void dequant_q4_k(const uint8_t *s, float *d, int64_t k) {
	for (int64_t b = 0; b < k / 256; b++, s += 144, d += 256) {
		float dd = half_f32(rd16(s)), dmin = half_f32(rd16(s + 2));
		const uint8_t *sc = s + 4, *qs = s + 16;
		for (int c = 0; c < 4; c++) {
			uint8_t s0, m0, s1, m1;
			q4k_scale_min(sc, 2 * c, &s0, &m0);
			q4k_scale_min(sc, 2 * c + 1, &s1, &m1);
			/* -std=c11 keeps fp-contract off: no product is fused with the subtraction. */
			float d0 = dd * (float)s0, o0 = dmin * (float)m0, d1 = dd * (float)s1, o1 = dmin * (float)m1;
			const uint8_t *q = qs + 32 * c;
			for (int l = 0; l < 32; l++) {
				d[64 * c + l] = d0 * (float)(q[l] & 0xF) - o0;
				d[64 * c + 32 + l] = d1 * (float)(q[l] >> 4) - o1;
			}
		}
	}
}

static void dequant_portable(int dtype, const uint8_t *s, float *d, int64_t k) {
	if (dtype == VX_Q4_K) {
		dequant_q4_k(s, d, k);
		return;
	}
	if (dtype == VX_BF16) {
		for (int64_t i = 0; i < k; i++) {
			uint32_t bits = (uint32_t)rd16(s + 2 * i) << 16;
			memcpy(d + i, &bits, 4);
		}
		return;
	}
	if (dtype == VX_F16) {
		for (int64_t i = 0; i < k; i++)
			d[i] = half_f32(rd16(s + 2 * i));
		return;
	}
	for (int64_t b = 0; b < k / QK; b++, s += QB) {
		float sc = half_f32(rd16(s));
		const int8_t *q = (const int8_t *)(s + 2);
		for (int j = 0; j < QK; j++)
			d[b * QK + j] = (float)q[j] * sc;
	}
}

#ifdef VX_QX86
static QAVX2_FN void dequant_avx2(int dtype, const uint8_t *s, float *d, int64_t k) {
	if (dtype == VX_F16) {
		int64_t i = 0;
		for (; i + 8 <= k; i += 8)
			_mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
		for (; i < k; i++)
			d[i] = half_f32(rd16(s + 2 * i));
		return;
	}
	for (int64_t b = 0; b < k / QK; b++, s += QB) {
		__m256 sc = _mm256_cvtph_ps(_mm_set1_epi16((short)rd16(s)));
		for (int j = 0; j < QK; j += 8) {
			__m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + 2 + j)));
			_mm256_storeu_ps(d + b * QK + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), sc));
		}
	}
}

static QVNNI_FN void dequant_avx512(int dtype, const uint8_t *s, float *d, int64_t k) {
	if (dtype == VX_F16) {
		int64_t i = 0;
		for (; i + 16 <= k; i += 16)
			_mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * i))));
		for (; i < k; i++)
			d[i] = half_f32(rd16(s + 2 * i));
		return;
	}
	for (int64_t b = 0; b < k / QK; b++, s += QB) {
		__m512 sc = _mm512_cvtph_ps(_mm256_set1_epi16((short)rd16(s)));
		__m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + 2)));
		__m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + 18)));
		_mm512_storeu_ps(d + b * QK, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), sc));
		_mm512_storeu_ps(d + b * QK + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), sc));
	}
}
#endif

static void dequant_lv(int lv, int dtype, const void *src, float *dst, int64_t k) {
#ifdef VX_QX86
	if (dtype == VX_Q4_K || dtype == VX_BF16) {
		dequant_portable(dtype, src, dst, k); /* the compiler vectorises these loops */
		return;
	}
	if (lv == LV_VNNI) {
		dequant_avx512(dtype, src, dst, k);
		return;
	}
	if (lv == LV_AVX2) {
		dequant_avx2(dtype, src, dst, k);
		return;
	}
#endif
	(void)lv;
	dequant_portable(dtype, src, dst, k);
}

void vx_dequant_row(int dtype, const void *src, float *dst, int64_t k) { dequant_lv(level(), dtype, src, dst, k); }

/* ---- quantising x rows (Q8_0 decode) ---- */

/* Blocks of 32 values -> int8 q and f32 scale d with x ~ q*d; d = amax/127, q rounded to
 * nearest. The scale stays f32 (ggml rounds it to f16): a free bit of accuracy. */
static void quant_row(const float *x, int64_t k, int8_t *q, float *d, int32_t *sum) {
	for (int64_t b = 0; b < k / QK; b++) {
		const float *xb = x + b * QK;
		float amax = 0;
		for (int j = 0; j < QK; j++)
			amax = fmaxf(amax, fabsf(xb[j]));
		float id = amax > 0 ? 127.0f / amax : 0.0f;
		d[b] = amax / 127.0f;
		int32_t s = 0;
		for (int j = 0; j < QK; j++) {
			q[b * QK + j] = (int8_t)lrintf(xb[j] * id);
			s += q[b * QK + j];
		}
		sum[b] = s; /* the R8 kernel's correction: its weights are stored as q+128 */
	}
}

#ifdef VX_QX86
/* quant_row for AVX-512: cvtps_epi32 rounds to nearest even like lrintf in the default mode,
 * so both paths give the same bytes. */
static QVNNI_FN void quant_row_avx512(const float *x, int64_t k, int8_t *q, float *d, int32_t *sum) {
	for (int64_t b = 0; b < k / QK; b++) {
		__m512 a = _mm512_loadu_ps(x + b * QK), c = _mm512_loadu_ps(x + b * QK + 16);
		float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
		float id = amax > 0 ? 127.0f / amax : 0.0f;
		d[b] = amax / 127.0f;
		__m512 v = _mm512_set1_ps(id);
		__m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, v)), qc = _mm512_cvtps_epi32(_mm512_mul_ps(c, v));
		_mm_storeu_si128((__m128i *)(q + b * QK), _mm512_cvtepi32_epi8(qa));
		_mm_storeu_si128((__m128i *)(q + b * QK + 16), _mm512_cvtepi32_epi8(qc));
		sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
	}
}
#endif

/* ---- 8-row kernels (VX_Q8_0_R8): out[0..7] = the group's rows . one quantised x row ---- */

static void dot_r8_portable(const uint8_t *grp, const int8_t *xq, const float *xd, int64_t nb, float *out) {
	float acc[8] = {0};
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *rec = grp + b * RB;
		const int8_t *xb = xq + b * QK;
		for (int r = 0; r < 8; r++) {
			int32_t s = 0;
			for (int c = 0; c < 4; c++)
				for (int j = 0; j < 8; j++)
					s += ((int32_t)rec[16 + c * 64 + r * 8 + j] - 128) * xb[c * 8 + j];
			acc[r] += (float)s * (half_f32(rd16(rec + 2 * r)) * xd[b]);
		}
	}
	memcpy(out, acc, sizeof acc);
}

#ifdef VX_QX86
/* dequant_r8 for AVX-512: a row's 32 values of a block are its four 8-byte chunks. */
static QVNNI_FN void dequant_r8_avx512(const uint8_t *grp, int64_t nb, int nr, float *dst, int64_t k) {
	const __m128i flip = _mm_set1_epi8((char)0x80);
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *rec = grp + b * RB;
		for (int r = 0; r < nr; r++) {
			__m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)rd16(rec + 2 * r)));
			const uint8_t *q = rec + 16 + r * 8;
			__m128i a = _mm_xor_si128(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)q), _mm_loadl_epi64((const __m128i *)(q + 64))), flip);
			__m128i c = _mm_xor_si128(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(q + 128)), _mm_loadl_epi64((const __m128i *)(q + 192))), flip);
			float *o = dst + r * k + b * QK;
			_mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a)), d));
			_mm512_storeu_ps(o + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c)), d));
		}
	}
}

static inline int64_t ld64(const void *p) {
	int64_t v;
	memcpy(&v, p, 8);
	return v;
}
static inline double ldf64(const void *p) {
	double v;
	memcpy(&v, p, 8);
	return v;
}

/* load_r8_block loads a block record's four weight vectors and returns its scales, two lanes
 * a row, after prefetching the record PF_AHEAD bytes on (keeping several blocks in flight). */
static QVNNI_FN QINLINE __m512 load_r8_block(const uint8_t *rec, __m512i *w0, __m512i *w1, __m512i *w2, __m512i *w3) {
	if (PF_AHEAD > 0)
		for (int l = 0; l < RB; l += 64)
			_mm_prefetch((const char *)(rec + PF_AHEAD + l), _MM_HINT_T1);
	*w0 = _mm512_loadu_si512(rec + 16);
	*w1 = _mm512_loadu_si512(rec + 80);
	*w2 = _mm512_loadu_si512(rec + 144);
	*w3 = _mm512_loadu_si512(rec + 208);
	__m128i h = _mm_loadu_si128((const __m128i *)rec);
	return _mm512_cvtph_ps(_mm256_set_m128i(_mm_unpackhi_epi16(h, h), _mm_unpacklo_epi16(h, h)));
}

/* 512-bit lanes 2r and 2r+1 belong to row r: one dpbusd multiplies 8 rows by 8 x values. The
 * unsigned operand is the stored q+128, so each block starts its sum at -128*sum(x). Decode
 * (one x row) streams the weights once, prefetching ahead. */
static QVNNI_FN void dot_r8_vnni(const uint8_t *grp, const int8_t *xq, const float *xd, const int32_t *xs,
                                 int64_t nb, float *out) {
	__m512 acc = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		__m512i w0, w1, w2, w3;
		__m512 sw = load_r8_block(grp + b * RB, &w0, &w1, &w2, &w3);
		const int8_t *xb = xq + b * QK;
		__m512i s0 = _mm512_maskz_set1_epi32(0x5555, -128 * xs[b]);
		__m512i s1 = _mm512_setzero_si512();
		s0 = _mm512_dpbusd_epi32(s0, w0, _mm512_set1_epi64(ld64(xb)));
		s1 = _mm512_dpbusd_epi32(s1, w1, _mm512_set1_epi64(ld64(xb + 8)));
		s0 = _mm512_dpbusd_epi32(s0, w2, _mm512_set1_epi64(ld64(xb + 16)));
		s1 = _mm512_dpbusd_epi32(s1, w3, _mm512_set1_epi64(ld64(xb + 24)));
		__m512 sc = _mm512_mul_ps(sw, _mm512_set1_ps(xd[b]));
		/* Pair the row's two lanes in integers: the -128*sum(x) offset sits in one of them,
		 * and scaling them apart would round away the small difference. */
		__m512i si = _mm512_add_epi32(s0, s1);
		si = _mm512_add_epi32(si, _mm512_shuffle_epi32(si, _MM_PERM_CDAB));
		acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), sc, acc);
	}
	float t[16];
	_mm512_storeu_ps(t, acc);
	for (int r = 0; r < 8; r++)
		out[r] = t[2 * r];
}

/* Several x rows (batched decode, prefill) share each load of the group's weights, two at a
 * time: after the dot products, x row a's sums for row r sit in lanes 2r and 2r+1 of sa and
 * row b's in sb; two masked shuffles gather a's pair sum into lane 2r and b's into lane 2r+1,
 * so one conversion and one multiply-add per block serve both rows. The scales and offsets of
 * the pair come interleaved (xdp, xsp: [nb][2] per pair, offsets already -128*sum(x)); every
 * sum is the same integer as dot_r8_vnni's, so each x row's result is bit for bit the one it
 * gets alone. np pairs (rows 2np, row stride k). */
static QVNNI_FN QINLINE void dot_r8_vnni_pairs(const uint8_t *grp, const int8_t *xq, int64_t k, const float *xdp,
                                                const int32_t *xsp, int64_t nb, const int np, float *out) {
	__m512 acc[4];
	for (int p = 0; p < np; p++)
		acc[p] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		__m512i w0, w1, w2, w3;
		__m512 sw = load_r8_block(grp + b * RB, &w0, &w1, &w2, &w3);
		for (int p = 0; p < np; p++) {
			const int8_t *xa = xq + 2 * p * k + b * QK, *xb = xa + k;
			__m512i sa = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, _mm512_set1_epi64(ld64(xa)));
			__m512i sb = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, _mm512_set1_epi64(ld64(xb)));
			sa = _mm512_dpbusd_epi32(sa, w1, _mm512_set1_epi64(ld64(xa + 8)));
			sb = _mm512_dpbusd_epi32(sb, w1, _mm512_set1_epi64(ld64(xb + 8)));
			sa = _mm512_dpbusd_epi32(sa, w2, _mm512_set1_epi64(ld64(xa + 16)));
			sb = _mm512_dpbusd_epi32(sb, w2, _mm512_set1_epi64(ld64(xb + 16)));
			sa = _mm512_dpbusd_epi32(sa, w3, _mm512_set1_epi64(ld64(xa + 24)));
			sb = _mm512_dpbusd_epi32(sb, w3, _mm512_set1_epi64(ld64(xb + 24)));
			__m512i u = _mm512_mask_shuffle_epi32(sa, 0xAAAA, sb, _MM_PERM_CDAB);
			__m512i v = _mm512_mask_shuffle_epi32(sb, 0x5555, sa, _MM_PERM_CDAB);
			int64_t o = (p * nb + b) * 2;
			__m512i si = _mm512_add_epi32(_mm512_add_epi32(u, v), _mm512_set1_epi64(ld64(xsp + o)));
			__m512 sc = _mm512_mul_ps(sw, _mm512_castpd_ps(_mm512_set1_pd(ldf64(xdp + o))));
			acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), sc, acc[p]);
		}
	}
	for (int p = 0; p < np; p++) {
		float t[16];
		_mm512_storeu_ps(t, acc[p]);
		for (int r = 0; r < 8; r++) {
			out[2 * p * 8 + r] = t[2 * r];
			out[(2 * p + 1) * 8 + r] = t[2 * r + 1];
		}
	}
}
static QVNNI_FN void dot_r8_vnni_2(const uint8_t *grp, const int8_t *xq, int64_t k, const float *xdp,
                                   const int32_t *xsp, int64_t nb, float *out) {
	dot_r8_vnni_pairs(grp, xq, k, xdp, xsp, nb, 1, out);
}
static QVNNI_FN void dot_r8_vnni_4(const uint8_t *grp, const int8_t *xq, int64_t k, const float *xdp,
                                   const int32_t *xsp, int64_t nb, float *out) {
	dot_r8_vnni_pairs(grp, xq, k, xdp, xsp, nb, 2, out);
}
static QVNNI_FN void dot_r8_vnni_8(const uint8_t *grp, const int8_t *xq, int64_t k, const float *xdp,
                                   const int32_t *xsp, int64_t nb, float *out) {
	dot_r8_vnni_pairs(grp, xq, k, xdp, xsp, nb, 4, out);
}

/* AVX2: rows 0-3 in one register, 4-7 in another; the quants are flipped back to signed and
 * multiplied with the |w| x sign(w)*x trick (maddubs). */
static QAVX2_FN void dot_r8_avx2(const uint8_t *grp, const int8_t *xq, const float *xd, int64_t nb, float *out) {
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *rec = grp + b * RB;
		const int8_t *xb = xq + b * QK;
		__m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
		for (int c = 0; c < 4; c++) {
			__m256i xv = _mm256_set1_epi64x(ld64(xb + 8 * c));
			__m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + 16 + 64 * c)), flip);
			__m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + 48 + 64 * c)), flip);
			s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(xv, w0)), ones));
			s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(xv, w1)), ones));
		}
		__m128i h = _mm_loadu_si128((const __m128i *)rec);
		__m256 dx = _mm256_set1_ps(xd[b]);
		__m256 sc0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpacklo_epi16(h, h)), dx);
		__m256 sc1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpackhi_epi16(h, h)), dx);
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), sc0, acc0);
		acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), sc1, acc1);
	}
	float t[16];
	_mm256_storeu_ps(t, acc0);
	_mm256_storeu_ps(t + 8, acc1);
	for (int r = 0; r < 8; r++)
		out[r] = t[2 * r] + t[2 * r + 1];
}
#endif

/* ---- dot kernels: out[r] = row r of W (r < nr) . one x row ---- */

static void dot_q8_portable(const uint8_t *w, int64_t rb, int nr, const int8_t *xq, const float *xd,
                            int64_t nb, float *out) {
	for (int r = 0; r < nr; r++) {
		const uint8_t *blk = w + r * rb;
		float acc = 0;
		for (int64_t b = 0; b < nb; b++, blk += QB) {
			const int8_t *q = (const int8_t *)(blk + 2), *xb = xq + b * QK;
			int32_t s = 0;
			for (int j = 0; j < QK; j++)
				s += (int32_t)q[j] * xb[j];
			acc += (float)s * (half_f32(rd16(blk)) * xd[b]);
		}
		out[r] = acc;
	}
}

static void dot_f16_portable(const uint8_t *w, int64_t rb, int nr, const float *x, int64_t k, float *out) {
	for (int r = 0; r < nr; r++) {
		const uint8_t *row = w + r * rb;
		float acc = 0;
		for (int64_t i = 0; i < k; i++)
			acc += half_f32(rd16(row + 2 * i)) * x[i];
		out[r] = acc;
	}
}

#ifdef VX_QX86
static inline QAVX2_FN float hsum256(__m256 v) {
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* AVX2: |w| (unsigned) x sign(w)*x (signed) with maddubs; pairs stay below 2*127*127, so the
 * int16 sums never saturate. */
static QAVX2_FN QINLINE void dot_q8_avx2_n(const uint8_t *w, int64_t rb, const int nr, const int8_t *xq,
                                            const float *xd, int64_t nb, float *out) {
	__m256 acc[ROWS];
	const __m256i ones = _mm256_set1_epi16(1);
	for (int r = 0; r < nr; r++)
		acc[r] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		__m256i xv = _mm256_loadu_si256((const __m256i *)(xq + b * QK));
		__m256 dx = _mm256_set1_ps(xd[b]);
		for (int r = 0; r < nr; r++) {
			const uint8_t *blk = w + r * rb + b * QB;
			__m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
			__m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
			__m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
			__m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16((short)rd16(blk))), dx);
			acc[r] = _mm256_fmadd_ps(s, d, acc[r]);
		}
	}
	for (int r = 0; r < nr; r++)
		out[r] = hsum256(acc[r]);
}
static QAVX2_FN void dot_q8_avx2_4(const uint8_t *w, int64_t rb, const int8_t *xq, const float *xd, int64_t nb, float *out) {
	dot_q8_avx2_n(w, rb, ROWS, xq, xd, nb, out);
}
static QAVX2_FN void dot_q8_avx2_1(const uint8_t *w, int64_t rb, const int8_t *xq, const float *xd, int64_t nb, float *out) {
	dot_q8_avx2_n(w, rb, 1, xq, xd, nb, out);
}

/* AVX-512 VNNI: dpbusd does the |w| x sign(w)*x products and their sums in one instruction
 * with int32 accumulation. */
static QVNNI_FN QINLINE void dot_q8_vnni_n(const uint8_t *w, int64_t rb, const int nr, const int8_t *xq,
                                            const float *xd, int64_t nb, float *out) {
	__m256 acc[ROWS];
	for (int r = 0; r < nr; r++)
		acc[r] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		__m256i xv = _mm256_loadu_si256((const __m256i *)(xq + b * QK));
		__m256 dx = _mm256_set1_ps(xd[b]);
		for (int r = 0; r < nr; r++) {
			const uint8_t *blk = w + r * rb + b * QB;
			__m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
			__m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
			__m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16((short)rd16(blk))), dx);
			acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[r]);
		}
	}
	for (int r = 0; r < nr; r++)
		out[r] = hsum256(acc[r]);
}
static QVNNI_FN void dot_q8_vnni_4(const uint8_t *w, int64_t rb, const int8_t *xq, const float *xd, int64_t nb, float *out) {
	dot_q8_vnni_n(w, rb, ROWS, xq, xd, nb, out);
}
static QVNNI_FN void dot_q8_vnni_1(const uint8_t *w, int64_t rb, const int8_t *xq, const float *xd, int64_t nb, float *out) {
	dot_q8_vnni_n(w, rb, 1, xq, xd, nb, out);
}

static QAVX2_FN QINLINE void dot_f16_avx2_n(const uint8_t *w, int64_t rb, const int nr, const float *x, int64_t k, float *out) {
	__m256 acc[ROWS];
	for (int r = 0; r < nr; r++)
		acc[r] = _mm256_setzero_ps();
	int64_t i = 0;
	for (; i + 8 <= k; i += 8) {
		__m256 xv = _mm256_loadu_ps(x + i);
		for (int r = 0; r < nr; r++)
			acc[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + r * rb + 2 * i))), xv, acc[r]);
	}
	for (int r = 0; r < nr; r++) {
		float s = hsum256(acc[r]);
		for (int64_t j = i; j < k; j++)
			s += half_f32(rd16(w + r * rb + 2 * j)) * x[j];
		out[r] = s;
	}
}
static QAVX2_FN void dot_f16_avx2_4(const uint8_t *w, int64_t rb, const float *x, int64_t k, float *out) {
	dot_f16_avx2_n(w, rb, ROWS, x, k, out);
}
static QAVX2_FN void dot_f16_avx2_1(const uint8_t *w, int64_t rb, const float *x, int64_t k, float *out) {
	dot_f16_avx2_n(w, rb, 1, x, k, out);
}

static QVNNI_FN QINLINE void dot_f16_avx512_n(const uint8_t *w, int64_t rb, const int nr, const float *x, int64_t k, float *out) {
	__m512 acc[ROWS];
	for (int r = 0; r < nr; r++)
		acc[r] = _mm512_setzero_ps();
	int64_t i = 0;
	for (; i + 16 <= k; i += 16) {
		__m512 xv = _mm512_loadu_ps(x + i);
		for (int r = 0; r < nr; r++)
			acc[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + r * rb + 2 * i))), xv, acc[r]);
	}
	for (int r = 0; r < nr; r++) {
		float s = _mm512_reduce_add_ps(acc[r]);
		for (int64_t j = i; j < k; j++)
			s += half_f32(rd16(w + r * rb + 2 * j)) * x[j];
		out[r] = s;
	}
}
static QVNNI_FN void dot_f16_avx512_4(const uint8_t *w, int64_t rb, const float *x, int64_t k, float *out) {
	dot_f16_avx512_n(w, rb, ROWS, x, k, out);
}
static QVNNI_FN void dot_f16_avx512_1(const uint8_t *w, int64_t rb, const float *x, int64_t k, float *out) {
	dot_f16_avx512_n(w, rb, 1, x, k, out);
}
#endif

/* ---- the op ---- */

typedef struct {
	int dtype, lv;
	int64_t M, N, K, rb, nb;
	const uint8_t *w;
	const float *x, *bias;
	float *y;
	const int8_t *xq; /* Q8_0 decode: x rows quantised, M x nb*QK */
	const float *xd;  /* and their scales, M x nb */
	const int32_t *xs; /* and their block sums, M x nb */
	const float *xdp;  /* VNNI, M >= 2: rows 2p and 2p+1's scales interleaved, [M/2][nb][2] */
	const int32_t *xsp; /* and their block sums times -128, likewise */
	int64_t chunk;    /* W rows per task (decode) or per panel (prefill) */
	int64_t npanel, mparts;
	const vx_epi *epi;
	vx_ctx *ctx;
} lq_job;

static void dot_rows(const lq_job *j, const uint8_t *w, int nr, int64_t m, float *out) {
#ifdef VX_QX86
	if (j->dtype == VX_Q8_0) {
		const int8_t *xq = j->xq + m * j->nb * QK;
		const float *xd = j->xd + m * j->nb;
		if (j->lv == LV_VNNI) {
			if (nr == ROWS)
				dot_q8_vnni_4(w, j->rb, xq, xd, j->nb, out);
			else
				for (int r = 0; r < nr; r++)
					dot_q8_vnni_1(w + r * j->rb, j->rb, xq, xd, j->nb, out + r);
			return;
		}
		if (j->lv == LV_AVX2) {
			if (nr == ROWS)
				dot_q8_avx2_4(w, j->rb, xq, xd, j->nb, out);
			else
				for (int r = 0; r < nr; r++)
					dot_q8_avx2_1(w + r * j->rb, j->rb, xq, xd, j->nb, out + r);
			return;
		}
	} else {
		const float *x = j->x + m * j->K;
		if (j->lv == LV_VNNI) {
			if (nr == ROWS)
				dot_f16_avx512_4(w, j->rb, x, j->K, out);
			else
				for (int r = 0; r < nr; r++)
					dot_f16_avx512_1(w + r * j->rb, j->rb, x, j->K, out + r);
			return;
		}
		if (j->lv == LV_AVX2) {
			if (nr == ROWS)
				dot_f16_avx2_4(w, j->rb, x, j->K, out);
			else
				for (int r = 0; r < nr; r++)
					dot_f16_avx2_1(w + r * j->rb, j->rb, x, j->K, out + r);
			return;
		}
	}
#endif
	if (j->dtype == VX_Q8_0)
		dot_q8_portable(w, j->rb, nr, j->xq + m * j->nb * QK, j->xd + m * j->nb, j->nb, out);
	else
		dot_f16_portable(w, j->rb, nr, j->x + m * j->K, j->K, out);
}

static void small_task(void *p, int64_t i) {
	const lq_job *j = p;
	int64_t n0 = i * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
	float out[ROWS];
	for (int64_t r = n0; r < n1; r += ROWS) {
		int nr = (int)(n1 - r < ROWS ? n1 - r : ROWS);
		/* Every x row against this group of W rows while they are in cache. */
		for (int64_t m = 0; m < j->M; m++) {
			dot_rows(j, j->w + r * j->rb, nr, m, out);
			float *y = j->y + m * j->N + r;
			for (int q = 0; q < nr; q++)
				y[q] = out[q] + (j->bias ? j->bias[r + q] : 0.0f);
		}
	}
	vx_epi_apply(j->epi, j->y, j->N, 0, j->M, n0, n1);
}

static void small_task_r8(void *p, int64_t i) {
	const lq_job *j = p;
	int64_t g0 = i * j->chunk / 8, g1 = (i + 1) * j->chunk / 8, ng = (j->N + 7) / 8;
	if (g1 > ng)
		g1 = ng;
	float out[8 * 8] = {0}; /* zeroed once per task: only for GCC's -Wmaybe-uninitialized, a
	                         * false alarm in the portable-only (arm64, VX_NO_SIMD) build */
	for (int64_t g = g0; g < g1; g++) {
		const uint8_t *grp = j->w + g * j->nb * RB;
		int nr = (int)(j->N - g * 8 < 8 ? j->N - g * 8 : 8);
		for (int64_t m = 0; m < j->M;) {
			const int8_t *xq = j->xq + m * j->nb * QK;
			const float *xd = j->xd + m * j->nb;
			int mr = 1;
#ifdef VX_QX86
			if (j->lv == LV_VNNI && j->M - m >= 2) { /* m is even here: rows go 8, 4, 2 at a time */
				const float *xdp = j->xdp + m * j->nb;
				const int32_t *xsp = j->xsp + m * j->nb;
				mr = j->M - m >= 8 ? 8 : j->M - m >= 4 ? 4 : 2;
				if (mr == 8)
					dot_r8_vnni_8(grp, xq, j->K, xdp, xsp, j->nb, out);
				else if (mr == 4)
					dot_r8_vnni_4(grp, xq, j->K, xdp, xsp, j->nb, out);
				else
					dot_r8_vnni_2(grp, xq, j->K, xdp, xsp, j->nb, out);
			} else if (j->lv == LV_VNNI)
				dot_r8_vnni(grp, xq, xd, j->xs + m * j->nb, j->nb, out);
			else if (j->lv == LV_AVX2)
				dot_r8_avx2(grp, xq, xd, j->nb, out);
			else
#endif
				dot_r8_portable(grp, xq, xd, j->nb, out);
			for (int i = 0; i < mr; i++, m++) {
				float *y = j->y + m * j->N + g * 8;
				for (int q = 0; q < nr; q++)
					y[q] = out[i * 8 + q] + (j->bias ? j->bias[g * 8 + q] : 0.0f);
			}
		}
	}
	vx_epi_apply(j->epi, j->y, j->N, 0, j->M, g0 * 8, g1 * 8 < j->N ? g1 * 8 : j->N);
}

static void panel_task(void *p, int64_t i) {
	const lq_job *j = p;
	int64_t pi = i % j->npanel, mi = i / j->npanel;
	int64_t n0 = pi * j->chunk, nr = j->N - n0 < j->chunk ? j->N - n0 : j->chunk;
	int64_t m0 = j->M * mi / j->mparts, m1 = j->M * (mi + 1) / j->mparts;
	if (m1 <= m0 || nr <= 0)
		return;
	float *panel = vx_scratch(j->ctx, vx_thread_id(), nr * j->K * 4); /* grown before the loop */
	if (j->dtype == VX_Q8_0_R8) { /* n0 is a multiple of 8: whole groups but maybe the last */
		for (int64_t r = 0; r < nr; r += 8) {
			const uint8_t *grp = j->w + (n0 + r) / 8 * j->nb * RB;
			int gr = (int)(nr - r < 8 ? nr - r : 8);
#ifdef VX_QX86
			if (j->lv == LV_VNNI) {
				dequant_r8_avx512(grp, j->nb, gr, panel + r * j->K, j->K);
				continue;
			}
#endif
			dequant_r8(grp, j->nb, 0, gr, panel + r * j->K, j->K);
		}
	} else {
		for (int64_t r = 0; r < nr; r++)
			dequant_lv(j->lv, j->dtype, j->w + (n0 + r) * j->rb, panel + r * j->K, j->K);
	}
	float *y = j->y + m0 * j->N + n0;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(m1 - m0), (int)nr, (int)j->K, 1.0f,
	            j->x + m0 * j->K, (int)j->K, panel, (int)j->K, 0.0f, y, (int)j->N);
	if (j->bias)
		for (int64_t m = m0; m < m1; m++)
			for (int64_t r = 0; r < nr; r++)
				j->y[m * j->N + n0 + r] += j->bias[n0 + r];
	vx_epi_apply(j->epi, j->y, j->N, m0, m1, n0, n0 + nr);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int vx_k_linear_q(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *w = vx_src(node, t, 1), *y = &t[node->dst];
	vx_epi epi;
	int n_src, rc = vx_epi_parse(node, t, y, &n_src, &epi);
	if (rc != VX_OK)
		return rc;
	const vx_tensor *b = n_src == 3 ? vx_src(node, t, 2) : NULL;
	if (n_src < 2 || n_src > 3 || !vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || !w ||
	    (w->dtype != VX_Q8_0 && w->dtype != VX_F16 && w->dtype != VX_Q8_0_R8 && w->dtype != VX_Q4_K &&
	     w->dtype != VX_BF16 && w->dtype != VX_F32_P && w->dtype != VX_F16_P) || w->ndim != 2 || !w->data)
		return VX_ERR_BAD_SHAPE;
	if (x->ndim < 1 || y->ndim < 1 || !vx_is_contiguous(x) || !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	int64_t N = w->shape[0], K = w->shape[1], M = K > 0 ? vx_numel(x) / K : 0;
	int r8 = w->dtype == VX_Q8_0_R8;
	int panels = w->dtype == VX_F32_P || w->dtype == VX_F16_P;
	int64_t rb = panels ? 4 * K : vx_qrow_bytes(r8 ? VX_Q8_0 : w->dtype, K);
	/* y's leading dims may group the M rows differently (a fused epilogue's output). */
	if (rb == 0 || N <= 0 || x->shape[x->ndim - 1] != K || y->shape[y->ndim - 1] != N || vx_numel(y) != M * N)
		return VX_ERR_BAD_SHAPE;
	if (b && (!vx_tensor_ok(b, VX_F32) || vx_numel(b) != N || !vx_is_contiguous(b)))
		return VX_ERR_BAD_SHAPE;
	if (M == 0)
		return VX_OK;
	/* ip[0]: the rows are this many independent groups (sessions batched together); the
	 * kernel is chosen by one group's rows, so each group's results are those it gets alone. */
	int64_t row_groups = node->ip[0] > 1 ? node->ip[0] : 1;
	if (panels)
		return vx_linear_f32p(ctx, x->data, w->data, w->dtype, b ? b->data : NULL, y->data, M, N, K, row_groups,
		                      epi.n ? &epi : NULL);
	int nt = vx_ctx_threads(ctx);
	lq_job j = {.dtype = w->dtype, .lv = level(), .M = M, .N = N, .K = K, .rb = rb, .nb = K / QK,
	            .w = w->data, .x = x->data, .bias = b ? b->data : NULL, .y = y->data, .ctx = ctx,
	            .epi = epi.n ? &epi : NULL};
	double work = (double)M * (double)N * (double)K;
	/* Q8_0R8 on VNNI: the int8 kernel for prefill too (4 dpbusd per 256 MACs outrun sgemm on
	 * widened panels about 2x). */
	/* Q4_K and BF16 have no dot kernels: their W panels are widened for sgemm at any M. */
	int widen = w->dtype == VX_Q4_K || w->dtype == VX_BF16;
	if (!widen && (M <= SMALL_M * row_groups || (r8 && j.lv == LV_VNNI))) {
		if (j.dtype != VX_F16) {
			int64_t qb = (M * K + 63) & ~(int64_t)63;
			int8_t *xq = vx_scratch(ctx, VX_SCRATCH_SHARED, qb + M * j.nb * 16);
			if (!xq)
				return VX_ERR_NOMEM;
			float *xd = (float *)(xq + qb);
			int32_t *xs = (int32_t *)(xd + M * j.nb);
			float *xdp = (float *)(xs + M * j.nb);
			int32_t *xsp = (int32_t *)(xdp + M * j.nb);
			for (int64_t m = 0; m < M; m++) {
#ifdef VX_QX86
				if (j.lv == LV_VNNI) {
					quant_row_avx512(j.x + m * K, K, xq + m * K, xd + m * j.nb, xs + m * j.nb);
					continue;
				}
#endif
				quant_row(j.x + m * K, K, xq + m * K, xd + m * j.nb, xs + m * j.nb);
			}
			j.xq = xq;
			j.xd = xd;
			j.xs = xs;
			if (r8 && j.lv == LV_VNNI) /* the pair kernels' interleaved scales and offsets */
				for (int64_t m = 0; m + 1 < M; m += 2)
					for (int64_t b = 0; b < j.nb; b++)
						for (int i = 0; i < 2; i++) {
							xdp[(m * j.nb + 2 * b) + i] = xd[(m + i) * j.nb + b];
							xsp[(m * j.nb + 2 * b) + i] = -128 * xs[(m + i) * j.nb + b];
						}
			j.xdp = xdp;
			j.xsp = xsp;
		}
		if (r8) { /* whole 8-row groups per task */
			int64_t groups = cdiv(N, 8);
			int64_t tasks = work < 65536.0 || nt == 1 ? 1 : (groups < 4 * nt ? groups : 4 * nt);
			j.chunk = cdiv(groups, tasks) * 8;
			tasks = cdiv(N, j.chunk);
			if (tasks == 1)
				small_task_r8(&j, 0);
			else
				vx_parallel_for(ctx, tasks, small_task_r8, &j);
			return VX_OK;
		}
		int64_t groups = cdiv(N, ROWS);
		int64_t tasks = work < 65536.0 || nt == 1 ? 1 : (groups < 4 * nt ? groups : 4 * nt);
		j.chunk = cdiv(groups, tasks) * ROWS;
		tasks = cdiv(N, j.chunk);
		if (tasks == 1)
			small_task(&j, 0);
		else
			vx_parallel_for(ctx, tasks, small_task, &j);
		return VX_OK;
	}
	/* Panels of ~1 MiB of f32 (256 rows at K=1024), at least two per thread. */
	int64_t pr = (1 << 18) / K;
	pr = pr < 16 ? 16 : pr > 256 ? 256 : pr / 16 * 16; /* multiples of 16 keep R8 groups whole */
	int64_t fair = cdiv(cdiv(N, 2 * nt), 16) * 16;
	j.chunk = pr < fair ? pr : fair;
	j.npanel = cdiv(N, j.chunk);
	j.mparts = j.npanel >= 2 * nt ? 1 : (M / 16 > 1 ? (M / 16 < 2 * nt ? M / 16 : 2 * nt) : 1);
	rc = VX_OK;
	for (int i = 0; i < nt; i++)
		if (!vx_scratch(ctx, i, j.chunk * K * 4))
			rc = VX_ERR_NOMEM;
	if (rc != VX_OK)
		return rc;
	int64_t tasks = j.npanel * j.mparts;
	if (tasks == 1 || nt == 1) {
		for (int64_t i = 0; i < tasks; i++)
			panel_task(&j, i);
	} else {
		vx_parallel_for(ctx, tasks, panel_task, &j);
	}
	return VX_OK;
}

/* ---- encoding weights (voxpipe import) ----
 * vx_encode turns a checkpoint's little-endian f32/f16/bf16 bytes straight into the stored
 * type of a GGUF tensor (f32, f16, bf16, q8_0), bit for bit what engine/ggufpack's Go
 * encoders write for the float32 values engine/ckpt decodes (the same bytes, 10-20 times
 * faster, no float32 copy in between). The portable code below is that Go code in C,
 * special cases included; the AVX2 paths take it for every block or element they do not
 * handle exactly themselves (a q8_0 block holding NaN, Inf or only tiny values). */

static inline uint32_t rd32(const uint8_t *p) {
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint32_t f2u(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}
static inline float u2f(uint32_t u) {
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Element i of a little-endian source of type from, as engine/ckpt decodes it (a half's
 * signalling NaN stays signalling). */
static inline float src_elem(int from, const uint8_t *s, int64_t i) {
	if (from == VX_F16)
		return half_f32(rd16(s + 2 * i));
	if (from == VX_BF16)
		return u2f((uint32_t)rd16(s + 2 * i) << 16);
	return u2f(rd32(s + 4 * i));
}

/* engine/gguf.Float32ToHalf: round to nearest even, beyond the range ±Inf, NaN as
 * sign | 0x7e00 | the top mantissa bits. */
static uint16_t f32_half(float f) {
	uint32_t b = f2u(f), mant = b & 0x7fffff;
	uint16_t sign = (uint16_t)(b >> 16) & 0x8000;
	int exp = (int)(b >> 23) & 0xff;
	if (exp == 0xff)
		return mant ? (uint16_t)(sign | 0x7e00 | (mant >> 13)) : (uint16_t)(sign | 0x7c00);
	int e = exp - 127 + 15;
	if (e >= 0x1f)
		return sign | 0x7c00;
	if (e <= 0) {
		if (e < -10)
			return sign;
		uint32_t m = mant | 0x800000, shift = (uint32_t)(14 - e), h = m >> shift, rem = m & ((1u << shift) - 1),
		         halfway = 1u << (shift - 1);
		if (rem > halfway || (rem == halfway && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = (uint32_t)e << 10 | mant >> 13, rem = mant & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

/* engine/ggufpack.Float32ToBF16 (ggml's): round to nearest even, NaN kept quiet. */
static inline uint16_t f32_bf16(uint32_t u) {
	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 64);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* Go's max(x, y) for float32 as the Go compiler emits it, NaN payloads included (they reach
 * a q8_0 block's scale): amd64 -(m2 | m1) with m1 = MINSS(-x, -y), m2 = MINSS(m1, -x);
 * arm64 FMAXS; elsewhere the runtime's fmax. */
static inline float go_max32(float x, float y) {
#if defined(__x86_64__)
	float a = u2f(f2u(x) ^ 0x80000000u), b = u2f(f2u(y) ^ 0x80000000u);
	float m1 = a < b ? a : b; /* MINSS: the second operand when either is NaN */
	float m2 = m1 < a ? m1 : a;
	return u2f((f2u(m2) | f2u(m1)) ^ 0x80000000u);
#elif defined(__aarch64__)
	float r;
	__asm__("fmax %s0, %s1, %s2" : "=w"(r) : "w"(x), "w"(y));
	return r;
#else
	if (y != y || y > x)
		return y;
	if (x != x || x > y || x != 0)
		return x;
	return u2f(f2u(x) & f2u(y));
#endif
}

/* A q8_0 quant as the Go encoder computes it: int8(int32(float64(p) + copysign(0.5, p)))
 * (half away from zero); the conversion of a value int32 cannot hold is the machine's
 * (amd64 CVTTSD2SL: INT32_MIN; arm64 FCVTZS: saturated, NaN 0). */
static inline uint8_t q8_quant(float p) {
	double v = (double)p;
	v += copysign(0.5, v);
	int32_t q;
#if defined(__aarch64__)
	if (v != v)
		q = 0;
	else if (v >= 2147483648.0)
		q = INT32_MAX;
	else if (v <= -2147483649.0)
		q = INT32_MIN;
	else
		q = (int32_t)v;
#else
	if (v > -2147483649.0 && v < 2147483648.0)
		q = (int32_t)v;
	else
		q = INT32_MIN;
#endif
	return (uint8_t)q;
}

/* One q8_0 block (32 values of type from at s) as ggufpack's appendQ8_0 writes it. */
static void q8_block_ref(int from, const uint8_t *s, uint8_t *blk) {
	float x[QK], amax = 0;
	for (int j = 0; j < QK; j++) {
		x[j] = src_elem(from, s, j);
		amax = go_max32(amax, u2f(f2u(x[j]) & 0x7fffffff));
	}
	float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
	uint16_t h = f32_half(d);
	blk[0] = (uint8_t)h;
	blk[1] = (uint8_t)(h >> 8);
	for (int j = 0; j < QK; j++)
		blk[2 + j] = q8_quant(x[j] * id);
}

static void encode_portable(int from, int to, const uint8_t *s, uint8_t *d, int64_t n) {
	int es = from == VX_F32 ? 4 : 2;
	switch (to) {
	case VX_Q8_0:
		for (int64_t b = 0; b < n / QK; b++)
			q8_block_ref(from, s + b * QK * es, d + b * QB);
		break;
	case VX_F16:
		for (int64_t i = 0; i < n; i++) {
			uint16_t h = f32_half(src_elem(from, s, i));
			d[2 * i] = (uint8_t)h;
			d[2 * i + 1] = (uint8_t)(h >> 8);
		}
		break;
	case VX_BF16:
		for (int64_t i = 0; i < n; i++) {
			uint16_t h = f32_bf16(f2u(src_elem(from, s, i)));
			d[2 * i] = (uint8_t)h;
			d[2 * i + 1] = (uint8_t)(h >> 8);
		}
		break;
	case VX_F32:
		for (int64_t i = 0; i < n; i++) {
			uint32_t u = f2u(src_elem(from, s, i));
			d[4 * i] = (uint8_t)u;
			d[4 * i + 1] = (uint8_t)(u >> 8);
			d[4 * i + 2] = (uint8_t)(u >> 16);
			d[4 * i + 3] = (uint8_t)(u >> 24);
		}
		break;
	}
}

#ifdef VX_QX86
/* 8 source values as floats: f32 loaded, bf16 shifted, f16 by vcvtph2ps (which quiets a
 * signalling NaN: callers that keep NaN bits take them from the source instead). */
static QAVX2_FN QINLINE __m256 enc_load8(int from, const uint8_t *p) {
	if (from == VX_F32)
		return _mm256_loadu_ps((const float *)p);
	__m128i h = _mm_loadu_si128((const __m128i *)p);
	if (from == VX_BF16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	return _mm256_cvtph_ps(h);
}

/* Q8_0 blocks, 8 values per register. A block whose largest magnitude a is finite and at
 * least 2^-101 takes the fast path: the scale d = a/127 is then a normal float, 1/d is finite
 * and every product x·(1/d) is within 127·(1+2^-24)^3 of zero, so rounding it half away from
 * zero in float32 (truncate, then step away from zero when the dropped fraction is >= 1/2,
 * both exact) gives the Go encoder's quant and the saturating packs never saturate. Other
 * blocks (zeros, denormals, NaN, Inf) go to q8_block_ref. */
static QAVX2_FN void encode_q8_avx2(int from, const uint8_t *s, uint8_t *d, int64_t nb) {
	const int es = from == VX_F32 ? 4 : 2;
	const __m256i absm = _mm256_set1_epi32(0x7fffffff), perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	const __m256 signm = _mm256_set1_ps(-0.0f), halfv = _mm256_set1_ps(0.5f), onev = _mm256_set1_ps(1.0f);
	for (int64_t b = 0; b < nb; b++, s += QK * es, d += QB) {
		__m256 x[4];
		__m256i m = _mm256_setzero_si256();
		for (int k = 0; k < 4; k++) {
			x[k] = enc_load8(from, s + 8 * k * es);
			m = _mm256_max_epi32(m, _mm256_and_si256(_mm256_castps_si256(x[k]), absm));
		}
		__m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
		m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
		m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xb1));
		uint32_t ab = (uint32_t)_mm_cvtsi128_si32(m4); /* bits of the largest |x|, a NaN's if any */
		if (ab - 0x0d000000u >= 0x7f800000u - 0x0d000000u) {
			q8_block_ref(from, s, d);
			continue;
		}
		float dd = u2f(ab) / 127.0f, id = 1.0f / dd;
		/* dd is a normal float: vcvtps2ph rounds it as f32_half does */
		uint16_t h = (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(dd), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0);
		d[0] = (uint8_t)h;
		d[1] = (uint8_t)(h >> 8);
		__m256 vid = _mm256_set1_ps(id);
		__m256i q[4];
		for (int k = 0; k < 4; k++) {
			__m256 p = _mm256_mul_ps(x[k], vid);
			__m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
			__m256 frac = _mm256_andnot_ps(signm, _mm256_sub_ps(p, t));
			__m256 step = _mm256_or_ps(_mm256_and_ps(p, signm), onev); /* ±1 */
			t = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, halfv, _CMP_GE_OQ), step));
			q[k] = _mm256_cvttps_epi32(t);
		}
		__m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
		_mm256_storeu_si256((__m256i *)(d + 2), _mm256_permutevar8x32_epi32(q8, perm));
	}
}

/* F16 (vcvtph2ps/vcvtps2ph round to nearest even and keep NaN payloads as
 * engine/gguf.Float32ToHalf does), BF16 (integer rounding) or F32 (from f16: a half's
 * signalling NaN put back as engine/ckpt decodes it) in runs of 8; the tail portable. */
static QAVX2_FN int64_t encode_elem_avx2(int from, int to, const uint8_t *s, uint8_t *d, int64_t n) {
	const int es = from == VX_F32 ? 4 : 2;
	int64_t i = 0;
	if (to == VX_F16) {
		for (; i + 8 <= n; i += 8)
			_mm_storeu_si128((__m128i *)(d + 2 * i),
			                 _mm256_cvtps_ph(enc_load8(from, s + es * i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	} else if (to == VX_BF16) {
		const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
		              bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(64);
		for (; i + 8 <= n; i += 8) {
			__m256i u = _mm256_castps_si256(enc_load8(from, s + es * i));
			__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
			__m256i r = _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
			r = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16), _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet), nan);
			__m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
			_mm_storeu_si128((__m128i *)(d + 2 * i), _mm256_castsi256_si128(p));
		}
	} else if (to == VX_F32 && from == VX_F16) {
		const __m256i mant = _mm256_set1_epi32(0x3ff), sign = _mm256_set1_epi32(0x8000), e31 = _mm256_set1_epi32(0x7c00),
		              absm = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7f800000);
		for (; i + 8 <= n; i += 8) {
			__m128i h = _mm_loadu_si128((const __m128i *)(s + 2 * i));
			__m256i hw = _mm256_cvtepu16_epi32(h);
			__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(hw, absm), e31);
			__m256i nb = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(hw, sign), 16), inf),
			                             _mm256_slli_epi32(_mm256_and_si256(hw, mant), 13));
			__m256i v = _mm256_blendv_epi8(_mm256_castps_si256(_mm256_cvtph_ps(h)), nb, nan);
			_mm256_storeu_si256((__m256i *)(d + 4 * i), v);
		}
	} else if (to == VX_F32 && from == VX_BF16) {
		for (; i + 8 <= n; i += 8)
			_mm256_storeu_ps((float *)(d + 4 * i), enc_load8(from, s + 2 * i));
	}
	return i;
}
#endif

int64_t vx_encode_bytes(int to, int64_t n) {
	if (n < 0 || (to != VX_F32 && to != VX_F16 && to != VX_BF16 && to != VX_Q8_0))
		return -1;
	if (n == 0)
		return 0;
	int64_t b = to == VX_F32 ? 4 * n : vx_qrow_bytes(to, n); /* a row of n values */
	return b > 0 ? b : -1;
}

int64_t vx_encode(int from, int to, const void *src, void *dst, int64_t n) {
	int64_t out = vx_encode_bytes(to, n);
	if (out < 0 || (from != VX_F32 && from != VX_F16 && from != VX_BF16))
		return -1;
	const uint8_t *s = src;
	uint8_t *d = dst;
	if (from == VX_F32 && to == VX_F32) { /* f16 and bf16 to themselves quiet NaNs as Go does */
		memcpy(d, s, (size_t)out);
		return out;
	}
#ifdef VX_QX86
	if (level() >= LV_AVX2) {
		if (to == VX_Q8_0) {
			encode_q8_avx2(from, s, d, n / QK);
			return out;
		}
		int64_t i = encode_elem_avx2(from, to, s, d, n);
		s += (from == VX_F32 ? 4 : 2) * i;
		d += (to == VX_F32 ? 4 : 2) * i;
		n -= i;
	}
#endif
	encode_portable(from, to, s, d, n);
	return out;
}
