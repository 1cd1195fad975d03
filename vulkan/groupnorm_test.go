package vulkan

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// gnRef is float64 GroupNorm of row-major x [B, C, S] (population variance); w, b optional.
func gnRef(x []float32, B, C, S, G int, w, b []float32, eps float32) []float64 {
	y := make([]float64, len(x))
	n := C / G * S
	for r := range B * G {
		v := x[r*n : (r+1)*n]
		var m, q float64
		for _, e := range v {
			m += float64(e)
		}
		m /= float64(n)
		for _, e := range v {
			q += (float64(e) - m) * (float64(e) - m)
		}
		rstd := 1 / math.Sqrt(q/float64(n)+float64(eps))
		for i, e := range v {
			c := r%G*(C/G) + i/S
			o := (float64(e) - m) * rstd
			if w != nil {
				o *= float64(w[c])
			}
			if b != nil {
				o += float64(b[c])
			}
			y[r*n+i] = o
		}
	}
	return y
}

// GroupNorm against float64 on odd shapes: one group, several, instance norm (groups = C), 4-
// and 5-axis inputs, without affine, weight only, weight and bias, operands at offsets (the
// value after y stays untouched), and one group of 280 000 values (the loops). Inputs carry an
// offset of 3 (the mean's refinement). Bound: 1e-5·(1 + |ref|).
func TestGroupNorm(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(21, 22))
	for _, s := range []struct {
		shape  []int64
		groups int
	}{
		{[]int64{2, 6, 37}, 1}, {[]int64{2, 6, 37}, 3}, {[]int64{2, 6, 37}, 6}, {[]int64{2, 9, 1001}, 3},
		{[]int64{2, 9, 1001}, 9}, {[]int64{2, 6, 5, 7}, 3}, {[]int64{2, 6, 3, 4, 5}, 2}, {[]int64{3, 4}, 2},
		{[]int64{1, 4, 70000}, 1},
	} {
		B, C := int(s.shape[0]), int(s.shape[1])
		n := int(numel(s.shape))
		S := n / (B * C)
		x := randoms(rng, n, 2)
		for i := range x {
			x[i] += 3
		}
		w, b := randoms(rng, C, 1), randoms(rng, C, 1)
		const xo, yo, po = 3, 5, 2
		xb := upload(t, d, append(make([]float32, xo), x...))
		wb := upload(t, d, append(make([]float32, po), w...))
		bb := upload(t, d, append(make([]float32, po), b...))
		xt := Contiguous(xb, s.shape...)
		xt.Off = xo
		wt, bt := Contiguous(wb, int64(C)), Contiguous(bb, int64(C))
		wt.Off, bt.Off = po, po
		for affine := range 3 {
			if n > 100000 && affine < 2 {
				continue // the large group once
			}
			var wp, bp *Tensor
			var wr, br []float32
			if affine > 0 {
				wp, wr = &wt, w
			}
			if affine > 1 {
				bp, br = &bt, b
			}
			out := upload(t, d, make([]float32, yo+n+1))
			out.Float32s()[yo+n] = 42
			yt := Contiguous(out, s.shape...)
			yt.Off = yo
			ds, err := GroupNormOp(xt, wp, bp, yt, s.groups, 1e-5)
			if err == nil {
				err = d.Run(ds)
			}
			if err != nil {
				t.Fatalf("%v groups %d: %v", s.shape, s.groups, err)
			}
			got := out.Float32s()[yo:]
			for i, want := range gnRef(x, B, C, S, s.groups, wr, br, 1e-5) {
				if math.Abs(float64(got[i])-want) > 1e-5*(1+math.Abs(want)) {
					t.Fatalf("%v groups %d affine %d: y[%d] = %v, want %v", s.shape, s.groups, affine, i, got[i], want)
				}
			}
			if got[n] != 42 {
				t.Errorf("%v groups %d: wrote past y", s.shape, s.groups)
			}
		}
	}
}

// GroupNormOp refuses what it cannot run, by name.
func TestGroupNormErrors(t *testing.T) {
	d := device(t)
	b := upload(t, d, make([]float32, 200))
	x := Contiguous(b, 2, 6, 10)
	w6 := Contiguous(b, 6)
	w5 := Contiguous(b, 5)
	strided := Tensor{Buf: b, Shape: []int64{2, 6, 10}, Stride: []int64{60, 1, 6}}
	past := Contiguous(b, 6)
	past.Off = 197
	for _, c := range []struct {
		name string
		x, y Tensor
		w    *Tensor
		g    int
		want string
	}{
		{"groups not dividing C", x, x, nil, 4, "4 groups for 6 channels"},
		{"no groups", x, x, nil, 0, "0 groups"},
		{"strided x", strided, x, nil, 3, "contiguous"},
		{"weight of 5", x, x, &w5, 3, "weight"},
		{"weight past its buffer", x, x, &past, 3, "past its buffer"},
		{"shapes differ", Contiguous(b, 2, 6, 9), x, &w6, 3, "want [2 6 10]"},
		{"one axis", Contiguous(b, 12), Contiguous(b, 12), nil, 3, "[B, C, ...]"},
		{"no buffer", Tensor{Shape: []int64{2, 6, 10}, Stride: []int64{60, 10, 1}}, x, nil, 3, "no buffer"},
	} {
		_, err := GroupNormOp(c.x, c.w, nil, c.y, c.g, 1e-5)
		if err == nil || !strings.HasPrefix(err.Error(), "vulkan: groupnorm: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// gnPermuted is x [B, C, T] stored as [B, T, C] (a transposed view), and that storage.
func gnPermuted(t *testing.T, d *Device, x []float32, B, C, T int) Tensor {
	st := make([]float32, len(x))
	for b := range B {
		for c := range C {
			for i := range T {
				st[(b*T+i)*C+c] = x[(b*C+c)*T+i]
			}
		}
	}
	return Tensor{Buf: upload(t, d, st), Shape: []int64{int64(B), int64(C), int64(T)}, Stride: []int64{int64(T * C), 1, int64(C)}}
}

// ChannelAffine against float64: with and without shift, 2- to 4-axis inputs, a transposed
// view of x. Bound: 1e-6·(|x·scale| + |shift|) (one or two roundings).
func TestChannelAffine(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(23, 24))
	for _, s := range []struct {
		shape   []int64
		permute bool
	}{{[]int64{2, 6, 37}, false}, {[]int64{2, 9, 1001}, true}, {[]int64{2, 9, 5, 7}, false}, {[]int64{5, 9}, false}} {
		B, C := int(s.shape[0]), int(s.shape[1])
		n := int(numel(s.shape))
		S := n / (B * C)
		x, sc, sh := randoms(rng, n, 2), randoms(rng, C, 1), randoms(rng, C, 1)
		xt := Contiguous(upload(t, d, x), s.shape...)
		if s.permute {
			xt = gnPermuted(t, d, x, B, C, S)
		}
		for _, withShift := range []bool{false, true} {
			shift := Tensor{}
			if withShift {
				shift = Contiguous(upload(t, d, sh), int64(C))
			}
			out := upload(t, d, make([]float32, n))
			ds, err := ChannelAffineOp(xt, Contiguous(upload(t, d, sc), int64(C)), shift, Contiguous(out, s.shape...))
			if err == nil {
				err = d.Run(ds)
			}
			if err != nil {
				t.Fatalf("%v: %v", s.shape, err)
			}
			for i, g := range out.Float32s() {
				c := i / S % C
				p := float64(x[i]) * float64(sc[c])
				h := 0.0
				if withShift {
					h = float64(sh[c])
				}
				if math.Abs(float64(g)-(p+h)) > 1e-6*(math.Abs(p)+math.Abs(h))+1e-30 {
					t.Fatalf("%v shift %v: y[%d] = %v, want %v", s.shape, withShift, i, g, p+h)
				}
			}
		}
	}
	b := upload(t, d, make([]float32, 100))
	if _, err := ChannelAffineOp(Contiguous(b, 2, 6, 5), Contiguous(b, 5), Tensor{}, Contiguous(b, 2, 6, 5)); err == nil || !strings.Contains(err.Error(), "vulkan: channelaffine: scale") {
		t.Errorf("scale of 5 for 6 channels: %v", err)
	}
	if _, err := ChannelAffineOp(Contiguous(b, 2, 6, 5), Contiguous(b, 6), Contiguous(b, 7), Contiguous(b, 2, 6, 5)); err == nil || !strings.Contains(err.Error(), "shift") {
		t.Errorf("shift of 7 for 6 channels: %v", err)
	}
}

// SnakeBeta against float64: contiguous [B, C, T], a transposed view, 2 and 4 axes, some
// |x| up to 50 (the reduction by π). Bound: 1e-5·(|x| + 1/β) for the terms plus 1e-6·|αx|/β
// for the argument (float α·x and exp carry a few ulps whatever computes sin).
func TestSnakeBeta(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(25, 26))
	for _, s := range []struct {
		shape   []int64
		permute bool
	}{{[]int64{2, 9, 1001}, false}, {[]int64{2, 6, 37}, true}, {[]int64{3, 6}, false}, {[]int64{2, 6, 5, 7}, false}} {
		B, C := int(s.shape[0]), int(s.shape[1])
		n := int(numel(s.shape))
		S := n / (B * C)
		x, al, be := randoms(rng, n, 2), randoms(rng, C, 0.5), randoms(rng, C, 0.5)
		for i := 0; i < n; i += 17 {
			x[i] *= 12
		}
		xt := Contiguous(upload(t, d, x), s.shape...)
		if s.permute {
			xt = gnPermuted(t, d, x, B, C, S)
		}
		out := upload(t, d, make([]float32, n))
		ds, err := SnakeBetaOp(xt, Contiguous(upload(t, d, al), int64(C)), Contiguous(upload(t, d, be), int64(C)), Contiguous(out, s.shape...))
		if err == nil {
			err = d.Run(ds)
		}
		if err != nil {
			t.Fatalf("%v: %v", s.shape, err)
		}
		for i, g := range out.Float32s() {
			c := i / S % C
			v, a := float64(x[i]), math.Exp(float64(al[c]))
			ib := 1 / (math.Exp(float64(be[c])) + 1e-9)
			sn := math.Sin(a * v)
			want := v + ib*sn*sn
			if math.Abs(float64(g)-want) > 1e-5*(math.Abs(v)+ib)+1e-6*ib*math.Abs(a*v) {
				t.Fatalf("%v: y[%d] = %v, want %v (x %v, α %v, β %v)", s.shape, i, g, want, v, al[c], be[c])
			}
		}
	}
	b := upload(t, d, make([]float32, 100))
	if _, err := SnakeBetaOp(Contiguous(b, 2, 6, 5), Contiguous(b, 6), Contiguous(b, 3), Contiguous(b, 2, 6, 5)); err == nil || !strings.Contains(err.Error(), "vulkan: snakebeta: beta") {
		t.Errorf("beta of 3 for 6 channels: %v", err)
	}
	if _, err := SnakeBetaOp(Contiguous(b, 2, 6, 5), Contiguous(b, 6), Contiguous(b, 6), Contiguous(b, 2, 5, 6)); err == nil || !strings.Contains(err.Error(), "vulkan: snakebeta: x") {
		t.Errorf("x and y of different shapes: %v", err)
	}
}
