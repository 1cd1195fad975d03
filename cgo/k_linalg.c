/* Linear-algebra kernels: matmul, conv1d, conv2d, conv_transpose1d, attention.
 *
 * GEMMs go to single-threaded OpenBLAS (vx_init pins it to one thread); the parallelism is
 * ours, over batches and row/column blocks via vx_parallel_for. Hand loops (depthwise conv,
 * softmax) have an AVX2/FMA path chosen at run time and a portable path. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <cblas.h>
#include "kern.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define VX_HAVE_X86 1
#endif

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t round_up(int64_t a, int64_t m) { return cdiv(a, m) * m; }


static int is_f32(const vx_tensor *t) { return t && t->dtype == VX_F32 && t->data != NULL; }

/* Attention's keys and values: f32, or f16 (a half-precision KV cache). */
static int kv_ok(const vx_tensor *t) { return t && (t->dtype == VX_F32 || t->dtype == VX_F16) && t->data != NULL; }

/* Makes every thread slot's scratch at least `bytes` large (call before vx_parallel_for, so
 * tasks never reallocate). */
static int prepare_thread_scratch(vx_ctx *ctx, int64_t bytes) {
	int nt = vx_ctx_threads(ctx);
	for (int i = 0; i < nt; i++)
		if (!vx_scratch(ctx, i, bytes))
			return VX_ERR_NOMEM;
	return VX_OK;
}

static inline float *thread_scratch(vx_ctx *ctx, int64_t bytes) {
	return vx_scratch(ctx, vx_thread_id(), bytes);
}

/* ---- packing strided tensors ---- */

/* Floats needed to pack t with pack_operand. */
static int64_t pack_count(const vx_tensor *t) {
	int64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= (d < t->ndim - 2 && t->stride[d] == 0) ? 1 : t->shape[d];
	return n;
}

/* Copies t into dst (row-major) and describes the copy in *out. Leading (batch) dims with
 * stride 0 stay broadcast (not materialised, stride 0 in *out); the last two dims are always
 * materialised. */
static void pack_operand(const vx_tensor *t, float *dst, vx_tensor *out) {
	int nd = t->ndim;
	int64_t msh[VX_MAX_DIMS];
	*out = *t;
	out->data = dst;
	int64_t st = 1;
	for (int d = nd - 1; d >= 0; d--) {
		int bcast = d < nd - 2 && t->stride[d] == 0;
		msh[d] = bcast ? 1 : t->shape[d];
		out->stride[d] = bcast ? 0 : st;
		st *= msh[d];
	}
	if (st == 0 || nd == 0) {
		if (nd == 0)
			dst[0] = *(const float *)t->data;
		return;
	}
	const float *src = t->data;
	int64_t idx[VX_MAX_DIMS] = {0};
	int64_t inner = msh[nd - 1], sin = t->stride[nd - 1];
	int64_t outer = st / inner;
	for (int64_t o = 0; o < outer; o++) {
		int64_t off = 0;
		for (int d = 0; d < nd - 1; d++)
			off += idx[d] * t->stride[d];
		const float *p = src + off;
		if (sin == 1)
			memcpy(dst, p, (size_t)inner * sizeof(float));
		else
			for (int64_t i = 0; i < inner; i++)
				dst[i] = p[i * sin];
		dst += inner;
		for (int d = nd - 2; d >= 0; d--) {
			if (++idx[d] < msh[d])
				break;
			idx[d] = 0;
		}
	}
}

/* Describes a (rows x cols) matrix with strides (srow, scol) for BLAS: sets *trans and *ld
 * (row-major; trans: stored transposed with leading dimension ld). Returns 0 when BLAS
 * cannot take it as is (the caller packs it). */
static int blas_layout(int64_t rows, int64_t cols, int64_t srow, int64_t scol, int *trans, int64_t *ld) {
	if (cols <= 1)
		scol = 1;
	if (rows <= 1)
		srow = scol == 1 ? imax(cols, 1) : 1;
	if (scol == 1 && srow >= imax(cols, 1)) {
		*trans = 0;
		*ld = srow;
		return 1;
	}
	if (srow == 1 && scol >= imax(rows, 1)) {
		*trans = 1;
		*ld = scol;
		return 1;
	}
	return 0;
}

/* ---- one GEMM block on the calling thread ---- */

/* C(m, n) = sum_k A(m, k) B(k, n) [+ bias[n] + rbias[m]] */
typedef struct {
	const float *a; /* A(m, k) = a[m*am + k*ak] */
	int64_t am, ak;
	const float *b; /* B(k, n) = b[k*bk + n*bn] */
	int64_t bk, bn;
	float *c; /* C(m, n) = c[m*ldc + n] */
	int64_t ldc;
	int64_t m, n, k;
	const float *bias; /* per column: bias[n*bias_s], or NULL */
	int64_t bias_s;
	const float *rbias; /* per row: rbias[m*rbias_s], or NULL */
	int64_t rbias_s;
} gemm_args;

#define TINY_GEMM 4096 /* m*n*k at or below this: a plain loop beats calling BLAS */
#define SMALL_GEMM 3   /* at most this many rows (columns): gemv per row (column) */

static inline float bias_at(const gemm_args *g, int64_t i, int64_t j) {
	float v = 0.0f;
	if (g->bias)
		v += g->bias[j * g->bias_s];
	if (g->rbias)
		v += g->rbias[i * g->rbias_s];
	return v;
}

/* Strides must satisfy blas_layout for A and B unless k <= 0 or the product is tiny. */
static void gemm_block(const gemm_args *g) {
	int64_t m = g->m, n = g->n, k = g->k;
	if (m <= 0 || n <= 0)
		return;
	if (k <= 0 || m * n * k <= TINY_GEMM) {
		for (int64_t i = 0; i < m; i++) {
			float *c = g->c + i * g->ldc;
			const float *a = g->a + i * g->am;
			for (int64_t j = 0; j < n; j++) {
				const float *b = g->b + j * g->bn;
				float s = 0.0f;
				for (int64_t p = 0; p < k; p++)
					s += a[p * g->ak] * b[p * g->bk];
				c[j] = s + bias_at(g, i, j);
			}
		}
		return;
	}
	float beta = 0.0f;
	if (g->bias || g->rbias) {
		for (int64_t i = 0; i < m; i++) {
			float *c = g->c + i * g->ldc;
			float r = g->rbias ? g->rbias[i * g->rbias_s] : 0.0f;
			if (!g->bias)
				for (int64_t j = 0; j < n; j++)
					c[j] = r;
			else if (g->bias_s == 1 && !g->rbias)
				memcpy(c, g->bias, (size_t)n * sizeof(float));
			else
				for (int64_t j = 0; j < n; j++)
					c[j] = g->bias[j * g->bias_s] + r;
		}
		beta = 1.0f;
	}
	int ta = 0, tb = 0;
	int64_t lda = 1, ldb = 1;
	blas_layout(m, k, g->am, g->ak, &ta, &lda);
	blas_layout(k, n, g->bk, g->bn, &tb, &ldb);
	/* OpenBLAS's sgemm packs all of B (or A) whatever the other size, so for a few rows
	 * (columns) one gemv per row (column) is several times faster (measured: m <= 3). */
	if (m <= SMALL_GEMM) {
		/* y[n] = sum_k a[k] B(k, n) for each row a of A */
		int64_t incx = k == 1 ? 1 : g->ak;
		for (int64_t i = 0; i < m; i++) {
			const float *a = g->a + i * g->am;
			float *c = g->c + i * g->ldc;
			if (!tb)
				cblas_sgemv(CblasRowMajor, CblasTrans, (int)k, (int)n, 1.0f, g->b, (int)ldb, a,
				            (int)incx, beta, c, 1);
			else
				cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, g->b, (int)ldb, a,
				            (int)incx, beta, c, 1);
		}
		return;
	}
	if (n <= SMALL_GEMM) {
		/* y[m] = sum_k A(m, k) b[k] for each column b of B */
		int64_t incx = k == 1 ? 1 : g->bk;
		for (int64_t j = 0; j < n; j++) {
			const float *b = g->b + j * g->bn;
			float *c = g->c + j;
			if (!ta)
				cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)m, (int)k, 1.0f, g->a, (int)lda, b,
				            (int)incx, beta, c, (int)g->ldc);
			else
				cblas_sgemv(CblasRowMajor, CblasTrans, (int)k, (int)m, 1.0f, g->a, (int)lda, b,
				            (int)incx, beta, c, (int)g->ldc);
		}
		return;
	}
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
	            (int)m, (int)n, (int)k, 1.0f, g->a, (int)lda, g->b, (int)ldb, beta, g->c,
	            (int)g->ldc);
}

/* Sub-block [m0, m0+mb) x [n0, n0+nb) of g. */
static gemm_args gemm_sub(const gemm_args *g, int64_t m0, int64_t mb, int64_t n0, int64_t nb) {
	gemm_args s = *g;
	s.a = g->a + m0 * g->am;
	s.b = g->b + n0 * g->bn;
	s.c = g->c + m0 * g->ldc + n0;
	s.m = mb;
	s.n = nb;
	if (g->bias)
		s.bias = g->bias + n0 * g->bias_s;
	if (g->rbias)
		s.rbias = g->rbias + m0 * g->rbias_s;
	return s;
}

/* Splits an m x n output into about `want` blocks (rows in multiples of 16 when there are
 * enough, columns in multiples of 64); returns the block sizes. */
static void split_gemm(int64_t m, int64_t n, int64_t want, int64_t *mb, int64_t *nb) {
	int64_t pm = 1, pn = 1;
	while (pm * pn < want) {
		int can_m = pm < m && cdiv(m, pm + 1) >= 4;
		int can_n = cdiv(n, pn + 1) >= 64;
		if (!can_m && !can_n)
			break;
		if (can_m && (!can_n || m / pm >= n / pn))
			pm++;
		else
			pn++;
	}
	*mb = pm == 1 ? m : (m >= 16 * pm ? round_up(cdiv(m, pm), 16) : cdiv(m, pm));
	*nb = pn == 1 ? n : round_up(cdiv(n, pn), 64);
	*mb = imax(1, imin(*mb, m));
	*nb = imax(1, imin(*nb, n));
}

/* GEMM work below this many flops runs on the calling thread. */
#define PAR_MIN_FLOPS 100000.0
#define ATTN_PAR_MIN_FLOPS 1.0e6

/* Blocks per independent GEMM so that `count` GEMMs keep nt threads busy. */
static int64_t blocks_wanted(int nt, int64_t count, double flops) {
	if (nt <= 1 || flops < PAR_MIN_FLOPS || count <= 0)
		return 1;
	if (count >= 2 * (int64_t)nt || count % nt == 0)
		return 1;
	if (count == 1)
		return nt;
	return cdiv(2 * (int64_t)nt, count);
}

/* ---- VX_OP_MATMUL ---- */

typedef struct {
	gemm_args g; /* batch 0, full matrix */
	int nbd;     /* batch dims left after folding */
	int64_t bshape[VX_MAX_DIMS];
	int64_t sa[VX_MAX_DIMS], sb[VX_MAX_DIMS], sc[VX_MAX_DIMS];
	int64_t mb, nb, n_mb, n_nb;
} matmul_job;

static void matmul_task(void *p, int64_t i) {
	const matmul_job *j = p;
	int64_t per = j->n_mb * j->n_nb;
	int64_t batch = i / per, r = i % per;
	int64_t bm = r / j->n_nb, bn = r % j->n_nb;
	gemm_args g = j->g;
	for (int d = j->nbd - 1; d >= 0; d--) {
		int64_t x = batch % j->bshape[d];
		batch /= j->bshape[d];
		g.a += x * j->sa[d];
		g.b += x * j->sb[d];
		g.c += x * j->sc[d];
	}
	int64_t m0 = bm * j->mb, n0 = bn * j->nb;
	gemm_args s = gemm_sub(&g, m0, imin(j->mb, g.m - m0), n0, imin(j->nb, g.n - n0));
	gemm_block(&s);
}

int vx_k_matmul(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *A = vx_src(node, t, 0), *B = vx_src(node, t, 1), *bias = vx_src(node, t, 2);
	const vx_tensor *C = &t[node->dst];
	int transB = node->ip[0] != 0;
	if (!is_f32(A) || !is_f32(B) || !is_f32(C) || (bias && !is_f32(bias)))
		return VX_ERR_BAD_SHAPE;
	if (A->ndim < 2 || B->ndim < 2 || C->ndim < 2)
		return VX_ERR_BAD_SHAPE;
	int an = A->ndim, bnd = B->ndim, cn = C->ndim;
	int64_t M = A->shape[an - 2], K = A->shape[an - 1];
	int64_t Kb = transB ? B->shape[bnd - 1] : B->shape[bnd - 2];
	int64_t N = transB ? B->shape[bnd - 2] : B->shape[bnd - 1];
	if (Kb != K || C->shape[cn - 2] != M || C->shape[cn - 1] != N)
		return VX_ERR_BAD_SHAPE;
	if (bias && (bias->ndim < 1 || bias->shape[bias->ndim - 1] != N || vx_numel(bias) != N))
		return VX_ERR_BAD_SHAPE;
	int nbd = cn - 2;
	if (an - 2 > nbd || bnd - 2 > nbd)
		return VX_ERR_BAD_SHAPE;
	int64_t ldc = C->stride[cn - 2];
	if ((N > 1 && C->stride[cn - 1] != 1) || (M > 1 && ldc < N))
		return VX_ERR_BAD_SHAPE;
	if (M <= 1)
		ldc = N;

	matmul_job j;
	memset(&j, 0, sizeof j);
	int64_t nbatch = 1;
	for (int d = 0; d < nbd; d++) {
		int64_t n = C->shape[d];
		int da = d - (nbd - (an - 2)), db = d - (nbd - (bnd - 2));
		if ((da >= 0 && A->shape[da] != n && A->shape[da] != 1) ||
		    (db >= 0 && B->shape[db] != n && B->shape[db] != 1))
			return VX_ERR_BAD_SHAPE;
		j.bshape[d] = n;
		j.sa[d] = da >= 0 && A->shape[da] != 1 ? A->stride[da] : 0;
		j.sb[d] = db >= 0 && B->shape[db] != 1 ? B->stride[db] : 0;
		j.sc[d] = C->stride[d];
		nbatch *= n;
	}
	if (nbatch == 0 || M == 0 || N == 0)
		return VX_OK;

	const float *a = A->data, *b = B->data;
	int64_t am = A->stride[an - 2], ak = A->stride[an - 1];
	int64_t bk = transB ? B->stride[bnd - 1] : B->stride[bnd - 2];
	int64_t bn = transB ? B->stride[bnd - 2] : B->stride[bnd - 1];
	int tr;
	int64_t ld;
	int packA = K > 0 && !blas_layout(M, K, am, ak, &tr, &ld);
	int packB = K > 0 && !blas_layout(K, N, bk, bn, &tr, &ld);
	if (packA || packB) {
		int64_t na = packA ? round_up(pack_count(A), 16) : 0, nb = packB ? pack_count(B) : 0;
		float *s = vx_scratch(ctx, VX_SCRATCH_SHARED, (na + nb) * (int64_t)sizeof(float));
		if (!s)
			return VX_ERR_NOMEM;
		vx_tensor p;
		if (packA) {
			pack_operand(A, s, &p);
			a = s;
			am = p.stride[an - 2];
			ak = p.stride[an - 1];
			for (int d = 0; d < nbd; d++) {
				int da = d - (nbd - (an - 2));
				if (da >= 0 && A->shape[da] != 1)
					j.sa[d] = p.stride[da];
			}
		}
		if (packB) {
			pack_operand(B, s + na, &p);
			b = s + na;
			bk = transB ? p.stride[bnd - 1] : p.stride[bnd - 2];
			bn = transB ? p.stride[bnd - 2] : p.stride[bnd - 1];
			for (int d = 0; d < nbd; d++) {
				int db = d - (nbd - (bnd - 2));
				if (db >= 0 && B->shape[db] != 1)
					j.sb[d] = p.stride[db];
			}
		}
	}
	if (K == 1)
		ak = 1;

	/* Fold trailing batch dims into M where B is broadcast over them and the rows of A and
	 * C continue evenly: one tall GEMM instead of many short ones. */
	while (nbd > 0 && ak == 1) {
		int d = nbd - 1;
		if (j.sb[d] != 0)
			break;
		if (M == 1) {
			if (j.sa[d] < imax(K, 1) || j.sc[d] < N)
				break;
			am = j.sa[d];
			ldc = j.sc[d];
		} else if (am < K || j.sa[d] != M * am || j.sc[d] != M * ldc) {
			break;
		}
		M *= j.bshape[d];
		nbatch /= j.bshape[d];
		nbd--;
	}

	j.nbd = nbd;
	j.g.a = a;
	j.g.am = am;
	j.g.ak = ak;
	j.g.b = b;
	j.g.bk = bk;
	j.g.bn = bn;
	j.g.c = C->data;
	j.g.ldc = ldc;
	j.g.m = M;
	j.g.n = N;
	j.g.k = K;
	if (bias) {
		j.g.bias = bias->data;
		j.g.bias_s = N == 1 ? 0 : bias->stride[bias->ndim - 1];
	}

	int nt = vx_ctx_threads(ctx);
	double flops = 2.0 * (double)nbatch * (double)M * (double)N * (double)K;
	split_gemm(M, N, blocks_wanted(nt, nbatch, flops), &j.mb, &j.nb);
	j.n_mb = cdiv(M, j.mb);
	j.n_nb = cdiv(N, j.nb);
	int64_t tasks = nbatch * j.n_mb * j.n_nb;
	if (nt <= 1 || flops < PAR_MIN_FLOPS) {
		for (int64_t i = 0; i < tasks; i++)
			matmul_task(&j, i);
	} else {
		vx_parallel_for(ctx, tasks, matmul_task, &j);
	}
	return VX_OK;
}

/* ---- convolutions: shared helpers ---- */

/* Contiguous copy of a weight tensor (the tensor itself when already contiguous). */
static const float *dense_weight(const vx_tensor *w, float *buf) {
	if (vx_is_contiguous(w))
		return w->data;
	vx_tensor p, full = *w;
	pack_operand(&full, buf, &p);
	return buf;
}

static int check_bias(const vx_tensor *bias, int64_t n) {
	return !bias || (is_f32(bias) && bias->ndim >= 1 && vx_numel(bias) == n &&
	                 bias->shape[bias->ndim - 1] == n);
}

/* ---- VX_OP_CONV1D ---- */

typedef struct {
	vx_ctx *ctx;
	const float *x;
	int64_t sxb, sxc, sxt;
	const float *w; /* contiguous [Cout, cig, K] */
	const float *bias;
	int64_t sbias;
	float *y;
	int64_t syb, syc;
	int64_t Cout, T, Tout, K, G, cig, cog;
	int64_t stride, padl, dil;
	int pointwise;
	int64_t mb, n_mb, tb, n_tb; /* output channel and time blocks per (b, g) */
} conv1d_job;

/* col[(c, k), t] = x[c, (t0+t)*stride + k*dil - padl] (0 outside), tn columns. */
static void im2col_1d(const conv1d_job *j, const float *x, int64_t t0, int64_t tn, float *col) {
	for (int64_t c = 0; c < j->cig; c++) {
		const float *xc = x + c * j->sxc;
		for (int64_t k = 0; k < j->K; k++) {
			float *dst = col + (c * j->K + k) * tn;
			int64_t off = k * j->dil - j->padl; /* input index = (t0+t)*stride + off */
			/* valid t: 0 <= (t0+t)*stride + off < T */
			int64_t lo = 0, hi = tn;
			int64_t base = t0 * j->stride + off;
			if (base < 0)
				lo = cdiv(-base, j->stride);
			int64_t last = j->T - 1 - base; /* t*stride <= last */
			hi = last < 0 ? 0 : imin(tn, last / j->stride + 1);
			if (lo > hi)
				lo = hi;
			for (int64_t t = 0; t < lo; t++)
				dst[t] = 0.0f;
			const float *src = xc + base * j->sxt;
			int64_t step = j->stride * j->sxt;
			if (step == 1)
				memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
			else
				for (int64_t t = lo; t < hi; t++)
					dst[t] = src[t * step];
			for (int64_t t = hi; t < tn; t++)
				dst[t] = 0.0f;
		}
	}
}

static void conv1d_gemm_task(void *p, int64_t i) {
	const conv1d_job *j = p;
	int64_t tbi = i % j->n_tb, r = i / j->n_tb;
	int64_t mbi = r % j->n_mb, bg = r / j->n_mb;
	int64_t g = bg % j->G, b = bg / j->G;
	int64_t t0 = tbi * j->tb, tn = imin(j->tb, j->Tout - t0);
	int64_t m0 = mbi * j->mb, mn = imin(j->mb, j->cog - m0);
	const float *x = j->x + b * j->sxb + g * j->cig * j->sxc;
	int64_t rows = j->cig * j->K;
	int64_t co0 = g * j->cog + m0;
	gemm_args ga;
	memset(&ga, 0, sizeof ga);
	ga.a = j->w + co0 * rows;
	ga.am = rows;
	ga.ak = 1;
	ga.c = j->y + b * j->syb + co0 * j->syc + t0;
	ga.ldc = j->syc;
	ga.m = mn;
	ga.n = tn;
	ga.k = rows;
	if (j->bias) {
		ga.rbias = j->bias + co0 * j->sbias;
		ga.rbias_s = j->sbias;
	}
	if (j->pointwise) {
		ga.b = x + t0 * j->sxt;
		ga.bk = j->sxc;
		ga.bn = j->sxt;
	} else {
		float *col = thread_scratch(j->ctx, rows * tn * (int64_t)sizeof(float));
		im2col_1d(j, x, t0, tn, col);
		ga.b = col;
		ga.bk = tn;
		ga.bn = 1;
	}
	gemm_block(&ga);
}

/* Depthwise (cig == 1): out[t] = bias + sum_k w[k] * xp[t*stride + k*dil], xp the padded
 * input row. */
static void dw_row_portable(const float *xp, const float *w, int64_t K, int64_t dil,
                            int64_t stride, float bias, float *out, int64_t tout) {
	for (int64_t t = 0; t < tout; t++)
		out[t] = bias;
	for (int64_t k = 0; k < K; k++) {
		float wk = w[k];
		const float *xk = xp + k * dil;
		if (stride == 1)
			for (int64_t t = 0; t < tout; t++)
				out[t] += wk * xk[t];
		else
			for (int64_t t = 0; t < tout; t++)
				out[t] += wk * xk[t * stride];
	}
}

#ifdef VX_HAVE_X86
__attribute__((target("avx2,fma"))) static void dw_row_avx2(const float *xp, const float *w,
                                                             int64_t K, int64_t dil, float bias,
                                                             float *out, int64_t tout) {
	int64_t t = 0;
	__m256 vb = _mm256_set1_ps(bias);
	for (; t + 32 <= tout; t += 32) {
		__m256 a0 = vb, a1 = vb, a2 = vb, a3 = vb;
		const float *xt = xp + t;
		for (int64_t k = 0; k < K; k++) {
			__m256 wk = _mm256_broadcast_ss(w + k);
			const float *q = xt + k * dil;
			a0 = _mm256_fmadd_ps(wk, _mm256_loadu_ps(q), a0);
			a1 = _mm256_fmadd_ps(wk, _mm256_loadu_ps(q + 8), a1);
			a2 = _mm256_fmadd_ps(wk, _mm256_loadu_ps(q + 16), a2);
			a3 = _mm256_fmadd_ps(wk, _mm256_loadu_ps(q + 24), a3);
		}
		_mm256_storeu_ps(out + t, a0);
		_mm256_storeu_ps(out + t + 8, a1);
		_mm256_storeu_ps(out + t + 16, a2);
		_mm256_storeu_ps(out + t + 24, a3);
	}
	for (; t + 8 <= tout; t += 8) {
		__m256 a0 = vb;
		for (int64_t k = 0; k < K; k++)
			a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + k), _mm256_loadu_ps(xp + t + k * dil), a0);
		_mm256_storeu_ps(out + t, a0);
	}
	for (; t < tout; t++) {
		float s = bias;
		for (int64_t k = 0; k < K; k++)
			s = fmaf(w[k], xp[t + k * dil], s);
		out[t] = s;
	}
}

/* AVX-512: 16 outputs a vector, the last partial one masked, so a short row (a vocoder
 * step's 14 frames) is one vector per tap instead of scalar taps for its tail. The same
 * FMA chain per output as the AVX2 path. (Loading straight from x with masks for the
 * padding, without the copy, was slower: 16 us a vocoder step's conv against 9.) */
AVX512_FN static void dw_row_avx512(const float *xp, const float *w, int64_t K, int64_t dil, float bias,
                                    float *out, int64_t tout) {
	__m512 vb = _mm512_set1_ps(bias);
	for (int64_t t = 0; t < tout; t += 16) {
		__mmask16 m = tout - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (tout - t)) - 1);
		__m512 a = vb;
		for (int64_t k = 0; k < K; k++)
			a = _mm512_fmadd_ps(_mm512_set1_ps(w[k]), _mm512_maskz_loadu_ps(m, xp + t + k * dil), a);
		_mm512_mask_storeu_ps(out + t, m, a);
	}
}
#endif

static void conv1d_dw_task(void *p, int64_t i) {
	const conv1d_job *j = p;
	int64_t co = i % j->Cout, b = i / j->Cout;
	int64_t ci = co / j->cog; /* == group index since cig == 1 */
	const float *x = j->x + b * j->sxb + ci * j->sxc;
	int64_t len = (j->Tout - 1) * j->stride + (j->K - 1) * j->dil + 1;
	float *xp = thread_scratch(j->ctx, len * (int64_t)sizeof(float));
	if (j->sxt == 1) { /* zeros around one copy of the row's span */
		int64_t lo = imin(j->padl, len), hi = imax(lo, imin(len, j->padl + j->T));
		memset(xp, 0, (size_t)lo * sizeof(float));
		if (hi > lo)
			memcpy(xp + lo, x, (size_t)(hi - lo) * sizeof(float)); /* lo == padl here */
		memset(xp + hi, 0, (size_t)(len - hi) * sizeof(float));
	} else {
		for (int64_t q = 0; q < len; q++) {
			int64_t s = q - j->padl;
			xp[q] = (s >= 0 && s < j->T) ? x[s * j->sxt] : 0.0f;
		}
	}
	float bias = j->bias ? j->bias[co * j->sbias] : 0.0f;
	float *out = j->y + b * j->syb + co * j->syc;
	const float *w = j->w + co * j->K;
#ifdef VX_HAVE_X86
	if (j->stride == 1 && vx_use_avx512()) {
		dw_row_avx512(xp, w, j->K, j->dil, bias, out, j->Tout);
		return;
	}
	if (j->stride == 1 && vx_use_avx2()) {
		dw_row_avx2(xp, w, j->K, j->dil, bias, out, j->Tout);
		return;
	}
#endif
	dw_row_portable(xp, w, j->K, j->dil, j->stride, bias, out, j->Tout);
}

int vx_k_conv1d(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *X = vx_src(node, t, 0), *W = vx_src(node, t, 1), *bias = vx_src(node, t, 2);
	const vx_tensor *Y = &t[node->dst];
	if (W && W->dtype == VX_F32_P)
		return vx_conv1d_f32p(ctx, node, X, W, bias, Y);
	if (!is_f32(X) || !is_f32(W) || !is_f32(Y) || X->ndim != 3 || W->ndim != 3 || Y->ndim != 3)
		return VX_ERR_BAD_SHAPE;
	conv1d_job j;
	memset(&j, 0, sizeof j);
	j.ctx = ctx;
	int64_t B = X->shape[0], Cin = X->shape[1];
	j.T = X->shape[2];
	j.Cout = W->shape[0];
	j.K = W->shape[2];
	j.stride = node->ip[0];
	j.padl = node->ip[1];
	int64_t padr = node->ip[2];
	j.dil = node->ip[3];
	j.G = node->ip[4];
	if (j.stride < 1 || j.dil < 1 || j.G < 1 || j.padl < 0 || padr < 0 || j.K < 1)
		return VX_ERR_BAD_SHAPE;
	if (Cin % j.G || j.Cout % j.G || W->shape[1] != Cin / j.G || !check_bias(bias, j.Cout))
		return VX_ERR_BAD_SHAPE;
	j.cig = Cin / j.G;
	j.cog = j.Cout / j.G;
	int64_t span = j.T + j.padl + padr - j.dil * (j.K - 1) - 1;
	if (span < 0)
		return VX_ERR_BAD_SHAPE;
	j.Tout = span / j.stride + 1;
	if (Y->shape[0] != B || Y->shape[1] != j.Cout || Y->shape[2] != j.Tout)
		return VX_ERR_BAD_SHAPE;
	if (j.Tout > 1 && Y->stride[2] != 1)
		return VX_ERR_BAD_SHAPE;
	if (B == 0 || j.Cout == 0 || j.Tout == 0)
		return VX_OK;
	j.x = X->data;
	j.sxb = X->stride[0];
	j.sxc = X->stride[1];
	j.sxt = X->stride[2];
	j.y = Y->data;
	j.syb = Y->stride[0];
	j.syc = Y->stride[1];
	if (j.Cout > 1 && j.syc < j.Tout)
		return VX_ERR_BAD_SHAPE;
	if (j.Cout <= 1)
		j.syc = j.Tout;
	if (bias) {
		j.bias = bias->data;
		j.sbias = bias->stride[bias->ndim - 1];
	}
	if (Cin == 0) { /* empty reduction: just the bias */
		for (int64_t b = 0; b < B; b++)
			for (int64_t c = 0; c < j.Cout; c++)
				for (int64_t q = 0; q < j.Tout; q++)
					j.y[b * j.syb + c * j.syc + q] = j.bias ? j.bias[c * j.sbias] : 0.0f;
		return VX_OK;
	}
	if (!vx_is_contiguous(W)) {
		float *buf = vx_scratch(ctx, VX_SCRATCH_SHARED, vx_numel(W) * (int64_t)sizeof(float));
		if (!buf)
			return VX_ERR_NOMEM;
		j.w = dense_weight(W, buf);
	} else {
		j.w = W->data;
	}
	int nt = vx_ctx_threads(ctx);
	double flops = 2.0 * (double)B * (double)j.Cout * (double)j.Tout * (double)j.cig * (double)j.K;

	if (j.cig == 1 && j.cog <= 4) {
		/* depthwise (or depthwise with a small channel multiplier): direct loop per row */
		int64_t len = (j.Tout - 1) * j.stride + (j.K - 1) * j.dil + 1;
		if (prepare_thread_scratch(ctx, len * (int64_t)sizeof(float)))
			return VX_ERR_NOMEM;
		int64_t rows = B * j.Cout;
		if (nt <= 1 || flops < PAR_MIN_FLOPS)
			for (int64_t i = 0; i < rows; i++)
				conv1d_dw_task(&j, i);
		else
			vx_parallel_for(ctx, rows, conv1d_dw_task, &j);
		return VX_OK;
	}

	int64_t rows = j.cig * j.K;
	int tr;
	int64_t ld;
	j.pointwise = j.K == 1 && j.stride == 1 && j.padl == 0 &&
	              blas_layout(j.cig, j.Tout, j.sxc, j.sxt, &tr, &ld) && !tr;
	/* Blocks follow one batch element's work, not the batch's: a block's GEMM path depends on
	 * its size, so an element batched across streams then gets the bits it gets alone. */
	split_gemm(j.cog, j.Tout, blocks_wanted(nt, j.G, flops / (double)B), &j.mb, &j.tb);
	if (!j.pointwise) {
		/* keep the im2col block within ~1 MiB, but at least 64 columns */
		int64_t cap = imax(64, (1 << 18) / rows);
		if (j.tb > cap)
			j.tb = cap;
		if (prepare_thread_scratch(ctx, rows * j.tb * (int64_t)sizeof(float)))
			return VX_ERR_NOMEM;
	}
	j.n_mb = cdiv(j.cog, j.mb);
	j.n_tb = cdiv(j.Tout, j.tb);
	int64_t tasks = B * j.G * j.n_mb * j.n_tb;
	if (nt <= 1 || flops < PAR_MIN_FLOPS)
		for (int64_t i = 0; i < tasks; i++)
			conv1d_gemm_task(&j, i);
	else
		vx_parallel_for(ctx, tasks, conv1d_gemm_task, &j);
	return VX_OK;
}

/* ---- VX_OP_CONV2D ---- */

typedef struct {
	vx_ctx *ctx;
	const float *x;
	int64_t sx[4];
	const float *w; /* contiguous [Cout, cig, KH, KW] */
	const float *bias;
	int64_t sbias;
	float *y;
	int64_t syb, syc;
	int64_t H, W, OH, OW, KH, KW, G, cig, cog;
	int64_t sh, sw, ph, pw, dh, dw;
	int64_t mb, n_mb, pb, n_pb; /* channel and output-position blocks per (b, g) */
} conv2d_job;

static void conv2d_task(void *p, int64_t i) {
	const conv2d_job *j = p;
	int64_t pbi = i % j->n_pb, r = i / j->n_pb;
	int64_t mbi = r % j->n_mb, bg = r / j->n_mb;
	int64_t g = bg % j->G, b = bg / j->G;
	int64_t p0 = pbi * j->pb, pn = imin(j->pb, j->OH * j->OW - p0);
	int64_t m0 = mbi * j->mb, mn = imin(j->mb, j->cog - m0);
	int64_t rows = j->cig * j->KH * j->KW;
	const float *x = j->x + b * j->sx[0] + g * j->cig * j->sx[1];
	float *col = thread_scratch(j->ctx, rows * pn * (int64_t)sizeof(float));
	for (int64_t c = 0; c < j->cig; c++)
		for (int64_t kh = 0; kh < j->KH; kh++)
			for (int64_t kw = 0; kw < j->KW; kw++) {
				float *dst = col + ((c * j->KH + kh) * j->KW + kw) * pn;
				const float *xc = x + c * j->sx[1];
				int64_t oh = p0 / j->OW, ow = p0 % j->OW;
				for (int64_t q = 0; q < pn; q++) {
					int64_t ih = oh * j->sh + kh * j->dh - j->ph;
					int64_t iw = ow * j->sw + kw * j->dw - j->pw;
					dst[q] = (ih >= 0 && ih < j->H && iw >= 0 && iw < j->W)
					             ? xc[ih * j->sx[2] + iw * j->sx[3]]
					             : 0.0f;
					if (++ow == j->OW) {
						ow = 0;
						oh++;
					}
				}
			}
	int64_t co0 = g * j->cog + m0;
	gemm_args ga;
	memset(&ga, 0, sizeof ga);
	ga.a = j->w + co0 * rows;
	ga.am = rows;
	ga.ak = 1;
	ga.b = col;
	ga.bk = pn;
	ga.bn = 1;
	ga.c = j->y + b * j->syb + co0 * j->syc + p0;
	ga.ldc = j->syc;
	ga.m = mn;
	ga.n = pn;
	ga.k = rows;
	if (j->bias) {
		ga.rbias = j->bias + co0 * j->sbias;
		ga.rbias_s = j->sbias;
	}
	gemm_block(&ga);
}

int vx_k_conv2d(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *X = vx_src(node, t, 0), *Wt = vx_src(node, t, 1), *bias = vx_src(node, t, 2);
	const vx_tensor *Y = &t[node->dst];
	if (Wt && Wt->dtype == VX_F32_P)
		return vx_conv2d_f32p(ctx, node, X, Wt, bias, Y);
	if (!is_f32(X) || !is_f32(Wt) || !is_f32(Y) || X->ndim != 4 || Wt->ndim != 4 || Y->ndim != 4)
		return VX_ERR_BAD_SHAPE;
	conv2d_job j;
	memset(&j, 0, sizeof j);
	j.ctx = ctx;
	int64_t B = X->shape[0], Cin = X->shape[1], Cout = Wt->shape[0];
	j.H = X->shape[2];
	j.W = X->shape[3];
	j.KH = Wt->shape[2];
	j.KW = Wt->shape[3];
	j.sh = node->ip[0];
	j.sw = node->ip[1];
	j.ph = node->ip[2];
	j.pw = node->ip[3];
	j.dh = node->ip[4];
	j.dw = node->ip[5];
	j.G = node->ip[6];
	if (j.sh < 1 || j.sw < 1 || j.dh < 1 || j.dw < 1 || j.ph < 0 || j.pw < 0 || j.G < 1 ||
	    j.KH < 1 || j.KW < 1)
		return VX_ERR_BAD_SHAPE;
	if (Cin % j.G || Cout % j.G || Wt->shape[1] != Cin / j.G || !check_bias(bias, Cout))
		return VX_ERR_BAD_SHAPE;
	j.cig = Cin / j.G;
	j.cog = Cout / j.G;
	int64_t sph = j.H + 2 * j.ph - j.dh * (j.KH - 1) - 1, spw = j.W + 2 * j.pw - j.dw * (j.KW - 1) - 1;
	if (sph < 0 || spw < 0)
		return VX_ERR_BAD_SHAPE;
	j.OH = sph / j.sh + 1;
	j.OW = spw / j.sw + 1;
	if (Y->shape[0] != B || Y->shape[1] != Cout || Y->shape[2] != j.OH || Y->shape[3] != j.OW)
		return VX_ERR_BAD_SHAPE;
	/* each output channel plane must be contiguous */
	if ((j.OW > 1 && Y->stride[3] != 1) || (j.OH > 1 && Y->stride[2] != j.OW))
		return VX_ERR_BAD_SHAPE;
	int64_t P = j.OH * j.OW;
	if (B == 0 || Cout == 0 || P == 0)
		return VX_OK;
	j.x = X->data;
	for (int d = 0; d < 4; d++)
		j.sx[d] = X->stride[d];
	j.y = Y->data;
	j.syb = Y->stride[0];
	j.syc = Cout > 1 ? Y->stride[1] : P;
	if (Cout > 1 && j.syc < P)
		return VX_ERR_BAD_SHAPE;
	if (bias) {
		j.bias = bias->data;
		j.sbias = bias->stride[bias->ndim - 1];
	}
	if (!vx_is_contiguous(Wt)) {
		float *buf = vx_scratch(ctx, VX_SCRATCH_SHARED, vx_numel(Wt) * (int64_t)sizeof(float));
		if (!buf)
			return VX_ERR_NOMEM;
		j.w = dense_weight(Wt, buf);
	} else {
		j.w = Wt->data;
	}
	int64_t rows = j.cig * j.KH * j.KW;
	int nt = vx_ctx_threads(ctx);
	double flops = 2.0 * (double)B * (double)Cout * (double)P * (double)rows;
	/* Blocks follow one batch element's work (see conv1d). */
	split_gemm(j.cog, P, blocks_wanted(nt, j.G, flops / (double)B), &j.mb, &j.pb);
	int64_t cap = imax(64, (1 << 18) / imax(rows, 1));
	if (j.pb > cap)
		j.pb = cap;
	if (prepare_thread_scratch(ctx, imax(rows, 1) * j.pb * (int64_t)sizeof(float)))
		return VX_ERR_NOMEM;
	j.n_mb = cdiv(j.cog, j.mb);
	j.n_pb = cdiv(P, j.pb);
	int64_t tasks = B * j.G * j.n_mb * j.n_pb;
	if (nt <= 1 || flops < PAR_MIN_FLOPS)
		for (int64_t i = 0; i < tasks; i++)
			conv2d_task(&j, i);
	else
		vx_parallel_for(ctx, tasks, conv2d_task, &j);
	return VX_OK;
}

/* ---- VX_OP_CONV_TRANSPOSE1D ---- */

typedef struct {
	vx_ctx *ctx;
	const float *x; /* rows with unit stride: x[b, c, t] = x[b*sxb + c*sxc + t] */
	int64_t sxb, sxc;
	const float *w; /* contiguous [Cin, cog, K] */
	const float *bias;
	int64_t sbias;
	float *y;
	int64_t syb, syc;
	int64_t T, Tout, K, G, cig, cog;
	int64_t stride, pad, dil;
	int64_t cb, n_cb, tb; /* output channel blocks per (b, g); input time block */
} convt_job;

static void convt_task(void *p, int64_t i) {
	const convt_job *j = p;
	int64_t cbi = i % j->n_cb, bg = i / j->n_cb;
	int64_t g = bg % j->G, b = bg / j->G;
	int64_t c0 = cbi * j->cb, cn = imin(j->cb, j->cog - c0);
	int64_t co0 = g * j->cog + c0;
	float *y = j->y + b * j->syb + co0 * j->syc;
	for (int64_t c = 0; c < cn; c++) {
		float v = j->bias ? j->bias[(co0 + c) * j->sbias] : 0.0f;
		float *yc = y + c * j->syc;
		for (int64_t q = 0; q < j->Tout; q++)
			yc[q] = v;
	}
	int64_t rows = cn * j->K, wrow = j->cog * j->K;
	float *col = thread_scratch(j->ctx, rows * j->tb * (int64_t)sizeof(float));
	const float *x = j->x + b * j->sxb + g * j->cig * j->sxc;
	for (int64_t t0 = 0; t0 < j->T; t0 += j->tb) {
		int64_t tn = imin(j->tb, j->T - t0);
		/* col[(c, k), t] = sum_ci w[ci, c0+c, k] x[ci, t0+t] */
		gemm_args ga;
		memset(&ga, 0, sizeof ga);
		ga.a = j->w + g * j->cig * wrow + c0 * j->K;
		ga.am = 1;
		ga.ak = wrow;
		ga.b = x + t0;
		ga.bk = j->sxc;
		ga.bn = 1;
		ga.c = col;
		ga.ldc = tn;
		ga.m = rows;
		ga.n = tn;
		ga.k = j->cig;
		gemm_block(&ga);
		/* col2im: y[c, (t0+t)*stride + k*dil - pad] += col[(c, k), t] */
		for (int64_t c = 0; c < cn; c++) {
			float *yc = y + c * j->syc;
			for (int64_t k = 0; k < j->K; k++) {
				const float *src = col + (c * j->K + k) * tn;
				int64_t base = t0 * j->stride + k * j->dil - j->pad;
				int64_t lo = base < 0 ? cdiv(-base, j->stride) : 0;
				int64_t last = j->Tout - 1 - base;
				int64_t hi = last < 0 ? 0 : imin(tn, last / j->stride + 1);
				float *yo = yc + base;
				if (j->stride == 1)
					for (int64_t q = lo; q < hi; q++)
						yo[q] += src[q];
				else
					for (int64_t q = lo; q < hi; q++)
						yo[q * j->stride] += src[q];
			}
		}
	}
}

int vx_k_conv_transpose1d(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *X = vx_src(node, t, 0), *W = vx_src(node, t, 1), *bias = vx_src(node, t, 2);
	const vx_tensor *Y = &t[node->dst];
	if (!is_f32(X) || !is_f32(W) || !is_f32(Y) || X->ndim != 3 || W->ndim != 3 || Y->ndim != 3)
		return VX_ERR_BAD_SHAPE;
	convt_job j;
	memset(&j, 0, sizeof j);
	j.ctx = ctx;
	int64_t B = X->shape[0], Cin = X->shape[1];
	j.T = X->shape[2];
	j.K = W->shape[2];
	j.stride = node->ip[0];
	j.pad = node->ip[1];
	int64_t opad = node->ip[2];
	j.dil = node->ip[3];
	j.G = node->ip[4];
	if (j.stride < 1 || j.dil < 1 || j.G < 1 || j.pad < 0 || opad < 0 || j.K < 1)
		return VX_ERR_BAD_SHAPE;
	if (W->shape[0] != Cin || Cin % j.G)
		return VX_ERR_BAD_SHAPE;
	j.cig = Cin / j.G;
	j.cog = W->shape[1];
	int64_t Cout = j.cog * j.G;
	if (!check_bias(bias, Cout))
		return VX_ERR_BAD_SHAPE;
	j.Tout = (j.T - 1) * j.stride - 2 * j.pad + j.dil * (j.K - 1) + opad + 1;
	if (j.T < 1 || j.Tout < 0)
		return VX_ERR_BAD_SHAPE;
	if (Y->shape[0] != B || Y->shape[1] != Cout || Y->shape[2] != j.Tout)
		return VX_ERR_BAD_SHAPE;
	if (j.Tout > 1 && Y->stride[2] != 1)
		return VX_ERR_BAD_SHAPE;
	if (B == 0 || Cout == 0 || j.Tout == 0)
		return VX_OK;
	j.y = Y->data;
	j.syb = Y->stride[0];
	j.syc = Cout > 1 ? Y->stride[1] : j.Tout;
	if (Cout > 1 && j.syc < j.Tout)
		return VX_ERR_BAD_SHAPE;
	if (bias) {
		j.bias = bias->data;
		j.sbias = bias->stride[bias->ndim - 1];
	}
	/* x rows must be unit-stride with a row stride BLAS accepts; W dense */
	int64_t sxt = j.T > 1 ? X->stride[2] : 1, sxc = X->stride[1];
	int packx = sxt != 1 || (j.cig > 1 && sxc < j.T);
	int packw = !vx_is_contiguous(W);
	int64_t nx = packx ? round_up(vx_numel(X), 16) : 0, nw = packw ? vx_numel(W) : 0;
	float *s = NULL;
	if (packx || packw) {
		s = vx_scratch(ctx, VX_SCRATCH_SHARED, (nx + nw) * (int64_t)sizeof(float));
		if (!s)
			return VX_ERR_NOMEM;
	}
	if (packx) {
		vx_tensor p, full = *X;
		full.ndim = 3;
		pack_operand(&full, s, &p);
		/* pack_operand keeps a stride-0 batch dim broadcast */
		j.x = s;
		j.sxb = p.stride[0];
		j.sxc = j.T;
	} else {
		j.x = X->data;
		j.sxb = X->stride[0];
		j.sxc = sxc;
	}
	j.w = packw ? dense_weight(W, s + nx) : W->data;
	if (Cin == 0 || j.cig == 0) {
		for (int64_t b = 0; b < B; b++)
			for (int64_t c = 0; c < Cout; c++)
				for (int64_t q = 0; q < j.Tout; q++)
					j.y[b * j.syb + c * j.syc + q] = j.bias ? j.bias[c * j.sbias] : 0.0f;
		return VX_OK;
	}
	int nt = vx_ctx_threads(ctx);
	double flops = 2.0 * (double)B * (double)Cin * (double)j.cog * (double)j.K * (double)j.T;
	int64_t want = blocks_wanted(nt, j.G, flops / (double)B); /* per batch element (see conv1d) */
	j.cb = cdiv(j.cog, imin(want, j.cog));
	j.n_cb = cdiv(j.cog, j.cb);
	/* keep the column buffer around 1 MiB */
	j.tb = imin(j.T, imax(64, (1 << 18) / (j.cb * j.K)));
	if (prepare_thread_scratch(ctx, j.cb * j.K * j.tb * (int64_t)sizeof(float)))
		return VX_ERR_NOMEM;
	int64_t tasks = B * j.G * j.n_cb;
	if (nt <= 1 || flops < PAR_MIN_FLOPS)
		for (int64_t i = 0; i < tasks; i++)
			convt_task(&j, i);
	else
		vx_parallel_for(ctx, tasks, convt_task, &j);
	return VX_OK;
}

/* ---- VX_OP_ATTENTION ---- */

/* Softmax of one row of logits, in place: s[j] = s[j]*scale + bias[j*bs] + mask[j*ms]
 * (bias, mask optional), then exp(s - max). Returns 1/sum, or 0 when every logit is -inf
 * (the row is then all zeros). */
static float softmax_row_portable(float *s, int64_t n, float scale, const float *bias,
                                  int64_t bs, const float *mask, int64_t ms) {
	float mx = -INFINITY;
	for (int64_t j = 0; j < n; j++) {
		float v = s[j] * scale;
		if (bias)
			v += bias[j * bs];
		if (mask)
			v += mask[j * ms];
		s[j] = v;
		if (v > mx)
			mx = v;
	}
	if (mx == -INFINITY) {
		memset(s, 0, (size_t)n * sizeof(float));
		return 0.0f;
	}
	float sum = 0.0f;
	for (int64_t j = 0; j < n; j++) {
		float e = expf(s[j] - mx);
		s[j] = e;
		sum += e;
	}
	return 1.0f / sum;
}

#ifdef VX_HAVE_X86
/* exp for x <= 88; 0 below -87.3 (so -inf gives 0). Relative error ~2e-7. */
__attribute__((target("avx2,fma"))) static inline __m256 exp256(__m256 x) {
	const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
	const __m256 ln2hi = _mm256_set1_ps(0.693145751953125f);
	const __m256 ln2lo = _mm256_set1_ps(1.42860682030941723212e-6f);
	__m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
	x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, ln2hi, x);
	r = _mm256_fnmadd_ps(n, ln2lo, r);
	/* e^r on |r| <= ln2/2: Taylor to degree 6 */
	__m256 p = _mm256_set1_ps(1.0f / 720.0f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	__m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
	return _mm256_andnot_ps(under, res);
}

__attribute__((target("avx2,fma"))) static inline float hmax256(__m256 v) {
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
	__m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	m = _mm_add_ps(m, _mm_movehl_ps(m, m));
	m = _mm_add_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,fma"))) static float softmax_row_avx2(float *s, int64_t n, float scale,
                                                                   const float *bias, int64_t bs,
                                                                   const float *mask, int64_t ms) {
	int vec_ok = (!bias || bs == 0 || bs == 1) && (!mask || ms == 0 || ms == 1);
	__m256 vmax = _mm256_set1_ps(-INFINITY);
	float mx = -INFINITY;
	int64_t j = 0;
	if (vec_ok) {
		__m256 vs = _mm256_set1_ps(scale);
		__m256 bconst = _mm256_set1_ps((bias && bs == 0 ? bias[0] : 0.0f) + (mask && ms == 0 ? mask[0] : 0.0f));
		int bv = bias && bs == 1, mv = mask && ms == 1;
		for (; j + 8 <= n; j += 8) {
			__m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(s + j), vs, bconst);
			if (bv)
				v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j));
			if (mv)
				v = _mm256_add_ps(v, _mm256_loadu_ps(mask + j));
			_mm256_storeu_ps(s + j, v);
			vmax = _mm256_max_ps(vmax, v);
		}
		mx = hmax256(vmax);
	}
	for (; j < n; j++) {
		float v = s[j] * scale;
		if (bias)
			v += bias[j * bs];
		if (mask)
			v += mask[j * ms];
		s[j] = v;
		if (v > mx)
			mx = v;
	}
	if (mx == -INFINITY) {
		memset(s, 0, (size_t)n * sizeof(float));
		return 0.0f;
	}
	__m256 vm = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
	for (j = 0; j + 8 <= n; j += 8) {
		__m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
		_mm256_storeu_ps(s + j, e);
		vsum = _mm256_add_ps(vsum, e);
	}
	if (j < n) {
		/* tail through the same approximation, masked */
		float tmp[8];
		int64_t r = n - j;
		for (int q = 0; q < 8; q++)
			tmp[q] = q < r ? s[j + q] - mx : -INFINITY;
		__m256 e = exp256(_mm256_loadu_ps(tmp));
		_mm256_storeu_ps(tmp, e);
		vsum = _mm256_add_ps(vsum, e);
		for (int q = 0; q < r; q++)
			s[j + q] = tmp[q];
	}
	return 1.0f / hsum256(vsum);
}

__attribute__((target("avx2,fma"))) static void scale_row_avx2(float *o, int64_t n, float f) {
	__m256 v = _mm256_set1_ps(f);
	int64_t j = 0;
	for (; j + 8 <= n; j += 8)
		_mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(o + j), v));
	for (; j < n; j++)
		o[j] *= f;
}

/* Decode attention (one query position; the rows are the query heads sharing a kv head):
 * each key and value row is read once for all of them, straight from the cache with the next
 * rows prefetched. Keys the mask hides (−Inf) before the first seen one and after the last
 * (a cache bucket's unwritten tail, a sliding window) are not read at all; hidden ones in
 * between are skipped by blocks of four. Query rows go two at a time, so that each key and
 * value vector is loaded (and widened) once for both: 1.1-1.2x the one-row-at-a-time kernel
 * on a warm cache, and the same on a cold one, where the reads from memory bound it.
 * The cache is f32, or f16 (f16 != 0) widened in registers: half the bytes from memory.
 * s holds rows × Tk scores, inv the rows' softmax normalisers. */
#define PF_ROWS 8 /* cache rows ahead that decode attention prefetches */
#define KV_FN __attribute__((target("avx2,fma,f16c")))

/* 8 values of a cache row from element e: f32, or f16 widened. */
static KV_FN inline __attribute__((always_inline)) __m256 kv_load8(const char *row, int64_t e, int f16) {
	if (f16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * e)));
	return _mm256_loadu_ps((const float *)row + e);
}

/* The sums of a0..a3's lanes, in that order. */
static KV_FN inline __m128 hsum4_256(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
	__m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
	return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* Scores of keys [t, t+nt) (nt <= 4; k0 the first's row) for query rows q0 and, when two,
 * q1, into s0 and s1: the dot products over D (a multiple of 8). */
static KV_FN inline __attribute__((always_inline)) void
qk_block(const float *q0, const float *q1, int two, const char *k0, int64_t skt, int64_t nt, int64_t D, float *s0,
         float *s1, int f16) {
	const char *k1 = nt > 1 ? k0 + skt : k0, *k2 = nt > 2 ? k0 + 2 * skt : k0, *k3 = nt > 3 ? k0 + 3 * skt : k0;
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
	for (int64_t d = 0; d < D; d += 8) {
		__m256 x0 = kv_load8(k0, d, f16), x1 = kv_load8(k1, d, f16), x2 = kv_load8(k2, d, f16),
		       x3 = kv_load8(k3, d, f16);
		__m256 qa = _mm256_loadu_ps(q0 + d);
		a0 = _mm256_fmadd_ps(qa, x0, a0);
		a1 = _mm256_fmadd_ps(qa, x1, a1);
		a2 = _mm256_fmadd_ps(qa, x2, a2);
		a3 = _mm256_fmadd_ps(qa, x3, a3);
		if (two) {
			__m256 qb = _mm256_loadu_ps(q1 + d);
			b0 = _mm256_fmadd_ps(qb, x0, b0);
			b1 = _mm256_fmadd_ps(qb, x1, b1);
			b2 = _mm256_fmadd_ps(qb, x2, b2);
			b3 = _mm256_fmadd_ps(qb, x3, b3);
		}
	}
	float sa[4], sb[4];
	_mm_storeu_ps(sa, hsum4_256(a0, a1, a2, a3));
	if (two)
		_mm_storeu_ps(sb, hsum4_256(b0, b1, b2, b3));
	for (int64_t i = 0; i < nt; i++) {
		s0[i] = sa[i];
		if (two)
			s1[i] = sb[i];
	}
}

static KV_FN inline __attribute__((always_inline)) void
attn_decode_body(const float *q, int64_t ldq, const char *k, int64_t skt, const char *v, int64_t svt, float *o,
                 int64_t ldo, int64_t rows, int64_t Tk, int64_t D, int64_t Dv, float scale, const float *bias,
                 int64_t sbh, int64_t sbk, const float *mask, int64_t smk, float *s, float *inv, int f16) {
	const int64_t es = f16 ? 2 : 4; /* bytes per cache value */
	skt *= es;
	svt *= es;
	/* the keys the mask can let through: [lo, hi) */
	int64_t lo = 0, hi = Tk;
	if (mask) {
		while (lo < hi && mask[lo * smk] == -INFINITY)
			lo++;
		while (hi > lo && mask[(hi - 1) * smk] == -INFINITY)
			hi--;
	}
	const int64_t n = hi - lo;
	if (n == 0) { /* every key hidden: zeros, as the softmax of all −Inf gives */
		for (int64_t r = 0; r < rows; r++)
			memset(o + r * ldo, 0, (size_t)Dv * sizeof(float));
		return;
	}
	k += lo * skt;
	v += lo * svt;
	if (mask)
		mask += lo * smk;
	if (bias)
		bias += lo * sbk;
	for (int64_t r = 0; r < rows; r += 2) {
		const int two = r + 1 < rows;
		float *s0 = s + r * n, *s1 = s0 + n;
		for (int64_t t = 0; t < n; t += 4) {
			int64_t nt = n - t < 4 ? n - t : 4, live = 0;
			for (int64_t i = 0; i < nt; i++)
				live += !(mask && mask[(t + i) * smk] == -INFINITY);
			if (!live) { /* the mask's −Inf decides; a hidden row's garbage never meets it */
				for (int64_t i = 0; i < nt; i++) {
					s0[t + i] = 0.0f;
					if (two)
						s1[t + i] = 0.0f;
				}
				continue;
			}
			/* the cache comes from memory, not from the caches: keep the next rows in flight */
			if (r == 0)
				for (int64_t i = t + PF_ROWS; i < t + PF_ROWS + 4 && i < n; i++)
					for (int64_t b = 0; b < D * es; b += 64)
						_mm_prefetch(k + i * skt + b, _MM_HINT_T0);
			qk_block(q + r * ldq, q + (r + 1) * ldq, two, k + t * skt, skt, nt, D, s0 + t, s1 + t, f16);
			if (mask)
				for (int64_t i = 0; i < nt; i++)
					if (mask[(t + i) * smk] == -INFINITY) {
						s0[t + i] = 0.0f; /* garbage (NaN) in a hidden row never meets the −Inf */
						if (two)
							s1[t + i] = 0.0f;
					}
		}
	}
	for (int64_t r = 0; r < rows; r++)
		inv[r] = softmax_row_avx2(s + r * n, n, scale, bias ? bias + r * sbh : NULL, sbk, mask, smk);
	/* o = P V, a value row at a time (one pass over the cache, as it streams from memory),
	 * for two query rows at once; then the rows are normalised */
	for (int64_t r = 0; r < rows; r++)
		memset(o + r * ldo, 0, (size_t)Dv * sizeof(float));
	for (int64_t r = 0; r < rows; r += 2) {
		const int two = r + 1 < rows;
		const float *p0 = s + r * n, *p1 = p0 + n;
		float *o0 = o + r * ldo, *o1 = o0 + ldo;
		for (int64_t t = 0; t < n; t++) {
			const char *vt = v + t * svt;
			if (r == 0 && t + PF_ROWS < n)
				for (int64_t b = 0; b < Dv * es; b += 64)
					_mm_prefetch(vt + PF_ROWS * svt + b, _MM_HINT_T0);
			float w0 = p0[t], w1 = two ? p1[t] : 0.0f;
			if (w0 == 0.0f && w1 == 0.0f)
				continue; /* hidden, or underflowed: adds nothing */
			__m256 pa = _mm256_set1_ps(w0), pb = _mm256_set1_ps(w1);
			for (int64_t e = 0; e < Dv; e += 8) {
				__m256 x = kv_load8(vt, e, f16);
				_mm256_storeu_ps(o0 + e, _mm256_fmadd_ps(pa, x, _mm256_loadu_ps(o0 + e)));
				if (two)
					_mm256_storeu_ps(o1 + e, _mm256_fmadd_ps(pb, x, _mm256_loadu_ps(o1 + e)));
			}
		}
	}
	for (int64_t r = 0; r < rows; r++)
		scale_row_avx2(o + r * ldo, Dv, inv[r]);
}

/* The two instances: the f32 one runs no f16c instruction (its callers check AVX2 and FMA
 * only); the f16 one runs where the CPU has F16C. */
static KV_FN void attn_decode_avx2(const float *q, int64_t ldq, const char *k, int64_t skt, const char *v,
                                   int64_t svt, float *o, int64_t ldo, int64_t rows, int64_t Tk, int64_t D,
                                   int64_t Dv, float scale, const float *bias, int64_t sbh, int64_t sbk,
                                   const float *mask, int64_t smk, float *s, float *inv) {
	attn_decode_body(q, ldq, k, skt, v, svt, o, ldo, rows, Tk, D, Dv, scale, bias, sbh, sbk, mask, smk, s, inv, 0);
}

static KV_FN void attn_decode_f16(const float *q, int64_t ldq, const char *k, int64_t skt, const char *v,
                                  int64_t svt, float *o, int64_t ldo, int64_t rows, int64_t Tk, int64_t D,
                                  int64_t Dv, float scale, const float *bias, int64_t sbh, int64_t sbk,
                                  const float *mask, int64_t smk, float *s, float *inv) {
	attn_decode_body(q, ldq, k, skt, v, svt, o, ldo, rows, Tk, D, Dv, scale, bias, sbh, sbk, mask, smk, s, inv, 1);
}
#endif

int vx_attn_decode_kernel = 1;

typedef struct {
	vx_ctx *ctx;
	const float *q;
	const void *k, *v; /* f32, or f16 where kv16 (a half-precision cache the decode kernel reads) */
	int kv16;
	float *o;
	int64_t sq[3], sk[3], sv[3], so[3]; /* b, h, t strides in elements (inner stride 1) */
	const float *mask;
	int64_t smq, smk;
	const float *bias;
	int64_t sbh, sbq, sbk;
	int64_t B, H, Hk, G, Tq, Tk, D, Dv;
	float scale;
	int group_mode; /* Tq == 1: one task per (b, kv head), its G query heads are the rows */
	int64_t qb, n_qb;
	int simd;
} attn_job;

/* Whether the job's tasks run the decode kernel (attn_decode_avx2 / attn_decode_f16). */
static int decode_kernel(const attn_job *j) {
#ifdef VX_HAVE_X86
	return j->group_mode && j->simd && vx_attn_decode_kernel && j->D % 8 == 0 && j->Dv % 8 == 0;
#else
	(void)j;
	return 0;
#endif
}

/* An f16 operand [B, H, T, D] (unit inner stride) widened into dst as a contiguous f32 one. */
static void widen_f16_operand(const vx_tensor *t, float *dst, vx_tensor *out) {
	*out = *t;
	out->data = dst;
	out->dtype = VX_F32;
	int64_t st = 1;
	for (int d = 3; d >= 0; d--) {
		out->stride[d] = st;
		st *= t->shape[d];
	}
	const uint16_t *src = t->data;
	for (int64_t b = 0; b < t->shape[0]; b++)
		for (int64_t h = 0; h < t->shape[1]; h++)
			for (int64_t r = 0; r < t->shape[2]; r++, dst += t->shape[3])
				vx_encode(VX_F16, VX_F32, src + b * t->stride[0] + h * t->stride[1] + r * t->stride[2], dst, t->shape[3]);
}

static void attn_task(void *p, int64_t i) {
	const attn_job *j = p;
	int64_t b, h0, hk, q0, rows, ldq, ldo;
	const float *q;
	float *o;
	if (j->group_mode) {
		hk = i % j->Hk;
		b = i / j->Hk;
		h0 = hk * j->G;
		q0 = 0;
		rows = j->G;
		q = j->q + b * j->sq[0] + h0 * j->sq[1];
		o = j->o + b * j->so[0] + h0 * j->so[1];
		ldq = j->sq[1];
		ldo = j->so[1];
	} else {
		int64_t qbi = i % j->n_qb, bh = i / j->n_qb;
		h0 = bh % j->H;
		b = bh / j->H;
		hk = h0 / j->G;
		q0 = qbi * j->qb;
		rows = imin(j->qb, j->Tq - q0);
		q = j->q + b * j->sq[0] + h0 * j->sq[1] + q0 * j->sq[2];
		o = j->o + b * j->so[0] + h0 * j->so[1] + q0 * j->so[2];
		ldq = j->sq[2];
		ldo = j->so[2];
	}
	int64_t Tk = j->Tk, es = j->kv16 ? 2 : 4;
	const char *kb = (const char *)j->k + (b * j->sk[0] + hk * j->sk[1]) * es;
	const char *vb = (const char *)j->v + (b * j->sv[0] + hk * j->sv[1]) * es;
	float *s = thread_scratch(j->ctx, (rows * Tk + rows) * (int64_t)sizeof(float));
	float *inv = s + rows * Tk;
#ifdef VX_HAVE_X86
	if (decode_kernel(j)) {
		(j->kv16 ? attn_decode_f16 : attn_decode_avx2)(q, ldq, kb, j->sk[2], vb, j->sv[2], o, ldo, rows, Tk, j->D,
		                                               j->Dv, j->scale, j->bias ? j->bias + h0 * j->sbh : NULL,
		                                               j->sbh, j->sbk, j->mask, j->smk, s, inv);
		return;
	}
#endif
	const float *k = (const float *)kb, *v = (const float *)vb; /* f32 here: an f16 cache was widened */

	/* S = Q K^T */
	gemm_args ga;
	memset(&ga, 0, sizeof ga);
	ga.a = q;
	ga.am = ldq;
	ga.ak = 1;
	ga.b = k;
	ga.bk = 1;
	ga.bn = j->sk[2];
	ga.c = s;
	ga.ldc = Tk;
	ga.m = rows;
	ga.n = Tk;
	ga.k = j->D;
	gemm_block(&ga);

	for (int64_t r = 0; r < rows; r++) {
		int64_t h = j->group_mode ? h0 + r : h0, qi = j->group_mode ? 0 : q0 + r;
		const float *bias = j->bias ? j->bias + h * j->sbh + qi * j->sbq : NULL;
		const float *mask = j->mask ? j->mask + qi * j->smq : NULL;
#ifdef VX_HAVE_X86
		if (j->simd)
			inv[r] = softmax_row_avx2(s + r * Tk, Tk, j->scale, bias, j->sbk, mask, j->smk);
		else
#endif
			inv[r] = softmax_row_portable(s + r * Tk, Tk, j->scale, bias, j->sbk, mask, j->smk);
	}

	/* O = P V, then normalise the rows */
	memset(&ga, 0, sizeof ga);
	ga.a = s;
	ga.am = Tk;
	ga.ak = 1;
	ga.b = v;
	ga.bk = j->sv[2];
	ga.bn = 1;
	ga.c = o;
	ga.ldc = ldo;
	ga.m = rows;
	ga.n = j->Dv;
	ga.k = Tk;
	gemm_block(&ga);
	for (int64_t r = 0; r < rows; r++) {
		float *orow = o + r * ldo;
#ifdef VX_HAVE_X86
		if (j->simd) {
			scale_row_avx2(orow, j->Dv, inv[r]);
			continue;
		}
#endif
		for (int64_t e = 0; e < j->Dv; e++)
			orow[e] *= inv[r];
	}
}

/* The last two dims of an optional mask/bias: accept [.., R or 1, C or 1] with every further
 * leading dim of size 1 except `keep` (the head dim of the bias, the third from last).
 * Sets the strides (0 where broadcast). */
static int broadcast_2d(const vx_tensor *m, int64_t R, int64_t Cn, int head_dim, int64_t H,
                        int64_t *sh, int64_t *sr, int64_t *sc) {
	int nd = m->ndim;
	if (nd < 2 || m->dtype != VX_F32 || !m->data)
		return 0;
	int64_t r = m->shape[nd - 2], c = m->shape[nd - 1];
	if ((r != R && r != 1) || (c != Cn && c != 1))
		return 0;
	*sr = r == 1 ? 0 : m->stride[nd - 2];
	*sc = c == 1 ? 0 : m->stride[nd - 1];
	int lead_end = nd - 2;
	*sh = 0;
	if (head_dim && nd >= 3) {
		int64_t hh = m->shape[nd - 3];
		if (hh != H && hh != 1)
			return 0;
		*sh = hh == 1 ? 0 : m->stride[nd - 3];
		lead_end = nd - 3;
	}
	for (int d = 0; d < lead_end; d++)
		if (m->shape[d] != 1)
			return 0;
	return 1;
}

int vx_k_attention(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *Q = vx_src(node, t, 0), *K = vx_src(node, t, 1), *V = vx_src(node, t, 2);
	const vx_tensor *O = &t[node->dst];
	const vx_tensor *M = node->ip[0] ? vx_src(node, t, 3) : NULL;
	const vx_tensor *Bi = node->ip[1] ? vx_src(node, t, 4) : NULL;
	if (!is_f32(Q) || !kv_ok(K) || !kv_ok(V) || !is_f32(O))
		return VX_ERR_BAD_SHAPE;
	if ((node->ip[0] && !M) || (node->ip[1] && !Bi))
		return VX_ERR_BAD_SHAPE;
	if (Q->ndim != 4 || K->ndim != 4 || V->ndim != 4 || O->ndim != 4)
		return VX_ERR_BAD_SHAPE;
	attn_job j;
	memset(&j, 0, sizeof j);
	j.ctx = ctx;
	j.B = Q->shape[0];
	j.H = Q->shape[1];
	j.Tq = Q->shape[2];
	j.D = Q->shape[3];
	j.Hk = K->shape[1];
	j.Tk = K->shape[2];
	j.Dv = V->shape[3];
	if (K->shape[0] != j.B || K->shape[3] != j.D || V->shape[0] != j.B || V->shape[1] != j.Hk ||
	    V->shape[2] != j.Tk)
		return VX_ERR_BAD_SHAPE;
	if (j.Hk < 1 || j.H % j.Hk)
		return VX_ERR_BAD_SHAPE;
	if (O->shape[0] != j.B || O->shape[1] != j.H || O->shape[2] != j.Tq || O->shape[3] != j.Dv)
		return VX_ERR_BAD_SHAPE;
	j.G = j.H / j.Hk;
	if (M && !broadcast_2d(M, j.Tq, j.Tk, 0, 0, &(int64_t){0}, &j.smq, &j.smk))
		return VX_ERR_BAD_SHAPE;
	if (Bi && !broadcast_2d(Bi, j.Tq, j.Tk, 1, j.H, &j.sbh, &j.sbq, &j.sbk))
		return VX_ERR_BAD_SHAPE;
	j.mask = M ? M->data : NULL;
	j.bias = Bi ? Bi->data : NULL;
	j.scale = node->fp[0];
	if (j.B == 0 || j.H == 0 || j.Tq == 0 || j.Dv == 0)
		return VX_OK;
	/* output rows: unit inner stride, rows not overlapping */
	if ((j.Dv > 1 && O->stride[3] != 1) || (j.Tq > 1 && O->stride[2] < j.Dv))
		return VX_ERR_BAD_SHAPE;
	if (j.Tk == 0) { /* nothing to attend to: zeros */
		for (int64_t b = 0; b < j.B; b++)
			for (int64_t h = 0; h < j.H; h++)
				for (int64_t i = 0; i < j.Tq; i++)
					memset((float *)O->data + b * O->stride[0] + h * O->stride[1] + i * O->stride[2], 0,
					       (size_t)j.Dv * sizeof(float));
		return VX_OK;
	}

	/* q, k, v: unit inner stride and non-overlapping rows, else pack */
	const vx_tensor *in[3] = {Q, K, V};
	int64_t inner[3] = {j.D, j.D, j.Dv}, rowsN[3] = {j.Tq, j.Tk, j.Tk};
	int need[3];
	for (int x = 0; x < 3; x++) {
		const vx_tensor *s = in[x];
		need[x] = (inner[x] > 1 && s->stride[3] != 1) || (rowsN[x] > 1 && s->stride[2] < inner[x]);
		if (need[x] && s->dtype != VX_F32)
			return VX_ERR_BAD_SHAPE; /* an f16 cache is read in place or widened, never packed */
	}
	/* decode with grouped heads: the G query heads of a kv head share one GEMM, provided
	 * their rows do not overlap (a packed q's do not, unless broadcast over the heads) */
	j.group_mode = j.Tq == 1 && j.G > 1 && (need[0] ? Q->stride[1] != 0 : Q->stride[1] >= j.D) && O->stride[1] >= j.Dv;
	j.simd = vx_use_avx2();
	/* An f16 cache: the decode kernel reads it in place; any other path gets it widened once,
	 * with the packing. */
	j.kv16 = K->dtype == VX_F16 && V->dtype == VX_F16 && decode_kernel(&j) && vx_use_f16c();
	int64_t total = 0;
	for (int x = 1; x < 3; x++)
		need[x] |= in[x]->dtype == VX_F16 && !j.kv16;
	for (int x = 0; x < 3; x++)
		if (need[x])
			total += round_up(vx_numel(in[x]), 16);
	const void *ptr[3] = {Q->data, K->data, V->data};
	int64_t str[3][3];
	for (int x = 0; x < 3; x++)
		for (int d = 0; d < 3; d++)
			str[x][d] = in[x]->stride[d];
	if (total) {
		float *buf = vx_scratch(ctx, VX_SCRATCH_SHARED, total * (int64_t)sizeof(float));
		if (!buf)
			return VX_ERR_NOMEM;
		for (int x = 0; x < 3; x++) {
			if (!need[x])
				continue;
			vx_tensor p, full = *in[x];
			full.ndim = 4;
			if (full.dtype == VX_F16)
				widen_f16_operand(&full, buf, &p);
			else /* materialise everything (pack_operand keeps only leading stride-0 dims) */
				pack_operand(&full, buf, &p);
			ptr[x] = buf;
			for (int d = 0; d < 3; d++)
				str[x][d] = p.stride[d];
			buf += round_up(vx_numel(in[x]), 16);
		}
	}
	j.q = ptr[0];
	j.k = ptr[1];
	j.v = ptr[2];
	for (int d = 0; d < 3; d++) {
		j.sq[d] = str[0][d];
		j.sk[d] = str[1][d];
		j.sv[d] = str[2][d];
		j.so[d] = O->stride[d];
	}
	if (j.Tq <= 1) {
		j.sq[2] = j.D;
		j.so[2] = j.Dv;
	}
	if (j.Tk <= 1) {
		j.sk[2] = j.D;
		j.sv[2] = j.Dv;
	}
	j.o = O->data;

	int nt = vx_ctx_threads(ctx);
	int64_t tasks;
	int64_t rows_max;
	if (j.group_mode) {
		tasks = j.B * j.Hk;
		rows_max = j.G;
	} else {
		/* query blocks: score block about 128 KiB, and enough tasks for the threads. The block
		 * follows one batch element's heads, so that each element (a stream batched with
		 * others) gets the blocks, and so the bits, it gets alone. */
		int64_t qb = imax(8, imin(256, (32 * 1024) / imax(j.Tk, 1)));
		int64_t bh = j.B * j.H;
		if (j.H < 2 * nt)
			qb = imin(qb, imax(4, cdiv(j.Tq, cdiv(2 * nt, j.H))));
		j.qb = imin(qb, j.Tq);
		j.n_qb = cdiv(j.Tq, j.qb);
		tasks = bh * j.n_qb;
		rows_max = j.qb;
	}
	if (prepare_thread_scratch(ctx, (rows_max * j.Tk + rows_max) * (int64_t)sizeof(float)))
		return VX_ERR_NOMEM;
	/* Handing a small attention's tasks to the other threads costs more than it saves: a
	 * MeanVC2 DiT step's (2 heads, 16 x 52) takes 9.7 µs on one thread and 15.7 on two
	 * (BenchmarkAttention/dit-step). The tasks are the same either way, and so are the bits. */
	double flops = 2.0 * (double)j.B * (double)j.H * (double)j.Tq * (double)j.Tk * (double)(j.D + j.Dv);
	if (nt <= 1 || flops < ATTN_PAR_MIN_FLOPS)
		for (int64_t i = 0; i < tasks; i++)
			attn_task(&j, i);
	else
		vx_parallel_for(ctx, tasks, attn_task, &j);
	return VX_OK;
}

/* ---- benchmark hook ---- */

void vx_bench_openblas_sgemm(int threads, int64_t m, int64_t n, int64_t k, int trans_b,
                             const float *a, const float *b, int64_t copies, int64_t first, float *c,
                             int64_t iters) {
	vx_init();
	openblas_set_num_threads(threads);
	if (copies < 1)
		copies = 1;
	for (int64_t i = 0; i < iters; i++)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m,
		            (int)n, (int)k, 1.0f, a, (int)k, b + (first + i) % copies * n * k, trans_b ? (int)k : (int)n,
		            0.0f, c, (int)n);
	openblas_set_num_threads(1);
}
