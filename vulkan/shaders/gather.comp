#version 450
// GatherRows: y[i, j] = table[idx[i], j] for a table [N, D] in its file encoding (enc: the
// engine's dtype numbers, 0 F32 and 1 I32 copied as bits, 2 Q8_0, 3 F16, 5 Q4_K, 6 BF16
// dequantised to f32 as the CPU does it, bit for bit) read as 32-bit words from byte tbyte,
// rows of rowbytes bytes. One invocation per output value. An index outside [0, all) gives a
// row of zeros (the CPU refuses the run; a shader cannot, and must not read past the table).
// A table too large for one buffer comes in parts, one dispatch each: this one holds rows
// [lo, lo+N) and writes only the output rows whose index falls there (the part at lo = 0
// also writes the zeros).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer T { uint tab[]; };
layout(std430, binding = 1) readonly buffer I { int idx[]; };
layout(std430, binding = 2) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P {
	uint n; uint D; uint N; uint enc;
	uint tbyte; uint rowbytes; uint ioff; uint yoff;
	uint lo; uint all;
} p;

// The 16 bits at even byte b.
uint rd16(uint b) { return (tab[b >> 2] >> ((b & 2u) * 8u)) & 0xffffu; }

void main() {
	uint e = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (e >= p.n) return;
	uint i = e / p.D, j = e - i * p.D;
	int a = idx[p.ioff + i], r = a - int(p.lo);
	bool mine = r >= 0 && uint(r) < p.N;
	bool none = a < 0 || uint(a) >= p.all; // in no part: zeros, written by the first
	if (!mine && !(none && p.lo == 0u)) return;
	uint v = 0u;
	if (mine) {
		uint rb = p.tbyte + uint(r) * p.rowbytes;
		if (p.enc <= 1u) {
			v = tab[(rb >> 2) + j];
		} else if (p.enc == 3u) {
			v = floatBitsToUint(unpackHalf2x16(rd16(rb + 2u * j)).x);
		} else if (p.enc == 6u) {
			v = rd16(rb + 2u * j) << 16;
		} else if (p.enc == 2u) {
			uint b = rb + (j >> 5) * 34u, q = b + 2u + (j & 31u);
			float d = unpackHalf2x16(rd16(b)).x;
			int qv = bitfieldExtract(int(tab[q >> 2]), int((q & 3u) * 8u), 8);
			v = floatBitsToUint(float(qv) * d);
		} else { // Q4_K: super-block j>>8, sub-block 2c+hi, nibble l of byte 32c+l
			uint bw = (rb >> 2) + (j >> 8) * 36u, o = j & 255u;
			uint c = o >> 6, hi = (o >> 5) & 1u, l = o & 31u, sb = 2u * c + hi;
			vec2 dm = unpackHalf2x16(tab[bw]);
			uint s0 = tab[bw + 1u], s1 = tab[bw + 2u], s2 = tab[bw + 3u];
			uint sc, m;
			if (sb < 4u) {
				sc = (s0 >> (8u * sb)) & 63u;
				m = (s1 >> (8u * sb)) & 63u;
			} else {
				uint sh = 8u * (sb - 4u);
				sc = ((s2 >> sh) & 15u) | (((s0 >> sh) & 0xc0u) >> 2);
				m = ((s2 >> (sh + 4u)) & 15u) | (((s1 >> sh) & 0xc0u) >> 2);
			}
			uint q = (tab[bw + 4u + 8u * c + (l >> 2)] >> (8u * (l & 3u) + 4u * hi)) & 15u;
			// ggml's rounding: each product rounded to float, no fused multiply-add.
			precise float a = dm.x * float(sc);
			precise float mo = dm.y * float(m);
			precise float f = a * float(q) - mo;
			v = floatBitsToUint(f);
		}
	}
	y[p.yoff + e] = v;
}
