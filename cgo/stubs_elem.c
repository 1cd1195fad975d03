/* PLACEHOLDER kernels, replaced by k_data.c, k_elem.c, k_norm.c, k_reduce.c, k_rope.c. */
#include "vx.h"
#define STUB(name) int name(vx_ctx *c, const vx_node *n, const vx_tensor *t) { (void)c; (void)n; (void)t; return VX_ERR_UNIMPLEMENTED; }
STUB(vx_k_copy) STUB(vx_k_concat) STUB(vx_k_pad) STUB(vx_k_gather_rows) STUB(vx_k_interp_linear)
STUB(vx_k_unary) STUB(vx_k_binary) STUB(vx_k_snake_beta) STUB(vx_k_layer_norm) STUB(vx_k_rms_norm)
STUB(vx_k_group_norm) STUB(vx_k_channel_affine) STUB(vx_k_softmax) STUB(vx_k_reduce) STUB(vx_k_cumsum)
STUB(vx_k_rope)
