/* Data movement: COPY, CONCAT, PAD, GATHER_ROWS, INTERP_LINEAR.
 *
 * COPY, CONCAT and PAD move 4-byte elements (f32 or i32; source and destination types must
 * match) with one strided N-d copy routine: dims of size 1 are dropped, dims contiguous in both
 * tensors are merged, and the innermost run is a memcpy, a fill (source stride 0) or a strided
 * loop. CONCAT and PAD accept strided sources as well (the ABI only promises contiguous ones);
 * PAD's reflect and replicate borders are the same copy with a negative or zero stride. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kern.h"

/* ---- strided N-d copy of 4-byte elements ---- */

typedef struct {
	int nd;
	int64_t shape[5];
	int64_t st[2][5]; /* dst, src (elements; any sign; src 0 broadcasts) */
	uint32_t *d;
	const uint32_t *s;
} copy_job;

static void copy_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const copy_job *j = arg;
	int64_t od = 0, os = 0, r = row;
	for (int k = j->nd - 2; k >= 0; k--) {
		int64_t ix = r % j->shape[k];
		r /= j->shape[k];
		od += ix * j->st[0][k];
		os += ix * j->st[1][k];
	}
	int in = j->nd - 1;
	int64_t sd = j->st[0][in], ss = j->st[1][in], n = hi - lo;
	uint32_t *d = j->d + od + lo * sd;
	const uint32_t *s = j->s + os + lo * ss;
	if (sd == 1 && ss == 1) {
		memmove(d, s, (size_t)n * 4);
	} else if (ss == 0) {
		uint32_t v = *s;
		if (sd == 1)
			for (int64_t i = 0; i < n; i++)
				d[i] = v;
		else
			for (int64_t i = 0; i < n; i++)
				d[i * sd] = v;
	} else if (sd == 1) {
		for (int64_t i = 0; i < n; i++)
			d[i] = s[i * ss];
	} else {
		for (int64_t i = 0; i < n; i++)
			d[i * sd] = s[i * ss];
	}
}

/* Copy shape[0..nd) from s (strides ss) to d (strides sd). nd <= 5. */
static void copy_nd(vx_ctx *ctx, int nd, const int64_t *shape, void *d, const int64_t *sd, const void *s,
                    const int64_t *ss) {
	copy_job j = {.d = d, .s = s};
	int off = 5 - nd;
	for (int i = 0; i < 5; i++) {
		j.shape[i] = i < off ? 1 : shape[i - off];
		j.st[0][i] = i < off ? 0 : sd[i - off];
		j.st[1][i] = i < off ? 0 : ss[i - off];
		if (j.shape[i] == 0)
			return;
	}
	/* drop size-1 dims, merge dims contiguous in both */
	int64_t sh[5], st[2][5];
	int n = 0;
	for (int i = 0; i < 5; i++) {
		if (j.shape[i] == 1)
			continue;
		if (n > 0 && st[0][n - 1] == j.st[0][i] * j.shape[i] && st[1][n - 1] == j.st[1][i] * j.shape[i]) {
			sh[n - 1] *= j.shape[i];
			st[0][n - 1] = j.st[0][i];
			st[1][n - 1] = j.st[1][i];
			continue;
		}
		sh[n] = j.shape[i];
		st[0][n] = j.st[0][i];
		st[1][n] = j.st[1][i];
		n++;
	}
	if (n == 0) {
		sh[0] = 1;
		st[0][0] = st[1][0] = 1;
		n = 1;
	}
	j.nd = n;
	int64_t rows = 1;
	for (int i = 0; i < n; i++) {
		j.shape[i] = sh[i];
		j.st[0][i] = st[0][i];
		j.st[1][i] = st[1][i];
		if (i < n - 1)
			rows *= sh[i];
	}
	vx_run_segs(ctx, rows, sh[n - 1], 1.0, 2048, copy_seg, &j);
}

/* ---- COPY ---- */

int vx_k_copy(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	if (node->n_src != 1 || !vx_tensor_ok(x, -1) || !vx_tensor_ok(y, x ? x->dtype : -1) || !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	int64_t sx[5], sy[5], stx[5], sty[5];
	vx_pad5(x, sx, stx);
	vx_pad5(y, sy, sty);
	if (memcmp(sx, sy, sizeof sx) != 0)
		return VX_ERR_BAD_SHAPE;
	if (x->data == y->data && vx_is_contiguous(x))
		return VX_OK;
	int64_t s = 1;
	for (int i = 4; i >= 0; i--) {
		sty[i] = s;
		s *= sy[i];
	}
	copy_nd(ctx, 5, sy, y->data, sty, x->data, stx);
	return VX_OK;
}

/* ---- CONCAT ---- */

static int norm_axis(int64_t axis, int ndim) {
	if (axis < 0)
		axis += ndim;
	return (axis < 0 || axis >= ndim) ? -1 : (int)axis;
}

int vx_k_concat(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *y = &t[node->dst];
	if (!vx_tensor_ok(y, -1) || !vx_is_contiguous(y) || node->n_src < 1 || node->n_src > VX_MAX_SRC)
		return VX_ERR_BAD_SHAPE;
	int axis = norm_axis(node->ip[0], y->ndim);
	if (axis < 0)
		return VX_ERR_BAD_SHAPE;
	int64_t total = 0;
	for (int k = 0; k < node->n_src; k++) {
		const vx_tensor *x = vx_src(node, t, k);
		if (!vx_tensor_ok(x, y->dtype) || x->ndim != y->ndim)
			return VX_ERR_BAD_SHAPE;
		for (int i = 0; i < y->ndim; i++)
			if (i != axis && x->shape[i] != y->shape[i])
				return VX_ERR_BAD_SHAPE;
		total += x->shape[axis];
	}
	if (total != y->shape[axis])
		return VX_ERR_BAD_SHAPE;
	int64_t off = 0;
	for (int k = 0; k < node->n_src; k++) {
		const vx_tensor *x = vx_src(node, t, k);
		copy_nd(ctx, y->ndim, x->shape, (uint32_t *)y->data + off * y->stride[axis], y->stride, x->data,
		        x->stride);
		off += x->shape[axis];
	}
	return VX_OK;
}

/* ---- PAD ---- */

int vx_k_pad(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	if (node->n_src != 1 || !vx_tensor_ok(x, -1) || !vx_tensor_ok(y, x ? x->dtype : -1) || !vx_is_contiguous(y) ||
	    x->ndim != y->ndim)
		return VX_ERR_BAD_SHAPE;
	int axis = norm_axis(node->ip[0], y->ndim);
	int64_t pl = node->ip[1], pr = node->ip[2], mode = node->ip[3];
	if (axis < 0 || pl < 0 || pr < 0 || mode < 0 || mode > 2)
		return VX_ERR_BAD_SHAPE;
	int64_t n = x->shape[axis];
	for (int i = 0; i < y->ndim; i++)
		if (y->shape[i] != (i == axis ? n + pl + pr : x->shape[i]))
			return VX_ERR_BAD_SHAPE;
	if (mode == 1 && (pl >= n || pr >= n)) /* reflect excludes the edge: pad < size */
		return VX_ERR_BAD_SHAPE;
	if (mode == 2 && n == 0 && pl + pr > 0)
		return VX_ERR_BAD_SHAPE;
	if (vx_numel(y) == 0)
		return VX_OK;
	int nd = y->ndim;
	int64_t ya = y->stride[axis], xa = x->stride[axis];
	uint32_t *yd = y->data;
	const uint32_t *xd = x->data;
	copy_nd(ctx, nd, x->shape, yd + pl * ya, y->stride, xd, x->stride);
	uint32_t fill;
	if (y->dtype == VX_I32) {
		int32_t v = (int32_t)node->fp[0];
		memcpy(&fill, &v, 4);
	} else {
		memcpy(&fill, &node->fp[0], 4);
	}
	int64_t zero[VX_MAX_DIMS] = {0};
	for (int side = 0; side < 2; side++) {
		int64_t p = side == 0 ? pl : pr;
		if (p == 0)
			continue;
		int64_t sh[VX_MAX_DIMS], ss[VX_MAX_DIMS];
		memcpy(sh, x->shape, sizeof sh);
		memcpy(ss, x->stride, sizeof ss);
		sh[axis] = p;
		uint32_t *dst = side == 0 ? yd : yd + (pl + n) * ya;
		const uint32_t *src;
		if (mode == 0) {
			copy_nd(ctx, nd, sh, dst, y->stride, &fill, zero);
			continue;
		}
		if (mode == 1) { /* left: x[pl], x[pl-1], ..., x[1]; right: x[n-2], x[n-3], ... */
			src = side == 0 ? xd + pl * xa : xd + (n - 2) * xa;
			ss[axis] = -xa;
		} else { /* replicate x[0] / x[n-1] */
			src = side == 0 ? xd : xd + (n - 1) * xa;
			ss[axis] = 0;
		}
		copy_nd(ctx, nd, sh, dst, y->stride, src, ss);
	}
	return VX_OK;
}

/* ---- GATHER_ROWS ---- */

typedef struct {
	int64_t D;
	const uint32_t *table;
	const int32_t *idx;
	uint32_t *y;
} gather_job;

static void gather_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const gather_job *j = arg;
	memcpy(j->y + row * j->D + lo, j->table + (int64_t)j->idx[row] * j->D + lo, (size_t)(hi - lo) * 4);
}

/* An embedding table kept as Q8_0/F16: the gathered rows come out as f32. */
static int gather_quant(const vx_tensor *tab, const vx_tensor *ix, const vx_tensor *y) {
	if (!vx_tensor_ok(ix, VX_I32) || !vx_tensor_ok(y, VX_F32) || tab->ndim != 2 || !tab->data ||
	    !vx_is_contiguous(ix) || !vx_is_contiguous(y) || y->ndim < 1)
		return VX_ERR_BAD_SHAPE;
	int64_t N = tab->shape[0], D = tab->shape[1], M = vx_numel(ix), rb = vx_qrow_bytes(tab->dtype, D);
	if (rb == 0 || y->shape[y->ndim - 1] != D || vx_numel(y) != M * D)
		return VX_ERR_BAD_SHAPE;
	const int32_t *idx = ix->data;
	for (int64_t i = 0; i < M; i++)
		if (idx[i] < 0 || idx[i] >= N)
			return VX_ERR_BAD_SHAPE;
	for (int64_t i = 0; i < M; i++)
		vx_dequant_row(tab->dtype, (const char *)tab->data + idx[i] * rb, (float *)y->data + i * D, D);
	return VX_OK;
}

int vx_k_gather_rows(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *tab = vx_src(node, t, 0), *ix = vx_src(node, t, 1), *y = &t[node->dst];
	if (node->n_src == 2 && tab && (tab->dtype == VX_Q8_0 || tab->dtype == VX_F16 || tab->dtype == VX_Q4_K || tab->dtype == VX_BF16))
		return gather_quant(tab, ix, y);
	if (node->n_src != 2 || !vx_tensor_ok(tab, -1) || !vx_tensor_ok(ix, VX_I32) || !vx_tensor_ok(y, tab ? tab->dtype : -1))
		return VX_ERR_BAD_SHAPE;
	if (tab->ndim != 2 || !vx_is_contiguous(tab) || !vx_is_contiguous(ix) || !vx_is_contiguous(y) ||
	    y->ndim < 1)
		return VX_ERR_BAD_SHAPE;
	int64_t N = tab->shape[0], D = tab->shape[1], M = vx_numel(ix);
	if (y->shape[y->ndim - 1] != D || vx_numel(y) != M * D)
		return VX_ERR_BAD_SHAPE;
	const int32_t *idx = ix->data;
	for (int64_t i = 0; i < M; i++)
		if (idx[i] < 0 || idx[i] >= N)
			return VX_ERR_BAD_SHAPE;
	gather_job j = {.D = D, .table = tab->data, .idx = idx, .y = y->data};
	vx_run_segs(ctx, M, D, 1.0, 2048, gather_seg, &j);
	return VX_OK;
}

/* ---- SCATTER_ROWS ---- */

int vx_k_scatter_rows(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	(void)ctx;
	const vx_tensor *rows = vx_src(node, t, 0), *ix = vx_src(node, t, 1), *tab = &t[node->dst];
	/* an f16 table (a half-precision KV cache) takes f32 rows, rounded to nearest even */
	int half = tab->dtype == VX_F16;
	if (node->n_src != 2 || !vx_tensor_ok(rows, half ? VX_F32 : -1) || !vx_tensor_ok(ix, VX_I32) ||
	    !vx_tensor_ok(tab, half ? VX_F16 : rows->dtype))
		return VX_ERR_BAD_SHAPE;
	if (tab->ndim < 2 || rows->ndim != tab->ndim || !vx_is_contiguous(tab) || !vx_is_contiguous(rows) ||
	    !vx_is_contiguous(ix))
		return VX_ERR_BAD_SHAPE;
	int nd = tab->ndim;
	int64_t N = tab->shape[nd - 2], D = tab->shape[nd - 1], M = vx_numel(ix);
	if (rows->shape[nd - 2] != M || rows->shape[nd - 1] != D)
		return VX_ERR_BAD_SHAPE;
	for (int i = 0; i < nd - 2; i++)
		if (rows->shape[i] != tab->shape[i])
			return VX_ERR_BAD_SHAPE;
	const int32_t *idx = ix->data;
	for (int64_t i = 0; i < M; i++)
		if (idx[i] < 0 || idx[i] >= N)
			return VX_ERR_BAD_SHAPE;
	int64_t L = vx_numel(tab) / (N * D);
	char *dst = tab->data;
	const char *src = rows->data;
	size_t row = (size_t)D * 4; /* f32 and i32 alike */
	for (int64_t l = 0; l < L; l++)
		for (int64_t i = 0; i < M; i++) {
			if (half)
				vx_encode(VX_F32, VX_F16, src + ((l * M + i) * D) * 4, dst + ((l * N + idx[i]) * D) * 2, D);
			else
				memcpy(dst + ((l * N + idx[i]) * D) * 4, src + ((l * M + i) * D) * 4, row);
		}
	return VX_OK;
}

/* ---- INTERP_LINEAR ---- */

typedef struct {
	int64_t Ti, To;
	const int64_t *i0;
	const int32_t *off;
	const float *lam;
	const float *x;
	float *y;
} interp_job;

static void interp_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const interp_job *j = arg;
	const float *x = j->x + row * j->Ti;
	float *y = j->y + row * j->To;
	for (int64_t i = lo; i < hi; i++) {
		float l1 = j->lam[i], l0 = 1.0f - l1;
		const float *p = x + j->i0[i];
		y[i] = l0 * p[0] + l1 * p[j->off[i]];
	}
}

int vx_k_interp_linear(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	if (node->n_src != 1 || !vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || x->ndim < 1 || x->ndim != y->ndim ||
	    !vx_is_contiguous(x) || !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	int last = x->ndim - 1;
	for (int i = 0; i < last; i++)
		if (x->shape[i] != y->shape[i])
			return VX_ERR_BAD_SHAPE;
	int64_t Ti = x->shape[last], To = y->shape[last];
	if (vx_numel(y) == 0)
		return VX_OK;
	if (Ti == 0)
		return VX_ERR_BAD_SHAPE;
	int64_t *i0 = malloc((size_t)To * (sizeof(int64_t) + sizeof(int32_t) + sizeof(float)));
	if (!i0)
		return VX_ERR_NOMEM;
	int32_t *off = (int32_t *)(i0 + To);
	float *lam = (float *)(off + To);
	/* PyTorch (align_corners=False, output size given): computed in float like its CPU kernel */
	float scale = (float)Ti / (float)To;
	for (int64_t i = 0; i < To; i++) {
		float r = scale * ((float)i + 0.5f) - 0.5f;
		if (r < 0)
			r = 0;
		int64_t k = (int64_t)r;
		if (k > Ti - 1)
			k = Ti - 1;
		float l = r - (float)k;
		i0[i] = k;
		off[i] = k < Ti - 1 ? 1 : 0;
		lam[i] = l < 0 ? 0 : (l > 1 ? 1 : l);
	}
	interp_job j = {.Ti = Ti, .To = To, .i0 = i0, .off = off, .lam = lam, .x = x->data, .y = y->data};
	vx_run_segs(ctx, vx_numel(y) / To, To, 2.0, 2048, interp_seg, &j);
	free(i0);
	return VX_OK;
}
