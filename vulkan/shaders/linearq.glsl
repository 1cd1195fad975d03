// y[M, N] = x[M, K]·Wᵀ (+ bias[N]) with W [N, K] read in its file encoding (enc: the engine's
// dtype numbers, 2 Q8_0, 3 F16, 5 Q4_K, 6 BF16) from a word buffer at byte wbyte, rows of
// rowbytes bytes: 32-bit words only (no 8/16-bit storage needed), bytes and halves picked out
// of them. Every Q8_0, F16 and BF16 half sits at an even byte (word offsets, even row sizes),
// Q4_K super-blocks (144 bytes) on a word. Decode reads each weight once: a workgroup takes R
// rows of W, its invocations split K in units of 8 values (neighbours read neighbouring
// bytes), dequantise in registers and accumulate in fp32 for up to MC x rows at a time. The
// invocations' parts are summed by subgroup additions and one pass over the subgroups' sums
// where the device has subgroup arithmetic (linearq_sg.comp defines SUBGROUP_SUM), else by a
// shared-memory tree (linearq.comp): on lavapipe the tree's seven barriers a pass cost more
// than the products. With ONE_SUBGROUP (linearq_sg8.comp, for a device whose subgroups are 8
// wide: lavapipe) a workgroup is one subgroup of 8 invocations, whose subgroupAdd is the whole
// sum: no shared memory and no barrier at all, which is what a software device runs fastest.
#ifdef ONE_SUBGROUP
layout(local_size_x = 8) in;
#define WG 8u
#else
layout(local_size_x = 128) in;
#define WG 128u
#endif
#define R 2u  // W rows per workgroup
#define MC 8u // x rows per pass
#include "linearq_io.glsl"

#ifndef ONE_SUBGROUP
shared float red[MC * R][WG];
#endif
float acc[MC * R]; // acc[m·R + r]: x row m0+m times W row n0+r

// acc += x rows [m0, m0+mc) at k..k+7 · v[r][0..7], scaled by s[r].
void fma8(uint m0, uint mc, uint k, float v[R][8], float s[R]) {
	uint xb = p.xoff + m0 * p.K + k;
	[[unroll]] for (uint m = 0u; m < MC; m++) {
		if (m < mc) {
			float xv[8];
			[[unroll]] for (uint j = 0u; j < 8u; j++) xv[j] = x[xb + m * p.K + j];
			[[unroll]] for (uint r = 0u; r < R; r++) {
				float t = 0.0;
				[[unroll]] for (uint j = 0u; j < 8u; j++) t = fma(xv[j], v[r][j], t);
				acc[m * R + r] = fma(s[r], t, acc[m * R + r]);
			}
		}
	}
}

// Q8_0: blocks of 34 bytes (half d, 32 int8 q); unit u is quarter u&3 of block u>>2.
#ifdef INT8_DOT
// OpSDotKHR over two words of 4 signed bytes each (fmt 0: PackedVectorFormat4x8Bit).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6018, 6019], id = 4450)
int sdot4x8(int a, int b, spirv_literal int fmt);

// With integer dot products (linearq_dot.comp, for a few x rows as the CPU's Q8_0 kernel
// does): each x block of 32 values is rounded to int8 with scale amax/127 (ties to even, as
// lrintf), 8 of them at a time multiplied by W's int8 in two dot products summed in int32,
// then scaled by both blocks' scales in fp32.
void dotQ8(uint rb[R], uint m0, uint mc) {
	for (uint u = gl_LocalInvocationID.x; u < p.K >> 3; u += WG) {
		uint q8 = (u & 3u) * 8u;
		int wl[R], wh[R];
		float s[R];
		[[unroll]] for (uint r = 0u; r < R; r++) {
			uint b = rb[r] + (u >> 2) * 34u;
			s[r] = unpackHalf2x16(rd16(b)).x;
			wl[r] = int(rd32(b + 2u + q8));
			wh[r] = int(rd32(b + 6u + q8));
		}
		[[unroll]] for (uint m = 0u; m < MC; m++) {
			if (m < mc) {
				uint xb = p.xoff + (m0 + m) * p.K + (u >> 2) * 32u;
				float amax = 0.0;
				for (uint j = 0u; j < 32u; j++) amax = max(amax, abs(x[xb + j]));
				float id = amax > 0.0 ? 127.0 / amax : 0.0, dx = amax / 127.0;
				int xl = 0, xh = 0;
				[[unroll]] for (uint j = 0u; j < 4u; j++) {
					xl |= (int(roundEven(x[xb + q8 + j] * id)) & 255) << (8u * j);
					xh |= (int(roundEven(x[xb + q8 + 4u + j] * id)) & 255) << (8u * j);
				}
				[[unroll]] for (uint r = 0u; r < R; r++)
					acc[m * R + r] = fma(s[r] * dx, float(sdot4x8(xl, wl[r], 0) + sdot4x8(xh, wh[r], 0)), acc[m * R + r]);
			}
		}
	}
}
#else
void dotQ8(uint rb[R], uint m0, uint mc) {
	for (uint u = gl_LocalInvocationID.x; u < p.K >> 3; u += WG) {
		float v[R][8], s[R];
		[[unroll]] for (uint r = 0u; r < R; r++) {
			uint b = rb[r] + (u >> 2) * 34u;
			s[r] = unpackHalf2x16(rd16(b)).x;
			uint lo = rd32(b + 2u + (u & 3u) * 8u), hi = rd32(b + 6u + (u & 3u) * 8u);
			[[unroll]] for (uint j = 0u; j < 4u; j++) {
				v[r][j] = float(bitfieldExtract(int(lo), int(8u * j), 8));
				v[r][4u + j] = float(bitfieldExtract(int(hi), int(8u * j), 8));
			}
		}
		fma8(m0, mc, u << 3, v, s);
	}
}
#endif

// F16 (bf = false) or BF16 halves; K need not be a multiple of 8 (a tail of single values).
void dotHalf(bool bf, uint rb[R], uint m0, uint mc) {
	float one[R];
	[[unroll]] for (uint r = 0u; r < R; r++) one[r] = 1.0;
	for (uint u = gl_LocalInvocationID.x; u < p.K >> 3; u += WG) {
		float v[R][8];
		[[unroll]] for (uint r = 0u; r < R; r++) {
			[[unroll]] for (uint j = 0u; j < 4u; j++) {
				uint h = rd32(rb[r] + u * 16u + 4u * j);
				if (bf) {
					v[r][2u * j] = uintBitsToFloat(h << 16);
					v[r][2u * j + 1u] = uintBitsToFloat(h & 0xffff0000u);
				} else {
					vec2 f = unpackHalf2x16(h);
					v[r][2u * j] = f.x;
					v[r][2u * j + 1u] = f.y;
				}
			}
		}
		fma8(m0, mc, u << 3, v, one);
	}
	uint k = (p.K & ~7u) + gl_LocalInvocationID.x;
	if (gl_LocalInvocationID.x < (p.K & 7u)) {
		[[unroll]] for (uint r = 0u; r < R; r++) {
			uint h = rd16(rb[r] + 2u * k);
			float wv = bf ? uintBitsToFloat(h << 16) : unpackHalf2x16(h).x;
			[[unroll]] for (uint m = 0u; m < MC; m++)
				if (m < mc) acc[m * R + r] = fma(x[p.xoff + (m0 + m) * p.K + k], wv, acc[m * R + r]);
		}
	}
}

// Q4_K: super-blocks of 144 bytes (half d, half dmin, 12 bytes of 6-bit scales and mins, 128
// of nibbles), value = (d·sc)·q − dmin·m per 32-value sub-block. Unit u is nibble word
// wi = u&31 of super-block u>>5: its low nibbles are 4 values of sub-block 2c (c = wi>>3),
// its high nibbles the same 4 of sub-block 2c+1. Σ x·(a·q − o) = a·Σ x·q − o·Σ x.
void dotQ4K(uint rb[R], uint m0, uint mc) {
	for (uint u = gl_LocalInvocationID.x; u < p.K >> 3; u += WG) {
		uint c = (u >> 3) & 3u, l = (u & 7u) * 4u;
		uint k = (u >> 5) * 256u + c * 64u + l; // low nibbles at k.., high at k+32..
		float a0[R], o0[R], a1[R], o1[R];
		uint qw[R];
		[[unroll]] for (uint r = 0u; r < R; r++) {
			uint bw = (rb[r] >> 2) + (u >> 5) * 36u; // the super-block's first word
			vec2 dm = unpackHalf2x16(w[bw]);
			uint s0 = w[bw + 1u], s1 = w[bw + 2u], s2 = w[bw + 3u];
			uint sh0 = 16u * c, sh1 = sh0 + 8u; // byte j = 2c, 2c+1 of a scale word (mod 4)
			uint sc0, m0v, sc1, m1v;
			if (c < 2u) {
				sc0 = (s0 >> sh0) & 63u; m0v = (s1 >> sh0) & 63u;
				sc1 = (s0 >> sh1) & 63u; m1v = (s1 >> sh1) & 63u;
			} else {
				sh0 -= 32u; sh1 -= 32u;
				sc0 = ((s2 >> sh0) & 15u) | (((s0 >> sh0) & 0xc0u) >> 2);
				m0v = ((s2 >> (sh0 + 4u)) & 15u) | (((s1 >> sh0) & 0xc0u) >> 2);
				sc1 = ((s2 >> sh1) & 15u) | (((s0 >> sh1) & 0xc0u) >> 2);
				m1v = ((s2 >> (sh1 + 4u)) & 15u) | (((s1 >> sh1) & 0xc0u) >> 2);
			}
			a0[r] = dm.x * float(sc0); o0[r] = dm.y * float(m0v);
			a1[r] = dm.x * float(sc1); o1[r] = dm.y * float(m1v);
			qw[r] = w[bw + 4u + c * 8u + (u & 7u)];
		}
		uint xb = p.xoff + m0 * p.K + k;
		[[unroll]] for (uint m = 0u; m < MC; m++) {
			if (m < mc) {
				vec4 xl = vec4(x[xb + m * p.K], x[xb + m * p.K + 1u], x[xb + m * p.K + 2u], x[xb + m * p.K + 3u]);
				vec4 xh = vec4(x[xb + m * p.K + 32u], x[xb + m * p.K + 33u], x[xb + m * p.K + 34u], x[xb + m * p.K + 35u]);
				float sl = xl.x + xl.y + xl.z + xl.w, sh = xh.x + xh.y + xh.z + xh.w;
				[[unroll]] for (uint r = 0u; r < R; r++) {
					vec4 ql = vec4(uvec4(qw[r], qw[r] >> 8, qw[r] >> 16, qw[r] >> 24) & 15u);
					vec4 qh = vec4(uvec4(qw[r] >> 4, qw[r] >> 12, qw[r] >> 20, qw[r] >> 28) & 15u);
					float t = a0[r] * dot(xl, ql) - o0[r] * sl + a1[r] * dot(xh, qh) - o1[r] * sh;
					acc[m * R + r] += t;
				}
			}
		}
	}
}

void main() {
	uint t = gl_LocalInvocationID.x;
	for (uint ng = gl_WorkGroupID.x; ng * R < p.N; ng += gl_NumWorkGroups.x) {
		uint n0 = ng * R;
		uint rb[R];
		[[unroll]] for (uint r = 0u; r < R; r++) rb[r] = p.wbyte + min(n0 + r, p.N - 1u) * p.rowbytes; // past N: a repeat, not written
		for (uint mg = gl_WorkGroupID.y; mg * MC < p.M; mg += gl_NumWorkGroups.y) {
			uint m0 = mg * MC, mc = min(MC, p.M - m0);
			[[unroll]] for (uint v = 0u; v < MC * R; v++) acc[v] = 0.0;
			if (p.enc == 2u) dotQ8(rb, m0, mc);
			else if (p.enc == 5u) dotQ4K(rb, m0, mc);
			else dotHalf(p.enc == 6u, rb, m0, mc);
			uint nv = mc * R;
#if defined(ONE_SUBGROUP)
			[[unroll]] for (uint v = 0u; v < MC * R; v++) {
				if (v < nv) {
					float sv = subgroupAdd(acc[v]);
					uint n = n0 + v % R;
					if (t == 0u && n < p.N) y[p.yoff + (m0 + v / R) * p.ldy + n] = sv + (p.has_bias != 0u ? bias[p.boff + n] : 0.0);
				}
			}
#elif defined(SUBGROUP_SUM)
			[[unroll]] for (uint v = 0u; v < MC * R; v++) {
				if (v < nv) {
					float sv = subgroupAdd(acc[v]);
					if (subgroupElect()) red[v][gl_SubgroupID] = sv;
				}
			}
			barrier();
			if (t < nv) {
				for (uint i = 1u; i < gl_NumSubgroups; i++) red[t][0] += red[t][i];
			}
#else
			[[unroll]] for (uint v = 0u; v < MC * R; v++)
				if (v < nv) red[v][t] = acc[v];
			barrier();
			for (uint s = WG / 2u; s > 0u; s >>= 1) {
				if (t < s) {
					[[unroll]] for (uint v = 0u; v < MC * R; v++)
						if (v < nv) red[v][t] += red[v][t + s];
				}
				barrier();
			}
#endif
#ifndef ONE_SUBGROUP
			if (t < nv) {
				uint n = n0 + t % R;
				if (n < p.N) y[p.yoff + (m0 + t / R) * p.ldy + n] = red[t][0] + (p.has_bias != 0u ? bias[p.boff + n] : 0.0);
			}
			barrier(); // red is rewritten by the next pass
#endif
		}
	}
}
