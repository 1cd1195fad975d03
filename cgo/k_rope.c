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
#include "kern.h"

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
	const vx_tensor *x = vx_src(node, t, 0), *p = vx_src(node, t, 1), *y = &t[node->dst];
	if (node->n_src != 2 || !vx_tensor_ok(x, VX_F32) || !vx_tensor_ok(p, VX_I32) || !vx_tensor_ok(y, VX_F32) || x->ndim != 4 ||
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
	vx_run_segs(ctx, T, hf, 30.0, 0, table_seg, &j);
	vx_run_segs(ctx, x->shape[0] * x->shape[1] * T, D, 2.0, 0, rope_seg, &j);
	free(inv);
	return VX_OK;
}
