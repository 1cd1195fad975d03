#version 450
// y = f(x) elementwise over a tensor of up to 4 dims (shape, each operand's element offset
// and strides: views, broadcasts with stride 0); f is the engine's unary op code (vx.h
// VX_U_*: neg exp log sin cos sqrt tanh sigmoid relu silu gelu_erf gelu_tanh abs clamp scale
// square recip), or 17: copy. p0, p1: clamp's bounds, scale's factor and offset.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint shape[4];
	uint xoff; uint xs[4];
	uint yoff; uint ys[4];
	uint op; float p0; float p1;
} p;

float sigmoid(float v) { return 1.0 / (1.0 + exp(-v)); }

// erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7).
float erf_as(float v) {
	float t = 1.0 / (1.0 + 0.3275911 * abs(v));
	float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
	return sign(v) * (1.0 - poly * exp(-v * v));
}

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	uint i3 = i % p.shape[3], r = i / p.shape[3];
	uint i2 = r % p.shape[2]; r /= p.shape[2];
	uint i1 = r % p.shape[1], i0 = r / p.shape[1];
	float v = x[p.xoff + i0 * p.xs[0] + i1 * p.xs[1] + i2 * p.xs[2] + i3 * p.xs[3]];
	float r2 = v;
	switch (p.op) {
	case 0u: r2 = -v; break;
	case 1u: r2 = exp(v); break;
	case 2u: r2 = log(v); break;
	case 3u: r2 = sin(v); break;
	case 4u: r2 = cos(v); break;
	case 5u: r2 = sqrt(v); break;
	case 6u: r2 = tanh(clamp(v, -15.0, 15.0)); break;
	case 7u: r2 = sigmoid(v); break;
	case 8u: r2 = max(v, 0.0); break;
	case 9u: r2 = v * sigmoid(v); break;
	case 10u: r2 = 0.5 * v * (1.0 + erf_as(v * 0.70710678118654752)); break;
	case 11u: r2 = v * sigmoid(1.5957691216057308 * (v + 0.044715 * v * v * v)); break;
	case 12u: r2 = abs(v); break;
	case 13u: r2 = min(max(v, p.p0), p.p1); break;
	case 14u: r2 = p.p0 * v + p.p1; break;
	case 15u: r2 = v * v; break;
	case 16u: r2 = 1.0 / v; break;
	}
	y[p.yoff + i0 * p.ys[0] + i1 * p.ys[1] + i2 * p.ys[2] + i3 * p.ys[3]] = r2;
}
