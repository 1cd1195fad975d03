/* Reductions and scans: REDUCE (sum, mean, max, var), CUMSUM.
 *
 * The source is viewed as [outer, n, inner] around the axis. Sums accumulate in double
 * (like PyTorch's CPU cumsum); VAR is the POPULATION variance (correction 0, divide by n),
 * two-pass. MAX propagates NaN as torch.max does. For inner > 1 the work runs over blocks of
 * up to 256 columns with a per-block accumulator, so memory is read row by row. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kern.h"

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
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	if (node->n_src != 1 || !vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || !vx_is_contiguous(x) ||
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
		vx_run_segs(ctx, outer, 1, (double)(n > 0 ? n : 1), 0, red_seg_rows, &j);
	else
		vx_run_segs(ctx, outer, inner, (double)(n > 0 ? n : 1), 256, red_seg_cols, &j);
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
	const vx_tensor *x = vx_src(node, t, 0), *y = &t[node->dst];
	if (node->n_src != 1 || !vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(y, VX_F32) || !vx_is_contiguous(x) ||
	    !vx_is_contiguous(y) || x->ndim != y->ndim || memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof(int64_t)) != 0)
		return VX_ERR_BAD_SHAPE;
	int64_t outer, n, inner;
	if (split_axis(x, node->ip[0], &outer, &n, &inner) < 0)
		return VX_ERR_BAD_SHAPE;
	if (outer * n * inner == 0)
		return VX_OK;
	red_job j = {.n = n, .inner = inner, .x = x->data, .y = y->data};
	if (inner == 1)
		vx_run_segs(ctx, outer, 1, (double)n, 0, cum_seg_rows, &j);
	else
		vx_run_segs(ctx, outer, inner, (double)n, 256, cum_seg_cols, &j);
	return VX_OK;
}
