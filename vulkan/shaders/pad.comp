#version 450
// Pad: y = x padded on one axis by pl values before it and the rest after, over up to 4 dims
// (each operand's element offset and strides). Moves 32-bit words, so F32 and I32 alike.
// mode 0: the constant word fill, 1: reflect (the edge not repeated), 2: replicate the edge.
// One invocation per output value.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P {
	uint n; uint shape[4];
	uint xoff; uint xs[4];
	uint yoff; uint ys[4];
	uint axis; uint pl; uint nx; uint mode; uint fill;
} p;

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	uint c[4];
	c[3] = i % p.shape[3]; uint r = i / p.shape[3];
	c[2] = r % p.shape[2]; r /= p.shape[2];
	c[1] = r % p.shape[1]; c[0] = r / p.shape[1];
	uint yi = p.yoff + c[0] * p.ys[0] + c[1] * p.ys[1] + c[2] * p.ys[2] + c[3] * p.ys[3];
	int k = int(c[p.axis]) - int(p.pl), last = int(p.nx) - 1;
	if (k < 0 || k > last) {
		if (p.mode == 0u) {
			y[yi] = p.fill;
			return;
		}
		if (p.mode == 1u) k = k < 0 ? -k : 2 * last - k;
		else k = clamp(k, 0, last);
	}
	c[p.axis] = uint(k);
	y[yi] = x[p.xoff + c[0] * p.xs[0] + c[1] * p.xs[1] + c[2] * p.xs[2] + c[3] * p.xs[3]];
}
