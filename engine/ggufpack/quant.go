package ggufpack

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// Encode appends src (whole rows, for block types whole blocks) encoded as t to dst: F32,
// F16 (round to nearest even), BF16 (ggml's rounding), Q8_0 (gguf.QuantizeQ8_0, ggml's
// reference quantiser) or Q4_K (QuantizeQ4_K, likewise).
func Encode(dst []byte, src []float32, t gguf.DType) ([]byte, error) {
	switch t {
	case gguf.F32:
		for _, v := range src {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	case gguf.F16:
		for _, v := range src {
			dst = binary.LittleEndian.AppendUint16(dst, gguf.Float32ToHalf(v))
		}
	case gguf.BF16:
		for _, v := range src {
			dst = binary.LittleEndian.AppendUint16(dst, Float32ToBF16(v))
		}
	case gguf.Q8_0:
		return appendQ8_0(dst, src)
	case gguf.Q4_K:
		q, err := QuantizeQ4_K(src)
		if err != nil {
			return dst, err
		}
		dst = append(dst, q...)
	default:
		return dst, fmt.Errorf("encoding to %v is not supported (F32, F16, BF16, Q8_0, Q4_K)", t)
	}
	return dst, nil
}

// Float32ToBF16 rounds f to bfloat16 the way ggml does: to nearest even, NaN kept quiet.
func Float32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 64
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// nearestInt is ggml's nearest_int: round half to even (exact for |x| < 2^22).
func nearestInt(x float32) int {
	return int(math.RoundToEven(float64(x)))
}

// QuantizeQ4_K encodes src (a whole number of 256-value super-blocks) as Q4_K blocks
// exactly as ggml's quantize_row_q4_K_ref does (no importance matrix): per 32-value
// sub-block a weighted least-squares scale/min search (make_qkx2_quants: 15 levels, rmin −1,
// rdelta 0.1, 20 steps, weights rms + |x|), scales and mins to 6 bits against the block
// maxima, d and dmin as binary16, and the quants recomputed from the stored values.
// Every float32 operation is rounded as the C code rounds it (no fused multiply-add).
func QuantizeQ4_K(src []float32) ([]byte, error) {
	const qk = 256
	if len(src)%qk != 0 {
		return nil, fmt.Errorf("quantize Q4_K: %d values is not a multiple of %d", len(src), qk)
	}
	dst := make([]byte, len(src)/qk*144)
	var L [qk]uint8
	var laux [32]uint8
	var weights [32]float32
	var mins, scales [8]float32
	for b := 0; b < len(src)/qk; b++ {
		x := src[qk*b : qk*b+qk]
		y := dst[144*b : 144*b+144]
		var maxScale, maxMin float32
		for j := 0; j < 8; j++ {
			var sumX2 float32
			for l := 0; l < 32; l++ {
				v := x[32*j+l]
				sumX2 = sumX2 + float32(v*v)
			}
			avX := float32(math.Sqrt(float64(sumX2 / 32)))
			for l := 0; l < 32; l++ {
				weights[l] = avX + float32(math.Abs(float64(x[32*j+l])))
			}
			scales[j] = makeQKX2Quants(32, 15, x[32*j:32*j+32], weights[:], L[32*j:32*j+32], &mins[j], laux[:], -1, 0.1, 20)
			if scales[j] > maxScale {
				maxScale = scales[j]
			}
			if mins[j] > maxMin {
				maxMin = mins[j]
			}
		}
		var invScale, invMin float32
		if maxScale > 0 {
			invScale = 63 / maxScale
		}
		if maxMin > 0 {
			invMin = 63 / maxMin
		}
		sc := y[4:16]
		for j := 0; j < 8; j++ {
			ls := uint8(nearestInt(float32(invScale * scales[j])))
			lm := uint8(nearestInt(float32(invMin * mins[j])))
			ls, lm = min(63, ls), min(63, lm)
			if j < 4 {
				sc[j] = ls
				sc[j+4] = lm
			} else {
				sc[j+4] = ls&0xF | (lm&0xF)<<4
				sc[j-4] |= (ls >> 4) << 6
				sc[j] |= (lm >> 4) << 6
			}
		}
		d := gguf.Float32ToHalf(maxScale / 63)
		dmin := gguf.Float32ToHalf(maxMin / 63)
		binary.LittleEndian.PutUint16(y[0:], d)
		binary.LittleEndian.PutUint16(y[2:], dmin)
		df, dminf := gguf.HalfToFloat32(d), gguf.HalfToFloat32(dmin)
		for j := 0; j < 8; j++ {
			s, m := scaleMinK4(j, sc)
			dd := float32(df * float32(s))
			if dd == 0 {
				continue
			}
			dm := float32(dminf * float32(m))
			for ii := 0; ii < 32; ii++ {
				l := nearestInt(float32(x[32*j+ii]+dm) / dd)
				L[32*j+ii] = uint8(max(0, min(15, l)))
			}
		}
		q := y[16:]
		for j := 0; j < qk; j += 64 {
			for l := 0; l < 32; l++ {
				q[l] = L[j+l] | L[j+l+32]<<4
			}
			q = q[32:]
		}
	}
	return dst, nil
}

// scaleMinK4 unpacks sub-block j's 6-bit scale and min (ggml's get_scale_min_k4).
func scaleMinK4(j int, q []byte) (uint8, uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xF | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// makeQKX2Quants is ggml's make_qkx2_quants (use_mad false): it returns the scale and
// stores −min in *theMin and the levels in L.
func makeQKX2Quants(n, nmax int, x, weights []float32, L []uint8, theMin *float32, laux []uint8, rmin, rdelta float32, nstep int) float32 {
	mn, mx := x[0], x[0]
	sumW := weights[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		if x[i] < mn {
			mn = x[i]
		}
		if x[i] > mx {
			mx = x[i]
		}
		w := weights[i]
		sumW += w
		sumX = sumX + float32(w*x[i])
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		for i := 0; i < n; i++ {
			L[i] = 0
		}
		*theMin = -mn
		return 0
	}
	iscale := float32(nmax) / (mx - mn)
	scale := 1 / iscale
	var bestError float32
	for i := 0; i < n; i++ {
		l := nearestInt(float32(iscale * (x[i] - mn)))
		L[i] = uint8(max(0, min(nmax, l)))
		diff := float32(scale*float32(L[i])) + mn - x[i]
		diff = float32(diff * diff)
		bestError = bestError + float32(weights[i]*diff)
	}
	if nstep < 1 {
		*theMin = -mn
		return scale
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + float32(nmax)) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := 0; i < n; i++ {
			l := nearestInt(float32(iscale * (x[i] - mn)))
			l = max(0, min(nmax, l))
			laux[i] = uint8(l)
			w := weights[i]
			wl := float32(w * float32(l))
			sumL += wl
			sumL2 = sumL2 + float32(wl*float32(l))
			sumXL = sumXL + float32(wl*x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curError float32
			for i := 0; i < n; i++ {
				diff := float32(thisScale*float32(laux[i])) + thisMin - x[i]
				diff = float32(diff * diff)
				curError = curError + float32(weights[i]*diff)
			}
			if curError < bestError {
				copy(L[:n], laux[:n])
				bestError = curError
				scale = thisScale
				mn = thisMin
			}
		}
	}
	*theMin = -mn
	return scale
}
