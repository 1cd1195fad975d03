package vulkan

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// convLayout stores a logical row-major tensor in a buffer: axes in order (outermost
// first; nil: as given), each axis grown by grow values with the view starting one in, and
// axis 0 stored once with stride 0 when bcast0. The values outside the view are NaN, so a
// read outside it shows in the result, and a write outside it in the buffer.
type convLayout struct {
	order  []int
	grow   int64
	bcast0 bool
}

func (l convLayout) place(t *testing.T, d *Device, vals []float32, shape []int64) Tensor {
	t.Helper()
	r := len(shape)
	order := l.order
	if order == nil {
		order = make([]int, r)
		for i := range order {
			order[i] = i
		}
	}
	dims := make([]int64, r)
	for i, n := range shape {
		dims[i] = n + l.grow
	}
	if l.bcast0 {
		dims[0] = 1
	}
	stride := make([]int64, r)
	size := int64(1)
	for j := r - 1; j >= 0; j-- {
		stride[order[j]] = size
		size *= dims[order[j]]
	}
	off := int64(0)
	for i := range stride {
		if l.grow > 0 && !(l.bcast0 && i == 0) {
			off += stride[i]
		}
	}
	if l.bcast0 {
		stride[0] = 0
	}
	buf := make([]float32, size)
	for i := range buf {
		buf[i] = float32(math.NaN())
	}
	view := Tensor{Buf: upload(t, d, buf), Off: int(off), Shape: shape, Stride: stride}
	f := view.Buf.Float32s()
	convEach(shape, func(flat int, idx []int64) {
		f[convAt(view, idx)] = vals[flat]
	})
	return view
}

// convEach calls fn for every index of shape in row-major order.
func convEach(shape []int64, fn func(flat int, idx []int64)) {
	n := numel(shape)
	idx := make([]int64, len(shape))
	for flat := range int(n) {
		r := int64(flat)
		for i := len(shape) - 1; i >= 0; i-- {
			idx[i] = r % shape[i]
			r /= shape[i]
		}
		fn(flat, idx)
	}
}

func convAt(t Tensor, idx []int64) int64 {
	p := int64(t.Off)
	for i, v := range idx {
		p += v * t.Stride[i]
	}
	return p
}

// convCheck compares y (a view placed by convLayout.place) with want within 1e-5 of each
// output's Σ|terms| (mag, bias included) plus 1e-6, and checks that nothing outside the
// view was written.
func convCheck(t *testing.T, name string, y Tensor, want, mag []float64) {
	t.Helper()
	f := y.Buf.Float32s()
	written := 0
	for _, v := range f {
		if !math.IsNaN(float64(v)) {
			written++
		}
	}
	if written != len(want) {
		t.Fatalf("%s: %d values written in y's buffer, want %d", name, written, len(want))
	}
	convEach(y.Shape, func(flat int, idx []int64) {
		got := float64(f[convAt(y, idx)])
		if math.IsNaN(got) || math.Abs(got-want[flat]) > 1e-5*mag[flat]+1e-6 {
			t.Fatalf("%s: y%v = %v, want %v (Σ|terms| %v)", name, idx, got, want[flat], mag[flat])
		}
	})
}

// convInputs are random x (the same for every batch when bcast), w and bias (nil unless
// withBias).
func convInputs(rng *rand.Rand, nx, batch, nw, nb int, bcast, withBias bool) (x, w, bias []float32) {
	x = randoms(rng, nx, 1)
	if bcast {
		per := nx / batch
		for b := 1; b < batch; b++ {
			copy(x[b*per:(b+1)*per], x[:per])
		}
	}
	w = randoms(rng, nw, 0.3)
	if withBias {
		bias = randoms(rng, nb, 1)
	}
	return x, w, bias
}

// convBiasView places bias (nil: none) as a [1, n, 1] view with stride 2 along n.
func convBiasView(t *testing.T, d *Device, bias []float32) *Tensor {
	if bias == nil {
		return nil
	}
	n := int64(len(bias))
	v := convLayout{grow: 1}.place(t, d, bias, []int64{1, n, 1})
	return &v
}

type conv1dCase struct {
	B, Cin, Cout, T, K              int
	stride, padL, padR, dil, groups int
	bias                            bool
	x, w, y                         convLayout
}

func conv1dRef(c conv1dCase, x, w, bias []float32) (y, mag []float64, tout int) {
	tout = (c.T+c.padL+c.padR-c.dil*(c.K-1)-1)/c.stride + 1
	cig, cog := c.Cin/c.groups, c.Cout/c.groups
	y, mag = make([]float64, c.B*c.Cout*tout), make([]float64, c.B*c.Cout*tout)
	for b := range c.B {
		for co := range c.Cout {
			g := co / cog
			for to := range tout {
				var s, m float64
				if bias != nil {
					s, m = float64(bias[co]), math.Abs(float64(bias[co]))
				}
				for ci := range cig {
					for k := range c.K {
						ti := to*c.stride + k*c.dil - c.padL
						if ti < 0 || ti >= c.T {
							continue
						}
						v := float64(w[(co*cig+ci)*c.K+k]) * float64(x[(b*c.Cin+g*cig+ci)*c.T+ti])
						s += v
						m += math.Abs(v)
					}
				}
				y[(b*c.Cout+co)*tout+to], mag[(b*c.Cout+co)*tout+to] = s, m
			}
		}
	}
	return y, mag, tout
}

// Conv1D against float64 on odd shapes: kernels 1, 3, 5, 7; strides 1–3; dilation 1, 2;
// groups 1, 3 and depthwise; asymmetric and causal padding; x as a transposed view, a
// slice, a broadcast batch; w transposed and sliced; a strided bias and y.
func TestConv1D(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(21, 22))
	tr := convLayout{order: []int{0, 2, 1}}  // [B, T, C] in memory
	wtr := convLayout{order: []int{0, 2, 1}} // [Cout, K, Cin/g] in memory
	sl := convLayout{grow: 2}                // a slice of a larger tensor
	bc := convLayout{bcast0: true}           // one x for every batch
	for _, c := range []conv1dCase{
		{B: 2, Cin: 6, Cout: 9, T: 37, K: 3, stride: 1, padL: 1, padR: 1, dil: 1, groups: 1, bias: true},
		{B: 2, Cin: 6, Cout: 9, T: 37, K: 5, stride: 2, padL: 2, padR: 3, dil: 2, groups: 3, bias: true, x: tr},
		{B: 2, Cin: 6, Cout: 9, T: 37, K: 7, stride: 3, dil: 1, groups: 3, x: sl, w: wtr},
		{B: 2, Cin: 6, Cout: 9, T: 37, K: 3, stride: 1, padL: 2, dil: 1, groups: 1, bias: true, x: bc, y: sl},
		{B: 2, Cin: 6, Cout: 9, T: 37, K: 5, stride: 1, padL: 8, dil: 2, groups: 3, bias: true, x: tr, w: sl},
		{B: 2, Cin: 6, Cout: 12, T: 37, K: 7, stride: 2, padL: 3, padR: 3, dil: 1, groups: 6, bias: true, x: sl},
		{B: 1, Cin: 6, Cout: 6, T: 41, K: 5, stride: 1, padL: 4, dil: 1, groups: 6, x: tr},
		{B: 2, Cin: 5, Cout: 9, T: 37, K: 1, stride: 1, dil: 1, groups: 1, bias: true, x: tr, y: convLayout{order: []int{0, 2, 1}}},
		{B: 3, Cin: 7, Cout: 3, T: 9, K: 7, stride: 2, padL: 3, padR: 4, dil: 2, groups: 1, bias: true},
		{B: 1, Cin: 64, Cout: 33, T: 300, K: 3, stride: 1, padL: 1, padR: 1, dil: 3, groups: 1, bias: true},
	} {
		x, w, bias := convInputs(rng, c.B*c.Cin*c.T, c.B, c.Cout*(c.Cin/c.groups)*c.K, c.Cout, c.x.bcast0, c.bias)
		want, mag, tout := conv1dRef(c, x, w, bias)
		xv := c.x.place(t, d, x, []int64{int64(c.B), int64(c.Cin), int64(c.T)})
		wv := c.w.place(t, d, w, []int64{int64(c.Cout), int64(c.Cin / c.groups), int64(c.K)})
		yv := c.y.place(t, d, make([]float32, c.B*c.Cout*tout), []int64{int64(c.B), int64(c.Cout), int64(tout)})
		ds, err := Conv1DOp(xv, wv, convBiasView(t, d, bias), yv, c.stride, c.padL, c.padR, c.dil, c.groups)
		if err == nil {
			err = d.Run(ds)
		}
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		convCheck(t, "conv1d", yv, want, mag)
	}
}

// A conv1d of more than 65 535·256 outputs runs over a two-axis grid of workgroups.
func TestConv1DLargeGrid(t *testing.T) {
	d := device(t)
	const T = 65535*256 + 777
	x := make([]float32, T)
	for i := range x {
		x[i] = float32(i%1000) * 0.001
	}
	xv, yv := Contiguous(upload(t, d, x), 1, 1, T), Contiguous(upload(t, d, make([]float32, T-1)), 1, 1, T-1)
	wv := Contiguous(upload(t, d, []float32{2, -1}), 1, 1, 2)
	ds, err := Conv1DOp(xv, wv, nil, yv, 1, 0, 0, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ds.groups[1] < 2 {
		t.Fatalf("groups %v: want a second axis", ds.groups)
	}
	if err := d.Run(ds); err != nil {
		t.Fatal(err)
	}
	for i, got := range yv.Buf.Float32s() {
		want := 2*float64(x[i]) - float64(x[i+1])
		if math.Abs(float64(got)-want) > 1e-6 {
			t.Fatalf("y[%d] = %v, want %v", i, got, want)
		}
	}
}

type convt1dCase struct {
	B, Cin, Cout, T, K               int
	stride, pad, outPad, dil, groups int
	bias                             bool
	x, w, y                          convLayout
}

func convt1dRef(c convt1dCase, x, w, bias []float32) (y, mag []float64, tout int) {
	tout = (c.T-1)*c.stride - 2*c.pad + c.dil*(c.K-1) + c.outPad + 1
	cig, cog := c.Cin/c.groups, c.Cout/c.groups
	y, mag = make([]float64, c.B*c.Cout*tout), make([]float64, c.B*c.Cout*tout)
	for b := range c.B {
		for co := range c.Cout {
			for to := range tout {
				if bias != nil {
					y[(b*c.Cout+co)*tout+to] = float64(bias[co])
					mag[(b*c.Cout+co)*tout+to] = math.Abs(float64(bias[co]))
				}
			}
		}
		// Scatter, as PyTorch defines it (the shader gathers).
		for ci := range c.Cin {
			g := ci / cig
			for j := range c.T {
				xv := float64(x[(b*c.Cin+ci)*c.T+j])
				for oc := range cog {
					for k := range c.K {
						to := j*c.stride + k*c.dil - c.pad
						if to < 0 || to >= tout {
							continue
						}
						v := xv * float64(w[(ci*cog+oc)*c.K+k])
						i := (b*c.Cout+g*cog+oc)*tout + to
						y[i] += v
						mag[i] += math.Abs(v)
					}
				}
			}
		}
	}
	return y, mag, tout
}

// ConvTranspose1D against a float64 scatter: strides 1–5, kernels shorter and longer than the
// stride, padding, output padding, dilation 1–3, groups 1, 3; x transposed, sliced and
// broadcast; w transposed; a strided bias and y.
func TestConvTranspose1D(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(23, 24))
	tr := convLayout{order: []int{0, 2, 1}}
	sl := convLayout{grow: 2}
	for _, c := range []convt1dCase{
		{B: 2, Cin: 6, Cout: 9, T: 13, K: 4, stride: 2, pad: 1, dil: 1, groups: 1, bias: true},
		{B: 2, Cin: 6, Cout: 9, T: 13, K: 6, stride: 3, pad: 1, outPad: 2, dil: 1, groups: 3, bias: true, x: tr},
		{B: 2, Cin: 6, Cout: 9, T: 11, K: 8, stride: 4, pad: 2, outPad: 1, dil: 1, groups: 1, x: sl, w: tr},
		{B: 2, Cin: 6, Cout: 6, T: 17, K: 10, stride: 5, pad: 3, outPad: 4, dil: 1, groups: 3, bias: true, x: convLayout{bcast0: true}, y: sl},
		{B: 2, Cin: 6, Cout: 9, T: 13, K: 3, stride: 2, pad: 0, outPad: 1, dil: 2, groups: 3, bias: true, w: sl},
		{B: 2, Cin: 6, Cout: 9, T: 13, K: 5, stride: 4, pad: 2, dil: 3, groups: 1, bias: true, x: tr},
		{B: 2, Cin: 6, Cout: 9, T: 13, K: 2, stride: 5, pad: 0, outPad: 3, dil: 1, groups: 1, bias: true},
		{B: 1, Cin: 6, Cout: 9, T: 37, K: 3, stride: 1, pad: 1, dil: 1, groups: 3, bias: true, y: tr},
		{B: 1, Cin: 48, Cout: 24, T: 50, K: 16, stride: 8, pad: 4, dil: 1, groups: 1, bias: true},
	} {
		x, w, bias := convInputs(rng, c.B*c.Cin*c.T, c.B, c.Cin*(c.Cout/c.groups)*c.K, c.Cout, c.x.bcast0, c.bias)
		want, mag, tout := convt1dRef(c, x, w, bias)
		xv := c.x.place(t, d, x, []int64{int64(c.B), int64(c.Cin), int64(c.T)})
		wv := c.w.place(t, d, w, []int64{int64(c.Cin), int64(c.Cout / c.groups), int64(c.K)})
		yv := c.y.place(t, d, make([]float32, c.B*c.Cout*tout), []int64{int64(c.B), int64(c.Cout), int64(tout)})
		ds, err := ConvTranspose1DOp(xv, wv, convBiasView(t, d, bias), yv, c.stride, c.pad, c.outPad, c.dil, c.groups)
		if err == nil {
			err = d.Run(ds)
		}
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		convCheck(t, "conv_transpose1d", yv, want, mag)
	}
}

type conv2dCase struct {
	B, Cin, Cout, H, W, KH, KW     int
	sh, sw, ph, pw, dh, dw, groups int
	bias                           bool
	x, y                           convLayout
}

func conv2dRef(c conv2dCase, x, w, bias []float32) (y, mag []float64, oh, ow int) {
	oh = (c.H+2*c.ph-c.dh*(c.KH-1)-1)/c.sh + 1
	ow = (c.W+2*c.pw-c.dw*(c.KW-1)-1)/c.sw + 1
	cig, cog := c.Cin/c.groups, c.Cout/c.groups
	y, mag = make([]float64, c.B*c.Cout*oh*ow), make([]float64, c.B*c.Cout*oh*ow)
	for b := range c.B {
		for co := range c.Cout {
			g := co / cog
			for i := range oh {
				for j := range ow {
					var s, m float64
					if bias != nil {
						s, m = float64(bias[co]), math.Abs(float64(bias[co]))
					}
					for ci := range cig {
						for kh := range c.KH {
							for kw := range c.KW {
								ih, iw := i*c.sh+kh*c.dh-c.ph, j*c.sw+kw*c.dw-c.pw
								if ih < 0 || ih >= c.H || iw < 0 || iw >= c.W {
									continue
								}
								v := float64(w[((co*cig+ci)*c.KH+kh)*c.KW+kw]) * float64(x[((b*c.Cin+g*cig+ci)*c.H+ih)*c.W+iw])
								s += v
								m += math.Abs(v)
							}
						}
					}
					k := ((b*c.Cout+co)*oh+i)*ow + j
					y[k], mag[k] = s, m
				}
			}
		}
	}
	return y, mag, oh, ow
}

// Conv2D against float64 on small odd planes: kernels 1×1 to 5×5 (not square), strides,
// symmetric padding, dilation, groups 1, 3 and depthwise; x channel-last, W-major, sliced and
// broadcast; a strided bias and y.
func TestConv2D(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(25, 26))
	chLast := convLayout{order: []int{0, 2, 3, 1}}
	wMajor := convLayout{order: []int{0, 1, 3, 2}}
	sl := convLayout{grow: 2}
	for _, c := range []conv2dCase{
		{B: 2, Cin: 6, Cout: 9, H: 11, W: 13, KH: 3, KW: 3, sh: 1, sw: 1, ph: 1, pw: 1, dh: 1, dw: 1, groups: 1, bias: true},
		{B: 2, Cin: 6, Cout: 9, H: 11, W: 13, KH: 3, KW: 5, sh: 2, sw: 1, ph: 1, pw: 2, dh: 1, dw: 2, groups: 3, bias: true, x: chLast},
		{B: 2, Cin: 6, Cout: 9, H: 11, W: 13, KH: 4, KW: 3, sh: 3, sw: 2, dh: 1, dw: 1, groups: 1, x: sl, y: sl},
		{B: 2, Cin: 6, Cout: 12, H: 7, W: 9, KH: 3, KW: 3, sh: 2, sw: 2, ph: 1, pw: 1, dh: 2, dw: 1, groups: 6, bias: true, x: wMajor},
		{B: 2, Cin: 5, Cout: 9, H: 7, W: 6, KH: 1, KW: 1, sh: 1, sw: 1, dh: 1, dw: 1, groups: 1, bias: true, x: convLayout{bcast0: true}, y: chLast},
		{B: 1, Cin: 3, Cout: 9, H: 5, W: 4, KH: 5, KW: 4, sh: 1, sw: 3, ph: 2, pw: 0, dh: 1, dw: 1, groups: 3, bias: true},
	} {
		x, w, bias := convInputs(rng, c.B*c.Cin*c.H*c.W, c.B, c.Cout*(c.Cin/c.groups)*c.KH*c.KW, c.Cout, c.x.bcast0, c.bias)
		want, mag, oh, ow := conv2dRef(c, x, w, bias)
		xv := c.x.place(t, d, x, []int64{int64(c.B), int64(c.Cin), int64(c.H), int64(c.W)})
		wv := Contiguous(upload(t, d, w), int64(c.Cout), int64(c.Cin/c.groups), int64(c.KH), int64(c.KW))
		yv := c.y.place(t, d, make([]float32, len(want)), []int64{int64(c.B), int64(c.Cout), int64(oh), int64(ow)})
		ds, err := Conv2DOp(xv, wv, convBiasView(t, d, bias), yv, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw, c.groups)
		if err == nil {
			err = d.Run(ds)
		}
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		convCheck(t, "conv2d", yv, want, mag)
	}
}

// Inconsistent shapes and parameters are errors naming the op and what is wrong.
func TestConvErrors(t *testing.T) {
	d := device(t)
	buf := upload(t, d, make([]float32, 4096))
	c := func(shape ...int64) Tensor { return Contiguous(buf, shape...) }
	bias := c(5)
	for _, e := range []struct {
		want string
		err  func() error
	}{
		{"vulkan: conv1d: stride 0", func() error { _, err := Conv1DOp(c(1, 4, 10), c(4, 4, 3), nil, c(1, 4, 8), 0, 0, 0, 1, 1); return err }},
		{"vulkan: conv1d: 3 groups do not divide", func() error { _, err := Conv1DOp(c(1, 4, 10), c(6, 1, 3), nil, c(1, 6, 8), 1, 0, 0, 1, 3); return err }},
		{"vulkan: conv1d: w [4 2 3]", func() error { _, err := Conv1DOp(c(1, 4, 10), c(4, 2, 3), nil, c(1, 4, 8), 1, 0, 0, 1, 1); return err }},
		{"vulkan: conv1d: input of 2 steps", func() error { _, err := Conv1DOp(c(1, 4, 2), c(4, 4, 3), nil, c(1, 4, 1), 1, 0, 0, 1, 1); return err }},
		{"vulkan: conv1d: y of shape [1 4 9]", func() error { _, err := Conv1DOp(c(1, 4, 10), c(4, 4, 3), nil, c(1, 4, 9), 1, 0, 0, 1, 1); return err }},
		{"vulkan: conv1d: bias of shape [5]", func() error {
			_, err := Conv1DOp(c(1, 4, 10), c(4, 4, 3), &bias, c(1, 4, 8), 1, 0, 0, 1, 1)
			return err
		}},
		{"vulkan: conv1d: x [2 8 100] at offset 0 reaches past", func() error {
			_, err := Conv1DOp(Contiguous(upload(t, d, make([]float32, 10)), 2, 8, 100), c(4, 8, 3), nil, c(2, 4, 98), 1, 0, 0, 1, 1)
			return err
		}},
		{"vulkan: conv1d: y [1 4 8] has a broadcast axis", func() error {
			y := c(1, 4, 8)
			y.Stride[1] = 0
			_, err := Conv1DOp(c(1, 4, 10), c(4, 4, 3), nil, y, 1, 0, 0, 1, 1)
			return err
		}},
		{"vulkan: conv_transpose1d: w [3 2 4], want [4", func() error {
			_, err := ConvTranspose1DOp(c(1, 4, 10), c(3, 2, 4), nil, c(1, 2, 22), 2, 0, 0, 1, 1)
			return err
		}},
		{"vulkan: conv_transpose1d: y of shape [1 2 21]", func() error {
			_, err := ConvTranspose1DOp(c(1, 4, 10), c(4, 2, 4), nil, c(1, 2, 21), 2, 0, 0, 1, 1)
			return err
		}},
		{"vulkan: conv_transpose1d: padding 20 leaves no output", func() error {
			_, err := ConvTranspose1DOp(c(1, 4, 10), c(4, 2, 4), nil, c(1, 2, 1), 2, 20, 0, 1, 1)
			return err
		}},
		{"vulkan: conv2d: w [4 4 3 3] (strides [36 9 1 3]) must be contiguous", func() error {
			w := c(4, 4, 3, 3)
			w.Stride[2], w.Stride[3] = 1, 3
			_, err := Conv2DOp(c(1, 4, 5, 5), w, nil, c(1, 4, 3, 3), 1, 1, 0, 0, 1, 1, 1)
			return err
		}},
		{"vulkan: conv2d: input 5×5 (padded by 0, 0) is smaller", func() error {
			_, err := Conv2DOp(c(1, 4, 5, 5), c(4, 4, 6, 3), nil, c(1, 4, 1, 3), 1, 1, 0, 0, 1, 1, 1)
			return err
		}},
		{"vulkan: conv2d: y of shape [1 4 3 3] (strides [36 9 3 1]), want [1 4 2 3]", func() error {
			_, err := Conv2DOp(c(1, 4, 5, 5), c(4, 4, 3, 3), nil, c(1, 4, 3, 3), 2, 1, 0, 0, 1, 1, 1)
			return err
		}},
	} {
		if err := e.err(); err == nil || !strings.Contains(err.Error(), e.want) {
			t.Errorf("got %v, want an error containing %q", err, e.want)
		}
	}
}
