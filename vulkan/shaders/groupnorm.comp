#version 450
// GroupNorm over contiguous x viewed as [B, C, S]: one workgroup per (batch, group), whose
// n = C/G·S values are one contiguous run; strided loops, so a group may hold millions.
// fp32 sums: the mean, then Σ(x − m) and Σ(x − m)² in one more pass (the first refines the
// mean, so a large offset costs no accuracy; population variance, as PyTorch).
// y = (x − mean)·(rstd·w[c]) + b[c], w and b optional, rounded as the CPU kernel does.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer Bi { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint rows; uint n; uint S; uint cpg; uint G; uint has_w; uint has_b; float eps;
	uint xoff; uint woff; uint boff; uint yoff;
} p;

shared vec2 red[256];

vec2 groupsum(vec2 v) {
	uint t = gl_LocalInvocationID.x;
	red[t] = v;
	barrier();
	for (uint s = 128u; s > 0u; s >>= 1) {
		if (t < s) red[t] += red[t + s];
		barrier();
	}
	vec2 r = red[0];
	barrier();
	return r;
}

void main() {
	uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
	if (row >= p.rows || p.n == 0u) return; // uniform per workgroup
	uint t = gl_LocalInvocationID.x;
	uint xb = p.xoff + row * p.n, yb = p.yoff + row * p.n;
	float fn = float(p.n);
	float s = 0.0;
	for (uint i = t; i < p.n; i += 256u) s += x[xb + i];
	float m0 = groupsum(vec2(s, 0.0)).x / fn;
	vec2 d = vec2(0.0);
	for (uint i = t; i < p.n; i += 256u) {
		float v = x[xb + i] - m0;
		d += vec2(v, v * v);
	}
	d = groupsum(d) / fn;
	float mean = m0 + d.x;
	float rstd = 1.0 / sqrt(max(d.y - d.x * d.x, 0.0) + p.eps);
	uint c0 = (row % p.G) * p.cpg;
	for (uint i = t; i < p.n; i += 256u) {
		uint c = c0 + i / p.S;
		float sc = p.has_w != 0u ? rstd * w[p.woff + c] : rstd;
		float sh = p.has_b != 0u ? bias[p.boff + c] : 0.0;
		y[yb + i] = (x[xb + i] - mean) * sc + sh;
	}
}
