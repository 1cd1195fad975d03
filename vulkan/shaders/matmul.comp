#version 450
// y[b, M, N] = a[b, M, K] · b[b, K, N] (+ bias[N]) for up to two batch axes, every operand
// with its element offset and strides (views, broadcast batch axes with stride 0; Bᵀ given
// as [N, K] is B with its two strides swapped). Each workgroup computes a 16×16 tile of y,
// staging tiles of a and b through shared memory; every output sums over k in order, in fp32.
layout(local_size_x = 16, local_size_y = 16) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint M; uint N; uint K; uint nb1; // nb1: the inner batch axis' size (gl_WorkGroupID.z = b0·nb1 + b1)
	uint aoff; uint ab0; uint ab1; uint am; uint ak;
	uint boff; uint bb0; uint bb1; uint bk; uint bn;
	uint yoff; uint yb0; uint yb1; uint ym; uint yn;
	uint biasoff; uint has_bias;
} p;

shared float as_[16][17];
shared float bs_[16][17];

void main() {
	uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
	uint n = gl_WorkGroupID.x * 16u + tx;
	uint m = gl_WorkGroupID.y * 16u + ty;
	uint b0 = gl_WorkGroupID.z / p.nb1, b1 = gl_WorkGroupID.z % p.nb1;
	uint abase = p.aoff + b0 * p.ab0 + b1 * p.ab1;
	uint bbase = p.boff + b0 * p.bb0 + b1 * p.bb1;
	uint bn_row = gl_WorkGroupID.x * 16u + ty; // the b column this thread stages
	float acc = 0.0;
	for (uint k0 = 0u; k0 < p.K; k0 += 16u) {
		uint k = k0 + tx;
		as_[ty][tx] = (m < p.M && k < p.K) ? a[abase + m * p.am + k * p.ak] : 0.0;
		bs_[ty][tx] = (bn_row < p.N && k < p.K) ? b[bbase + k * p.bk + bn_row * p.bn] : 0.0;
		barrier();
		for (uint j = 0u; j < 16u; j++) {
			acc = fma(as_[ty][j], bs_[tx][j], acc);
		}
		barrier();
	}
	if (m < p.M && n < p.N) {
		y[p.yoff + b0 * p.yb0 + b1 * p.yb1 + m * p.ym + n * p.yn] = acc + (p.has_bias != 0u ? bias[p.biasoff + n] : 0.0);
	}
}
