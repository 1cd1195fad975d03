package vulkan

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// dmLayout is the strides of shape stored in the axis order perm (perm[0] outermost) and the
// values that takes: a strided view when perm is not the identity.
func dmLayout(shape []int64, perm []int) (stride []int64, size int64) {
	stride = make([]int64, len(shape))
	size = 1
	for k := len(perm) - 1; k >= 0; k-- {
		stride[perm[k]] = size
		size *= shape[perm[k]]
	}
	return stride, size
}

// dmIdentity is the axis order of a contiguous tensor of rank r.
func dmIdentity(r int) []int {
	p := make([]int, r)
	for i := range p {
		p[i] = i
	}
	return p
}

// dmReversed is the axis order that stores a tensor of rank r transposed.
func dmReversed(r int) []int {
	p := make([]int, r)
	for i := range p {
		p[i] = r - 1 - i
	}
	return p
}

// dmEach calls f with every index of shape, row-major.
func dmEach(shape []int64, f func(c []int64)) {
	c := make([]int64, len(shape))
	for _, d := range shape {
		if d == 0 {
			return
		}
	}
	for {
		f(c)
		i := len(c) - 1
		for ; i >= 0; i-- {
			if c[i]++; c[i] < shape[i] {
				break
			}
			c[i] = 0
		}
		if i < 0 {
			return
		}
	}
}

// dmAt is the value index of c in t.
func dmAt(t Tensor, c []int64) int64 {
	at := int64(t.Off)
	for i, v := range c {
		at += v * t.Stride[i]
	}
	return at
}

// dmSentinel fills a buffer with a value no op writes, so writes outside an output show.
const dmSentinel = float32(-12345.5)

// dmOperand is a host-visible buffer holding a tensor of shape stored in axis order perm at
// value offset off, guard values after it: random values (an input) or the sentinel (an
// output).
func dmOperand(t *testing.T, d *Device, rng *rand.Rand, shape []int64, perm []int, off int, random bool) Tensor {
	t.Helper()
	stride, size := dmLayout(shape, perm)
	v := make([]float32, off+int(size)+5)
	for i := range v {
		v[i] = dmSentinel
		if random {
			v[i] = float32(rng.NormFloat64() + 0.5)
		}
	}
	return Tensor{Buf: upload(t, d, v), Off: off, Shape: shape, Stride: stride}
}

// dmRun runs one dispatch at once.
func dmRun(t *testing.T, d *Device, ds Dispatch, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(ds); err != nil {
		t.Fatal(err)
	}
}

// dmUntouched checks that y's buffer holds the sentinel wherever y does not reach.
func dmUntouched(t *testing.T, what string, y Tensor) {
	t.Helper()
	in := map[int64]bool{}
	dmEach(y.Shape, func(c []int64) { in[dmAt(y, c)] = true })
	for i, v := range y.Buf.Float32s() {
		if !in[int64(i)] && v != dmSentinel {
			t.Fatalf("%s: value %d outside the output was written (%v)", what, i, v)
		}
	}
}

// Pad: every mode on the first, middle and last axis of a 3-D tensor, contiguous and as
// transposed views (input and output), with pads of one, of the most reflect allows (n−1 on
// both sides) and on one side only; a 5-axis contiguous I32 tensor with an integer fill.
// Data movement: the values must match exactly, and nothing outside the output is written.
func TestPadShader(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(21, 22))
	shape := []int64{4, 5, 6}
	for _, perm := range [][]int{dmIdentity(3), dmReversed(3)} {
		for ax := range 3 {
			n := shape[ax]
			for mode := range 3 {
				for _, p := range [][2]int64{{1, 2}, {n - 1, n - 1}, {0, 3}} {
					x := dmOperand(t, d, rng, shape, perm, 3, true)
					ys := append([]int64(nil), shape...)
					ys[ax] += p[0] + p[1]
					y := dmOperand(t, d, rng, ys, perm, 2, false)
					fill := float32(0.25)
					ds, err := PadOp(x, y, ax-3, p[0], p[1], mode, math.Float32bits(fill))
					dmRun(t, d, ds, err)
					xv, yv := x.Buf.Float32s(), y.Buf.Float32s()
					dmEach(ys, func(c []int64) {
						k := c[ax] - p[0]
						want := fill
						if k < 0 || k >= n {
							switch mode {
							case 1:
								if k < 0 {
									k = -k
								} else {
									k = 2*(n-1) - k
								}
							case 2:
								k = min(max(k, 0), n-1)
							}
						}
						if k >= 0 && k < n {
							xc := append([]int64(nil), c...)
							xc[ax] = k
							want = xv[dmAt(x, xc)]
						}
						if got := yv[dmAt(y, c)]; got != want {
							t.Fatalf("perm %v axis %d mode %d pad %v: y%v = %v, want %v", perm, ax, mode, p, c, got, want)
						}
					})
					dmUntouched(t, "pad", y)
				}
			}
		}
	}
	// 5 contiguous axes (viewed around the axis), I32 words with the fill −7.
	shape5 := []int64{2, 3, 2, 3, 2}
	x := dmOperand(t, d, rng, shape5, dmIdentity(5), 0, false)
	xv := x.Buf.Float32s()
	for i := range xv {
		xv[i] = math.Float32frombits(uint32(int32(i - 20)))
	}
	ys := []int64{2, 3, 2, 7, 2}
	y := dmOperand(t, d, rng, ys, dmIdentity(5), 1, false)
	fill7 := int32(-7)
	ds, err := PadOp(x, y, 3, 1, 3, 0, uint32(fill7))
	dmRun(t, d, ds, err)
	yv := y.Buf.Float32s()
	dmEach(ys, func(c []int64) {
		want := int32(-7)
		if k := c[3] - 1; k >= 0 && k < 3 {
			xc := append([]int64(nil), c...)
			xc[3] = k
			want = int32(math.Float32bits(xv[dmAt(x, xc)]))
		}
		if got := int32(math.Float32bits(yv[dmAt(y, c)])); got != want {
			t.Fatalf("5-axis I32 pad: y%v = %d, want %d", c, got, want)
		}
	})
	dmUntouched(t, "5-axis pad", y)
}

// InterpLinear up (17 → 40), down (17 → 7, → 1), to the same length, and from a single
// point, contiguous and as transposed views, against float64 blending of the CPU kernel's
// float source positions: within 1e-5·max(|x₀|, |x₁|) of the two samples blended.
func TestInterpLinearShader(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(23, 24))
	for _, c := range []struct{ ti, to int64 }{{17, 40}, {17, 7}, {17, 17}, {17, 1}, {1, 5}, {5, 1000}} {
		for _, perm := range [][]int{dmIdentity(3), dmReversed(3)} {
			x := dmOperand(t, d, rng, []int64{3, 4, c.ti}, perm, 1, true)
			y := dmOperand(t, d, rng, []int64{3, 4, c.to}, perm, 3, false)
			ds, err := InterpLinearOp(x, y)
			dmRun(t, d, ds, err)
			xv, yv := x.Buf.Float32s(), y.Buf.Float32s()
			scale := float32(c.ti) / float32(c.to)
			dmEach(y.Shape, func(yc []int64) {
				i := yc[2]
				r := float32(scale*(float32(i)+0.5)) - 0.5 // rounded step by step, as the CPU kernel
				r = max(r, 0)
				k := min(int64(r), c.ti-1)
				l := float64(min(max(r-float32(k), 0), 1))
				k1 := min(k+1, c.ti-1)
				a := float64(xv[dmAt(x, []int64{yc[0], yc[1], k})])
				b := float64(xv[dmAt(x, []int64{yc[0], yc[1], k1})])
				want := (1-l)*a + l*b
				got := float64(yv[dmAt(y, yc)])
				if math.Abs(got-want) > 1e-5*math.Max(math.Abs(a), math.Abs(b))+1e-30 {
					t.Fatalf("%d → %d perm %v: y%v = %v, want %v", c.ti, c.to, perm, yc, got, want)
				}
			})
			dmUntouched(t, "interp", y)
		}
	}
}

// dmIndices is a buffer of int32 indices at value offset off.
func dmIndices(t *testing.T, d *Device, idx []int32, off int) Tensor {
	t.Helper()
	v := make([]float32, off+len(idx))
	for i, x := range idx {
		v[off+i] = math.Float32frombits(uint32(x))
	}
	return Tensor{Buf: upload(t, d, v), Off: off, Shape: []int64{int64(len(idx))}, Stride: []int64{1}}
}

// ScatterRows into a table with leading axes [3, 10, 5] and without [10, 5], at an offset
// inside a larger buffer, indices in any order, run after run into the same table (each run's
// rows land, the earlier ones stay), and indices outside the table (−1, 10) skipped: exact,
// and nothing outside the written rows changes.
func TestScatterRowsShader(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(25, 26))
	for _, lead := range [][]int64{{3}, {}} {
		const N, D, M = 10, 5, 4
		tshape := append(append([]int64(nil), lead...), N, D)
		rshape := append(append([]int64(nil), lead...), M, D)
		table := dmOperand(t, d, rng, tshape, dmIdentity(len(tshape)), 4, true)
		want := append([]float32(nil), table.Buf.Float32s()...)
		L := numel(lead)
		for run, idx := range [][]int32{{7, 0, 9, 2}, {3, 8, 1, 6}, {2, -1, 10, 5}} {
			rows := dmOperand(t, d, rng, rshape, dmIdentity(len(rshape)), 2, true)
			ix := dmIndices(t, d, idx, 1+run)
			ds, err := ScatterRowsOp(rows, ix, table)
			dmRun(t, d, ds, err)
			rv := rows.Buf.Float32s()
			for l := range L {
				for i, at := range idx {
					if at < 0 || at >= N {
						continue
					}
					copy(want[int64(table.Off)+(l*N+int64(at))*D:][:D], rv[int64(rows.Off)+(l*M+int64(i))*D:][:D])
				}
			}
			for i, v := range table.Buf.Float32s() {
				if v != want[i] {
					t.Fatalf("lead %v run %d (indices %v): table value %d = %v, want %v", lead, run, idx, i, v, want[i])
				}
			}
		}
	}
}

// dmLineRef is the float64 reference of a reduction of line vals: the result and the scale
// its error is measured against (sum: Σ|x|; mean: Σ|x|/n; var: itself; max: 0, exact).
func dmLineRef(kind int, vals []float64) (ref, scale float64) {
	n := float64(len(vals))
	var s, a float64
	m := math.Inf(-1)
	for _, v := range vals {
		s += v
		a += math.Abs(v)
		if v > m || math.IsNaN(v) {
			m = v
		}
		if math.IsNaN(m) {
			break
		}
	}
	switch kind {
	case 0:
		return s, a
	case 1:
		return s / n, a / n
	case 2:
		return m, 0
	}
	var q float64
	for _, v := range vals {
		q += (v - s/n) * (v - s/n)
	}
	return q / n, q / n
}

// dmCheckReduce runs every kind of reduction of x over axis into y (keepdim, or the axis
// dropped) and compares with float64 within 1e-5 of each result's scale (dmLineRef).
func dmCheckReduce(t *testing.T, d *Device, rng *rand.Rand, x Tensor, keep bool, what string) {
	t.Helper()
	xv := x.Buf.Float32s()
	for ax := range x.Shape {
		ys := append([]int64(nil), x.Shape...)
		ys[ax] = 1
		if !keep {
			ys = append(ys[:ax:ax], x.Shape[ax+1:]...)
		}
		for kind := range 4 {
			y := dmOperand(t, d, rng, ys, dmIdentity(len(ys)), 1, false)
			ds, err := ReduceOp(kind, x, y, ax)
			dmRun(t, d, ds, err)
			yv := y.Buf.Float32s()
			dmEach(ys, func(c []int64) {
				xc := append([]int64(nil), c...)
				if !keep {
					xc = append(append(append([]int64(nil), c[:ax]...), 0), c[ax:]...)
				}
				vals := make([]float64, x.Shape[ax])
				for k := range vals {
					xc[ax] = int64(k)
					vals[k] = float64(xv[dmAt(x, xc)])
				}
				ref, scale := dmLineRef(kind, vals)
				got := float64(yv[dmAt(y, c)])
				if math.IsNaN(ref) != math.IsNaN(got) || math.Abs(got-ref) > 1e-5*scale {
					t.Fatalf("%s: kind %d over axis %d: y%v = %v, want %v (scale %v)", what, kind, ax, c, got, ref, scale)
				}
			})
			dmUntouched(t, what, y)
		}
	}
}

// Reduce: sum, mean, max and (population) var on every axis of a 3-D tensor with a long axis
// of 5000 (one workgroup per line) and short ones (one invocation per line), kept or dropped
// in the output; of a transposed view; of 5 contiguous axes; max propagating a NaN; an empty
// axis (sum 0, mean NaN). Within 1e-5 of Σ|x| (sum), Σ|x|/n (mean), the variance itself;
// max exact.
func TestReduceShader(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(27, 28))
	dmCheckReduce(t, d, rng, dmOperand(t, d, rng, []int64{3, 5000, 5}, dmIdentity(3), 2, true), true, "[3, 5000, 5]")
	dmCheckReduce(t, d, rng, dmOperand(t, d, rng, []int64{4, 300, 6}, []int{1, 2, 0}, 1, true), false, "strided [4, 300, 6]")
	dmCheckReduce(t, d, rng, dmOperand(t, d, rng, []int64{2, 3, 2, 5, 70}, dmIdentity(5), 0, true), true, "[2, 3, 2, 5, 70]")

	x := dmOperand(t, d, rng, []int64{3, 100}, dmIdentity(2), 0, true)
	x.Buf.Float32s()[150] = float32(math.NaN())
	y := dmOperand(t, d, rng, []int64{3}, dmIdentity(1), 0, false)
	ds, err := ReduceOp(2, x, y, 1)
	dmRun(t, d, ds, err)
	if yv := y.Buf.Float32s(); math.IsNaN(float64(yv[0])) || !math.IsNaN(float64(yv[1])) || math.IsNaN(float64(yv[2])) {
		t.Errorf("max with a NaN in row 1: %v", yv[:3])
	}

	empty := dmOperand(t, d, rng, []int64{2, 0}, dmIdentity(2), 0, true)
	for kind, want := range []float64{0, math.NaN()} {
		y := dmOperand(t, d, rng, []int64{2, 1}, dmIdentity(2), 0, false)
		ds, err := ReduceOp(kind, empty, y, 1)
		dmRun(t, d, ds, err)
		if got := float64(y.Buf.Float32s()[0]); math.IsNaN(got) != math.IsNaN(want) || !math.IsNaN(want) && got != want {
			t.Errorf("kind %d over an empty axis: %v, want %v", kind, got, want)
		}
	}
	if _, err := ReduceOp(2, empty, dmOperand(t, d, rng, []int64{2, 1}, dmIdentity(2), 0, false), 1); err == nil {
		t.Error("max over an empty axis: no error")
	}
}

// dmCheckCumsum runs a cumsum of x over axis into y and compares with float64 within 1e-5
// of the running Σ|x| (fp32 sums).
func dmCheckCumsum(t *testing.T, d *Device, x, y Tensor, ax int, what string) {
	t.Helper()
	xv := append([]float32(nil), x.Buf.Float32s()...) // y may be x
	ds, err := CumsumOp(x, y, ax)
	dmRun(t, d, ds, err)
	if ax < 0 {
		ax += len(x.Shape)
	}
	yv := y.Buf.Float32s()
	dmEach(y.Shape, func(c []int64) {
		if c[ax] != 0 {
			return
		}
		xc := append([]int64(nil), c...)
		var s, a float64
		for k := range x.Shape[ax] {
			xc[ax] = k
			v := float64(xv[dmAt(x, xc)])
			s += v
			a += math.Abs(v)
			if got := float64(yv[dmAt(y, xc)]); math.Abs(got-s) > 1e-5*a {
				t.Fatalf("%s: axis %d: y%v = %v, want %v", what, ax, xc, got, s)
			}
		}
	})
}

// Cumsum on every axis of a 3-D tensor (a middle axis of 300: a workgroup scan of two chunks;
// short ones: a running sum per line), of a transposed view, a last axis of 1000 (four
// chunks), in place, and over 5 contiguous axes; within 1e-5 of the running Σ|x|.
func TestCumsumShader(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(29, 30))
	shape := []int64{4, 300, 3}
	for _, perm := range [][]int{dmIdentity(3), {2, 0, 1}} {
		x := dmOperand(t, d, rng, shape, perm, 1, true)
		for ax := range 3 {
			y := dmOperand(t, d, rng, shape, perm, 2, false)
			dmCheckCumsum(t, d, x, y, ax, "[4, 300, 3]")
			dmUntouched(t, "cumsum", y)
		}
	}
	x := dmOperand(t, d, rng, []int64{2, 1000}, dmIdentity(2), 0, true)
	dmCheckCumsum(t, d, x, x, -1, "in place [2, 1000]")
	x5 := dmOperand(t, d, rng, []int64{2, 3, 2, 90, 2}, dmIdentity(5), 0, true)
	y5 := dmOperand(t, d, rng, x5.Shape, dmIdentity(5), 0, false)
	dmCheckCumsum(t, d, x5, y5, 3, "[2, 3, 2, 90, 2]")
}

// What the shaders cannot do is an error naming the op: reflect pads past the edge, shapes
// that do not match, strided views of 5 axes, outputs that broadcast, scatter from strided
// rows, unknown reductions.
func TestPadInterpScatterReduceCumsumRefuse(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(31, 32))
	x := dmOperand(t, d, rng, []int64{4, 5}, dmIdentity(2), 0, true)
	y := func(shape ...int64) Tensor { return dmOperand(t, d, rng, shape, dmIdentity(len(shape)), 0, false) }
	x5 := dmOperand(t, d, rng, []int64{2, 2, 2, 2, 2}, dmReversed(5), 0, true)
	bcast := y(4, 1)
	bcast.Shape, bcast.Stride = []int64{4, 7}, []int64{1, 0}
	strided := dmOperand(t, d, rng, []int64{4, 5}, dmReversed(2), 0, true)
	for _, c := range []struct {
		name string
		err  error
	}{
		{"pad", func() error { _, err := PadOp(x, y(4, 11), 1, 5, 1, 1, 0); return err }()},
		{"pad", func() error { _, err := PadOp(x, y(4, 9), 1, 2, 1, 0, 0); return err }()},
		{"pad", func() error { _, err := PadOp(x, y(4, 6), 1, 1, 0, 3, 0); return err }()},
		{"pad", func() error { _, err := PadOp(x, y(4, 5), 2, 0, 0, 0, 0); return err }()},
		{"pad", func() error { _, err := PadOp(x5, y(2, 2, 2, 2, 3), 4, 1, 0, 0, 0); return err }()},
		{"interplinear", func() error { _, err := InterpLinearOp(x, y(3, 8)); return err }()},
		{"interplinear", func() error { _, err := InterpLinearOp(x, bcast); return err }()},
		{"scatterrows", func() error {
			_, err := ScatterRowsOp(strided, dmIndices(t, d, []int32{0, 1, 2, 3}, 0), y(9, 5))
			return err
		}()},
		{"scatterrows", func() error { _, err := ScatterRowsOp(x, dmIndices(t, d, []int32{0, 1}, 0), y(9, 5)); return err }()},
		{"scatterrows", func() error { _, err := ScatterRowsOp(x, dmIndices(t, d, []int32{0, 1, 2, 3}, 0), y(9, 4)); return err }()},
		{"reduce", func() error { _, err := ReduceOp(4, x, y(4, 1), 1); return err }()},
		{"reduce", func() error { _, err := ReduceOp(0, x, y(4, 2), 1); return err }()},
		{"reduce", func() error { _, err := ReduceOp(0, x5, y(2, 2, 2, 2, 1), 4); return err }()},
		{"cumsum", func() error { _, err := CumsumOp(x, y(4, 6), 1); return err }()},
		{"cumsum", func() error { _, err := CumsumOp(x, y(4, 5), 2); return err }()},
	} {
		if c.err == nil || !strings.HasPrefix(c.err.Error(), "vulkan: "+c.name+": ") {
			t.Errorf("want an error starting %q, got %v", "vulkan: "+c.name+": ", c.err)
		}
	}
}
