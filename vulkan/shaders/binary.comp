#version 450
// y[i] = a[i] op b[i mod nb]: the engine's binary ops (vx.h VX_B_*: add sub mul div max min)
// with b repeating along a's leading axes (a bias row, a per-row scale).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; uint nb; uint op; } p;

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	float u = a[i], v = b[i % p.nb];
	float r;
	switch (p.op) {
	case 0u: r = u + v; break;
	case 1u: r = u - v; break;
	case 2u: r = u * v; break;
	case 3u: r = u / v; break;
	case 4u: r = (isnan(u) || u > v) ? u : v; break;
	default: r = (isnan(u) || u < v) ? u : v; break;
	}
	y[i] = r;
}
