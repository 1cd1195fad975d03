/* Linear over F32 weights pre-packed at load (VX_F32_P): y = x W^T + bias, W [N, K].
 *
 * Why: the streaming models run many small products (16 rows per DiT call, 4 per ASR window,
 * 14 per vocoder step) over weights that never change. OpenBLAS packs its B panels on every
 * call and, split over our pool, every thread packs its own; here W is stored once in the
 * layout the microkernel streams, so a call only reads it.
 *
 * Layout: rows of W in panels of 16 (VX_F32P_ROWS), the row count padded with zero rows to a
 * multiple of 32 (two panels, the widest tile); panel p is K runs of 16 floats, run k holding
 * W[16p + j][k] for j = 0..15. One 64-byte load gives one k of 16 output columns.
 *
 * Kernels: a tile of MR x rows times NP panels keeps MR*NP*16 sums in registers and, per k,
 * loads NP panel vectors and broadcasts MR x values (AVX-512: MR <= 14 with NP = 2, or MR <= 4
 * with NP = 4 so few rows still have enough independent FMA chains; AVX2: MR <= 6 with one panel,
 * two ymm each). Rows are cut into tiles of even height, as few as fit: the 14 rows of a
 * vocoder step are one tile, so each W vector loaded (and widened, for halves) serves 14
 * FMAs instead of 8 or 6 (1.3-1.5x on its F32 products read from memory). Every output is
 * one FMA chain over k = 0..K-1 in order, whatever the tile, the row count or the thread
 * split: a row's result does not depend on the rows beside it, so products batched across
 * sessions give every session the bits it gets alone (and the AVX2 and AVX-512 paths agree
 * bit for bit).
 *
 * Threads split the panel pairs (and the rows when the pairs are too few). Large products
 * (many rows) go to OpenBLAS on W widened back to row-major once per call instead (a
 * twentieth of the product's time at 499 rows), where its blocking wins
 * (vx_f32p_native_rows; `voxpipe bench gemm`: MioTTS's 58-row prefill products run 1.3-1.4x
 * OpenBLAS's speed here, WavLM's 499-row ones are left to OpenBLAS).
 *
 * VX_F16_P keeps an F16 weight in the same panels as halves (runs of 32 bytes): the tiles
 * widen each run in registers (vcvtph2ps) and do the same FMAs, so a product reads half the
 * bytes and its sums are bit for bit those over the widened F32 weight. */
#include <string.h>
#include <cblas.h>
#include "kern.h"

#define PR VX_F32P_ROWS  /* rows per panel */
#define PAIR (2 * PR)    /* rows are padded to a multiple of this */
#ifndef F32P_PF
/* Software prefetch distance in k (x 64 bytes per panel), into L2 (prefetcht1). Into L1
 * (prefetcht0, distance 32) a product whose weight comes from DRAM ran slower than with no
 * prefetch at all (4x256x2048 on one core: 122 vs 95 us; each L1 prefetch holds one of the
 * core's few L1 miss buffers for a whole DRAM round trip), while L2 keeps more misses in
 * flight: MeanVC2's Linears on 1 thread 1640-1703 -> 1486-1558 ms over 20 s of audio (its
 * ASR 4x256x2048 126 -> 87 us a call); distance 32/64/128 into L2 within noise. */
#define F32P_PF 64
#endif

int64_t vx_f32p_rows(int64_t n) { return (n + PAIR - 1) / PAIR * PAIR; }

/* The panel layout of an [n, k] row-major weight of es-byte values (padding rows zero). */
static inline __attribute__((always_inline)) void repack(const char *src, char *dst, int64_t n, int64_t k, const int es) {
	int64_t np = vx_f32p_rows(n) / PR;
	for (int64_t p = 0; p < np; p++) {
		char *d = dst + p * k * PR * es;
		for (int j = 0; j < PR; j++) {
			int64_t row = p * PR + j;
			if (row >= n) {
				for (int64_t q = 0; q < k; q++)
					memset(d + (q * PR + j) * es, 0, es);
				continue;
			}
			const char *s = src + row * k * es;
			for (int64_t q = 0; q < k; q++)
				memcpy(d + (q * PR + j) * es, s + q * es, es);
		}
	}
}

void vx_repack_f32p(const float *src, float *dst, int64_t n, int64_t k) { repack((const char *)src, (char *)dst, n, k, 4); }

void vx_repack_f16p(const uint16_t *src, uint16_t *dst, int64_t n, int64_t k) {
	repack((const char *)src, (char *)dst, n, k, 2);
}

/* Rows [r0, r0+nr) of W (panels of floats, or of halves where half) back in row-major
 * [nr, k] f32 form (the OpenBLAS path, and tests). */
static inline __attribute__((always_inline)) void unpack(const void *w, const int half, int64_t k, int64_t r0,
                                                         int64_t nr, float *dst) {
	for (int64_t r = 0; r < nr; r++) {
		int64_t off = (r0 + r) / PR * k * PR + (r0 + r) % PR;
		float *d = dst + r * k;
		for (int64_t q = 0; q < k; q++)
			d[q] = half ? vx_half_to_float(((const uint16_t *)w)[off + q * PR]) : ((const float *)w)[off + q * PR];
	}
}

void vx_unpack_f32p(const float *w, int64_t k, int64_t r0, int64_t nr, float *dst) { unpack(w, 0, k, r0, nr, dst); }

static void unpack_f16p(const void *w, int64_t k, int64_t r0, int64_t nr, float *dst) { unpack(w, 1, k, r0, nr, dst); }

typedef struct {
	const float *x, *bias;
	const void *w; /* panels of floats, or of halves (half) */
	int half;
	float *y;
	int64_t M, N, K;
	int64_t pairs;       /* panel pairs of W */
	int64_t pparts;      /* pair ranges: range i is [pairs*i/pparts, pairs*(i+1)/pparts) */
	int64_t mparts;      /* row parts per pair range, likewise */
	float *wide;         /* OpenBLAS path: W row-major [N, K] */
	const vx_epi *epi;
	vx_ctx *ctx;
} f32p_job;

/* Tiles compute sums over k in [k0, k1): k0 = 0 starts from zero, otherwise from the partial
 * sums the previous k block left in y; k1 = K adds the bias. Storing and reloading a sum
 * does not change it, so a row's bits do not depend on the k blocking either. */

/* Columns [c0, c0+16) of rows [0, mr) of y: partial sums in, final or partial sums out. */
static inline void load16(const float *y, int64_t ldy, float *sum, int mr, int64_t c0, int64_t N, int64_t k0) {
	int nc = N - c0 < 16 ? (int)(N - c0) : 16;
	for (int r = 0; r < mr; r++)
		for (int c = 0; c < 16; c++)
			sum[r * 16 + c] = k0 > 0 && c < nc ? y[r * ldy + c0 + c] : 0.0f;
}
static inline void store16(float *y, int64_t ldy, const float *sum, int mr, int64_t c0, int64_t N,
                           const float *bias) {
	int nc = N - c0 < 16 ? (int)(N - c0) : 16;
	for (int r = 0; r < mr; r++)
		for (int c = 0; c < nc; c++)
			y[r * ldy + c0 + c] = sum[r * 16 + c] + (bias ? bias[c0 + c] : 0.0f);
}

/* ---- portable: the same tiles and the same order, but rounding each product (no FMA) ---- */
static void tile_portable(const f32p_job *j, int64_t m0, int mr, int64_t p0, int np, int64_t k0, int64_t k1) {
	float sum[8 * 16];
	for (int p = 0; p < np; p++) {
		int64_t c0 = (p0 + p) * PR;
		if (c0 >= j->N)
			break;
		int64_t off = (p0 + p) * j->K * PR;
		const float *w = (const float *)j->w + off;
		const uint16_t *wh = (const uint16_t *)j->w + off;
		float *y = j->y + m0 * j->N;
		load16(y, j->N, sum, mr, c0, j->N, k0);
		for (int64_t q = k0; q < k1; q++) {
			float wq[16];
			for (int c = 0; c < 16; c++)
				wq[c] = j->half ? vx_half_to_float(wh[q * PR + c]) : w[q * PR + c];
			for (int r = 0; r < mr; r++) {
				float a = j->x[(m0 + r) * j->K + q];
				for (int c = 0; c < 16; c++)
					sum[r * 16 + c] += a * wq[c];
			}
		}
		store16(y, j->N, sum, mr, c0, j->N, k1 == j->K ? j->bias : NULL);
	}
}

/* The most rows of an AVX-512 tile over two panels: 28 sums and the two panel vectors fill
 * 30 of the 32 zmm registers (the x values are broadcast from memory by the FMAs). */
#define MAXR512 14

#ifdef VX_X86
#include <immintrin.h>
#define ALWAYS __attribute__((always_inline)) inline

/* MR rows x NP panels, AVX-512: MR*NP zmm sums; H: the panels hold halves. */
static AVX512_FN ALWAYS void tile512(const f32p_job *j, int64_t m0, const int MR, int64_t p0, const int NP,
                                     int64_t k0, int64_t k1, int64_t ahead, const int H) {
	__m512 acc[MAXR512 * 2];
	const float *x = j->x + m0 * j->K, *w = (const float *)j->w + p0 * j->K * PR;
	const uint16_t *wh = (const uint16_t *)j->w + p0 * j->K * PR;
	float *y = j->y + m0 * j->N;
	int64_t K = j->K, ps = K * PR;
	__mmask16 mk[4];
	for (int p = 0; p < NP; p++) {
		int64_t nc = j->N - (p0 + p) * PR;
		mk[p] = nc >= 16 ? (__mmask16)0xffff : nc <= 0 ? 0 : (__mmask16)((1u << nc) - 1);
	}
	for (int r = 0; r < MR; r++)
		for (int p = 0; p < NP; p++)
			acc[r * NP + p] = k0 > 0 ? _mm512_maskz_loadu_ps(mk[p], y + r * j->N + (p0 + p) * PR) : _mm512_setzero_ps();
	for (int64_t q = k0; q < k1; q++) {
		__m512 b[4];
		if (ahead) { /* W is in L1 already: bring the next block into L2 meanwhile */
			for (int p = 0; p < NP; p++)
				_mm_prefetch(H ? (const char *)(wh + p * ps + q * PR + ahead) : (const char *)(w + p * ps + q * PR + ahead),
				             _MM_HINT_T1);
		}
#if F32P_PF
		else {
			/* as many bytes ahead for halves; past the panel's end, the start of the panel
			 * the next tile of panels reads (not the next panel, which this tile reads) */
			const int64_t d = H ? 2 * F32P_PF : F32P_PF;
			const int64_t o = q + d < K ? (q + d) * PR : (q + d) * PR + (NP - 1) * ps;
			for (int p = 0; p < NP; p++)
				_mm_prefetch(H ? (const char *)(wh + p * ps + o) : (const char *)(w + p * ps + o), _MM_HINT_T1);
		}
#endif
		for (int p = 0; p < NP; p++)
			b[p] = H ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(wh + p * ps + q * PR)))
			         : _mm512_load_ps(w + p * ps + q * PR);
		for (int r = 0; r < MR; r++) {
			__m512 a = _mm512_set1_ps(x[r * K + q]);
			for (int p = 0; p < NP; p++)
				acc[r * NP + p] = _mm512_fmadd_ps(a, b[p], acc[r * NP + p]);
		}
	}
	int last = k1 == K;
	for (int p = 0; p < NP; p++) {
		if (!mk[p])
			break;
		int64_t c0 = (p0 + p) * PR;
		__m512 bv = last && j->bias ? _mm512_maskz_loadu_ps(mk[p], j->bias + c0) : _mm512_setzero_ps();
		for (int r = 0; r < MR; r++)
			_mm512_mask_storeu_ps(y + r * j->N + c0, mk[p], last ? _mm512_add_ps(acc[r * NP + p], bv) : acc[r * NP + p]);
	}
}

/* ahead: 0, or how many values past its own a tile prefetches W (the next block) */
typedef void (*tile_fn)(const f32p_job *, int64_t, int64_t, int64_t, int64_t, int64_t);
#define T512(MR, NP)                                                                                    \
	static AVX512_FN void tile512_##MR##_##NP(const f32p_job *j, int64_t m0, int64_t p0, int64_t k0, int64_t k1, \
	                                          int64_t ahead) {                                      \
		tile512(j, m0, MR, p0, NP, k0, k1, ahead, 0);                                                   \
	}                                                                                                   \
	static AVX512_FN void tile512h_##MR##_##NP(const f32p_job *j, int64_t m0, int64_t p0, int64_t k0, int64_t k1, \
	                                           int64_t ahead) {                                     \
		tile512(j, m0, MR, p0, NP, k0, k1, ahead, 1);                                                   \
	}
T512(1, 2) T512(2, 2) T512(3, 2) T512(4, 2) T512(5, 2) T512(6, 2) T512(7, 2) T512(8, 2)
T512(9, 2) T512(10, 2) T512(11, 2) T512(12, 2) T512(13, 2) T512(14, 2)
T512(1, 4) T512(2, 4) T512(3, 4) T512(4, 4)
/* [half][rows] */
static const tile_fn tiles512_2[2][MAXR512 + 1] = {
	{0, tile512_1_2, tile512_2_2, tile512_3_2, tile512_4_2, tile512_5_2, tile512_6_2, tile512_7_2, tile512_8_2,
	 tile512_9_2, tile512_10_2, tile512_11_2, tile512_12_2, tile512_13_2, tile512_14_2},
	{0, tile512h_1_2, tile512h_2_2, tile512h_3_2, tile512h_4_2, tile512h_5_2, tile512h_6_2, tile512h_7_2, tile512h_8_2,
	 tile512h_9_2, tile512h_10_2, tile512h_11_2, tile512h_12_2, tile512h_13_2, tile512h_14_2}};
static const tile_fn tiles512_4[2][5] = {{0, tile512_1_4, tile512_2_4, tile512_3_4, tile512_4_4},
                                         {0, tile512h_1_4, tile512h_2_4, tile512h_3_4, tile512h_4_4}};

/* MR rows x one panel, AVX2: 2*MR ymm sums; H: the panel holds halves. Compiled with F16C
 * for the halves' instances; the F32 ones run no F16C instruction (their callers check AVX2
 * and FMA only). */
#define AVX2H_FN __attribute__((target("avx2,fma,f16c")))
static AVX2H_FN ALWAYS void tile256(const f32p_job *j, int64_t m0, const int MR, int64_t p0, int64_t k0, int64_t k1,
                                    const int H) {
	if (p0 * PR >= j->N)
		return;
	float sum[6 * 16];
	float *y = j->y + m0 * j->N;
	load16(y, j->N, sum, MR, p0 * PR, j->N, k0);
	__m256 acc[2 * 6];
	const float *x = j->x + m0 * j->K, *w = (const float *)j->w + p0 * j->K * PR;
	const uint16_t *wh = (const uint16_t *)j->w + p0 * j->K * PR;
	int64_t K = j->K;
	for (int r = 0; r < MR; r++) {
		acc[2 * r] = _mm256_loadu_ps(sum + r * 16);
		acc[2 * r + 1] = _mm256_loadu_ps(sum + r * 16 + 8);
	}
	for (int64_t q = k0; q < k1; q++) {
		__m256 b0, b1;
		if (H) {
			b0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(wh + q * PR)));
			b1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(wh + q * PR + 8)));
		} else {
			b0 = _mm256_load_ps(w + q * PR);
			b1 = _mm256_load_ps(w + q * PR + 8);
		}
		for (int r = 0; r < MR; r++) {
			__m256 a = _mm256_broadcast_ss(x + r * K + q);
			acc[2 * r] = _mm256_fmadd_ps(a, b0, acc[2 * r]);
			acc[2 * r + 1] = _mm256_fmadd_ps(a, b1, acc[2 * r + 1]);
		}
	}
	for (int r = 0; r < MR; r++) {
		_mm256_storeu_ps(sum + r * 16, acc[2 * r]);
		_mm256_storeu_ps(sum + r * 16 + 8, acc[2 * r + 1]);
	}
	store16(y, j->N, sum, MR, p0 * PR, j->N, k1 == K ? j->bias : NULL);
}

#define T256(MR)                                                                                          \
	static AVX2H_FN void tile256_##MR(const f32p_job *j, int64_t m0, int64_t p0, int64_t k0, int64_t k1,   \
	                                  int64_t ahead) {                                                    \
		(void)ahead;                                                                                      \
		tile256(j, m0, MR, p0, k0, k1, 0);                                                                \
	}                                                                                                     \
	static AVX2H_FN void tile256h_##MR(const f32p_job *j, int64_t m0, int64_t p0, int64_t k0, int64_t k1,  \
	                                   int64_t ahead) {                                                   \
		(void)ahead;                                                                                      \
		tile256(j, m0, MR, p0, k0, k1, 1);                                                                \
	}
T256(1) T256(2) T256(3) T256(4) T256(5) T256(6)
static const tile_fn tiles256[2][7] = {{0, tile256_1, tile256_2, tile256_3, tile256_4, tile256_5, tile256_6},
                                       {0, tile256h_1, tile256h_2, tile256h_3, tile256h_4, tile256h_5, tile256h_6}};
#endif

/* k per block when several row tiles reuse W: the W floats of one block (kc x 16 per panel)
 * stay within ~32 KB of L1 while each tile streams them. */
static int64_t k_block(int64_t K, int panels) {
	int64_t kc = 8192 / (16 * panels); /* 8192 floats: 32 KB */
	return K <= kc ? K : kc;
}

/* Rows [m0, m1) against panel pairs [g0, g1). */
static void run_block(const f32p_job *j, int64_t m0, int64_t m1, int64_t g0, int64_t g1) {
	int lv = 0;
#ifdef VX_X86
	lv = vx_use_avx512() ? 2 : vx_use_avx2() && (!j->half || vx_use_f16c()) ? 1 : 0;
	const int h = j->half;
#endif
	int64_t rows = m1 - m0;
	for (int64_t g = g0; g < g1;) {
		/* AVX-512 with at most 4 rows: two pairs at once where there are two (16 sums in
		 * registers instead of 8: enough independent FMA chains to fill both FMA units). */
		int quad = lv == 2 && rows <= 4 && g + 1 < g1;
		int panels = quad ? 4 : 2, maxr = lv == 2 ? MAXR512 : lv == 1 ? 6 : 8;
		/* row tiles of even height: 16 rows are two of 8, not 14 and 2 */
		int64_t ntiles = (rows + maxr - 1) / maxr;
		int64_t kc = ntiles > 1 ? k_block(j->K, lv == 1 ? 1 : panels) : j->K;
		for (int64_t k0 = 0; k0 < j->K; k0 += kc) {
			int64_t k1 = k0 + kc < j->K ? k0 + kc : j->K;
			/* The first row tile reads this block of W from memory; the others find it in L1
			 * and prefetch the next block (the next k, else the next pair's first) into L2,
			 * so that read overlaps their FMAs. */
			int64_t ahead = k1 < j->K ? kc * PR : 2 * j->K * PR - k0 * PR;
			int next = k1 < j->K || g + 1 < g1; /* this task has a next block */
			for (int64_t m = m0, t = 0; m < m1; t++) {
				int mr = (int)(m0 + rows * (t + 1) / ntiles - m);
				int64_t far = t > 0 && next ? ahead : 0;
				(void)far; /* read by the AVX-512 tiles only: the portable build has none */
#ifdef VX_X86
				if (quad) {
					tiles512_4[h][mr](j, m, 2 * g, k0, k1, 0);
				} else if (lv == 2) {
					tiles512_2[h][mr](j, m, 2 * g, k0, k1, far);
				} else if (lv == 1) {
					tiles256[h][mr](j, m, 2 * g, k0, k1, 0);
					tiles256[h][mr](j, m, 2 * g + 1, k0, k1, 0);
				} else
#endif
					tile_portable(j, m, mr, 2 * g, 2, k0, k1);
				m += mr;
			}
		}
		g += quad ? 2 : 1;
	}
}

/* Task i's pairs [*g0, *g1) and rows [*m0, *m1). */
static void task_range(const f32p_job *j, int64_t i, int64_t *g0, int64_t *g1, int64_t *m0, int64_t *m1) {
	int64_t gi = i / j->mparts, mi = i % j->mparts;
	*g0 = j->pairs * gi / j->pparts;
	*g1 = j->pairs * (gi + 1) / j->pparts;
	*m0 = j->M * mi / j->mparts;
	*m1 = j->M * (mi + 1) / j->mparts;
}

static void native_task(void *p, int64_t i) {
	const f32p_job *j = p;
	int64_t g0, g1, m0, m1;
	task_range(j, i, &g0, &g1, &m0, &m1);
	if (g1 > g0 && m1 > m0) {
		run_block(j, m0, m1, g0, g1);
		vx_epi_apply(j->epi, j->y, j->N, m0, m1, g0 * PAIR, g1 * PAIR < j->N ? g1 * PAIR : j->N);
	}
}

/* OpenBLAS path (many rows): W is widened back to row-major once (tasks over panel pairs),
 * then each task runs sgemm on its rows against all of it. */
static void unpack_task(void *p, int64_t g) {
	const f32p_job *j = p;
	int64_t n0 = g * PAIR, n1 = n0 + PAIR < j->N ? n0 + PAIR : j->N;
	if (j->half)
		unpack_f16p(j->w, j->K, n0, n1 - n0, j->wide + n0 * j->K);
	else
		vx_unpack_f32p(j->w, j->K, n0, n1 - n0, j->wide + n0 * j->K);
}

static void blas_task(void *p, int64_t i) {
	const f32p_job *j = p;
	int64_t m0 = j->M * i / j->mparts, m1 = j->M * (i + 1) / j->mparts;
	if (m1 <= m0)
		return;
	float beta = 0.0f;
	if (j->bias) {
		for (int64_t m = m0; m < m1; m++)
			memcpy(j->y + m * j->N, j->bias, (size_t)j->N * sizeof(float));
		beta = 1.0f;
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(m1 - m0), (int)j->N, (int)j->K, 1.0f,
	            j->x + m0 * j->K, (int)j->K, j->wide, (int)j->K, beta, j->y + m0 * j->N, (int)j->N);
	vx_epi_apply(j->epi, j->y, j->N, m0, m1, 0, j->N);
}

static int64_t cdiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Up to this many rows the native kernel runs, larger products OpenBLAS (see the top). */
int64_t vx_f32p_native_rows = 128;

int vx_linear_f32p(vx_ctx *ctx, const float *x, const void *w, int wtype, const float *bias, float *y, int64_t M,
                   int64_t N, int64_t K, int64_t groups, const vx_epi *epi) {
	if (M <= 0 || N <= 0)
		return VX_OK;
	if (K <= 0) {
		for (int64_t m = 0; m < M; m++)
			for (int64_t n = 0; n < N; n++)
				y[m * N + n] = bias ? bias[n] : 0.0f;
		vx_epi_apply(epi, y, N, 0, M, 0, N);
		return VX_OK;
	}
	int nt = vx_ctx_threads(ctx);
	f32p_job j = {.x = x, .w = w, .half = wtype == VX_F16_P, .bias = bias, .y = y, .M = M, .N = N, .K = K,
	              .epi = epi, .ctx = ctx};
	j.pairs = vx_f32p_rows(N) / PAIR;
	double work = (double)M * (double)N * (double)K;
	/* The choice follows one group's rows, so a group's results are those it gets alone. */
	int native = M <= vx_f32p_native_rows * (groups > 1 ? groups : 1);
	int64_t most = work < 65536.0 || nt == 1 ? 1 : 4 * (int64_t)nt;
	if (!native) {
		/* The caller's scratch slot: no task asks for scratch on this path, and Conv2D's im2col
		 * rows are in the shared one. */
		j.wide = vx_scratch(ctx, 0, N * K * (int64_t)sizeof(float));
		if (!j.wide)
			return VX_ERR_NOMEM;
		vx_parallel_for(ctx, j.pairs, unpack_task, &j);
		/* one part per thread: each sgemm packs all of W, so fewer, taller calls win */
		int64_t mp = M / 16;
		j.mparts = mp < 1 ? 1 : mp < nt ? mp : nt;
		vx_parallel_for(ctx, j.mparts, blas_task, &j);
		return VX_OK;
	}
	/* At most 4 tasks per thread (so vx_parallel_for hands them out one by one), the pairs
	 * dealt evenly; the rows are split too when the pairs are fewer than 2 per thread. Tiny
	 * products stay on the calling thread. */
	j.pparts = j.pairs < most ? j.pairs : most;
	j.mparts = 1;
	if (most > 1 && j.pparts < 2 * (int64_t)nt) {
		int64_t mp = M / 8; /* a part keeps whole tiles */
		int64_t want = cdiv64(2 * (int64_t)nt, j.pparts);
		j.mparts = mp < 1 ? 1 : mp < want ? mp : want;
	}
	int64_t tasks = j.pparts * j.mparts;
	if (tasks == 1 || nt == 1) {
		for (int64_t i = 0; i < tasks; i++)
			native_task(&j, i);
	} else {
		vx_parallel_for(ctx, tasks, native_task, &j);
	}
	return VX_OK;
}

/* ---- Conv2D over a packed kernel (VX_F32_P [Cout, Cin, KH, KW], no groups) ----
 * Y^T [P, Cout] = cols [P, Cin·KH·KW] · W^T on the Linear kernel, cols being the input
 * patches one output position per row (im2col), then Y [Cout, P] (+ bias) by transposing. */

typedef struct {
	const float *x; /* batch b's input: x[c*sx[1] + h*sx[2] + w*sx[3]] */
	int64_t sx[4], Cin, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OW, P, K, Cout;
	float *cols, *out, *y; /* y: batch b's output, channel c at y + c*syc */
	int64_t syc;
	const float *bias;
	int64_t sbias;
} conv2d_p_job;

/* Patch row i: Cin runs of KH·KW taps. Where a kernel has at most IM2COL_TAPS taps, their
 * offsets within a channel plane are worked out once per row (-1: in the padding), so the
 * copy is a tight gather (it took a third of a conformer Conv2D's time when every value
 * recomputed its index and bounds). */
#define IM2COL_TAPS 64

static void im2col_task(void *p, int64_t i) {
	const conv2d_p_job *j = p;
	int64_t oh = i / j->OW, ow = i % j->OW, kk = j->KH * j->KW;
	float *restrict row = j->cols + i * j->K;
	const float *restrict x = j->x;
	if (kk > IM2COL_TAPS) {
		for (int64_t c = 0; c < j->Cin; c++)
			for (int64_t kh = 0; kh < j->KH; kh++) {
				int64_t h = oh * j->sh - j->ph + kh * j->dh;
				for (int64_t kw = 0; kw < j->KW; kw++) {
					int64_t w = ow * j->sw - j->pw + kw * j->dw;
					*row++ = h >= 0 && h < j->H && w >= 0 && w < j->W ? x[c * j->sx[1] + h * j->sx[2] + w * j->sx[3]] : 0.0f;
				}
			}
		return;
	}
	int64_t off[IM2COL_TAPS];
	int inside = 1;
	for (int64_t kh = 0; kh < j->KH; kh++) {
		int64_t h = oh * j->sh - j->ph + kh * j->dh;
		for (int64_t kw = 0; kw < j->KW; kw++) {
			int64_t w = ow * j->sw - j->pw + kw * j->dw;
			int ok = h >= 0 && h < j->H && w >= 0 && w < j->W;
			off[kh * j->KW + kw] = ok ? h * j->sx[2] + w * j->sx[3] : -1;
			inside &= ok;
		}
	}
	const int64_t sc = j->sx[1], cin = j->Cin;
	if (inside) {
		for (int64_t c = 0; c < cin; c++, row += kk) {
			const float *plane = x + c * sc;
			for (int64_t t = 0; t < kk; t++)
				row[t] = plane[off[t]];
		}
		return;
	}
	for (int64_t c = 0; c < cin; c++, row += kk) {
		const float *plane = x + c * sc;
		for (int64_t t = 0; t < kk; t++)
			row[t] = off[t] >= 0 ? plane[off[t]] : 0.0f;
	}
}

/* Output channels per transpose task: each position's 16 channels are one cache line of out,
 * and the task writes 16 rows of y in step. (A task per channel read a column of out, a line
 * per value: the conformer's first Conv2D spent 110 us on 1.6 MFLOP.) */
#define TRANSPOSE_CH 16

static void transpose_task(void *p, int64_t t) {
	const conv2d_p_job *j = p;
	int64_t c0 = t * TRANSPOSE_CH, nc = j->Cout - c0 < TRANSPOSE_CH ? j->Cout - c0 : TRANSPOSE_CH;
	float b[TRANSPOSE_CH];
	for (int64_t c = 0; c < nc; c++)
		b[c] = j->bias ? j->bias[(c0 + c) * j->sbias] : 0.0f;
	for (int64_t q = 0; q < j->P; q++) {
		const float *o = j->out + q * j->Cout + c0;
		for (int64_t c = 0; c < nc; c++)
			j->y[(c0 + c) * j->syc + q] = o[c] + b[c];
	}
}

static int conv_f32p(vx_ctx *ctx, conv2d_p_job *jp, const vx_tensor *Wt, const vx_tensor *bias, const vx_tensor *X,
                     const vx_tensor *Y, int64_t B);

int vx_conv2d_f32p(vx_ctx *ctx, const vx_node *node, const vx_tensor *X, const vx_tensor *Wt, const vx_tensor *bias,
                   const vx_tensor *Y) {
	if (!vx_tensor_ok(X, VX_F32) || !vx_tensor_ok(Y, VX_F32) || X->ndim != 4 || Wt->ndim != 4 || Y->ndim != 4 || !Wt->data)
		return VX_ERR_BAD_SHAPE;
	conv2d_p_job j = {.Cin = X->shape[1], .H = X->shape[2], .W = X->shape[3], .KH = Wt->shape[2], .KW = Wt->shape[3],
	                  .sh = node->ip[0], .sw = node->ip[1], .ph = node->ip[2], .pw = node->ip[3], .dh = node->ip[4],
	                  .dw = node->ip[5], .Cout = Wt->shape[0]};
	int64_t B = X->shape[0];
	if (node->ip[6] != 1 || Wt->shape[1] != j.Cin || j.sh < 1 || j.sw < 1 || j.dh < 1 || j.dw < 1 || j.ph < 0 || j.pw < 0 ||
	    j.KH < 1 || j.KW < 1)
		return VX_ERR_BAD_SHAPE;
	if (bias && (!vx_tensor_ok(bias, VX_F32) || vx_numel(bias) != j.Cout))
		return VX_ERR_BAD_SHAPE;
	int64_t sph = j.H + 2 * j.ph - j.dh * (j.KH - 1) - 1, spw = j.W + 2 * j.pw - j.dw * (j.KW - 1) - 1;
	if (sph < 0 || spw < 0)
		return VX_ERR_BAD_SHAPE;
	int64_t OH = sph / j.sh + 1;
	j.OW = spw / j.sw + 1;
	j.P = OH * j.OW;
	j.K = j.Cin * j.KH * j.KW;
	if (Y->shape[0] != B || Y->shape[1] != j.Cout || Y->shape[2] != OH || Y->shape[3] != j.OW)
		return VX_ERR_BAD_SHAPE;
	if ((j.OW > 1 && Y->stride[3] != 1) || (OH > 1 && Y->stride[2] != j.OW))
		return VX_ERR_BAD_SHAPE; /* each output channel plane contiguous */
	j.syc = j.Cout > 1 ? Y->stride[1] : j.P;
	if (j.Cout > 1 && j.syc < j.P)
		return VX_ERR_BAD_SHAPE;
	if (B == 0 || j.Cout == 0 || j.P == 0)
		return VX_OK;
	for (int d = 0; d < 4; d++)
		j.sx[d] = X->stride[d];
	return conv_f32p(ctx, &j, Wt, bias, X, Y, B);
}

/* Runs a checked job: per batch element, the patches (im2col), the Linear, the transpose. */
static int conv_f32p(vx_ctx *ctx, conv2d_p_job *jp, const vx_tensor *Wt, const vx_tensor *bias, const vx_tensor *X,
                     const vx_tensor *Y, int64_t B) {
	conv2d_p_job j = *jp;
	if (bias) {
		j.bias = bias->data;
		j.sbias = bias->stride[bias->ndim - 1];
	}
	float *s = vx_scratch(ctx, VX_SCRATCH_SHARED, (j.P * j.K + j.P * j.Cout) * (int64_t)sizeof(float));
	if (!s)
		return VX_ERR_NOMEM;
	j.cols = s;
	j.out = s + j.P * j.K;
	for (int64_t b = 0; b < B; b++) {
		j.x = (const float *)X->data + b * X->stride[0];
		j.y = (float *)Y->data + b * Y->stride[0];
		if (j.P * j.K >= 16384) /* smaller patches are copied faster than a dispatch */
			vx_parallel_for(ctx, j.P, im2col_task, &j);
		else
			for (int64_t i = 0; i < j.P; i++)
				im2col_task(&j, i);
		int rc = vx_linear_f32p(ctx, j.cols, Wt->data, VX_F32_P, NULL, j.out, j.P, j.Cout, j.K, 1, NULL);
		if (rc != VX_OK)
			return rc;
		vx_parallel_for(ctx, (j.Cout + TRANSPOSE_CH - 1) / TRANSPOSE_CH, transpose_task, &j);
	}
	return VX_OK;
}

/* Conv1D over a packed kernel (VX_F32_P [Cout, Cin, K], no groups): the Conv2D path with one
 * row of height 1, the left padding as given and the right one implied by the output's
 * length. The vocoders' embedding convs and MioCodec's residual convs run a few frames at a
 * time, where the generic im2col GEMM reached a fifth of the machine's peak. */
int vx_conv1d_f32p(vx_ctx *ctx, const vx_node *node, const vx_tensor *X, const vx_tensor *Wt, const vx_tensor *bias,
                   const vx_tensor *Y) {
	if (!vx_tensor_ok(X, VX_F32) || !vx_tensor_ok(Y, VX_F32) || X->ndim != 3 || Wt->ndim != 3 || Y->ndim != 3 || !Wt->data)
		return VX_ERR_BAD_SHAPE;
	/* ip: 0 stride, 1 pad left, 2 pad right, 3 dilation, 4 groups */
	conv2d_p_job j = {.Cin = X->shape[1], .H = 1, .W = X->shape[2], .KH = 1, .KW = Wt->shape[2], .sh = 1, .sw = node->ip[0],
	                  .ph = 0, .pw = node->ip[1], .dh = 1, .dw = node->ip[3], .Cout = Wt->shape[0]};
	int64_t B = X->shape[0], padr = node->ip[2];
	if (node->ip[4] != 1 || Wt->shape[1] != j.Cin || j.sw < 1 || j.dw < 1 || j.pw < 0 || padr < 0 || j.KW < 1)
		return VX_ERR_BAD_SHAPE;
	if (bias && (!vx_tensor_ok(bias, VX_F32) || vx_numel(bias) != j.Cout))
		return VX_ERR_BAD_SHAPE;
	int64_t span = j.W + j.pw + padr - j.dw * (j.KW - 1) - 1;
	if (span < 0)
		return VX_ERR_BAD_SHAPE;
	j.OW = span / j.sw + 1;
	j.P = j.OW;
	j.K = j.Cin * j.KW;
	if (Y->shape[0] != B || Y->shape[1] != j.Cout || Y->shape[2] != j.OW || (j.OW > 1 && Y->stride[2] != 1))
		return VX_ERR_BAD_SHAPE;
	j.syc = j.Cout > 1 ? Y->stride[1] : j.P;
	if (j.Cout > 1 && j.syc < j.P)
		return VX_ERR_BAD_SHAPE;
	if (B == 0 || j.Cout == 0)
		return VX_OK;
	j.sx[0] = X->stride[0];
	j.sx[1] = X->stride[1];
	j.sx[2] = 0;
	j.sx[3] = X->stride[2];
	return conv_f32p(ctx, &j, Wt, bias, X, Y, B);
}
