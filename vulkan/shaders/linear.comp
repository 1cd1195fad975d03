#version 450
// y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]): nn.Linear with F32 weights. Each workgroup
// computes a 16×16 tile of y, staging 16×16 tiles of x and w through shared memory; every
// output sums over k in order, in fp32.
layout(local_size_x = 16, local_size_y = 16) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint M; uint N; uint K; uint has_bias; } p;

shared float xs[16][17];
shared float ws[16][17];

void main() {
	uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
	uint n = gl_WorkGroupID.x * 16u + tx; // output column
	uint m = gl_WorkGroupID.y * 16u + ty; // output row
	uint wrow = gl_WorkGroupID.x * 16u + ty; // the w row this thread stages
	float acc = 0.0;
	for (uint k0 = 0u; k0 < p.K; k0 += 16u) {
		uint k = k0 + tx;
		xs[ty][tx] = (m < p.M && k < p.K) ? x[m * p.K + k] : 0.0;
		ws[ty][tx] = (wrow < p.N && k < p.K) ? w[wrow * p.K + k] : 0.0;
		barrier();
		for (uint j = 0u; j < 16u; j++) {
			acc = fma(xs[ty][j], ws[tx][j], acc);
		}
		barrier();
	}
	if (m < p.M && n < p.N) {
		y[m * p.N + n] = acc + (p.has_bias != 0u ? bias[n] : 0.0);
	}
}
