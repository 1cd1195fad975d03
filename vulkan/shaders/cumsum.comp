#version 450
// Cumsum along one axis (n values; strides xa, ya) of every line of x into y (fp32). A line
// is one index into the other three axes (shape osh, strides xo and yo). mode 0: one
// invocation per line, a running sum (short axes); mode 1: one workgroup per line, chunks of
// 256 scanned in shared memory (Hillis-Steele) with the carry of the chunks before. Every
// value is read before it is written, so y may be x (in place).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint lines; uint n; uint osh[3];
	uint xoff; uint xo[3]; uint xa;
	uint yoff; uint yo[3]; uint ya;
	uint mode;
} p;

shared float s[256];

void main() {
	bool wg = p.mode == 1u;
	uint line = wg ? gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x
	               : gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (line >= p.lines) return; // uniform per workgroup in mode 1
	uint i2 = line % p.osh[2], r = line / p.osh[2];
	uint i1 = r % p.osh[1], i0 = r / p.osh[1];
	uint xb = p.xoff + i0 * p.xo[0] + i1 * p.xo[1] + i2 * p.xo[2];
	uint yb = p.yoff + i0 * p.yo[0] + i1 * p.yo[1] + i2 * p.yo[2];
	if (!wg) {
		float acc = 0.0;
		for (uint k = 0u; k < p.n; k++) {
			acc += x[xb + k * p.xa];
			y[yb + k * p.ya] = acc;
		}
		return;
	}
	uint t = gl_LocalInvocationID.x;
	float carry = 0.0;
	for (uint c = 0u; c < p.n; c += 256u) {
		uint k = c + t;
		s[t] = k < p.n ? x[xb + k * p.xa] : 0.0;
		barrier();
		for (uint off = 1u; off < 256u; off <<= 1) {
			float v = t >= off ? s[t - off] : 0.0;
			barrier();
			s[t] += v;
			barrier();
		}
		if (k < p.n) y[yb + k * p.ya] = carry + s[t];
		carry += s[255];
		barrier();
	}
}
