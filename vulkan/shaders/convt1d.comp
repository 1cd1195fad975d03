#version 450
// VX_OP_CONV_TRANSPOSE1D as a gather: y[b, co, t] = bias[co] + Σ_k Σ_ci x[b, g·cig + ci, j] ·
// w[g·cig + ci, co − g·cog, k] over the taps with t + pad = j·stride + k·dil, 0 ≤ j < T
// (g = co / cog). The k that solve it are kstep = stride/gcd(stride, dil) apart, so each
// invocation (one output, t fastest) finds the first and steps; fp32 sums. Every operand
// has its element offset and strides (views, a broadcast batch).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint cout; uint tout; int T;
	uint cig; uint cog; int K; int stride; int pad; int dil; int kstep;
	uint xoff; uint xsb; uint xsc; uint xst;
	uint woff; uint wsi; uint wso; uint wsk;
	uint boff; uint bs; uint has_bias;
	uint yoff; uint ysb; uint ysc; uint yst;
} p;

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	uint t = i % p.tout, r = i / p.tout;
	uint co = r % p.cout, b = r / p.cout;
	uint g = co / p.cog;
	int num = int(t) + p.pad; // = j·stride + k·dil, ≥ 0
	// j ≤ T−1 ⇔ k ≥ klo; j ≥ 0 ⇔ k ≤ khi (numerators kept ≥ 0 for GLSL's / and %).
	int over = num - (p.T - 1) * p.stride;
	int klo = over > 0 ? (over + p.dil - 1) / p.dil : 0;
	int khi = min(p.K - 1, num / p.dil);
	int k = klo;
	int lim = min(khi + 1, klo + p.kstep);
	while (k < lim && (num - k * p.dil) % p.stride != 0) k++;
	float acc = 0.0;
	if (k < lim) {
		uint xb = p.xoff + b * p.xsb + g * p.cig * p.xsc;
		uint wb = p.woff + g * p.cig * p.wsi + (co - g * p.cog) * p.wso;
		for (; k <= khi; k += p.kstep) {
			uint xi = xb + uint((num - k * p.dil) / p.stride) * p.xst;
			uint wi = wb + uint(k) * p.wsk;
			for (uint ci = 0u; ci < p.cig; ci++) {
				acc = fma(x[xi], w[wi], acc);
				xi += p.xsc;
				wi += p.wsi;
			}
		}
	}
	if (p.has_bias != 0u) acc += bias[p.boff + co * p.bs];
	y[p.yoff + b * p.ysb + co * p.ysc + t * p.yst] = acc;
}
