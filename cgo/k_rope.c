/* Rotary position embedding (ROPE).
 *
 * src0 x [B, H, T, D] (strided: any strides, e.g. a permuted view), src1 positions [T] i32,
 * dst [B, H, T, D] contiguous (may alias x when x is contiguous). ip[0] = rotary dims r
 * (even, <= D; 0 means D), ip[1] = 0 interleaved pairs (x[2i], x[2i+1]), 1 rotate-half pairs
 * (x[i], x[i + r/2]) as in HF LLaMA/Qwen; fp[0] = theta (> 0). Pair i turns by
 * pos * theta^(-2i/r); frequencies, angles and their cos/sin are computed in double, once
 * per (t, i), into a table shared by all B*H rows. Dims [r, D) are copied. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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

static void run_segs(vx_ctx *ctx, int64_t rows, int64_t len, double cost, seg_fn fn, void *arg) {
	if (rows <= 0 || len <= 0)
		return;
	seg_job j = {.len = len, .parts = 1, .items = rows, .ntask = 1, .fn = fn, .arg = arg};
	int th = vx_ctx_threads(ctx);
	if (th > 1 && (double)rows * (double)len * cost >= 32768.0) {
		int64_t want = 4 * (int64_t)th;
		j.ntask = rows < want ? rows : want;
	}
	if (j.ntask == 1)
		seg_task(&j, 0);
	else
		vx_parallel_for(ctx, j.ntask, seg_task, &j);
}

typedef struct {
	int64_t H, T, D, rot, half;
	int mode;
	double theta;
	const int32_t *pos;
	const double *inv_freq; /* [half] */
	float *cs;              /* [T][half][2]: cos, sin */
	const float *x;
	int64_t xs[4];
	float *y;
} rope_job;

static void table_seg(void *arg, int64_t t, int64_t lo, int64_t hi) {
	const rope_job *j = arg;
	(void)lo;
	(void)hi;
	float *cs = j->cs + t * j->half * 2;
	double p = (double)j->pos[t];
	for (int64_t i = 0; i < j->half; i++) {
		double a = p * j->inv_freq[i];
		cs[2 * i] = (float)cos(a);
		cs[2 * i + 1] = (float)sin(a);
	}
}

static void rope_seg(void *arg, int64_t row, int64_t lo, int64_t hi) {
	const rope_job *j = arg;
	(void)lo;
	(void)hi;
	int64_t t = row % j->T, h = (row / j->T) % j->H, b = row / (j->T * j->H);
	const float *x = j->x + b * j->xs[0] + h * j->xs[1] + t * j->xs[2];
	int64_t s = j->xs[3];
	float *y = j->y + row * j->D;
	const float *cs = j->cs + t * j->half * 2;
	if (j->mode == 0) {
		for (int64_t i = 0; i < j->half; i++) {
			float c = cs[2 * i], sn = cs[2 * i + 1];
			float x0 = x[(2 * i) * s], x1 = x[(2 * i + 1) * s];
			y[2 * i] = x0 * c - x1 * sn;
			y[2 * i + 1] = x0 * sn + x1 * c;
		}
	} else {
		for (int64_t i = 0; i < j->half; i++) {
			float c = cs[2 * i], sn = cs[2 * i + 1];
			float x0 = x[i * s], x1 = x[(i + j->half) * s];
			y[i] = x0 * c - x1 * sn;
			y[i + j->half] = x1 * c + x0 * sn;
		}
	}
	for (int64_t i = j->rot; i < j->D; i++)
		y[i] = x[i * s];
}

int vx_k_rope(vx_ctx *ctx, const vx_node *node, const vx_tensor *t) {
	const vx_tensor *x = src_at(node, t, 0), *p = src_at(node, t, 1), *y = &t[node->dst];
	if (node->n_src != 2 || !tensor_ok(x, VX_F32) || !tensor_ok(p, VX_I32) || !tensor_ok(y, VX_F32) || x->ndim != 4 ||
	    y->ndim != 4 || !vx_is_contiguous(y) || !vx_is_contiguous(p))
		return VX_ERR_BAD_SHAPE;
	for (int i = 0; i < 4; i++)
		if (x->shape[i] != y->shape[i])
			return VX_ERR_BAD_SHAPE;
	int64_t T = x->shape[2], D = x->shape[3], rot = node->ip[0] == 0 ? D : node->ip[0];
	if (vx_numel(p) != T || rot < 0 || rot > D || rot % 2 != 0 || node->ip[1] < 0 || node->ip[1] > 1 ||
	    !(node->fp[0] > 0))
		return VX_ERR_BAD_SHAPE;
	/* in place only when x is y itself */
	if (x->data == y->data && !vx_is_contiguous(x))
		return VX_ERR_BAD_SHAPE;
	if (vx_numel(x) == 0)
		return VX_OK;
	rope_job j = {.H = x->shape[1], .T = T, .D = D, .rot = rot, .half = rot / 2, .mode = (int)node->ip[1],
	              .theta = (double)node->fp[0], .pos = p->data, .x = x->data, .y = y->data};
	for (int i = 0; i < 4; i++)
		j.xs[i] = x->stride[i];
	int64_t hf = j.half > 0 ? j.half : 1;
	double *inv = malloc((size_t)hf * sizeof(double) + (size_t)(T * hf) * 2 * sizeof(float));
	if (!inv)
		return VX_ERR_NOMEM;
	for (int64_t i = 0; i < j.half; i++)
		inv[i] = pow(j.theta, -(double)(2 * i) / (double)rot);
	j.inv_freq = inv;
	j.cs = (float *)(inv + hf);
	run_segs(ctx, T, hf, 30.0, table_seg, &j);
	run_segs(ctx, x->shape[0] * x->shape[1] * T, D, 2.0, rope_seg, &j);
	free(inv);
	return VX_OK;
}
