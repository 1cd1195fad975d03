#version 450
// LayerNorm (mode 0: (x − mean)/sqrt(var + eps)·w + b) or RMSNorm (mode 1: x/sqrt(mean(x²) +
// eps)·w) over the last axis of contiguous rows; w and b optional. One workgroup per row;
// sums in fp32 by a shared-memory tree.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer Bi { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint rows; uint n; uint mode; uint has_w; uint has_b; float eps;
	uint xoff; uint woff; uint boff; uint yoff;
} p;

shared float red[256];

float rowsum(float v) {
	uint t = gl_LocalInvocationID.x;
	red[t] = v;
	barrier();
	for (uint s = 128u; s > 0u; s >>= 1) {
		if (t < s) red[t] += red[t + s];
		barrier();
	}
	float r = red[0];
	barrier();
	return r;
}

void main() {
	uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
	if (row >= p.rows) return; // uniform per workgroup
	uint t = gl_LocalInvocationID.x;
	uint xb = p.xoff + row * p.n, yb = p.yoff + row * p.n;
	float mean = 0.0;
	if (p.mode == 0u) {
		float s = 0.0;
		for (uint i = t; i < p.n; i += 256u) s += x[xb + i];
		mean = rowsum(s) / float(p.n);
	}
	float s2 = 0.0;
	for (uint i = t; i < p.n; i += 256u) {
		float d = x[xb + i] - mean;
		s2 += d * d;
	}
	float inv = 1.0 / sqrt(rowsum(s2) / float(p.n) + p.eps);
	for (uint i = t; i < p.n; i += 256u) {
		float v = (x[xb + i] - mean) * inv;
		if (p.has_w != 0u) v *= w[p.woff + i];
		if (p.has_b != 0u) v += bias[p.boff + i];
		y[yb + i] = v;
	}
}
