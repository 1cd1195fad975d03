/* Reductions and scans: REDUCE (sum, mean, max, var), CUMSUM.
 *
 * The source is viewed as [outer, n, inner] around the axis. Sums accumulate in double
 * (like PyTorch's CPU cumsum); VAR is the POPULATION variance (correction 0, divide by n),
 * two-pass. MAX propagates NaN as torch.max does. For inner > 1 the work runs over blocks of
 * up to 256 columns with a per-block accumulator, so memory is read row by row. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "vx.h"

/* ---- shared helpers (each kernel file keeps its own static copy) ---- */

static const vx_tensor *src_at(const vx_node *n, const vx_tensor *t, int i) {
	return (i < n->n_src && n->src[i] >= 0) ? &t[n->src[i]] : NULL;
}

static int tensor_ok(const vx_tensor *x, int dtype) {
	if (!x || x->ndim < 0 || x->ndim > VX_MAX_DIMS || x->dtype != dtype)
		return 0;
	int64_t n = 1;
	for (int i = 0; i < x->ndim; i++) {
		if (x->shape[i] < 0 || x->shape[i] > ((int64_t)1 << 40))
			return 0;
		n *= x->shape[i];
		if (n > ((int64_t)1 << 44))
			return 0;
	}
	return n == 0 || x->data != NULL;
}

typedef void (*seg_fn)(void *arg, int64_t row, int64_t lo, int64_t hi);
typedef struct {
	int64_t len, parts, items, ntask;
	seg_fn fn;
	void *arg;
} seg_job;

static void seg_task(void *p, int64_t i) {
	const seg_job *j = p;
	int64_t a = j->items * i / j->ntask, b = j->items * (i + 1) / j->ntask;
	for (int64_t it = a; it < b; it++) {
		int64_t row = it / j->parts, part = it % j->parts;
		j->fn(j->arg, row, j->len * part / j->parts, j->len * (part + 1) / j->parts);
	}
}

static void run_segs(vx_ctx *ctx, int64_t rows, int64_t len, double cost, int splittable, seg_fn fn,
                     void *arg) {
	if (rows <= 0 || len <= 0)
		return;
	seg_job j = {.len = len, .parts = 1, .items = rows, .ntask = 1, .fn = fn, .arg = arg};
	int th = vx_ctx_threads(ctx);
	if (th > 1 && (double)rows * (double)len * cost >= 32768.0) {
		int64_t want = 4 * (int64_t)th;
		if (splittable && rows < want && len >= 512) {
			j.parts = (want + rows - 1) / rows;
			if (j.parts > len / 256)
				j.parts = len / 256;
		}
		j.items = rows * j.parts;
		j.ntask = j.items < want ? j.items : want;
	}
	if (j.ntask == 1)
		seg_task(&j, 0);
	else
		vx_parallel_for(ctx, j.ntask, seg_task, &j);
}

/* [outer, n, inner] around axis ip[0] (negative counts from the end); -1 if out of range. */
static int split_axis(const vx_tensor *x, int64_t axis, int64_t *outer, int64_t *n, int64_t *inner) {
	if (axis < 0)
		axis += x->ndim;
	if (axis < 0 || axis >= x->ndim)
		return -1;
	*outer = *inner = 1;
	for (int i = 0; i < x->ndim; i++) {
		if (i < axis)
			*outer *= x->shape[i];
		else if (i > axis)
			*inner *= x->shape[i];
	}
	*n = x->shape[axis];
	return (int)axis;
}

#define BLK 256

/* ---- REDUCE ---- */

typedef struct {
	int op;
	int64_t n, inner;
	const float *x;
	float *y;
} red_job;

static float red_row(int op, const float *x, int64_t n, int64_t s) {
	if (op == VX_R_MAX) {
		float m = -INFINITY;
		for (int64_t k = 0; k < n; k++) {
			float v = x[k * s];
			if (v > m || v != v)
				m = v;
			if (m != m)
				break;
		}
		return m;
	}
	double sum = 0;
	for (int64_t k = 0; k < n; k++)
		sum += x[k * s];
	double mean = sum / (double)n;
	if (op == VX_R_SUM)
		return (float)sum;
	if (op == VX_R_MEAN)
		return (float)mean;
	double q = 0;
	for (int64_t k = 0; k < n; k++) {
		double d = x[k * s] - mean;
		q += d * d;
	}
	return (float)(q / (double)n);
}

/* one output row (inner == 1): row = outer index */
static void red_seg_rows(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const red_job *j = arg;
	(void)lo;
	(void)hi;
	j->y[row] = red_row(j->op, j->x + row * j->n, j->n, 1);
}

/* columns [lo, hi) of outer slice `o` (inner > 1) */
static void red_seg_cols(void *arg, int64_t o, int64_t lo, int64_t hi) {
	const red_job *j = arg;
	const float *x = j->x + o * j->n * j->inner;
	float *y = j->y + o * j->inner;
	for (int64_t c0 = lo; c0 < hi; c0 += BLK) {
		int64_t w = hi - c0 < BLK ? hi - c0 : BLK;
		if (j->op == VX_R_MAX) {
			float m[BLK];
			for (int64_t i = 0; i < w; i++)
				m[i] = -INFINITY;
			for (int64_t k = 0; k < j->n; k++) {
				const float *r = x + k * j->inner + c0;
				for (int64_t i = 0; i < w; i++)
					if (r[i] > m[i] || r[i] != r[i])
						m[i] = m[i] != m[i] ? m[i] : r[i];
			}
			memcpy(y + c0, m, (size_t)w * sizeof(float));
			continue;
		}
		double acc[BLK];
		for (int64_t i = 0; i < w; i++)
			acc[i] = 0;
		for (int64_t k = 0; k < j->n; k++) {
			const float *r = x + k * j->inner + c0;
			for (int64_t i = 0; i < w; i++)
				acc[i] += r[i];
		}
		if (j->op == VX_R_SUM) {
			for (int64_t i = 0; i < w; i++)
				y[c0 + i] = (float)acc[i];
			continue;
		}
		for (int64_t i = 0; i < w; i++)
			acc[i] /= (double)j->n;
		if (j->op == VX_R_MEAN) {
			for (int64_t i = 0; i < w; i++)
				y[c0 + i] = (float)acc[i];
			continue;
		}
		double q[BLK];
		for (int64_t i = 0; i < w; i++)
			q[i] = 0;
		for (int64_t k = 0; k < j->n; k++) {
			const float *r = x + k * j->inner + c0;
			for (int64_t i = 0; i < w; i++) {
				double d = r[i] - acc[i];
				q[i] += d * d;
			}
		}
		for (int64_t i = 0; i < w; i++)
			y[c0 + i] = (float)(q[i] / (double)j->n);
	}
}

/* dst: the source shape with the axis set to 1 (keepdim) or removed. VAR is the population
 * variance (correction 0). MAX over an empty axis is an error; SUM gives 0, MEAN/VAR NaN. */
int vx_k_reduce(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = src_at(node, t, 0), *y = &t[node->dst];
	if (node->n_src != 1 || !tensor_ok(x, VX_F32) || !tensor_ok(y, VX_F32) || !vx_is_contiguous(x) ||
	    !vx_is_contiguous(y))
		return VX_ERR_BAD_SHAPE;
	int64_t op = node->ip[1], outer, n, inner;
	if (op < 0 || op >= VX_R_COUNT)
		return VX_ERR_BAD_OP;
	int axis = split_axis(x, node->ip[0], &outer, &n, &inner);
	if (axis < 0)
		return VX_ERR_BAD_SHAPE;
	int keep = y->ndim == x->ndim, ok = keep || y->ndim == x->ndim - 1;
	for (int i = 0, k = 0; ok && i < x->ndim; i++) {
		if (i == axis) {
			if (keep && y->shape[k++] != 1)
				ok = 0;
		} else if (y->shape[k++] != x->shape[i]) {
			ok = 0;
		}
	}
	if (!ok)
		return VX_ERR_BAD_SHAPE;
	if (outer * inner == 0)
		return VX_OK;
	if (n == 0 && op == VX_R_MAX)
		return VX_ERR_BAD_SHAPE;
	red_job j = {.op = (int)op, .n = n, .inner = inner, .x = x->data, .y = y->data};
	if (inner == 1)
		run_segs(ctx, outer, 1, (double)(n > 0 ? n : 1), 0, red_seg_rows, &j);
	else
		run_segs(ctx, outer, inner, (double)(n > 0 ? n : 1), 1, red_seg_cols, &j);
	return VX_OK;
}

/* ---- CUMSUM ---- */

static void cum_seg_rows(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const red_job *j = arg;
	(void)lo;
	(void)hi;
	const float *x = j->x + row * j->n;
	float *y = j->y + row * j->n;
	double s = 0;
	for (int64_t k = 0; k < j->n; k++) {
		s += x[k];
		y[k] = (float)s;
	}
}

static void cum_seg_cols(void *arg, int64_t o, int64_t lo, int64_t hi) {
	const red_job *j = arg;
	const float *x = j->x + o * j->n * j->inner;
	float *y = j->y + o * j->n * j->inner;
	for (int64_t c0 = lo; c0 < hi; c0 += BLK) {
		int64_t w = hi - c0 < BLK ? hi - c0 : BLK;
		double acc[BLK];
		for (int64_t i = 0; i < w; i++)
			acc[i] = 0;
		for (int64_t k = 0; k < j->n; k++) {
			const float *r = x + k * j->inner + c0;
			float *q = y + k * j->inner + c0;
			for (int64_t i = 0; i < w; i++) {
				acc[i] += r[i];
				q[i] = (float)acc[i];
			}
		}
	}
}

/* dst same shape as src0 (may alias it). */
int vx_k_cumsum(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = src_at(node, t, 0), *y = &t[node->dst];
	if (node->n_src != 1 || !tensor_ok(x, VX_F32) || !tensor_ok(y, VX_F32) || !vx_is_contiguous(x) ||
	    !vx_is_contiguous(y) || x->ndim != y->ndim || memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof(int64_t)) != 0)
		return VX_ERR_BAD_SHAPE;
	int64_t outer, n, inner;
	if (split_axis(x, node->ip[0], &outer, &n, &inner) < 0)
		return VX_ERR_BAD_SHAPE;
	if (outer * n * inner == 0)
		return VX_OK;
	red_job j = {.n = n, .inner = inner, .x = x->data, .y = y->data};
	if (inner == 1)
		run_segs(ctx, outer, 1, (double)n, 0, cum_seg_rows, &j);
	else
		run_segs(ctx, outer, inner, (double)n, 1, cum_seg_cols, &j);
	return VX_OK;
}
