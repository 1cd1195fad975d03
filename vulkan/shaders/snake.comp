#version 450
// SnakeBeta: y = x + 1/(exp(beta[c]) + 1e-9)·sin(x·exp(alpha[c]))² elementwise over up to 4
// dims (shape, each operand's element offset and strides: views), c the coordinate on axis
// caxis. sin² by the CPU kernel's method (reduction by multiples of π in three parts whose
// products with k are exact for |k| < 2^13, then an odd polynomial), not the GPU's sin,
// whose precision Vulkan leaves loose.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer A { float alpha[]; };
layout(std430, binding = 2) readonly buffer Be { float beta[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint shape[4];
	uint xoff; uint xs[4];
	uint yoff; uint ys[4];
	uint caxis; uint aoff; uint boff;
} p;

float sin2(float v) {
	float k = roundEven(v * 0.31830988618379067);
	float r = ((v - k * 3.140625) - k * 9.67502593994140625e-4) - k * 1.509957990978376432e-7;
	float r2 = r * r;
	float q = 1.0 / 6227020800.0;
	q = q * r2 - 1.0 / 39916800.0;
	q = q * r2 + 1.0 / 362880.0;
	q = q * r2 - 1.0 / 5040.0;
	q = q * r2 + 1.0 / 120.0;
	q = q * r2 - 1.0 / 6.0;
	float s = r + r * r2 * q;
	return s * s;
}

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	uint ix[4];
	ix[3] = i % p.shape[3];
	uint r = i / p.shape[3];
	ix[2] = r % p.shape[2];
	r /= p.shape[2];
	ix[1] = r % p.shape[1];
	ix[0] = r / p.shape[1];
	uint c = ix[p.caxis];
	float v = x[p.xoff + ix[0] * p.xs[0] + ix[1] * p.xs[1] + ix[2] * p.xs[2] + ix[3] * p.xs[3]];
	float a = exp(alpha[p.aoff + c]);
	float ib = 1.0 / (exp(beta[p.boff + c]) + 1e-9);
	y[p.yoff + ix[0] * p.ys[0] + ix[1] * p.ys[1] + ix[2] * p.ys[2] + ix[3] * p.ys[3]] = v + ib * sin2(a * v);
}
