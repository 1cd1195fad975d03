#version 450
// Softmax over the last axis of contiguous rows of x (up to 4 axes): y = softmax(x·scale +
// mask), the additive mask optional with its own strides (broadcast axes: stride 0); a row
// masked out entirely gives zeros. One workgroup per
// row; max and sum by shared-memory trees.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer M { float mask[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint rows; uint n; float scale; uint has_mask;
	uint xoff; uint yoff; uint moff;
	uint d1; uint d2;         // x's two axes above the last (rows = d0·d1·d2)
	uint s0; uint s1; uint s2; uint sc; // the mask's strides (0: broadcast)
} p;

shared float red[256];

float reduce(float v, bool isMax) {
	uint t = gl_LocalInvocationID.x;
	red[t] = v;
	barrier();
	for (uint s = 128u; s > 0u; s >>= 1) {
		if (t < s) red[t] = isMax ? max(red[t], red[t + s]) : red[t] + red[t + s];
		barrier();
	}
	float r = red[0];
	barrier();
	return r;
}

float value(uint row, uint i) {
	float v = x[p.xoff + row * p.n + i] * p.scale;
	if (p.has_mask != 0u) {
		uint l2 = row % p.d2, r = row / p.d2;
		uint l1 = r % p.d1, l0 = r / p.d1;
		v += mask[p.moff + l0 * p.s0 + l1 * p.s1 + l2 * p.s2 + i * p.sc];
	}
	return v;
}

void main() {
	uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
	if (row >= p.rows) return;
	uint t = gl_LocalInvocationID.x;
	float m = -1.0 / 0.0;
	for (uint i = t; i < p.n; i += 256u) m = max(m, value(row, i));
	m = reduce(m, true);
	float s = 0.0;
	for (uint i = t; i < p.n; i += 256u) {
		float e = (m == -1.0 / 0.0) ? 0.0 : exp(value(row, i) - m);
		s += e;
	}
	s = reduce(s, false);
	for (uint i = t; i < p.n; i += 256u) {
		float e = (m == -1.0 / 0.0) ? 0.0 : exp(value(row, i) - m);
		y[p.yoff + row * p.n + i] = s > 0.0 ? e / s : 0.0;
	}
}
