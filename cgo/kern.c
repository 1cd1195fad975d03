#include <string.h>
#include "kern.h"

typedef struct {
	int64_t len, parts, items, ntask;
	vx_seg_fn fn;
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

void vx_run_segs(vx_ctx *ctx, int64_t rows, int64_t len, double cost, int64_t min_part, vx_seg_fn fn, void *arg) {
	if (rows <= 0 || len <= 0)
		return;
	seg_job j = {.len = len, .parts = 1, .items = rows, .ntask = 1, .fn = fn, .arg = arg};
	int th = vx_ctx_threads(ctx);
	if (th > 1 && (double)rows * (double)len * cost >= 32768.0) {
		int64_t want = 4 * (int64_t)th;
		if (min_part > 0 && rows < want && len >= 2 * min_part) {
			j.parts = (want + rows - 1) / rows;
			if (j.parts > len / min_part)
				j.parts = len / min_part;
		}
		j.items = rows * j.parts;
		j.ntask = j.items < want ? j.items : want;
	}
	if (j.ntask == 1)
		seg_task(&j, 0);
	else
		vx_parallel_for(ctx, j.ntask, seg_task, &j);
}

int vx_use_avx2(void) {
	return (vx_cpu_features & (VX_CPU_AVX2 | VX_CPU_FMA)) == (VX_CPU_AVX2 | VX_CPU_FMA);
}

int vx_use_avx512(void) { return vx_use_avx2() && (vx_cpu_features & VX_CPU_AVX512F); }

const vx_tensor *vx_src(const vx_node *n, const vx_tensor *t, int i) {
	return (i < n->n_src && i < VX_MAX_SRC && n->src[i] >= 0) ? &t[n->src[i]] : NULL;
}

int vx_tensor_ok(const vx_tensor *x, int dtype) {
	if (!x || x->ndim < 0 || x->ndim > VX_MAX_DIMS || (dtype >= 0 && x->dtype != dtype))
		return 0;
	if (x->dtype != VX_F32 && x->dtype != VX_I32 && !(dtype == VX_F16 && x->dtype == VX_F16))
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

void vx_pad5(const vx_tensor *x, int64_t sh[5], int64_t st[5]) {
	int off = VX_MAX_DIMS - x->ndim;
	for (int i = 0; i < VX_MAX_DIMS; i++) {
		sh[i] = i < off ? 1 : x->shape[i - off];
		st[i] = i < off ? 0 : x->stride[i - off];
	}
}

int vx_same_shape(const vx_tensor *a, const vx_tensor *b) {
	int64_t sa[5], sb[5], da[5], db[5];
	vx_pad5(a, sa, da);
	vx_pad5(b, sb, db);
	return memcmp(sa, sb, sizeof sa) == 0;
}
