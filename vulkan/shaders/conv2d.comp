#version 450
// VX_OP_CONV2D: y[b, co, oh, ow] = bias[co] + Σ_ci Σ_kh Σ_kw w[co, ci, kh, kw] ·
// x[b, g·cig + ci, oh·sh + kh·dh − ph, ow·sw + kw·dw − pw] with g = co / cog and x zero
// outside [0, H)×[0, W). One invocation per output (ow fastest), summing in fp32 over only the
// taps inside x. x and y have offsets and strides (views, a broadcast batch); w is contiguous.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint n; uint cout; uint oh; uint ow; int H; int W;
	uint cig; uint cog; int KH; int KW;
	int sh; int sw; int ph; int pw; int dh; int dw;
	uint xoff; uint xs0; uint xs1; uint xs2; uint xs3;
	uint woff;
	uint boff; uint bs; uint has_bias;
	uint yoff; uint ys0; uint ys1; uint ys2; uint ys3;
} p;

// The taps [k0, k1) of a kernel axis whose input index base + k·d lies in [0, len).
ivec2 taps(int base, int d, int K, int len) {
	int k0 = base < 0 ? (-base + d - 1) / d : 0;
	int last = len - 1 - base;
	return ivec2(k0, last < 0 ? 0 : min(K, last / d + 1));
}

void main() {
	uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
	if (i >= p.n) return;
	uint ox = i % p.ow, r = i / p.ow;
	uint oy = r % p.oh; r /= p.oh;
	uint co = r % p.cout, b = r / p.cout;
	int bh = int(oy) * p.sh - p.ph, bw = int(ox) * p.sw - p.pw;
	ivec2 kh = taps(bh, p.dh, p.KH, p.H), kw = taps(bw, p.dw, p.KW, p.W);
	float acc = 0.0;
	if (kh.x < kh.y && kw.x < kw.y) {
		uint xc = p.xoff + b * p.xs0 + (co / p.cog) * p.cig * p.xs1;
		uint wc = p.woff + co * p.cig * uint(p.KH * p.KW);
		uint xdh = uint(p.dh) * p.xs2, xdw = uint(p.dw) * p.xs3;
		uint x0 = uint(bh + kh.x * p.dh) * p.xs2 + uint(bw + kw.x * p.dw) * p.xs3;
		for (uint ci = 0u; ci < p.cig; ci++) {
			uint xh = xc + x0;
			uint wh = wc + uint(kh.x * p.KW + kw.x);
			for (int a = kh.x; a < kh.y; a++) {
				uint xi = xh, wi = wh;
				for (int c = kw.x; c < kw.y; c++) {
					acc = fma(w[wi], x[xi], acc);
					xi += xdw;
					wi++;
				}
				xh += xdh;
				wh += uint(p.KW);
			}
			xc += p.xs1;
			wc += uint(p.KH * p.KW);
		}
	}
	if (p.has_bias != 0u) acc += bias[p.boff + co * p.bs];
	y[p.yoff + b * p.ys0 + co * p.ys1 + oy * p.ys2 + ox * p.ys3] = acc;
}
