#version 450
// ChannelAffine (folded batch norm): y = x·scale[c] + shift[c] elementwise over up to 4 dims
// (shape, each operand's element offset and strides: views), c the coordinate on axis caxis;
// shift optional.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Sc { float scale[]; };
layout(std430, binding = 2) readonly buffer Sh { float shift[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint shape[4];
	uint xoff; uint xs[4];
	uint yoff; uint ys[4];
	uint caxis; uint soff; uint hoff; uint has_shift;
} p;

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
	float sh = p.has_shift != 0u ? shift[p.hoff + c] : 0.0;
	y[p.yoff + ix[0] * p.ys[0] + ix[1] * p.ys[1] + ix[2] * p.ys[2] + ix[3] * p.ys[3]] = v * scale[p.soff + c] + sh;
}
