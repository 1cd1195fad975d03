#version 450
// RoPE over x [B, H, T, D] (any strides) into contiguous y: pair i of the first `rot` dims
// (interleaved: x[2i], x[2i+1]; rotate-half: x[i], x[i + rot/2]) turns by the angle of its
// position; the rest passes through. cs [T, rot/2, 2] holds each angle's cos and sin,
// computed by the host in double precision for the run's positions (as the CPU backend
// does), so both backends rotate by the same values.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer CS { vec2 cs[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint H; uint T; uint D; uint rot; uint mode;
	uint xoff; uint xs0; uint xs1; uint xs2; uint xs3;
	uint csoff; uint yoff;
} p;

void main() {
	uint e = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (e >= p.n) return;
	uint d = e % p.D, r = e / p.D;
	uint t = r % p.T; r /= p.T;
	uint h = r % p.H, b = r / p.H;
	uint xb = p.xoff + b * p.xs0 + h * p.xs1 + t * p.xs2;
	float v = x[xb + d * p.xs3];
	if (d < p.rot) {
		uint half_ = p.rot / 2u;
		uint i, partner;
		bool first;
		if (p.mode == 0u) { i = d / 2u; first = (d % 2u) == 0u; partner = first ? d + 1u : d - 1u; }
		else { first = d < half_; i = first ? d : d - half_; partner = first ? d + half_ : d - half_; }
		vec2 a = cs[p.csoff + t * half_ + i];
		float u = x[xb + partner * p.xs3];
		v = first ? v * a.x - u * a.y : u * a.y + v * a.x;
	}
	y[p.yoff + e] = v;
}
