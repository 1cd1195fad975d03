// Linear over encoded weights for many x rows (prefill, codec windows, batches): y[M, N] =
// x[M, K]·Wᵀ (+ bias[N]) with W [N, K] in its file encoding (2 Q8_0, 3 F16, 5 Q4_K, 6 BF16;
// addressed as linearq.glsl says). linearq reads W once but redoes its dequantisation and
// reduction for every 8 rows of x; here each workgroup of 8×8 invocations computes a 64×64
// tile of y as matmul_tiled.comp does: each k step stages 16 values of 64 x rows and of 64 W
// rows (dequantised once, by the invocation that owns the row) in shared memory, then every
// invocation multiplies an 8×8 block from registers. Every output sums over k in order, in
// fp32. With HALF_TILES (linearq_tiled_f16.comp, devices with shaderFloat16) the staged
// values are rounded to binary16, which halves the shared memory; their products are exact in
// fp32 and summed in fp32, as a tensor core's f16 products with fp32 accumulation are.
layout(local_size_x = 8, local_size_y = 8) in;
#include "linearq_io.glsl"

#ifdef HALF_TILES
#define TILE float16_t
#else
#define TILE float
#endif
shared TILE xs[16][65]; // [k][m]
shared TILE ws[16][65]; // [k][n]

float half1(uint h, bool bf) { return bf ? uintBitsToFloat(h << 16) : unpackHalf2x16(h).x; }

// Stages W row n's values k0..k0+15 (k0 a multiple of 16) into ws[..][col]; zeros past K.
void stageRow(uint n, uint k0, uint col) {
	uint rb = p.wbyte + n * p.rowbytes;
	if (p.enc == 2u) { // Q8_0: blocks of 34 bytes, half d then 32 int8; K fills whole blocks
		uint b = rb + (k0 >> 5) * 34u;
		float d = unpackHalf2x16(rd16(b)).x;
		uint q = b + 2u + (k0 & 31u);
		[[unroll]] for (uint j = 0u; j < 4u; j++) {
			int v = int(rd32(q + 4u * j));
			[[unroll]] for (uint i = 0u; i < 4u; i++)
				ws[4u * j + i][col] = TILE(d * float(bitfieldExtract(v, int(8u * i), 8)));
		}
	} else if (p.enc == 5u) { // Q4_K: super-blocks of 144 bytes (see linearq.glsl)
		uint bw = (rb >> 2) + (k0 >> 8) * 36u;
		uint s = (k0 >> 5) & 7u, c = s >> 1; // sub-block of 32 values, chunk of 64
		vec2 dm = unpackHalf2x16(w[bw]);
		uint sc, mn;
		if (s < 4u) {
			sc = (w[bw + 1u] >> (8u * s)) & 63u;
			mn = (w[bw + 2u] >> (8u * s)) & 63u;
		} else {
			uint sh = 8u * (s - 4u);
			sc = ((w[bw + 3u] >> sh) & 15u) | (((w[bw + 1u] >> sh) >> 6) & 3u) << 4;
			mn = ((w[bw + 3u] >> (sh + 4u)) & 15u) | (((w[bw + 2u] >> sh) >> 6) & 3u) << 4;
		}
		float a = dm.x * float(sc), o = dm.y * float(mn);
		uint nib = 4u * (s & 1u), q0 = bw + 4u + c * 8u + ((k0 & 31u) >> 2);
		[[unroll]] for (uint j = 0u; j < 4u; j++) {
			uint qw = w[q0 + j];
			[[unroll]] for (uint i = 0u; i < 4u; i++)
				ws[4u * j + i][col] = TILE(a * float((qw >> (8u * i + nib)) & 15u) - o);
		}
	} else { // F16 or BF16 halves; K may end inside the tile
		bool bf = p.enc == 6u;
		[[unroll]] for (uint j = 0u; j < 16u; j += 2u) {
			uint k = k0 + j;
			float v0 = 0.0, v1 = 0.0;
			if (k + 1u < p.K) {
				uint h = rd32(rb + 2u * k);
				v0 = half1(h & 0xffffu, bf);
				v1 = half1(h >> 16, bf);
			} else if (k < p.K) {
				v0 = half1(rd16(rb + 2u * k), bf);
			}
			ws[j][col] = TILE(v0);
			ws[j + 1u][col] = TILE(v1);
		}
	}
}

void main() {
	uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
	uint t = ty * 8u + tx;
	uint lk = t & 15u, lr = t >> 4; // x staging: k = k0 + lk of rows lr + 4·r, r = 0…15
	for (uint ng = gl_WorkGroupID.x; ng * 64u < p.N; ng += gl_NumWorkGroups.x) {
		uint n0 = ng * 64u;
		for (uint mg = gl_WorkGroupID.y; mg * 64u < p.M; mg += gl_NumWorkGroups.y) {
			uint m0 = mg * 64u;
			float acc[8][8];
			[[unroll]] for (uint i = 0u; i < 8u; i++)
				[[unroll]] for (uint c = 0u; c < 8u; c++)
					acc[i][c] = 0.0;
			for (uint k0 = 0u; k0 < p.K; k0 += 16u) {
				uint k = k0 + lk;
				[[unroll]] for (uint r = 0u; r < 16u; r++) {
					uint m = m0 + lr + 4u * r;
					xs[lk][lr + 4u * r] = TILE((m < p.M && k < p.K) ? x[p.xoff + m * p.K + k] : 0.0);
				}
				if (n0 + t < p.N) {
					stageRow(n0 + t, k0, t);
				} else {
					[[unroll]] for (uint j = 0u; j < 16u; j++) ws[j][t] = TILE(0.0);
				}
				barrier();
				[[unroll]] for (uint j = 0u; j < 16u; j++) {
					float av[8], bv[8];
					[[unroll]] for (uint i = 0u; i < 8u; i++) {
						av[i] = float(xs[j][ty + 8u * i]);
						bv[i] = float(ws[j][tx + 8u * i]);
					}
					[[unroll]] for (uint i = 0u; i < 8u; i++)
						[[unroll]] for (uint c = 0u; c < 8u; c++)
							acc[i][c] = fma(av[i], bv[c], acc[i][c]);
				}
				barrier();
			}
			[[unroll]] for (uint i = 0u; i < 8u; i++) {
				uint m = m0 + ty + 8u * i;
				if (m >= p.M)
					continue;
				[[unroll]] for (uint c = 0u; c < 8u; c++) {
					uint n = n0 + tx + 8u * c;
					if (n < p.N)
						y[p.yoff + m * p.ldy + n] = acc[i][c] + (p.has_bias != 0u ? bias[p.boff + n] : 0.0);
				}
			}
		}
	}
}
