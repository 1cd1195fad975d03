#version 450
// Reduce one axis (n values, stride xa) of every line of x: 0 sum, 1 mean, 2 max (NaN
// propagates, as torch.max), 3 population variance (two passes); fp32. A line is one index
// into the other three axes (shape osh, strides xo for x and yo for y). mode 0: one
// invocation per line (short axes: a workgroup would idle); mode 1: one workgroup per line,
// a shared-memory tree. n = 0: sum 0, mean and var NaN.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint lines; uint n; uint osh[3];
	uint xoff; uint xo[3]; uint xa;
	uint yoff; uint yo[3];
	uint op; uint mode;
} p;

shared float red[256];

float nanmax(float a, float b) { return isnan(a) ? a : (isnan(b) || b > a ? b : a); }

float combine(float a, float b, bool isMax) { return isMax ? nanmax(a, b) : a + b; }

float tree(float v, bool isMax) {
	uint t = gl_LocalInvocationID.x;
	red[t] = v;
	barrier();
	for (uint s = 128u; s > 0u; s >>= 1) {
		if (t < s) red[t] = combine(red[t], red[t + s], isMax);
		barrier();
	}
	float r = red[0];
	barrier();
	return r;
}

void main() {
	bool wg = p.mode == 1u;
	uint line = wg ? gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x
	               : gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (line >= p.lines) return; // uniform per workgroup in mode 1
	uint i2 = line % p.osh[2], r = line / p.osh[2];
	uint i1 = r % p.osh[1], i0 = r / p.osh[1];
	uint xb = p.xoff + i0 * p.xo[0] + i1 * p.xo[1] + i2 * p.xo[2];
	uint t = wg ? gl_LocalInvocationID.x : 0u, step = wg ? 256u : 1u;
	bool isMax = p.op == 2u;
	float acc = isMax ? uintBitsToFloat(0xff800000u) : 0.0;
	for (uint k = t; k < p.n; k += step) acc = combine(acc, x[xb + k * p.xa], isMax);
	if (wg) acc = tree(acc, isMax);
	float res = acc;
	if (p.op == 1u || p.op == 3u) {
		float mean = acc / float(p.n);
		res = mean;
		if (p.op == 3u) {
			float q = 0.0;
			for (uint k = t; k < p.n; k += step) {
				float d = x[xb + k * p.xa] - mean;
				q += d * d;
			}
			if (wg) q = tree(q, false);
			res = q / float(p.n);
		}
		if (p.n == 0u) res = uintBitsToFloat(0x7fc00000u);
	}
	if (t == 0u) y[p.yoff + i0 * p.yo[0] + i1 * p.yo[1] + i2 * p.yo[2]] = res;
}
