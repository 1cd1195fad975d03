#version 450
// y = a op b elementwise over a tensor of up to 4 dims, each operand with its element offset
// and strides (views; stride 0 broadcasts); op is the engine's binary code (vx.h VX_B_*:
// add sub mul div max min; max and min pass a NaN in a through).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint shape[4];
	uint aoff; uint as_[4];
	uint boff; uint bs[4];
	uint yoff; uint ys[4];
	uint op;
} p;

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	uint i3 = i % p.shape[3], r = i / p.shape[3];
	uint i2 = r % p.shape[2]; r /= p.shape[2];
	uint i1 = r % p.shape[1], i0 = r / p.shape[1];
	float u = a[p.aoff + i0 * p.as_[0] + i1 * p.as_[1] + i2 * p.as_[2] + i3 * p.as_[3]];
	float v = b[p.boff + i0 * p.bs[0] + i1 * p.bs[1] + i2 * p.bs[2] + i3 * p.bs[3]];
	float res;
	switch (p.op) {
	case 0u: res = u + v; break;
	case 1u: res = u - v; break;
	case 2u: res = u * v; break;
	case 3u: res = u / v; break;
	case 4u: res = (isnan(u) || u > v) ? u : v; break;
	default: res = (isnan(u) || u < v) ? u : v; break;
	}
	y[p.yoff + i0 * p.ys[0] + i1 * p.ys[1] + i2 * p.ys[2] + i3 * p.ys[3]] = res;
}
