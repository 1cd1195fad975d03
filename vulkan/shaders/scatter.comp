#version 450
// ScatterRows: table[l, idx[i], :] = rows[l, i, :] for a contiguous table [L, N, D] and rows
// [L, M, D], int32 indices [M]. Moves 32-bit words (F32 and I32 alike). An index outside
// [0, N) skips its row (the CPU refuses the run; a shader cannot, and must not write past
// the table). One invocation per value of rows.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer R { uint rows[]; };
layout(std430, binding = 1) readonly buffer I { int idx[]; };
layout(std430, binding = 2) buffer T { uint tab[]; };
layout(push_constant) uniform P {
	uint n; uint M; uint D; uint N;
	uint roff; uint ioff; uint toff;
} p;

void main() {
	uint e = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (e >= p.n) return;
	uint j = e % p.D, r = e / p.D;
	uint i = r % p.M, l = r / p.M;
	int at = idx[p.ioff + i];
	if (at < 0 || uint(at) >= p.N) return;
	tab[p.toff + (l * p.N + uint(at)) * p.D + j] = rows[p.roff + e];
}
