#version 450
#extension GL_EXT_control_flow_attributes : enable
// matmul.comp for large products: each workgroup of 8×8 invocations computes a 64×64 tile
// of y, every invocation an 8×8 block of it in registers, so each staged pair of 64×16 tiles
// of a and b feeds 64 times more multiply-adds per barrier than the 16×16 kernel. Same
// operands and push constants as matmul.comp; every output sums over k in order, in fp32.
layout(local_size_x = 8, local_size_y = 8) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint M; uint N; uint K; uint nb1;
	uint aoff; uint ab0; uint ab1; uint am; uint ak;
	uint boff; uint bb0; uint bb1; uint bk; uint bn;
	uint yoff; uint yb0; uint yb1; uint ym; uint yn;
	uint biasoff; uint has_bias;
} p;

shared float as_[16][65]; // [k][m]
shared float bs_[16][65]; // [k][n]

void main() {
	uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
	uint t = ty * 8u + tx;
	uint m0 = gl_WorkGroupID.y * 64u, n0 = gl_WorkGroupID.x * 64u;
	uint b0 = gl_WorkGroupID.z / p.nb1, b1 = gl_WorkGroupID.z % p.nb1;
	uint abase = p.aoff + b0 * p.ab0 + b1 * p.ab1;
	uint bbase = p.boff + b0 * p.bb0 + b1 * p.bb1;
	float acc[8][8];
	[[unroll]] for (uint i = 0u; i < 8u; i++)
		[[unroll]] for (uint j = 0u; j < 8u; j++)
			acc[i][j] = 0.0;
	// Staging: invocation t loads k = t % 16 of rows (or columns) t / 16 + 4·r, r = 0…15.
	uint lk = t % 16u, lr = t / 16u;
	for (uint k0 = 0u; k0 < p.K; k0 += 16u) {
		uint k = k0 + lk;
		[[unroll]] for (uint r = 0u; r < 16u; r++) {
			uint m = m0 + lr + 4u * r, n = n0 + lr + 4u * r;
			as_[lk][lr + 4u * r] = (m < p.M && k < p.K) ? a[abase + m * p.am + k * p.ak] : 0.0;
			bs_[lk][lr + 4u * r] = (n < p.N && k < p.K) ? b[bbase + k * p.bk + n * p.bn] : 0.0;
		}
		barrier();
		[[unroll]] for (uint j = 0u; j < 16u; j++) {
			float av[8], bv[8];
			[[unroll]] for (uint i = 0u; i < 8u; i++) {
				av[i] = as_[j][ty + 8u * i];
				bv[i] = bs_[j][tx + 8u * i];
			}
			[[unroll]] for (uint i = 0u; i < 8u; i++)
				[[unroll]] for (uint c = 0u; c < 8u; c++)
					acc[i][c] = fma(av[i], bv[c], acc[i][c]);
		}
		barrier();
	}
	uint ybase = p.yoff + b0 * p.yb0 + b1 * p.yb1;
	[[unroll]] for (uint i = 0u; i < 8u; i++) {
		uint m = m0 + ty + 8u * i;
		if (m >= p.M)
			continue;
		[[unroll]] for (uint c = 0u; c < 8u; c++) {
			uint n = n0 + tx + 8u * c;
			if (n < p.N)
				y[ybase + m * p.ym + n * p.yn] = acc[i][c] + (p.has_bias != 0u ? bias[p.biasoff + n] : 0.0);
		}
	}
}
