/* Plan executor: dispatches each node to its kernel. The thread pool lives in pool.c. */
#include <time.h>
#include "kern.h"

static const vx_kernel_fn kernels[VX_OP_COUNT] = {
	[VX_OP_COPY] = vx_k_copy,
	[VX_OP_CONCAT] = vx_k_concat,
	[VX_OP_PAD] = vx_k_pad,
	[VX_OP_GATHER_ROWS] = vx_k_gather_rows,
	[VX_OP_SCATTER_ROWS] = vx_k_scatter_rows,
	[VX_OP_INTERP_LINEAR] = vx_k_interp_linear,
	[VX_OP_UNARY] = vx_k_unary,
	[VX_OP_BINARY] = vx_k_binary,
	[VX_OP_SNAKE_BETA] = vx_k_snake_beta,
	[VX_OP_LAYER_NORM] = vx_k_layer_norm,
	[VX_OP_RMS_NORM] = vx_k_rms_norm,
	[VX_OP_GROUP_NORM] = vx_k_group_norm,
	[VX_OP_CHANNEL_AFFINE] = vx_k_channel_affine,
	[VX_OP_SOFTMAX] = vx_k_softmax,
	[VX_OP_REDUCE] = vx_k_reduce,
	[VX_OP_CUMSUM] = vx_k_cumsum,
	[VX_OP_MATMUL] = vx_k_matmul,
	[VX_OP_CONV1D] = vx_k_conv1d,
	[VX_OP_CONV2D] = vx_k_conv2d,
	[VX_OP_CONV_TRANSPOSE1D] = vx_k_conv_transpose1d,
	[VX_OP_ROPE] = vx_k_rope,
	[VX_OP_ATTENTION] = vx_k_attention,
	[VX_OP_LINEAR_Q] = vx_k_linear_q,
};

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int same_dims(int nd, const int64_t *a, const vx_tensor *t) {
	if (nd != (t ? t->ndim : 0))
		return 0;
	for (int i = 0; i < nd; i++)
		if (a[i] != t->shape[i])
			return 0;
	return 1;
}

/* The profile entry of n's op and operand shapes (NULL when the table is full). */
static vx_profile_shape *shape_entry(vx_profile *prof, const vx_node *n, const vx_tensor *t) {
	const vx_tensor *a = vx_src(n, t, 0), *b = vx_src(n, t, 1);
	for (int i = 0; i < prof->n_shapes; i++) {
		vx_profile_shape *e = &prof->shapes[i];
		if (e->op == n->op && same_dims(e->ndim0, e->shape0, a) && same_dims(e->ndim1, e->shape1, b))
			return e;
	}
	if (prof->n_shapes == VX_PROFILE_SHAPES)
		return NULL;
	vx_profile_shape *e = &prof->shapes[prof->n_shapes++];
	e->op = n->op;
	e->ndim0 = a ? a->ndim : 0;
	e->ndim1 = b ? b->ndim : 0;
	for (int i = 0; i < e->ndim0; i++)
		e->shape0[i] = a->shape[i];
	for (int i = 0; i < e->ndim1; i++)
		e->shape1[i] = b->shape[i];
	return e;
}

int vx_execute(vx_ctx *ctx, const vx_plan *plan, int32_t *failed_node) {
	vx_profile *prof = vx_ctx_profile_of(ctx);
	for (int32_t i = 0; i < plan->n_nodes; i++) {
		const vx_node *n = &plan->nodes[i];
		int err = VX_ERR_BAD_OP;
		int64_t t0 = prof ? now_ns() : 0;
		if (n->op > VX_OP_NONE && n->op < VX_OP_COUNT && kernels[n->op])
			err = kernels[n->op](ctx, n, plan->tensors);
		if (prof && n->op > VX_OP_NONE && n->op < VX_OP_COUNT) {
			int64_t dt = now_ns() - t0;
			prof->ns[n->op] += dt;
			prof->calls[n->op]++;
			vx_profile_shape *e = shape_entry(prof, n, plan->tensors);
			if (e) {
				e->ns += dt;
				e->calls++;
			}
		}
		if (err != VX_OK) {
			if (failed_node)
				*failed_node = i;
			return err;
		}
	}
	return VX_OK;
}

int64_t vx_numel(const vx_tensor *t) {
	int64_t n = 1;
	for (int i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

int vx_is_contiguous(const vx_tensor *t) {
	int64_t want = 1;
	for (int i = t->ndim - 1; i >= 0; i--) {
		if (t->shape[i] != 1 && t->stride[i] != want)
			return 0;
		want *= t->shape[i];
	}
	return 1;
}
