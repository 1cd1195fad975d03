#version 450
// Attention, one workgroup per query row (b, h, t): y = softmax(q·kᵀ·scale + mask + bias)·v
// over the keys of kv head h / (H / Hk) (grouped-query), streamed in blocks of 64 with a
// running max and sum (flash-style: no score matrix in memory). q, k, v, mask [Tq, Tk] and
// bias [H, Tq, Tk] take any strides (broadcast axes: 0); y [B, H, Tq, Dv] is contiguous,
// Dv ≤ 256. A row whose keys are all masked out gives zeros.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer M { float mask[]; };
layout(std430, binding = 4) readonly buffer Bi { float bias[]; };
layout(std430, binding = 5) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
	uint H; uint Hk; uint Tq; uint Tk; uint D; uint Dv; float scale; uint flags; // flags: 1 mask, 2 bias
	uint qoff; uint qs0; uint qs1; uint qs2;   // q's last-axis stride is qd below
	uint koff; uint ks0; uint ks1; uint ks2;
	uint voff; uint vs0; uint vs1; uint vs2;
	uint moff; uint ms0; uint ms1;
	uint boff; uint bs0; uint bs1; uint bs2;
	uint yoff; uint qd; uint kd; uint vd; uint rows; // rows: B·H·Tq
} p;

shared float sc[64];
shared float red[64];

float reduce_max(float x) {
	uint t = gl_LocalInvocationID.x;
	red[t] = x;
	barrier();
	for (uint s = 32u; s > 0u; s >>= 1) {
		if (t < s) red[t] = max(red[t], red[t + s]);
		barrier();
	}
	float r = red[0];
	barrier();
	return r;
}

void main() {
	uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
	if (row >= p.rows) return;
	uint t = gl_LocalInvocationID.x;
	uint tq = row % p.Tq, r = row / p.Tq;
	uint h = r % p.H, b = r / p.H;
	uint hk = h / (p.H / p.Hk);
	uint qb = p.qoff + b * p.qs0 + h * p.qs1 + tq * p.qs2;
	uint kb = p.koff + b * p.ks0 + hk * p.ks1;
	uint vb = p.voff + b * p.vs0 + hk * p.vs1;
	const float NEG = -1.0 / 0.0;
	float m = NEG, l = 0.0;
	float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
	for (uint j0 = 0u; j0 < p.Tk; j0 += 64u) {
		uint j = j0 + t;
		float s = NEG;
		if (j < p.Tk) {
			float d = 0.0;
			for (uint i = 0u; i < p.D; i++) d = fma(q[qb + i * p.qd], k[kb + j * p.ks2 + i * p.kd], d);
			s = d * p.scale;
			if ((p.flags & 1u) != 0u) s += mask[p.moff + tq * p.ms0 + j * p.ms1];
			if ((p.flags & 2u) != 0u) s += bias[p.boff + h * p.bs0 + tq * p.bs1 + j * p.bs2];
		}
		sc[t] = s;
		float cm = reduce_max(s); // includes the barrier that publishes sc
		float mn = max(m, cm);
		if (mn == NEG) continue; // every key so far masked out
		float corr = (m == NEG) ? 0.0 : exp(m - mn);
		l *= corr;
		for (uint c = 0u; c < 4u; c++) acc[c] *= corr;
		uint nk = min(64u, p.Tk - j0);
		for (uint jj = 0u; jj < nk; jj++) {
			float w = exp(sc[jj] - mn); // exp(−∞) = 0 for masked keys
			l += w;
			for (uint c = 0u; c < 4u; c++) {
				uint dv = t + 64u * c;
				if (dv < p.Dv) acc[c] = fma(w, v[vb + (j0 + jj) * p.vs2 + dv * p.vd], acc[c]);
			}
		}
		m = mn;
		barrier(); // sc is rewritten by the next block
	}
	uint yb = p.yoff + row * p.Dv;
	for (uint c = 0u; c < 4u; c++) {
		uint dv = t + 64u * c;
		if (dv < p.Dv) y[yb + dv] = l > 0.0 ? acc[c] / l : 0.0;
	}
}
