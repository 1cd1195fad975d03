#version 450
// InterpLinear: y[..., i] = x[..., T] resampled linearly to the last axis's T' points
// (PyTorch, align_corners=False), over up to 4 dims with each operand's offset and strides.
// The source position is computed in float as the CPU kernel does (scale = T/T' rounded on
// the host; precise: no fused multiply-add to move a sample across a boundary).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint shape[4];
	uint xoff; uint xs[4];
	uint yoff; uint ys[4];
	uint ti; float scale;
} p;

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	uint i3 = i % p.shape[3], r = i / p.shape[3];
	uint i2 = r % p.shape[2]; r /= p.shape[2];
	uint i1 = r % p.shape[1], i0 = r / p.shape[1];
	precise float pos = p.scale * (float(i3) + 0.5) - 0.5;
	pos = max(pos, 0.0);
	uint k = min(uint(pos), p.ti - 1u);
	precise float l = clamp(pos - float(k), 0.0, 1.0);
	uint k1 = k < p.ti - 1u ? k + 1u : k;
	uint xb = p.xoff + i0 * p.xs[0] + i1 * p.xs[1] + i2 * p.xs[2];
	float a = x[xb + k * p.xs[3]], b = x[xb + k1 * p.xs[3]];
	y[p.yoff + i0 * p.ys[0] + i1 * p.ys[1] + i2 * p.ys[2] + i3 * p.ys[3]] = (1.0 - l) * a + l * b;
}
