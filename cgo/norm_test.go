package cgo

// Tests of LAYER_NORM, RMS_NORM, GROUP_NORM, CHANNEL_AFFINE, SOFTMAX, REDUCE, CUMSUM and ROPE
// against float64 references. Harness in elem_test.go.

import (
	"fmt"
	"math"
	"testing"
)

// normRows normalises each run of d values: (x - mean) / sqrt(var + eps) (rms: x / sqrt(ms + eps)).
func normRows(x []float64, d int, eps float64, rms bool) []float64 {
	out := make([]float64, len(x))
	for r := 0; r+d <= len(x); r += d {
		row := x[r : r+d]
		mean, v := 0.0, 0.0
		if !rms {
			for _, a := range row {
				mean += a
			}
			mean /= float64(d)
		}
		for _, a := range row {
			v += (a - mean) * (a - mean)
		}
		v /= float64(d)
		for i, a := range row {
			out[r+i] = (a - mean) / math.Sqrt(v+eps)
		}
	}
	return out
}

func TestLayerNorm(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, rms := range []bool{false, true} {
		op, name := OpLayerNorm, "layernorm"
		if rms {
			op, name = OpRMSNorm, "rmsnorm"
		}
		for _, sh := range [][]int64{{1}, {3, 17}, {2, 5, 63}, {4, 129}, {7, 1000}, {2, 3, 1, 5, 9}, {500, 1024}} {
			D := sh[len(sh)-1]
			x := m.randn(r, 0.7, 2, sh...)
			w := m.randn(r, 1, 0.5, D)
			b := m.randn(r, 0, 0.5, D)
			base := normRows(x.values(), int(D), 1e-5, rms)
			for nsrc := 1; nsrc <= 3; nsrc++ {
				if rms && nsrc == 3 {
					continue
				}
				want := make([]float64, len(base))
				for i, v := range base {
					d := int64(i) % D
					if nsrc >= 2 {
						v *= w.at([]int64{d})
					}
					if nsrc == 3 {
						v += b.at([]int64{d})
					}
					want[i] = v
				}
				srcs := []elArr{x, w, b}[:nsrc]
				y := m.f32(sh...)
				what := fmt.Sprintf("%s %v nsrc=%d", name, sh, nsrc)
				elExec(t, elOp{op: op, fp: [4]float32{1e-5}}, y, srcs, nil, func(cfg string) {
					elCheck(t, what+" "+cfg, y, want, 1e-5, 1e-5)
				})
			}
		}
		// constant rows: variance 0 -> (x - mean) = 0, not NaN
		x := m.f32(3, 8)
		x.fill(func() float64 { return 4.25 })
		y := m.f32(3, 8)
		want := normRows(x.values(), 8, 1e-5, rms)
		elExec(t, elOp{op: op, fp: [4]float32{1e-5}}, y, []elArr{x}, nil, func(cfg string) {
			elCheck(t, name+" constant "+cfg, y, want, 1e-5, 1e-5)
		})
		elExecErr(t, elOp{op: op, fp: [4]float32{1e-5}}, m.f32(3, 8), []elArr{m.f32(3, 8), m.f32(7)}, 2)
		elExecErr(t, elOp{op: op, fp: [4]float32{1e-5}}, m.f32(3, 8), []elArr{m.f32(8, 3).permute(1, 0)}, 2)
		elExecErr(t, elOp{op: op, fp: [4]float32{1e-5}}, m.f32(3, 8), []elArr{m.f32(3, 8), m.f32(8), m.f32(8), m.f32(8)}, 2)
	}
	elExecErr(t, elOp{op: OpRMSNorm, fp: [4]float32{1e-5}}, m.f32(3, 8), []elArr{m.f32(3, 8), m.f32(8), m.f32(8)}, 2) // no bias

	// a large-offset input: two-pass variance keeps the precision
	x := m.randn(r, 1000, 0.01, 4, 257)
	y := m.f32(4, 257)
	want := normRows(x.values(), 257, 1e-5, false)
	elExec(t, elOp{op: OpLayerNorm, fp: [4]float32{1e-5}}, y, []elArr{x}, nil, func(cfg string) {
		// (x - mean) in float loses ~ulp(1000)/std = 6e-5/0.01 relative; bound accordingly
		elCheck(t, "layernorm offset "+cfg, y, want, 1e-3, 1e-2)
	})
}

func TestGroupNorm(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, c := range []struct {
		shape []int64
		g     int64
	}{
		{[]int64{2, 6, 17}, 1}, {[]int64{2, 6, 17}, 2}, {[]int64{2, 6, 17}, 3}, {[]int64{2, 6, 17}, 6},
		{[]int64{1, 4, 3, 5}, 2}, {[]int64{3, 5}, 5}, {[]int64{1, 32, 3000}, 8}, {[]int64{1, 3, 20000}, 1},
	} {
		B, C := c.shape[0], c.shape[1]
		S := int64(1)
		for _, s := range c.shape[2:] {
			S *= s
		}
		x := m.randn(r, -0.4, 1.5, c.shape...)
		w := m.randn(r, 1, 0.5, C)
		b := m.randn(r, 0, 0.5, C)
		// group (b, g) is a contiguous block of C/G*S values
		base := normRows(x.values(), int(C/c.g*S), 1e-5, false)
		for nsrc := 1; nsrc <= 3; nsrc++ {
			want := make([]float64, len(base))
			for i, v := range base {
				ch := (int64(i) / S) % C
				if nsrc >= 2 {
					v *= w.at([]int64{ch})
				}
				if nsrc == 3 {
					v += b.at([]int64{ch})
				}
				want[i] = v
			}
			_ = B
			y := m.f32(c.shape...)
			what := fmt.Sprintf("groupnorm %v g=%d nsrc=%d", c.shape, c.g, nsrc)
			elExec(t, elOp{op: OpGroupNorm, ip: [8]int64{c.g}, fp: [4]float32{1e-5}}, y, []elArr{x, w, b}[:nsrc], nil, func(cfg string) {
				elCheck(t, what+" "+cfg, y, want, 1e-5, 1e-5)
			})
		}
	}
	elExecErr(t, elOp{op: OpGroupNorm, ip: [8]int64{4}, fp: [4]float32{1e-5}}, m.f32(2, 6, 3), []elArr{m.f32(2, 6, 3)}, 2)
	elExecErr(t, elOp{op: OpGroupNorm, ip: [8]int64{0}, fp: [4]float32{1e-5}}, m.f32(2, 6, 3), []elArr{m.f32(2, 6, 3)}, 2)
	elExecErr(t, elOp{op: OpGroupNorm, ip: [8]int64{2}, fp: [4]float32{1e-5}}, m.f32(2, 6, 3), []elArr{m.f32(2, 6, 3), m.f32(3)}, 2)
}

func TestChannelAffine(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, sh := range [][]int64{{2, 5, 17}, {3, 4}, {1, 7, 3, 9}, {2, 3, 10000}} {
		C := sh[1]
		S := int64(1)
		for _, s := range sh[2:] {
			S *= s
		}
		x := m.randn(r, 0, 1, sh...)
		sc := m.randn(r, 1, 0.5, C)
		shf := m.randn(r, 0, 0.5, C)
		xv := x.values()
		for nsrc := 2; nsrc <= 3; nsrc++ {
			want := make([]float64, len(xv))
			for i, v := range xv {
				ch := []int64{(int64(i) / S) % C}
				want[i] = v * sc.at(ch)
				if nsrc == 3 {
					want[i] += shf.at(ch)
				}
			}
			y := m.f32(sh...)
			elExec(t, elOp{op: OpChannelAffine}, y, []elArr{x, sc, shf}[:nsrc], func() { x.setValues(xv) }, func(cfg string) {
				elCheck(t, fmt.Sprintf("affine %v nsrc=%d %s", sh, nsrc, cfg), y, want, 1e-6, 1e-6)
			})
			// in place
			elExec(t, elOp{op: OpChannelAffine}, x, []elArr{x, sc, shf}[:nsrc], func() { x.setValues(xv) }, func(cfg string) {
				elCheck(t, fmt.Sprintf("affine in-place %v nsrc=%d %s", sh, nsrc, cfg), x, want, 1e-6, 1e-6)
			})
		}
	}
	elExecErr(t, elOp{op: OpChannelAffine}, m.f32(2, 5, 3), []elArr{m.f32(2, 5, 3), m.f32(3)}, 2)
	elExecErr(t, elOp{op: OpChannelAffine}, m.f32(2, 5, 3), []elArr{m.f32(2, 5, 3)}, 2)
}

func TestSoftmax(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	ninf := math.Inf(-1)
	type tc struct {
		name  string
		shape []int64
		scale float32
		mask  func() elArr
	}
	maskOf := func(sh ...int64) func() elArr {
		return func() elArr {
			a := m.randn(r, 0, 1, sh...)
			a.fill(func() float64 {
				if r.IntN(5) == 0 {
					return ninf
				}
				return r.NormFloat64()
			})
			return a
		}
	}
	causal := func(T int64) func() elArr {
		return func() elArr {
			a := m.f32(T, T)
			elForEach(a.shape, func(idx []int64) {
				if idx[1] > idx[0] {
					a.set(idx, ninf)
				} else {
					a.set(idx, 0)
				}
			})
			return a
		}
	}
	cases := []tc{
		{"1", []int64{1}, 1, nil},
		{"row3", []int64{4, 3}, 1, nil},
		{"17", []int64{5, 17}, 0.125, nil},
		{"63", []int64{2, 3, 63}, 1, nil},
		{"1000", []int64{7, 1000}, 0.5, nil},
		{"zero-scale-is-1", []int64{3, 9}, 0, nil},
		{"causal", []int64{2, 3, 17, 17}, 0.25, causal(17)},
		{"full-mask", []int64{2, 3, 5, 129}, 1, maskOf(2, 3, 5, 129)},
		{"head-bcast", []int64{2, 3, 5, 63}, 1, maskOf(2, 1, 5, 63)},
		{"row-bcast", []int64{2, 3, 5, 63}, 1, maskOf(63)},
		{"col-bcast", []int64{4, 63}, 1, maskOf(4, 1)},
		{"expanded", []int64{3, 5, 33}, 1, func() elArr { return maskOf(3, 1, 33)().expand(1, 5) }},
		{"transposed", []int64{6, 17}, 1, func() elArr { return maskOf(17, 6)().permute(1, 0) }},
		{"long", []int64{2, 50001}, 0.5, maskOf(50001)},
	}
	for _, c := range cases {
		x := m.randn(r, 0, 3, c.shape...)
		N := int(c.shape[len(c.shape)-1])
		var mask elArr
		srcs := []elArr{x}
		if c.mask != nil {
			mask = c.mask()
			srcs = append(srcs, mask)
		}
		scale := float64(c.scale)
		if scale == 0 {
			scale = 1
		}
		pre := make([]float64, 0, x.numel())
		elForEach(x.shape, func(idx []int64) {
			v := float64(float32(x.at(idx) * scale))
			if c.mask != nil {
				v += elBroadcastAt(mask, idx)
			}
			pre = append(pre, v)
		})
		// force one fully masked row when there is a mask with room for it
		if c.mask != nil && len(pre) > N {
			for i := N; i < 2*N; i++ {
				pre[i] = ninf
			}
			// write -inf into x itself for that row: x*scale + mask = -inf
			xv := x.values()
			for i := N; i < 2*N; i++ {
				xv[i] = ninf
			}
			x.setValues(xv)
		}
		want := make([]float64, len(pre))
		for rI := 0; rI < len(pre); rI += N {
			row := pre[rI : rI+N]
			mx := math.Inf(-1)
			for _, v := range row {
				mx = math.Max(mx, v)
			}
			if math.IsInf(mx, -1) {
				continue // zeros
			}
			s := 0.0
			for _, v := range row {
				s += math.Exp(v - mx)
			}
			for i, v := range row {
				want[rI+i] = math.Exp(v-mx) / s
			}
		}
		y := m.f32(c.shape...)
		elExec(t, elOp{op: OpSoftmax, fp: [4]float32{c.scale}}, y, srcs, nil, func(cfg string) {
			elCheck(t, "softmax "+c.name+" "+cfg, y, want, 1e-5, 1e-7)
		})
	}
	// in place
	x := m.randn(r, 0, 2, 3, 40)
	xv := x.values()
	want := make([]float64, len(xv))
	for rI := 0; rI < len(xv); rI += 40 {
		mx, s := math.Inf(-1), 0.0
		for _, v := range xv[rI : rI+40] {
			mx = math.Max(mx, v)
		}
		for _, v := range xv[rI : rI+40] {
			s += math.Exp(v - mx)
		}
		for i, v := range xv[rI : rI+40] {
			want[rI+i] = math.Exp(v-mx) / s
		}
	}
	elExec(t, elOp{op: OpSoftmax, fp: [4]float32{1}}, x, []elArr{x}, func() { x.setValues(xv) }, func(cfg string) {
		elCheck(t, "softmax in-place "+cfg, x, want, 1e-5, 1e-7)
	})
	elExecErr(t, elOp{op: OpSoftmax, fp: [4]float32{1}}, m.f32(3, 8), []elArr{m.f32(3, 8), m.f32(2, 8)}, 2)
	elExecErr(t, elOp{op: OpSoftmax, fp: [4]float32{1}}, m.f32(3, 8), []elArr{m.f32(3, 8), m.i32(8)}, 2)
	elExecErr(t, elOp{op: OpSoftmax, fp: [4]float32{1}}, m.f32(3, 8), []elArr{m.f32(3, 8), m.f32(1, 3, 8)}, 2)
}

func TestReduce(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	names := []string{"sum", "mean", "max", "var"}
	for _, sh := range [][]int64{{129}, {3, 17, 5}, {2, 3, 4, 5, 7}, {4, 300}, {1000, 40}, {3, 1}} {
		x := m.randn(r, 0.5, 2, sh...)
		xv := x.values()
		xv[len(xv)/2] = 9 // a clear maximum somewhere
		x.setValues(xv)
		for axis := -1; axis < len(sh); axis++ {
			ax := axis
			if ax < 0 {
				ax += len(sh)
			}
			out := append([]int64(nil), sh...)
			out[ax] = 1
			for op := RSum; op <= RVar; op++ {
				var want []float64
				elForEach(out, func(idx []int64) {
					var vals []float64
					si := append([]int64(nil), idx...)
					for k := int64(0); k < sh[ax]; k++ {
						si[ax] = k
						vals = append(vals, x.at(si))
					}
					s, mx := 0.0, math.Inf(-1)
					for _, v := range vals {
						s += v
						mx = math.Max(mx, v)
					}
					mean := s / float64(len(vals))
					q := 0.0
					for _, v := range vals {
						q += (v - mean) * (v - mean)
					}
					want = append(want, []float64{s, mean, mx, q / float64(len(vals))}[op])
				})
				for _, keep := range []bool{true, false} {
					dsh := out
					if !keep {
						dsh = append(append([]int64(nil), sh[:ax]...), sh[ax+1:]...)
					}
					y := m.f32(dsh...)
					what := fmt.Sprintf("reduce %s %v axis=%d keep=%v", names[op], sh, axis, keep)
					elExec(t, elOp{op: OpReduce, ip: [8]int64{int64(axis), int64(op)}}, y, []elArr{x}, nil, func(cfg string) {
						elCheck(t, what+" "+cfg, y, want, 1e-6, 1e-6)
					})
				}
			}
		}
	}
	// NaN propagates through max
	x := m.f32(2, 4)
	x.setValues([]float64{1, math.NaN(), 3, 2, 5, 6, 7, 8})
	y := m.f32(2, 1)
	elExec(t, elOp{op: OpReduce, ip: [8]int64{1, RMax}}, y, []elArr{x}, nil, func(cfg string) {
		elCheckExact(t, "max nan "+cfg, y, []float64{math.NaN(), 8})
	})
	y2 := m.f32(1, 4)
	elExec(t, elOp{op: OpReduce, ip: [8]int64{0, RMax}}, y2, []elArr{x}, nil, func(cfg string) {
		elCheckExact(t, "max nan cols "+cfg, y2, []float64{5, math.NaN(), 7, 8})
	})
	elExecErr(t, elOp{op: OpReduce, ip: [8]int64{1, RSum}}, m.f32(3, 2), []elArr{m.f32(3, 4)}, 2)
	elExecErr(t, elOp{op: OpReduce, ip: [8]int64{2, RSum}}, m.f32(3, 1), []elArr{m.f32(3, 4)}, 2)
	elExecErr(t, elOp{op: OpReduce, ip: [8]int64{1, RVar + 1}}, m.f32(3, 1), []elArr{m.f32(3, 4)}, 1)
	elExecErr(t, elOp{op: OpReduce, ip: [8]int64{1, RMax}}, m.f32(3, 1), []elArr{m.f32(3, 0)}, 2)
}

func TestCumsum(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, sh := range [][]int64{{129}, {3, 17, 5}, {2, 3, 1, 5, 7}, {40, 3000}, {3000, 40}} {
		x := m.randn(r, 0.2, 1, sh...)
		xv := x.values()
		for axis := -1; axis < len(sh); axis++ {
			ax := axis
			if ax < 0 {
				ax += len(sh)
			}
			want := make([]float64, len(xv))
			st := Contiguous(sh)
			for i := range xv {
				k := (int64(i) / st[ax]) % sh[ax]
				want[i] = xv[i]
				if k > 0 {
					want[i] += want[int64(i)-st[ax]]
				}
			}
			y := m.f32(sh...)
			what := fmt.Sprintf("cumsum %v axis=%d", sh, axis)
			o := elOp{op: OpCumsum, ip: [8]int64{int64(axis)}}
			elExec(t, o, y, []elArr{x}, func() { x.setValues(xv) }, func(cfg string) { elCheck(t, what+" "+cfg, y, want, 1e-5, 1e-5) })
			elExec(t, o, x, []elArr{x}, func() { x.setValues(xv) }, func(cfg string) {
				elCheck(t, what+" in-place "+cfg, x, want, 1e-5, 1e-5)
			})
		}
	}
	elExecErr(t, elOp{op: OpCumsum, ip: [8]int64{2}}, m.f32(3, 4), []elArr{m.f32(3, 4)}, 2)
	elExecErr(t, elOp{op: OpCumsum, ip: [8]int64{1}}, m.f32(4, 3), []elArr{m.f32(3, 4)}, 2)
}

// ropeRef rotates x [B, H, T, D] (any view) in float64.
func ropeRef(x elArr, pos []int64, rot int64, mode int, theta float64) []float64 {
	D := x.shape[3]
	var out []float64
	elForEach(x.shape[:3], func(idx []int64) {
		at := func(d int64) float64 { return x.at([]int64{idx[0], idx[1], idx[2], d}) }
		p := float64(pos[idx[2]])
		row := make([]float64, D)
		for d := int64(0); d < D; d++ {
			row[d] = at(d)
		}
		for i := int64(0); i < rot/2; i++ {
			a := p * math.Pow(theta, -float64(2*i)/float64(rot))
			c, s := math.Cos(a), math.Sin(a)
			i0, i1 := 2*i, 2*i+1
			if mode == 1 {
				i0, i1 = i, i+rot/2
			}
			x0, x1 := at(i0), at(i1)
			row[i0] = x0*c - x1*s
			row[i1] = x0*s + x1*c
		}
		out = append(out, row...)
	})
	return out
}

func TestRope(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, c := range []struct {
		shape []int64
		rot   int64
		theta float32
	}{
		{[]int64{2, 3, 17, 8}, 8, 10000}, {[]int64{1, 2, 5, 8}, 4, 10000}, {[]int64{1, 1, 3, 6}, 4, 1e6},
		{[]int64{2, 4, 63, 64}, 0, 1e6}, {[]int64{1, 2, 129, 34}, 32, 500000}, {[]int64{1, 1, 1, 2}, 2, 10000},
	} {
		T := c.shape[2]
		pos := m.i32(T)
		pv := make([]int64, T)
		for i := range pv {
			pv[i] = r.Int64N(5000)
			if i == 0 {
				pv[i] = 0
			}
		}
		// Positions outside the context's memo (negative, ≥ 65536) take the per-call table.
		switch T {
		case 5:
			pv[1] = -7
		case 3:
			pv[2] = 70000
		}
		ps := make([]float64, T)
		for i, v := range pv {
			ps[i] = float64(v)
		}
		pos.setValues(ps)
		rot := c.rot
		if rot == 0 {
			rot = c.shape[3]
		}
		for mode := 0; mode <= 1; mode++ {
			for _, view := range []string{"contiguous", "permuted", "in-place"} {
				var x elArr
				if view == "permuted" { // x stored as [B, T, H, D], viewed as [B, H, T, D]
					s := c.shape
					x = m.randn(r, 0, 1, s[0], s[2], s[1], s[3]).permute(0, 2, 1, 3)
				} else {
					x = m.randn(r, 0, 1, c.shape...)
				}
				xv := x.values()
				want := ropeRef(x, pv, rot, mode, float64(c.theta))
				o := elOp{op: OpRoPE, ip: [8]int64{c.rot, int64(mode)}, fp: [4]float32{c.theta}}
				what := fmt.Sprintf("rope %v rot=%d mode=%d %s", c.shape, c.rot, mode, view)
				// positions up to 5000: the angle is exact in double; the float rotation ~1e-7
				if view == "in-place" {
					elExec(t, o, x, []elArr{x, pos}, func() { x.setValues(xv) }, func(cfg string) {
						elCheck(t, what+" "+cfg, x, want, 1e-5, 1e-6)
					})
					continue
				}
				y := m.f32(c.shape...)
				elExec(t, o, y, []elArr{x, pos}, nil, func(cfg string) { elCheck(t, what+" "+cfg, y, want, 1e-5, 1e-6) })
			}
		}
	}
	for _, ip := range [][2]int64{{3, 0}, {10, 0}, {4, 2}, {-2, 0}} {
		elExecErr(t, elOp{op: OpRoPE, ip: [8]int64{ip[0], ip[1]}, fp: [4]float32{10000}}, m.f32(1, 2, 3, 8), []elArr{m.f32(1, 2, 3, 8), m.i32(3)}, 2)
	}
	elExecErr(t, elOp{op: OpRoPE, ip: [8]int64{8, 0}, fp: [4]float32{0}}, m.f32(1, 2, 3, 8), []elArr{m.f32(1, 2, 3, 8), m.i32(3)}, 2)
	elExecErr(t, elOp{op: OpRoPE, ip: [8]int64{8, 0}, fp: [4]float32{1e4}}, m.f32(1, 2, 3, 8), []elArr{m.f32(1, 2, 3, 8), m.i32(4)}, 2)
	elExecErr(t, elOp{op: OpRoPE, ip: [8]int64{8, 0}, fp: [4]float32{1e4}}, m.f32(1, 2, 3, 8), []elArr{m.f32(1, 2, 3, 8), m.f32(3)}, 2)
}
