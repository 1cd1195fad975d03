/* PLACEHOLDER kernels, replaced by k_linalg.c. */
#include "vx.h"
int vx_k_matmul(vx_ctx *c, const vx_node *n, const vx_tensor *t) { (void)c; (void)n; (void)t; return VX_ERR_UNIMPLEMENTED; }
int vx_k_conv1d(vx_ctx *c, const vx_node *n, const vx_tensor *t) { (void)c; (void)n; (void)t; return VX_ERR_UNIMPLEMENTED; }
int vx_k_conv2d(vx_ctx *c, const vx_node *n, const vx_tensor *t) { (void)c; (void)n; (void)t; return VX_ERR_UNIMPLEMENTED; }
int vx_k_conv_transpose1d(vx_ctx *c, const vx_node *n, const vx_tensor *t) { (void)c; (void)n; (void)t; return VX_ERR_UNIMPLEMENTED; }
int vx_k_attention(vx_ctx *c, const vx_node *n, const vx_tensor *t) { (void)c; (void)n; (void)t; return VX_ERR_UNIMPLEMENTED; }
