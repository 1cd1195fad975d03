#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// matmul.comp for a and b both contiguous along k (a Linear: y = x·Wᵀ), on software devices
// (lavapipe): a workgroup is one subgroup of 8 invocations computing an 8×8 tile of y, each
// invocation every 8th k of all 64 products (neighbours read neighbouring values of a row),
// then subgroup additions sum the parts. No shared memory and no barrier. Same operands and
// push constants as matmul.comp; the sums run in fp32, in another order than the others'.
layout(local_size_x = 8) in;
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

void main() {
	uint lane = gl_LocalInvocationID.x;
	uint n0 = gl_WorkGroupID.x * 8u, m0 = gl_WorkGroupID.y * 8u;
	uint b0 = gl_WorkGroupID.z / p.nb1, b1 = gl_WorkGroupID.z % p.nb1;
	uint arow[8], bcol[8];
	[[unroll]] for (uint i = 0u; i < 8u; i++) {
		arow[i] = p.aoff + b0 * p.ab0 + b1 * p.ab1 + min(m0 + i, p.M - 1u) * p.am; // past M or N:
		bcol[i] = p.boff + b0 * p.bb0 + b1 * p.bb1 + min(n0 + i, p.N - 1u) * p.bn; // repeats, not written
	}
	float acc[8][8];
	[[unroll]] for (uint i = 0u; i < 8u; i++)
		[[unroll]] for (uint c = 0u; c < 8u; c++)
			acc[i][c] = 0.0;
	for (uint k = lane; k < p.K; k += 8u) {
		float av[8], bv[8];
		[[unroll]] for (uint i = 0u; i < 8u; i++) {
			av[i] = a[arow[i] + k];
			bv[i] = b[bcol[i] + k];
		}
		[[unroll]] for (uint i = 0u; i < 8u; i++)
			[[unroll]] for (uint c = 0u; c < 8u; c++)
				acc[i][c] = fma(av[i], bv[c], acc[i][c]);
	}
	uint ybase = p.yoff + b0 * p.yb0 + b1 * p.yb1;
	[[unroll]] for (uint i = 0u; i < 8u; i++) {
		[[unroll]] for (uint c = 0u; c < 8u; c++) {
			float s = subgroupAdd(acc[i][c]);
			uint m = m0 + i, n = n0 + c;
			if (lane == 0u && m < p.M && n < p.N)
				y[ybase + m * p.ym + n * p.yn] = s + (p.has_bias != 0u ? bias[p.biasoff + n] : 0.0);
		}
	}
}
