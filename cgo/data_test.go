package cgo

// Tests of the data-movement kernels: COPY, CONCAT, PAD, GATHER_ROWS, INTERP_LINEAR.
// Harness in elem_test.go.

import (
	"fmt"
	"math"
	"testing"
)

func TestCopy(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	type tc struct {
		name string
		src  func() elArr
	}
	cases := []tc{
		{"contiguous", func() elArr { return m.randn(r, 0, 1, 3, 17, 63) }},
		{"contiguous-long", func() elArr { return m.randn(r, 0, 1, 100003) }},
		{"scalar", func() elArr { return m.randn(r, 0, 1) }},
		{"permute", func() elArr { return m.randn(r, 0, 1, 3, 17, 5).permute(2, 0, 1) }},
		{"transpose", func() elArr { return m.randn(r, 0, 1, 129, 63).permute(1, 0) }},
		{"permute5d", func() elArr { return m.randn(r, 0, 1, 2, 3, 5, 7, 3).permute(4, 2, 0, 3, 1) }},
		{"slice-step", func() elArr { return m.randn(r, 0, 1, 17, 63).slice(0, 2, 5, 3).slice(1, 1, 20, 3) }},
		{"slice-inner", func() elArr { return m.randn(r, 0, 1, 4, 129).slice(1, 64, 65, 1) }},
		{"expand", func() elArr { return m.randn(r, 0, 1, 3, 1, 17).expand(1, 5) }},
		{"expand-last", func() elArr { return m.randn(r, 0, 1, 63, 1).expand(1, 129) }},
		{"repeat-all", func() elArr { return m.randn(r, 0, 1, 1, 1).expand(0, 40).expand(1, 3000) }},
		{"int32-permute", func() elArr {
			a := m.i32(7, 3, 9)
			a.fill(func() float64 { return float64(r.Int32()) })
			return a.permute(1, 2, 0)
		}},
		{"int32-expand", func() elArr {
			a := m.i32(5, 1)
			a.fill(func() float64 { return float64(r.Int32() - 1<<30) })
			return a.expand(1, 11)
		}},
		{"empty", func() elArr { return m.randn(r, 0, 1, 0, 7) }},
	}
	for _, c := range cases {
		x := c.src()
		y := m.arr(x.dtype, x.shape...)
		want := x.values()
		elExec(t, elOp{op: OpCopy}, y, []elArr{x}, nil, func(cfg string) { elCheckExact(t, c.name+" "+cfg, y, want) })
	}
	// a large strided copy that is split across threads
	x := m.randn(r, 0, 1, 300, 257).permute(1, 0)
	y := m.f32(257, 300)
	want := x.values()
	elExec(t, elOp{op: OpCopy}, y, []elArr{x}, nil, func(cfg string) { elCheckExact(t, "big-transpose "+cfg, y, want) })

	elExecErr(t, elOp{op: OpCopy}, m.f32(3, 5), []elArr{m.f32(5, 3)}, 2)
	elExecErr(t, elOp{op: OpCopy}, m.i32(3, 5), []elArr{m.f32(3, 5)}, 2)
	elExecErr(t, elOp{op: OpCopy}, m.f32(5, 3).permute(1, 0), []elArr{m.f32(3, 5)}, 2)
}

func TestConcat(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	cases := []struct {
		axis   int
		shapes [][]int64
	}{
		{0, [][]int64{{3, 5}, {1, 5}, {17, 5}}},
		{1, [][]int64{{3, 5}, {3, 1}, {3, 63}}},
		{-1, [][]int64{{2, 3, 7}, {2, 3, 1}, {2, 3, 2}, {2, 3, 9}, {2, 3, 1}, {2, 3, 4}, {2, 3, 3}, {2, 3, 129}}},
		{1, [][]int64{{2, 4, 7}, {2, 0, 7}, {2, 9, 7}}},
		{3, [][]int64{{1, 2, 3, 4, 5}, {1, 2, 3, 6, 5}}},
		{0, [][]int64{{17}}},
		{1, [][]int64{{40, 3000}, {40, 1001}}},
	}
	for _, c := range cases {
		var srcs []elArr
		for _, sh := range c.shapes {
			srcs = append(srcs, m.randn(r, 0, 1, sh...))
		}
		for _, strided := range []bool{false, true} {
			if strided { // the first source as a permuted view
				sh := srcs[0].shape
				p := m.randn(r, 0, 1, append([]int64{sh[len(sh)-1]}, sh[:len(sh)-1]...)...)
				perm := make([]int, len(sh))
				for i := range perm {
					perm[i] = (i + 1) % len(sh)
				}
				srcs[0] = p.permute(perm...)
			}
			ax := c.axis
			if ax < 0 {
				ax += len(c.shapes[0])
			}
			out := append([]int64(nil), c.shapes[0]...)
			out[ax] = 0
			for _, s := range srcs {
				out[ax] += s.shape[ax]
			}
			var want []float64
			elForEach(out, func(idx []int64) {
				k, i := 0, idx[ax]
				for i >= srcs[k].shape[ax] {
					i -= srcs[k].shape[ax]
					k++
				}
				si := append([]int64(nil), idx...)
				si[ax] = i
				want = append(want, srcs[k].at(si))
			})
			y := m.f32(out...)
			name := fmt.Sprintf("concat axis=%d %v strided=%v", c.axis, c.shapes, strided)
			elExec(t, elOp{op: OpConcat, ip: [8]int64{int64(c.axis)}}, y, srcs, nil, func(cfg string) {
				elCheckExact(t, name+" "+cfg, y, want)
			})
		}
	}
	// int32
	a, b := m.i32(2, 3), m.i32(2, 2)
	a.fill(func() float64 { return float64(r.Int32()) })
	b.fill(func() float64 { return float64(-r.Int32()) })
	y := m.i32(2, 5)
	want := []float64{a.at([]int64{0, 0}), a.at([]int64{0, 1}), a.at([]int64{0, 2}), b.at([]int64{0, 0}), b.at([]int64{0, 1}),
		a.at([]int64{1, 0}), a.at([]int64{1, 1}), a.at([]int64{1, 2}), b.at([]int64{1, 0}), b.at([]int64{1, 1})}
	elExec(t, elOp{op: OpConcat, ip: [8]int64{1}}, y, []elArr{a, b}, nil, func(cfg string) { elCheckExact(t, "int32 "+cfg, y, want) })

	elExecErr(t, elOp{op: OpConcat, ip: [8]int64{1}}, m.f32(2, 6), []elArr{m.f32(2, 3), m.f32(2, 2)}, 2)
	elExecErr(t, elOp{op: OpConcat, ip: [8]int64{1}}, m.f32(2, 5), []elArr{m.f32(2, 3), m.f32(3, 2)}, 2)
	elExecErr(t, elOp{op: OpConcat, ip: [8]int64{2}}, m.f32(2, 5), []elArr{m.f32(2, 3), m.f32(2, 2)}, 2)
	elExecErr(t, elOp{op: OpConcat, ip: [8]int64{1}}, m.f32(2, 5), []elArr{m.f32(2, 3), m.i32(2, 2)}, 2)
}

func padRef(x elArr, axis int, pl, pr int64, mode int, val float64) ([]int64, []float64) {
	n := x.shape[axis]
	out := append([]int64(nil), x.shape...)
	out[axis] = n + pl + pr
	var want []float64
	elForEach(out, func(idx []int64) {
		i := idx[axis] - pl
		if i < 0 || i >= n {
			switch mode {
			case 0:
				want = append(want, val)
				return
			case 1:
				if i < 0 {
					i = -i
				} else {
					i = 2*(n-1) - i
				}
			case 2:
				i = min(max(i, 0), n-1)
			}
		}
		si := append([]int64(nil), idx...)
		si[axis] = i
		want = append(want, x.at(si))
	})
	return out, want
}

func TestPad(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	type tc struct {
		shape  []int64
		axis   int
		pl, pr int64
	}
	cases := []tc{
		{[]int64{17}, 0, 3, 5}, {[]int64{3, 17}, 1, 16, 16}, {[]int64{3, 17}, -1, 0, 7}, {[]int64{3, 17}, 1, 7, 0},
		{[]int64{5, 3, 63}, 0, 2, 4}, {[]int64{2, 5, 3, 7}, 2, 1, 2}, {[]int64{2, 63, 1}, 1, 62, 1},
		{[]int64{4, 1}, 1, 0, 0}, {[]int64{2, 3, 2, 2, 9}, 4, 8, 8}, {[]int64{8, 5000}, 1, 100, 257},
	}
	for _, c := range cases {
		for mode := 0; mode <= 2; mode++ {
			ax := c.axis
			if ax < 0 {
				ax += len(c.shape)
			}
			if mode == 1 && (c.pl >= c.shape[ax] || c.pr >= c.shape[ax]) {
				continue
			}
			for _, strided := range []bool{false, true} {
				x := m.randn(r, 0, 1, c.shape...)
				if strided { // every other element of a twice-as-long last dim
					sh := append([]int64(nil), c.shape...)
					sh[len(sh)-1] *= 2
					x = m.randn(r, 0, 1, sh...).slice(len(sh)-1, 1, c.shape[len(sh)-1], 2)
				}
				out, want := padRef(x, ax, c.pl, c.pr, mode, -2.5)
				y := m.f32(out...)
				name := fmt.Sprintf("pad %v axis=%d %d,%d mode=%d strided=%v", c.shape, c.axis, c.pl, c.pr, mode, strided)
				o := elOp{op: OpPad, ip: [8]int64{int64(c.axis), c.pl, c.pr, int64(mode)}, fp: [4]float32{-2.5}}
				elExec(t, o, y, []elArr{x}, nil, func(cfg string) { elCheckExact(t, name+" "+cfg, y, want) })
			}
		}
	}
	// int32 constant and replicate
	xi := m.i32(3, 4)
	xi.fill(func() float64 { return float64(r.Int32() - 1<<30) })
	for mode := 0; mode <= 2; mode++ {
		out, want := padRef(xi, 1, 2, 3, mode, 7)
		y := m.i32(out...)
		elExec(t, elOp{op: OpPad, ip: [8]int64{1, 2, 3, int64(mode)}, fp: [4]float32{7}}, y, []elArr{xi}, nil, func(cfg string) {
			elCheckExact(t, fmt.Sprintf("int32 mode=%d %s", mode, cfg), y, want)
		})
	}
	// reflect needs pad < size
	elExecErr(t, elOp{op: OpPad, ip: [8]int64{1, 5, 0, 1}}, m.f32(3, 10), []elArr{m.f32(3, 5)}, 2)
	elExecErr(t, elOp{op: OpPad, ip: [8]int64{1, 0, 5, 1}}, m.f32(3, 10), []elArr{m.f32(3, 5)}, 2)
	elExecErr(t, elOp{op: OpPad, ip: [8]int64{1, 1, 1, 1}}, m.f32(3, 3), []elArr{m.f32(3, 1)}, 2)
	elExecErr(t, elOp{op: OpPad, ip: [8]int64{1, 1, 1, 2}}, m.f32(3, 2), []elArr{m.f32(3, 0)}, 2)
	elExecErr(t, elOp{op: OpPad, ip: [8]int64{1, 2, 2, 0}}, m.f32(3, 8), []elArr{m.f32(3, 5)}, 2)
	elExecErr(t, elOp{op: OpPad, ip: [8]int64{1, -1, 2, 0}}, m.f32(3, 6), []elArr{m.f32(3, 5)}, 2)
	elExecErr(t, elOp{op: OpPad, ip: [8]int64{1, 1, 1, 3}}, m.f32(3, 7), []elArr{m.f32(3, 5)}, 2)
	elExecErr(t, elOp{op: OpPad, ip: [8]int64{2, 1, 1, 0}}, m.f32(3, 7), []elArr{m.f32(3, 5)}, 2)
}

func TestGatherRows(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, c := range []struct {
		N, D int64
		idx  []int64
	}{{17, 63, []int64{129}}, {1, 1, []int64{3}}, {5, 3000, []int64{40}}, {9, 7, []int64{3, 5}}, {4, 5, []int64{0}}} {
		tab := m.randn(r, 0, 1, c.N, c.D)
		idx := m.i32(c.idx...)
		ids := make([]float64, idx.numel())
		for i := range ids {
			ids[i] = float64(r.Int64N(c.N))
		}
		if len(ids) > 2 {
			ids[0], ids[1] = 0, float64(c.N-1)
		}
		idx.setValues(ids)
		out := append(append([]int64(nil), c.idx...), c.D)
		var want []float64
		for _, id := range ids {
			for d := int64(0); d < c.D; d++ {
				want = append(want, tab.at([]int64{int64(id), d}))
			}
		}
		y := m.f32(out...)
		elExec(t, elOp{op: OpGatherRows}, y, []elArr{tab, idx}, nil, func(cfg string) {
			elCheckExact(t, fmt.Sprintf("gather %v %s", c, cfg), y, want)
		})
	}
	// int32 table
	tab := m.i32(3, 2)
	tab.setValues([]float64{1, 2, 3, 4, 5, 6})
	idx := m.i32(4)
	idx.setValues([]float64{2, 0, 2, 1})
	y := m.i32(4, 2)
	elExec(t, elOp{op: OpGatherRows}, y, []elArr{tab, idx}, nil, func(cfg string) {
		elCheckExact(t, "gather int32 "+cfg, y, []float64{5, 6, 1, 2, 5, 6, 3, 4})
	})
	// out of range indices are errors, not reads
	for _, bad := range []float64{3, -1, 1 << 30} {
		idx.setValues([]float64{0, bad, 1, 2})
		elExecErr(t, elOp{op: OpGatherRows}, m.i32(4, 2), []elArr{tab, idx}, 2)
	}
	elExecErr(t, elOp{op: OpGatherRows}, m.f32(4, 3), []elArr{m.f32(3, 2), m.i32(4)}, 2)
	elExecErr(t, elOp{op: OpGatherRows}, m.f32(4, 2), []elArr{m.f32(3, 2), m.f32(4)}, 2)
}

// interpRef follows PyTorch F.interpolate(mode='linear', align_corners=False) with an output
// size: source index and weight in float32 as PyTorch's CPU kernel computes them.
func interpRef(x []float64, to int) []float64 {
	ti := len(x)
	scale := float32(ti) / float32(to)
	out := make([]float64, to)
	for i := range out {
		r := float32(scale*(float32(i)+0.5)) - 0.5
		if r < 0 {
			r = 0
		}
		k := min(int(r), ti-1)
		l := float32(math.Min(math.Max(float64(r-float32(k)), 0), 1))
		k1 := k
		if k < ti-1 {
			k1 = k + 1
		}
		out[i] = float64(1-l)*x[k] + float64(l)*x[k1]
	}
	return out
}

func TestInterpLinear(t *testing.T) {
	r := elRand()
	m := elNewMem(t)
	for _, c := range [][2]int64{{1, 5}, {5, 1}, {17, 63}, {63, 17}, {100, 240}, {129, 129}, {3, 7}, {480, 160}, {2000, 3001}} {
		for _, lead := range [][]int64{{}, {2, 3}, {40}} {
			x := m.randn(r, 0, 1, append(append([]int64(nil), lead...), c[0])...)
			y := m.f32(append(append([]int64(nil), lead...), c[1])...)
			xv := x.values()
			var want []float64
			for row := 0; row < len(xv)/int(c[0]); row++ {
				want = append(want, interpRef(xv[row*int(c[0]):(row+1)*int(c[0])], int(c[1]))...)
			}
			elExec(t, elOp{op: OpInterpLinear}, y, []elArr{x}, nil, func(cfg string) {
				elCheck(t, fmt.Sprintf("interp %v lead %v %s", c, lead, cfg), y, want, 1e-6, 1e-6)
			})
		}
	}
	elExecErr(t, elOp{op: OpInterpLinear}, m.f32(3, 8), []elArr{m.f32(2, 4)}, 2)
	elExecErr(t, elOp{op: OpInterpLinear}, m.f32(3, 8), []elArr{m.f32(3, 0)}, 2)
}
