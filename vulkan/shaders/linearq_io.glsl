// What every Linear shader over encoded weights binds (linearq.glsl, linearq_tiled.glsl):
// x, W as 32-bit words, bias and y, the push constants, and W's halves and words at any even
// byte.
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer Bi { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint M; uint N; uint K; uint enc;
	uint wbyte; uint rowbytes; uint xoff; uint yoff; uint boff; uint has_bias;
	uint ldy; // y's row stride (N, or more when y is a column slice of a wider output)
} p;

// The 16 bits at even byte b.
uint rd16(uint b) { return (w[b >> 2] >> ((b & 2u) * 8u)) & 0xffffu; }

// The 32 bits from even byte b (two words when b is not word-aligned).
uint rd32(uint b) {
	uint i = b >> 2;
	if ((b & 2u) == 0u) return w[i];
	return (w[i] >> 16) | (w[i + 1u] << 16);
}
