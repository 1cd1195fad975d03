#version 450
// y[i] = f(x[i]) for every unary op of the engine; p.op is cgo's UnaryOp code (vx.h VX_U_*):
// neg exp log sin cos sqrt tanh sigmoid relu silu gelu_erf gelu_tanh abs clamp scale square
// recip. p0, p1: clamp's bounds, scale's factor and offset.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; uint op; float p0; float p1; } p;

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
	float v = x[i];
	float r = v;
	switch (p.op) {
	case 0u: r = -v; break;
	case 1u: r = exp(v); break;
	case 2u: r = log(v); break;
	case 3u: r = sin(v); break;
	case 4u: r = cos(v); break;
	case 5u: r = sqrt(v); break;
	case 6u: r = tanh(clamp(v, -15.0, 15.0)); break;
	case 7u: r = sigmoid(v); break;
	case 8u: r = max(v, 0.0); break;
	case 9u: r = v * sigmoid(v); break;
	case 10u: r = 0.5 * v * (1.0 + erf_as(v * 0.70710678118654752)); break;
	case 11u: r = v * sigmoid(1.5957691216057308 * (v + 0.044715 * v * v * v)); break;
	case 12u: r = abs(v); break;
	case 13u: r = min(max(v, p.p0), p.p1); break;
	case 14u: r = p.p0 * v + p.p1; break;
	case 15u: r = v * v; break;
	case 16u: r = 1.0 / v; break;
	}
	y[i] = r;
}
