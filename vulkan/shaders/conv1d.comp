#version 450
// VX_OP_CONV1D: y[b, co, t] = bias[co] + Σ_ci Σ_k w[co, ci, k] · x[b, g·cig + ci, t·stride + k·dil − padl]
// with g = co / cog and x zero outside [0, T). One invocation per output position and cb
// output channels (cb = 4 when a group's channels come in fours, else 1: every x value read
// feeds cb sums), t fastest, so a subgroup shares its channels: weight loads are uniform and
// x loads adjacent. Sums in fp32 over only the taps that land inside x. Every operand has
// its element offset and strides (views, a broadcast batch with stride 0).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint cout; uint tout; int T;
	uint cig; uint cog; int K; int stride; int padl; int dil;
	uint xoff; uint xsb; uint xsc; uint xst;
	uint woff; uint wso; uint wsi; uint wsk;
	uint boff; uint bs; uint has_bias;
	uint yoff; uint ysb; uint ysc; uint yst;
	uint cb;
} p;

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	uint t = i % p.tout, r = i / p.tout;
	uint nq = p.cout / p.cb;
	uint co = (r % nq) * p.cb, b = r / nq;
	int base = int(t) * p.stride - p.padl; // x index of tap 0
	// Taps [k0, k1) read inside [0, T) (GLSL's division truncates: keep numerators ≥ 0).
	int k0 = base < 0 ? (-base + p.dil - 1) / p.dil : 0;
	int last = p.T - 1 - base;
	int k1 = last < 0 ? 0 : min(p.K, last / p.dil + 1);
	float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
	if (k0 < k1) {
		uint xr = p.xoff + b * p.xsb + (co / p.cog) * p.cig * p.xsc + uint(base + k0 * p.dil) * p.xst;
		uint wr = p.woff + co * p.wso + uint(k0) * p.wsk;
		uint xk = uint(p.dil) * p.xst;
		for (uint ci = 0u; ci < p.cig; ci++) {
			uint xi = xr, wi = wr;
			for (int k = k0; k < k1; k++) {
				float xv = x[xi];
				for (uint j = 0u; j < p.cb; j++) acc[j] = fma(w[wi + j * p.wso], xv, acc[j]);
				xi += xk;
				wi += p.wsk;
			}
			xr += p.xsc;
			wr += p.wsi;
		}
	}
	for (uint j = 0u; j < p.cb; j++) {
		float v = acc[j];
		if (p.has_bias != 0u) v += bias[p.boff + (co + j) * p.bs];
		y[p.yoff + b * p.ysb + (co + j) * p.ysc + t * p.yst] = v;
	}
}
