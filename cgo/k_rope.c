/* Rotary position embedding (ROPE).
 *
 * src0 x [B, H, T, D] (strided: any strides, e.g. a permuted view), src1 positions [T] i32,
 * dst [B, H, T, D] contiguous (may alias x when x is contiguous). ip[0] = rotary dims r
 * (even, <= D; 0 means D), ip[1] = 0 interleaved pairs (x[2i], x[2i+1]), 1 rotate-half pairs
 * (x[i], x[i + r/2]) as in HF LLaMA/Qwen; fp[0] = theta (> 0). Pair i turns by
 * pos * theta^(-2i/r); frequencies, angles and their cos/sin are computed in double, once
 * per (position, i), into a table shared by all B*H rows. Dims [r, D) are copied.
 * The context keeps the tables of positions 0..MEMO_POS-1 for up to MEMO_KEYS (theta, r)
 * pairs, grown as positions appear: a streaming model asks for the same positions layer
 * after layer and step after step, and the double cos/sin was most of the op's time
 * (30 us of a MeanVC2 DiT call's 52 positions). Other positions get a table per call. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "kern.h"

#define MEMO_POS 65536
#define MEMO_KEYS 4

struct vx_rope_memo {
	struct {
		double theta;
		int64_t rot, n; /* positions [0, n) filled */
		float *cs;      /* [n][rot/2][2]: cos, sin */
	} key[MEMO_KEYS];
	int used, next; /* entries in use; the one replaced next when all are */
};

void vx_rope_memo_free(vx_rope_memo *m) {
	if (!m)
		return;
	for (int i = 0; i < m->used; i++)
		free(m->key[i].cs);
	free(m);
}

typedef struct {
	int64_t H, T, D, rot, half;
	int mode;
	double theta;
	const int32_t *pos;
	const double *inv_freq; /* [half] */
	float *cs;              /* [T][half][2]: cos, sin; with memo, [position][half][2] */
	int memo;               /* cs is indexed by position, not by t */
	int64_t first;          /* table_seg fills rows first + t */
	const float *x;
	int64_t xs[4];
	float *y;
} rope_job;

static void table_seg(void *arg, int64_t t, int64_t lo, int64_t hi) {
	const rope_job *j = arg;
	(void)lo;
	(void)hi;
	float *cs = j->cs + (j->first + t) * j->half * 2;
	double p = j->memo ? (double)(j->first + t) : (double)j->pos[t];
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
	const float *cs = j->cs + (j->memo ? (int64_t)j->pos[t] : t) * j->half * 2;
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

/* Points j->cs at the context's table for (theta, rot), grown to hold position top. */
static int memo_table(vx_ctx *ctx, rope_job *j, int64_t top) {
	vx_rope_memo **mp = vx_ctx_rope_memo(ctx);
	if (!*mp && !(*mp = calloc(1, sizeof **mp)))
		return VX_ERR_NOMEM;
	vx_rope_memo *m = *mp;
	int k = 0;
	while (k < m->used && !(m->key[k].theta == j->theta && m->key[k].rot == j->rot))
		k++;
	if (k == m->used) {
		if (m->used < MEMO_KEYS) {
			m->used++;
		} else {
			k = m->next;
			m->next = (m->next + 1) % MEMO_KEYS;
			free(m->key[k].cs);
		}
		m->key[k].theta = j->theta;
		m->key[k].rot = j->rot;
		m->key[k].n = 0;
		m->key[k].cs = NULL;
	}
	int64_t hf = j->half > 0 ? j->half : 1;
	if (top >= m->key[k].n) {
		int64_t n = m->key[k].n * 2 > top + 1 ? m->key[k].n * 2 : top + 1;
		n = n < 64 ? 64 : n > MEMO_POS ? MEMO_POS : n;
		float *cs = realloc(m->key[k].cs, (size_t)(n * hf) * 2 * sizeof(float));
		if (!cs)
			return VX_ERR_NOMEM;
		j->cs = cs;
		j->first = m->key[k].n;
		vx_run_segs(ctx, n - j->first, hf, 30.0, 0, table_seg, j);
		m->key[k].cs = cs;
		m->key[k].n = n;
	}
	j->cs = m->key[k].cs;
	j->first = 0;
	return VX_OK;
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
	int64_t top = -1; /* the largest position, -1 when one is outside the memo's range */
	for (int64_t q = 0; q < T; q++) {
		int32_t v = j.pos[q];
		if (v < 0 || v >= MEMO_POS) {
			top = -1;
			break;
		}
		top = v > top ? v : top;
	}
	double *inv = malloc((size_t)hf * sizeof(double) + (top < 0 ? (size_t)(T * hf) * 2 * sizeof(float) : 0));
	if (!inv)
		return VX_ERR_NOMEM;
	for (int64_t i = 0; i < j.half; i++)
		inv[i] = pow(j.theta, -(double)(2 * i) / (double)rot);
	j.inv_freq = inv;
	int rc = VX_OK;
	if (top >= 0) {
		j.memo = 1;
		rc = memo_table(ctx, &j, top);
	} else {
		j.cs = (float *)(inv + hf);
		vx_run_segs(ctx, T, hf, 30.0, 0, table_seg, &j);
	}
	if (rc == VX_OK)
		vx_run_segs(ctx, x->shape[0] * x->shape[1] * T, D, 2.0, 0, rope_seg, &j);
	free(inv);
	return rc;
}
