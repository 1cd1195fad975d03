package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// End-to-end tests of the builder's ops through the CPU backend: each graph is built with
// PyTorch-order shapes, run, and compared with a naive float64 reference written from the
// PyTorch definition of the op, so the mapping from builder calls to kernel parameters is
// checked, not just the kernels.

const opTol = 1e-4

type opTest struct {
	t   *testing.T
	g   *Graph
	rng *rand.Rand
	f32 map[string][]float32
	i32 map[string][]int32
}

func newOpTest(t *testing.T, seed uint64) *opTest {
	return &opTest{t: t, g: NewGraph(t.Name()), rng: rand.New(rand.NewPCG(seed, 17)),
		f32: map[string][]float32{}, i32: map[string][]int32{}}
}

func (o *opTest) randn(n int64, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(o.rng.NormFloat64() * scale)
	}
	return x
}

// input declares a float32 graph input filled with N(0, 1) values (the returned slice is
// what will be fed; it may be edited before run).
func (o *opTest) input(name string, shape ...int64) (Tensor, []float32) {
	x := o.randn(numel(shape), 1)
	o.f32[name] = x
	return o.g.Input(name, F32, shape...), x
}

// inputInt declares an int32 graph input [len(v)] fed with v through InputInt32.
func (o *opTest) inputInt(name string, v []int32) Tensor {
	o.i32[name] = v
	return o.g.Input(name, I32, int64(len(v)))
}

// weight makes a persistent buffer of N(0, 0.25) values.
func (o *opTest) weight(name string, shape ...int64) (Tensor, []float32) {
	x := o.randn(numel(shape), 0.5)
	b, err := NewBufferFrom(name, x, shape...)
	if err != nil {
		o.t.Fatal(err)
	}
	o.t.Cleanup(b.Free)
	return o.g.Persistent(b), x
}

// output marks t as an output after checking its shape.
func (o *opTest) output(name string, t Tensor, want ...int64) {
	o.t.Helper()
	if err := o.g.Err(); err != nil {
		o.t.Fatal(err)
	}
	if !slices.Equal(t.Shape(), want) {
		o.t.Fatalf("%s: shape %v, want %v", name, t.Shape(), want)
	}
	o.g.Output(name, t)
}

func (o *opTest) run() map[string][]float32 {
	o.t.Helper()
	if err := o.g.Err(); err != nil {
		o.t.Fatal(err)
	}
	cpu, err := NewCPU(3)
	if err != nil {
		o.t.Fatal(err)
	}
	defer cpu.Close()
	prog, err := cpu.Compile(o.g)
	if err != nil {
		o.t.Fatal(err)
	}
	defer prog.Close()
	for name := range o.g.inputs {
		if x, ok := o.f32[name]; ok {
			dst := prog.Input(name)
			if len(dst) != len(x) {
				o.t.Fatalf("input %s: %d values for %d", name, len(x), len(dst))
			}
			copy(dst, x)
		} else if v, ok := o.i32[name]; ok {
			dst := prog.InputInt32(name)
			if len(dst) != len(v) {
				o.t.Fatalf("input %s: %d values for %d", name, len(v), len(dst))
			}
			copy(dst, v)
		} else {
			o.t.Fatalf("input %s not fed", name)
		}
	}
	if err := prog.Run(); err != nil {
		o.t.Fatal(err)
	}
	out := map[string][]float32{}
	for name := range o.g.outputs {
		out[name] = slices.Clone(prog.Output(name))
	}
	return out
}

// near compares got with want at ~1e-4 relative/absolute; infinities must match exactly.
func near(t *testing.T, what string, got []float32, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	bad := 0
	for i, w := range want {
		g := float64(got[i])
		ok := math.Abs(g-w) <= opTol*(1+math.Abs(w))
		if math.IsInf(w, 0) || math.IsNaN(w) {
			ok = g == w
		}
		if !ok {
			if bad < 5 {
				t.Errorf("%s[%d] = %v, want %v", what, i, g, w)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d values differ", what, bad, len(want))
	}
}

func f64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// splitAxis returns the sizes before, of and after axis ax of shape.
func splitAxis(shape []int64, ax int) (outer, n, inner int) {
	outer, inner = 1, 1
	for i, d := range shape {
		switch {
		case i < ax:
			outer *= int(d)
		case i > ax:
			inner *= int(d)
		}
	}
	return outer, int(shape[ax]), inner
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// ---- linear algebra ----

func TestOpLinear(t *testing.T) {
	o := newOpTest(t, 1)
	const B, T, K, N = 2, 3, 5, 7
	x, xs := o.input("x", B, T, K)
	w, ws := o.weight("w", N, K)
	b, bs := o.weight("b", N)
	o.output("y", o.g.Linear(x, w, &b), B, T, N)
	o.output("y0", o.g.Linear(x, w, nil), B, T, N)
	out := o.run()
	want, want0 := make([]float64, B*T*N), make([]float64, B*T*N)
	for r := 0; r < B*T; r++ {
		for n := 0; n < N; n++ {
			s := 0.0
			for k := 0; k < K; k++ {
				s += float64(xs[r*K+k]) * float64(ws[n*K+k])
			}
			want0[r*N+n] = s
			want[r*N+n] = s + float64(bs[n])
		}
	}
	near(t, "Linear+bias", out["y"], want)
	near(t, "Linear", out["y0"], want0)
}

func TestOpMatmulBroadcastBatch(t *testing.T) {
	o := newOpTest(t, 2)
	const M, K, N = 3, 5, 4
	a, as := o.input("a", 2, 1, M, K)
	b, bs := o.input("b", 3, K, N)
	bt, bts := o.input("bt", 3, N, K)
	o.output("y", o.g.Matmul(a, b), 2, 3, M, N)
	o.output("yt", o.g.Matmul(a, o.g.Transpose(bt, 1, 2)), 2, 3, M, N)
	// Rows of a wider input (a slice of the last axis: row stride 7 > K).
	aw, aws := o.input("aw", 2, 1, M, 7)
	o.output("ys", o.g.Matmul(o.g.Slice(aw, -1, 1, 1+K), b), 2, 3, M, N)
	out := o.run()
	want, wantT, wantS := make([]float64, 2*3*M*N), make([]float64, 2*3*M*N), make([]float64, 2*3*M*N)
	for i := 0; i < 2; i++ {
		for j := 0; j < 3; j++ {
			for m := 0; m < M; m++ {
				for n := 0; n < N; n++ {
					s, st, ss := 0.0, 0.0, 0.0
					for k := 0; k < K; k++ {
						av := float64(as[(i*M+m)*K+k])
						s += av * float64(bs[(j*K+k)*N+n])
						st += av * float64(bts[(j*N+n)*K+k])
						ss += float64(aws[(i*M+m)*7+1+k]) * float64(bs[(j*K+k)*N+n])
					}
					at := ((i*3+j)*M+m)*N + n
					want[at], wantT[at], wantS[at] = s, st, ss
				}
			}
		}
	}
	near(t, "Matmul", out["y"], want)
	near(t, "Matmul transposed view", out["yt"], wantT)
	near(t, "Matmul sliced rows", out["ys"], wantS)
}

// ---- convolutions ----

func refConv1D(x []float32, B, cin, T int, w []float32, cout, K int, bias []float32, stride, padL, dil, groups, tOut int) []float64 {
	cinG, coutG := cin/groups, cout/groups
	y := make([]float64, B*cout*tOut)
	for b := 0; b < B; b++ {
		for co := 0; co < cout; co++ {
			g := co / coutG
			for to := 0; to < tOut; to++ {
				s := 0.0
				if bias != nil {
					s = float64(bias[co])
				}
				for ci := 0; ci < cinG; ci++ {
					for k := 0; k < K; k++ {
						p := to*stride - padL + k*dil
						if p < 0 || p >= T {
							continue
						}
						s += float64(w[(co*cinG+ci)*K+k]) * float64(x[(b*cin+g*cinG+ci)*T+p])
					}
				}
				y[(b*cout+co)*tOut+to] = s
			}
		}
	}
	return y
}

func TestOpConv1D(t *testing.T) {
	o := newOpTest(t, 3)
	// stride 2, pad 2 left / 1 right, dilation 2, groups 2.
	const B, Cin, T, Cout, K = 2, 4, 11, 6, 3
	x, xs := o.input("x", B, Cin, T)
	w, ws := o.weight("w", Cout, Cin/2, K)
	b, bs := o.weight("b", Cout)
	tOut := (T+2+1-2*(K-1)-1)/2 + 1
	o.output("y", o.g.Conv1D(x, w, &b, 2, 2, 1, 2, 2), B, Cout, int64(tOut))
	// Depthwise: groups = Cin = Cout, no bias.
	const C2, T2, K2 = 3, 9, 5
	x2, x2s := o.input("x2", 1, C2, T2)
	w2, w2s := o.weight("w2", C2, 1, K2)
	o.output("y2", o.g.Conv1D(x2, w2, nil, 1, 3, 1, 1, C2), 1, C2, T2+3+1-K2+1)
	// The same conv on x given as a transposed view of [B, T, Cin]: the kernel reads strides.
	xt, xts := o.input("xt", B, T, Cin)
	o.output("yt", o.g.Conv1D(o.g.Transpose(xt, 1, 2), w, &b, 2, 2, 1, 2, 2), B, Cout, int64(tOut))
	out := o.run()
	near(t, "Conv1D", out["y"], refConv1D(xs, B, Cin, T, ws, Cout, K, bs, 2, 2, 2, 2, tOut))
	xtc := make([]float32, len(xts)) // [B, T, Cin] → [B, Cin, T] for the reference
	for bi := 0; bi < B; bi++ {
		for ti := 0; ti < T; ti++ {
			for c := 0; c < Cin; c++ {
				xtc[(bi*Cin+c)*T+ti] = xts[(bi*T+ti)*Cin+c]
			}
		}
	}
	near(t, "Conv1D strided input", out["yt"], refConv1D(xtc, B, Cin, T, ws, Cout, K, bs, 2, 2, 2, 2, tOut))
	near(t, "Conv1D depthwise", out["y2"], refConv1D(x2s, 1, C2, T2, w2s, C2, K2, nil, 1, 3, 1, C2, T2+3+1-K2+1))
}

func refConv2D(x []float32, B, cin, H, W int, w []float32, cout, KH, KW int, bias []float32, sh, sw, ph, pw, groups, oh, ow int) []float64 {
	cinG, coutG := cin/groups, cout/groups
	y := make([]float64, B*cout*oh*ow)
	for b := 0; b < B; b++ {
		for co := 0; co < cout; co++ {
			g := co / coutG
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					s := 0.0
					if bias != nil {
						s = float64(bias[co])
					}
					for ci := 0; ci < cinG; ci++ {
						for u := 0; u < KH; u++ {
							for v := 0; v < KW; v++ {
								r, c := i*sh-ph+u, j*sw-pw+v
								if r < 0 || r >= H || c < 0 || c >= W {
									continue
								}
								s += float64(w[((co*cinG+ci)*KH+u)*KW+v]) * float64(x[((b*cin+g*cinG+ci)*H+r)*W+c])
							}
						}
					}
					y[((b*cout+co)*oh+i)*ow+j] = s
				}
			}
		}
	}
	return y
}

func TestOpConv2D(t *testing.T) {
	o := newOpTest(t, 4)
	const B, Cin, H, W, Cout = 2, 3, 7, 6, 5
	x, xs := o.input("x", B, Cin, H, W)
	w, ws := o.weight("w", Cout, Cin, 3, 3)
	b, bs := o.weight("b", Cout)
	// stride 2, padding 1.
	oh, ow := (H+2-3)/2+1, (W+2-3)/2+1
	o.output("y", o.g.Conv2D(x, w, &b, 2, 2, 1, 1, 1), B, Cout, int64(oh), int64(ow))
	// Different H and W parameters and a non-square kernel catch swapped axes; groups 2.
	x2, x2s := o.input("x2", 1, 4, H, W)
	w2, w2s := o.weight("w2", 2, 2, 3, 2)
	oh2, ow2 := (H+0-3)/2+1, (W+2*2-2)/1+1
	o.output("y2", o.g.Conv2D(x2, w2, nil, 2, 1, 0, 2, 2), 1, 2, int64(oh2), int64(ow2))
	out := o.run()
	near(t, "Conv2D", out["y"], refConv2D(xs, B, Cin, H, W, ws, Cout, 3, 3, bs, 2, 2, 1, 1, 1, oh, ow))
	near(t, "Conv2D asymmetric", out["y2"], refConv2D(x2s, 1, 4, H, W, w2s, 2, 3, 2, nil, 2, 1, 0, 2, 2, oh2, ow2))
}

func refConvT1D(x []float32, B, cin, T int, w []float32, cout, K int, bias []float32, stride, pad, dil, groups, tOut int) []float64 {
	cinG, coutG := cin/groups, cout/groups
	y := make([]float64, B*cout*tOut)
	for b := 0; b < B; b++ {
		for co := 0; co < cout; co++ {
			for j := 0; j < tOut; j++ {
				if bias != nil {
					y[(b*cout+co)*tOut+j] = float64(bias[co])
				}
			}
		}
		for ci := 0; ci < cin; ci++ {
			g := ci / cinG
			for ti := 0; ti < T; ti++ {
				for c := 0; c < coutG; c++ {
					co := g*coutG + c
					for k := 0; k < K; k++ {
						j := ti*stride + k*dil - pad
						if j < 0 || j >= tOut {
							continue
						}
						y[(b*cout+co)*tOut+j] += float64(x[(b*cin+ci)*T+ti]) * float64(w[(ci*coutG+c)*K+k])
					}
				}
			}
		}
	}
	return y
}

func TestOpConvTranspose1D(t *testing.T) {
	o := newOpTest(t, 5)
	const B, Cin, T, K = 2, 4, 6, 3
	x, xs := o.input("x", B, Cin, T)
	// groups 1: w [Cin, Cout, K], Cout 3, with bias.
	w1, w1s := o.weight("w1", Cin, 3, K)
	b1, b1s := o.weight("b1", 3)
	tOut := (T-1)*2 - 2*1 + (K - 1) + 1 + 1
	o.output("y1", o.g.ConvTranspose1D(x, w1, &b1, 2, 1, 1, 1, 1), B, 3, int64(tOut))
	// groups 2: w [Cin, Cout/2, K], Cout 6, no bias.
	w2, w2s := o.weight("w2", Cin, 3, K)
	o.output("y2", o.g.ConvTranspose1D(x, w2, nil, 2, 1, 1, 1, 2), B, 6, int64(tOut))
	// dilation 2, stride 3, padding 2, output_padding 2, groups 2.
	w3, w3s := o.weight("w3", Cin, 1, K)
	tOut3 := (T-1)*3 - 2*2 + 2*(K-1) + 2 + 1
	o.output("y3", o.g.ConvTranspose1D(x, w3, nil, 3, 2, 2, 2, 2), B, 2, int64(tOut3))
	out := o.run()
	near(t, "ConvTranspose1D", out["y1"], refConvT1D(xs, B, Cin, T, w1s, 3, K, b1s, 2, 1, 1, 1, tOut))
	near(t, "ConvTranspose1D groups 2", out["y2"], refConvT1D(xs, B, Cin, T, w2s, 6, K, nil, 2, 1, 1, 2, tOut))
	near(t, "ConvTranspose1D dilated", out["y3"], refConvT1D(xs, B, Cin, T, w3s, 2, K, nil, 3, 2, 2, 2, tOut3))
}

// ---- attention and RoPE ----

func refAttention(q, k, v []float32, B, H, Hk, Tq, Tk, D, Dv int, scale float64, mask func(i, j int) float64, bias func(h, i, j int) float64) []float64 {
	y := make([]float64, B*H*Tq*Dv)
	rep := H / Hk
	s := make([]float64, Tk)
	for b := 0; b < B; b++ {
		for h := 0; h < H; h++ {
			kh := h / rep // repeat_interleave of the KV heads
			for i := 0; i < Tq; i++ {
				mx := math.Inf(-1)
				for j := 0; j < Tk; j++ {
					d := 0.0
					for e := 0; e < D; e++ {
						d += float64(q[((b*H+h)*Tq+i)*D+e]) * float64(k[((b*Hk+kh)*Tk+j)*D+e])
					}
					s[j] = d*scale + mask(i, j) + bias(h, i, j)
					mx = math.Max(mx, s[j])
				}
				sum := 0.0
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					sum += s[j]
				}
				for e := 0; e < Dv; e++ {
					acc := 0.0
					for j := range s {
						acc += s[j] / sum * float64(v[((b*Hk+kh)*Tk+j)*Dv+e])
					}
					y[((b*H+h)*Tq+i)*Dv+e] = acc
				}
			}
		}
	}
	return y
}

func TestOpAttention(t *testing.T) {
	o := newOpTest(t, 6)
	const B, H, Hk, Tq, Tk, D, Dv = 2, 4, 2, 3, 5, 4, 3
	q, qs := o.input("q", B, H, Tq, D)
	k, ks := o.input("k", B, Hk, Tk, D)
	v, vs := o.input("v", B, Hk, Tk, Dv)
	ninf := float32(math.Inf(-1))
	maskv := o.randn(Tq*Tk, 0.5)
	maskv[0*Tk+4], maskv[1*Tk+0], maskv[1*Tk+3], maskv[2*Tk+2] = ninf, ninf, ninf, ninf
	mb, err := NewBufferFrom("mask", maskv, Tq, Tk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mb.Free)
	mask := o.g.Persistent(mb)
	bias, bs := o.weight("bias", H, Tq, Tk)
	o.output("full", o.g.Attention(q, k, v, &mask, &bias, 0), B, H, Tq, Dv)
	o.output("bias", o.g.Attention(q, k, v, nil, &bias, 0.3), B, H, Tq, Dv)
	row, rs := o.weight("row", Tk) // broadcasts over Tq
	o.output("mask", o.g.Attention(q, k, v, &row, nil, 0.7), B, H, Tq, Dv)
	o.output("none", o.g.Attention(q, k, v, nil, nil, 1.1), B, H, Tq, Dv)
	// q as heads split from [B, Tq, H·D] by a permuted view, as models build it.
	qt, qts := o.input("qt", B, Tq, H*D)
	qv := o.g.Permute(o.g.Reshape(qt, B, Tq, H, D), 0, 2, 1, 3)
	o.output("view", o.g.Attention(qv, k, v, nil, nil, 1.1), B, H, Tq, Dv)
	out := o.run()
	qp := make([]float32, len(qts)) // [B, Tq, H, D] → [B, H, Tq, D] for the reference
	for bi := 0; bi < B; bi++ {
		for i := 0; i < Tq; i++ {
			for h := 0; h < H; h++ {
				for d := 0; d < D; d++ {
					qp[((bi*H+h)*Tq+i)*D+d] = qts[((bi*Tq+i)*H+h)*D+d]
				}
			}
		}
	}
	m := func(i, j int) float64 { return float64(maskv[i*Tk+j]) }
	bf := func(h, i, j int) float64 { return float64(bs[(h*Tq+i)*Tk+j]) }
	zm := func(i, j int) float64 { return 0 }
	zb := func(h, i, j int) float64 { return 0 }
	rm := func(i, j int) float64 { return float64(rs[j]) }
	near(t, "Attention mask+bias", out["full"], refAttention(qs, ks, vs, B, H, Hk, Tq, Tk, D, Dv, 1/math.Sqrt(D), m, bf))
	near(t, "Attention bias", out["bias"], refAttention(qs, ks, vs, B, H, Hk, Tq, Tk, D, Dv, float64(float32(0.3)), zm, bf))
	near(t, "Attention row mask", out["mask"], refAttention(qs, ks, vs, B, H, Hk, Tq, Tk, D, Dv, float64(float32(0.7)), rm, zb))
	near(t, "Attention plain", out["none"], refAttention(qs, ks, vs, B, H, Hk, Tq, Tk, D, Dv, float64(float32(1.1)), zm, zb))
	near(t, "Attention permuted q", out["view"], refAttention(qp, ks, vs, B, H, Hk, Tq, Tk, D, Dv, float64(float32(1.1)), zm, zb))
}

func refRoPE(x []float32, BH, T, D int, pos []int32, dims int, half bool, theta float64) []float64 {
	y := f64(x)
	for r := 0; r < BH; r++ {
		for ti := 0; ti < T; ti++ {
			row := y[(r*T+ti)*D:]
			src := x[(r*T+ti)*D:]
			for i := 0; i < dims/2; i++ {
				a := float64(pos[ti]) * math.Pow(theta, -float64(2*i)/float64(dims))
				c, s := math.Cos(a), math.Sin(a)
				i0, i1 := 2*i, 2*i+1
				if half {
					i0, i1 = i, i+dims/2
				}
				x0, x1 := float64(src[i0]), float64(src[i1])
				row[i0], row[i1] = x0*c-x1*s, x0*s+x1*c
			}
		}
	}
	return y
}

func TestOpRoPE(t *testing.T) {
	o := newOpTest(t, 7)
	const B, H, T = 2, 3, 4
	pos := []int32{5, 6, 7, 11}
	p := o.inputInt("pos", pos)
	x8, x8s := o.input("x8", B, H, T, 8)
	x7, x7s := o.input("x7", B, H, T, 7)
	o.output("i8", o.g.RoPE(x8, p, 6, RoPEInterleaved, 10000), B, H, T, 8)
	o.output("h8", o.g.RoPE(x8, p, 6, RoPEHalf, 10000), B, H, T, 8)
	o.output("i7", o.g.RoPE(x7, p, 4, RoPEInterleaved, 500), B, H, T, 7)
	o.output("h7", o.g.RoPE(x7, p, 4, RoPEHalf, 500), B, H, T, 7)
	// A permuted view ([B, T, H, D] as [B, H, T, D]) is read in place, strided.
	xp, xps := o.input("xp", B, T, H, 8)
	o.output("p8", o.g.RoPE(o.g.Permute(xp, 0, 2, 1, 3), p, 8, RoPEHalf, 10000), B, H, T, 8)
	out := o.run()
	permuted := make([]float32, 0, len(xps))
	for b := range B {
		for h := range H {
			for q := range T {
				permuted = append(permuted, xps[((b*T+q)*H+h)*8:][:8]...)
			}
		}
	}
	near(t, "RoPE of a permuted view", out["p8"], refRoPE(permuted, B*H, T, 8, pos, 8, true, 10000))
	near(t, "RoPE interleaved", out["i8"], refRoPE(x8s, B*H, T, 8, pos, 6, false, 10000))
	near(t, "RoPE half", out["h8"], refRoPE(x8s, B*H, T, 8, pos, 6, true, 10000))
	near(t, "RoPE interleaved odd D", out["i7"], refRoPE(x7s, B*H, T, 7, pos, 4, false, 500))
	near(t, "RoPE half odd D", out["h7"], refRoPE(x7s, B*H, T, 7, pos, 4, true, 500))
}

// ---- normalisation ----

func refLastNorm(x []float32, D int, w, b []float32, eps float64, rms bool) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < len(x)/D; r++ {
		row := f64(x[r*D : (r+1)*D])
		mean, v := 0.0, 0.0
		if !rms {
			for _, e := range row {
				mean += e
			}
			mean /= float64(D)
		}
		for _, e := range row {
			v += (e - mean) * (e - mean)
		}
		v /= float64(D)
		for i, e := range row {
			z := (e - mean) / math.Sqrt(v+eps)
			if w != nil {
				z *= float64(w[i])
			}
			if b != nil {
				z += float64(b[i])
			}
			y[r*D+i] = z
		}
	}
	return y
}

func TestOpLayerRMSNorm(t *testing.T) {
	o := newOpTest(t, 8)
	const D = 7
	x, xs := o.input("x", 2, 3, D)
	for i := range xs {
		xs[i] = xs[i]*2 + 0.5 // non-zero mean
	}
	w, ws := o.weight("w", D)
	b, bs := o.weight("b", D)
	o.output("ln", o.g.LayerNorm(x, &w, &b, 1e-5), 2, 3, D)
	o.output("ln0", o.g.LayerNorm(x, nil, nil, 1e-3), 2, 3, D)
	o.output("rms", o.g.RMSNorm(x, &w, 1e-5), 2, 3, D)
	o.output("rms0", o.g.RMSNorm(x, nil, 1e-2), 2, 3, D)
	o.output("lnw", o.g.LayerNorm(x, &w, nil, 1e-5), 2, 3, D)
	out := o.run()
	near(t, "LayerNorm", out["ln"], refLastNorm(xs, D, ws, bs, float64(float32(1e-5)), false))
	near(t, "LayerNorm plain", out["ln0"], refLastNorm(xs, D, nil, nil, float64(float32(1e-3)), false))
	near(t, "RMSNorm", out["rms"], refLastNorm(xs, D, ws, nil, float64(float32(1e-5)), true))
	near(t, "RMSNorm plain", out["rms0"], refLastNorm(xs, D, nil, nil, float64(float32(1e-2)), true))
	near(t, "LayerNorm weight only", out["lnw"], refLastNorm(xs, D, ws, nil, float64(float32(1e-5)), false))
}

func refGroupNorm(x []float32, B, C, S, groups int, w, b []float32, eps float64) []float64 {
	y := make([]float64, len(x))
	cg := C / groups
	for bi := 0; bi < B; bi++ {
		for g := 0; g < groups; g++ {
			base := (bi*C + g*cg) * S
			seg := f64(x[base : base+cg*S])
			mean, v := 0.0, 0.0
			for _, e := range seg {
				mean += e
			}
			mean /= float64(len(seg))
			for _, e := range seg {
				v += (e - mean) * (e - mean)
			}
			v /= float64(len(seg))
			for i, e := range seg {
				c := g*cg + i/S
				z := (e - mean) / math.Sqrt(v+eps)
				if w != nil {
					z *= float64(w[c])
				}
				if b != nil {
					z += float64(b[c])
				}
				y[base+i] = z
			}
		}
	}
	return y
}

func TestOpGroupInstanceNorm(t *testing.T) {
	o := newOpTest(t, 9)
	x, xs := o.input("x", 2, 4, 5)
	w, ws := o.weight("w", 4)
	b, bs := o.weight("b", 4)
	o.output("gn", o.g.GroupNorm(x, 2, &w, &b, 1e-5), 2, 4, 5)
	x2, x2s := o.input("x2", 2, 3, 3, 4)
	o.output("in", o.g.GroupNorm(x2, 3, nil, nil, 1e-5), 2, 3, 3, 4)
	o.output("gnw", o.g.GroupNorm(x, 2, &w, nil, 1e-5), 2, 4, 5)
	out := o.run()
	eps := float64(float32(1e-5))
	near(t, "GroupNorm", out["gn"], refGroupNorm(xs, 2, 4, 5, 2, ws, bs, eps))
	near(t, "InstanceNorm", out["in"], refGroupNorm(x2s, 2, 3, 12, 3, nil, nil, eps))
	near(t, "GroupNorm weight only", out["gnw"], refGroupNorm(xs, 2, 4, 5, 2, ws, nil, eps))
}

func TestOpChannelAffine(t *testing.T) {
	o := newOpTest(t, 10)
	x, xs := o.input("x", 2, 3, 5)
	s, ss := o.weight("s", 3)
	b, bs := o.weight("b", 3)
	o.output("y", o.g.ChannelAffine(x, s, b), 2, 3, 5)
	out := o.run()
	want := make([]float64, len(xs))
	for i := range xs {
		c := (i / 5) % 3
		want[i] = float64(xs[i])*float64(ss[c]) + float64(bs[c])
	}
	near(t, "ChannelAffine", out["y"], want)
}

func TestOpSoftmax(t *testing.T) {
	o := newOpTest(t, 11)
	const B, R, N = 2, 3, 5
	x, xs := o.input("x", B, R, N)
	m, ms := o.input("m", R, N) // broadcasts over B
	ms[1*N+2], ms[2*N+0] = float32(math.Inf(-1)), float32(math.Inf(-1))
	c, cs := o.input("c", B, 1, N) // broadcasts over R
	o.output("y", o.g.Softmax(x, &m, 0.7), B, R, N)
	o.output("yc", o.g.Softmax(x, &c, 1), B, R, N)
	o.output("y0", o.g.Softmax(x, nil, 1.3), B, R, N)
	out := o.run()
	ref := func(scale float64, mask func(b, r, n int) float64) []float64 {
		y := make([]float64, B*R*N)
		for b := 0; b < B; b++ {
			for r := 0; r < R; r++ {
				row := y[(b*R+r)*N : (b*R+r+1)*N]
				mx, sum := math.Inf(-1), 0.0
				for n := range row {
					row[n] = float64(xs[(b*R+r)*N+n])*scale + mask(b, r, n)
					mx = math.Max(mx, row[n])
				}
				for n := range row {
					row[n] = math.Exp(row[n] - mx)
					sum += row[n]
				}
				for n := range row {
					row[n] /= sum
				}
			}
		}
		return y
	}
	near(t, "Softmax mask", out["y"], ref(float64(float32(0.7)), func(b, r, n int) float64 { return float64(ms[r*N+n]) }))
	near(t, "Softmax column mask", out["yc"], ref(1, func(b, r, n int) float64 { return float64(cs[b*N+n]) }))
	near(t, "Softmax plain", out["y0"], ref(float64(float32(1.3)), func(b, r, n int) float64 { return 0 }))
}

// ---- views and data movement ----

func TestOpViews(t *testing.T) {
	o := newOpTest(t, 12)
	x, xs := o.input("x", 2, 3, 4)
	// Permute (2, 0, 1) made contiguous: y[k, i, j] = x[i, j, k].
	o.output("perm", o.g.Contiguous(o.g.Permute(x, 2, 0, 1)), 4, 2, 3)
	// Slice axis 1 [1, 3) then the last axis [-3, 3): y[i, j, k] = x[i, 1+j, 1+k].
	o.output("slice", o.g.Slice(o.g.Slice(x, 1, 1, 3), -1, -3, 3), 2, 2, 2)
	// Expand / Repeat of [3, 1] to [2, 3, 4]: y[i, j, k] = r[j].
	r, rs := o.input("r", 3, 1)
	o.output("expand", o.g.Expand(r, 2, -1, 4), 2, 3, 4)
	o.output("repeat", o.g.Repeat(r, 2, 3, 4), 2, 3, 4)
	// Reshape of a permuted view (a copy first).
	o.output("reshape", o.g.Reshape(o.g.Transpose(x, 0, 2), 4, -1), 4, 6)
	out := o.run()
	perm, slice, rep, reshape := make([]float64, 24), make([]float64, 8), make([]float64, 24), make([]float64, 24)
	for i := 0; i < 2; i++ {
		for j := 0; j < 3; j++ {
			for k := 0; k < 4; k++ {
				v := float64(xs[(i*3+j)*4+k])
				perm[(k*2+i)*3+j] = v
				reshape[(k*3+j)*2+i] = v
				rep[(i*3+j)*4+k] = float64(rs[j])
			}
		}
	}
	for i := 0; i < 2; i++ {
		for j := 0; j < 2; j++ {
			for k := 0; k < 2; k++ {
				slice[(i*2+j)*2+k] = float64(xs[(i*3+1+j)*4+1+k])
			}
		}
	}
	near(t, "Permute+Contiguous", out["perm"], perm)
	near(t, "Slice", out["slice"], slice)
	near(t, "Expand", out["expand"], rep)
	near(t, "Repeat", out["repeat"], rep)
	near(t, "Reshape", out["reshape"], reshape)
}

func TestOpConcatMiddleAxis(t *testing.T) {
	o := newOpTest(t, 13)
	a, as := o.input("a", 2, 3, 4)
	b, bs := o.input("b", 2, 1, 4)
	c, cs := o.input("c", 2, 4, 2) // used transposed: [2, 2, 4]
	o.output("y", o.g.Concat(1, a, b, o.g.Transpose(c, 1, 2)), 2, 6, 4)
	out := o.run()
	want := make([]float64, 0, 48)
	for i := 0; i < 2; i++ {
		for j := 0; j < 3; j++ {
			want = append(want, f64(as[(i*3+j)*4:(i*3+j+1)*4])...)
		}
		want = append(want, f64(bs[i*4:(i+1)*4])...)
		for j := 0; j < 2; j++ {
			for k := 0; k < 4; k++ {
				want = append(want, float64(cs[(i*4+k)*2+j]))
			}
		}
	}
	near(t, "Concat", out["y"], want)
}

func TestOpPad(t *testing.T) {
	o := newOpTest(t, 14)
	shape := []int64{2, 5, 3}
	x, xs := o.input("x", shape...)
	o.output("const", o.g.Pad(x, 1, 2, 3, PadConstant, 0.5), 2, 10, 3)
	o.output("reflect", o.g.Pad(x, 1, 4, 3, PadReflect, 0), 2, 12, 3)
	o.output("replicate", o.g.Pad(x, -2, 3, 1, PadReplicate, 0), 2, 9, 3)
	o.output("last", o.g.Pad(x, -1, 1, 2, PadReflect, 0), 2, 5, 6)
	out := o.run()
	ref := func(ax int, before, after int, mode int, value float64) []float64 {
		outer, n, inner := splitAxis(shape, ax)
		m := n + before + after
		y := make([]float64, outer*m*inner)
		for a := 0; a < outer; a++ {
			for i := 0; i < m; i++ {
				s := i - before
				inside := s >= 0 && s < n
				switch mode {
				case PadReflect:
					if s < 0 {
						s = -s
					} else if s >= n {
						s = 2*(n-1) - s
					}
				case PadReplicate:
					s = min(max(s, 0), n-1)
				}
				for c := 0; c < inner; c++ {
					if mode == PadConstant && !inside {
						y[(a*m+i)*inner+c] = value
					} else {
						y[(a*m+i)*inner+c] = float64(xs[(a*n+s)*inner+c])
					}
				}
			}
		}
		return y
	}
	near(t, "Pad constant", out["const"], ref(1, 2, 3, PadConstant, 0.5))
	near(t, "Pad reflect", out["reflect"], ref(1, 4, 3, PadReflect, 0))
	near(t, "Pad replicate", out["replicate"], ref(1, 3, 1, PadReplicate, 0))
	near(t, "Pad reflect last", out["last"], ref(2, 1, 2, PadReflect, 0))
}

func TestOpGatherRows(t *testing.T) {
	o := newOpTest(t, 15)
	const N, D = 6, 4
	table, ts := o.weight("table", N, D)
	idx := []int32{4, 0, 4, 5, 2}
	o.output("y", o.g.GatherRows(table, o.inputInt("idx", idx)), int64(len(idx)), D)
	out := o.run()
	var want []float64
	for _, i := range idx {
		want = append(want, f64(ts[int(i)*D:(int(i)+1)*D])...)
	}
	near(t, "GatherRows", out["y"], want)
}

func TestOpInterpLinear(t *testing.T) {
	o := newOpTest(t, 16)
	const R, T = 6, 5
	x, xs := o.input("x", 2, 3, T)
	ref := func(n int) []float64 {
		y := make([]float64, R*n)
		scale := float64(T) / float64(n)
		for r := 0; r < R; r++ {
			for i := 0; i < n; i++ {
				src := math.Max((float64(i)+0.5)*scale-0.5, 0)
				i0 := int(src)
				i1 := min(i0+1, T-1)
				l := src - float64(i0)
				y[r*n+i] = (1-l)*float64(xs[r*T+i0]) + l*float64(xs[r*T+i1])
			}
		}
		return y
	}
	for _, n := range []int64{9, 12, 3, 2, 1} {
		o.output(fmt.Sprint(n), o.g.InterpLinear(x, n), 2, 3, n)
	}
	out := o.run()
	for _, n := range []int{9, 12, 3, 2, 1} {
		near(t, fmt.Sprintf("InterpLinear %d→%d", T, n), out[fmt.Sprint(n)], ref(n))
	}
}

// ---- reductions, scans, gates ----

func TestOpReduceCumsum(t *testing.T) {
	o := newOpTest(t, 17)
	shape := []int64{2, 5, 3}
	x, xs := o.input("x", shape...)
	o.output("sum", o.g.Sum(x, 1), 2, 1, 3)
	o.output("mean", o.g.Mean(x, -2), 2, 1, 3)
	o.output("max", o.g.Max(x, 1), 2, 1, 3)
	o.output("var", o.g.Var(x, 1), 2, 1, 3)
	o.output("cumsum", o.g.Cumsum(x, 1), 2, 5, 3)
	o.output("sum0", o.g.Sum(x, 0), 1, 5, 3)
	out := o.run()
	red := func(ax int, f func(v []float64) float64) []float64 {
		outer, n, inner := splitAxis(shape, ax)
		y := make([]float64, outer*inner)
		v := make([]float64, n)
		for a := 0; a < outer; a++ {
			for c := 0; c < inner; c++ {
				for i := range v {
					v[i] = float64(xs[(a*n+i)*inner+c])
				}
				y[a*inner+c] = f(v)
			}
		}
		return y
	}
	sum := func(v []float64) float64 {
		s := 0.0
		for _, e := range v {
			s += e
		}
		return s
	}
	mean := func(v []float64) float64 { return sum(v) / float64(len(v)) }
	near(t, "Sum", out["sum"], red(1, sum))
	near(t, "Sum axis 0", out["sum0"], red(0, sum))
	near(t, "Mean", out["mean"], red(1, mean))
	near(t, "Max", out["max"], red(1, func(v []float64) float64 { return slices.Max(v) }))
	near(t, "Var", out["var"], red(1, func(v []float64) float64 {
		m, s := mean(v), 0.0
		for _, e := range v {
			s += (e - m) * (e - m)
		}
		return s / float64(len(v))
	}))
	cs := make([]float64, len(xs))
	for a := 0; a < 2; a++ {
		for c := 0; c < 3; c++ {
			s := 0.0
			for i := 0; i < 5; i++ {
				s += float64(xs[(a*5+i)*3+c])
				cs[(a*5+i)*3+c] = s
			}
		}
	}
	near(t, "Cumsum", out["cumsum"], cs)
}

func TestOpGLUSnakeWeightedSum(t *testing.T) {
	o := newOpTest(t, 18)
	x, xs := o.input("x", 2, 6, 3)
	o.output("glu1", o.g.GLU(x, 1), 2, 3, 3)
	y, ys := o.input("y", 2, 3, 4)
	o.output("glu2", o.g.GLU(y, -1), 2, 3, 2)
	alpha, as := o.weight("alpha", 3)
	beta, bs := o.weight("beta", 3)
	o.output("snake", o.g.SnakeBeta(y, alpha, beta), 2, 3, 4)
	z, zs := o.input("z", 2, 3, 4)
	u, us := o.input("u", 2, 3, 4)
	w := []float32{0.3, -1.2, 0.7}
	o.output("wsum", o.g.WeightedSum([]Tensor{y, z, u}, w), 2, 3, 4)
	out := o.run()
	glu1 := make([]float64, 18)
	for b := 0; b < 2; b++ {
		for c := 0; c < 3; c++ {
			for k := 0; k < 3; k++ {
				glu1[(b*3+c)*3+k] = float64(xs[(b*6+c)*3+k]) * sigmoid(float64(xs[(b*6+c+3)*3+k]))
			}
		}
	}
	glu2, snake, wsum := make([]float64, 12), make([]float64, 24), make([]float64, 24)
	for r := 0; r < 6; r++ {
		for k := 0; k < 2; k++ {
			glu2[r*2+k] = float64(ys[r*4+k]) * sigmoid(float64(ys[r*4+k+2]))
		}
	}
	for i, v := range ys {
		c := (i / 4) % 3
		e := float64(v)
		sn := math.Sin(e * math.Exp(float64(as[c])))
		snake[i] = e + sn*sn/(math.Exp(float64(bs[c]))+1e-9)
		wsum[i] = float64(w[0])*e + float64(w[1])*float64(zs[i]) + float64(w[2])*float64(us[i])
	}
	near(t, "GLU axis 1", out["glu1"], glu1)
	near(t, "GLU last axis", out["glu2"], glu2)
	near(t, "SnakeBeta", out["snake"], snake)
	near(t, "WeightedSum", out["wsum"], wsum)
}

// ---- elementwise ----

func TestOpUnary(t *testing.T) {
	o := newOpTest(t, 19)
	x, xs := o.input("x", 3, 7)
	p, ps := o.input("p", 3, 7) // positive, for log/sqrt/recip
	for i := range ps {
		ps[i] = float32(math.Abs(float64(ps[i]))) + 0.1
	}
	g := o.g
	cases := []struct {
		name string
		t    Tensor
		pos  bool
		f    func(float64) float64
	}{
		{"Neg", g.Neg(x), false, func(v float64) float64 { return -v }},
		{"Exp", g.Exp(x), false, math.Exp},
		{"Log", g.Log(p), true, math.Log},
		{"Sin", g.Sin(x), false, math.Sin},
		{"Cos", g.Cos(x), false, math.Cos},
		{"Sqrt", g.Sqrt(p), true, math.Sqrt},
		{"Tanh", g.Tanh(x), false, math.Tanh},
		{"Sigmoid", g.Sigmoid(x), false, sigmoid},
		{"ReLU", g.ReLU(x), false, func(v float64) float64 { return math.Max(v, 0) }},
		{"SiLU", g.SiLU(x), false, func(v float64) float64 { return v * sigmoid(v) }},
		{"Abs", g.Abs(x), false, math.Abs},
		{"Square", g.Square(x), false, func(v float64) float64 { return v * v }},
		{"Recip", g.Recip(p), true, func(v float64) float64 { return 1 / v }},
		{"GELU erf", g.GELU(x, false), false, func(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }},
		{"GELU tanh", g.GELU(x, true), false, func(v float64) float64 {
			return 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
		}},
		{"Clamp", g.Clamp(x, -0.3, 0.5), false, func(v float64) float64 {
			return math.Min(math.Max(v, float64(float32(-0.3))), float64(float32(0.5)))
		}},
		{"Scale", g.Scale(x, 1.7, -0.2), false, func(v float64) float64 {
			return float64(float32(1.7))*v + float64(float32(-0.2))
		}},
	}
	for _, c := range cases {
		o.output(c.name, c.t, 3, 7)
	}
	out := o.run()
	for _, c := range cases {
		src := xs
		if c.pos {
			src = ps
		}
		want := make([]float64, len(src))
		for i, v := range src {
			want[i] = c.f(float64(v))
		}
		near(t, c.name, out[c.name], want)
	}
}

func TestOpBinaryBroadcast(t *testing.T) {
	o := newOpTest(t, 20)
	a, as := o.input("a", 2, 3, 4)
	b, bs := o.input("b", 3, 1)
	for i := range bs {
		bs[i] += 3 // away from 0 for Div
	}
	g := o.g
	cases := []struct {
		name string
		t    Tensor
		f    func(x, y float64) float64
	}{
		{"Add", g.Add(a, b), func(x, y float64) float64 { return x + y }},
		{"Sub", g.Sub(a, b), func(x, y float64) float64 { return x - y }},
		{"Mul", g.Mul(a, b), func(x, y float64) float64 { return x * y }},
		{"Div", g.Div(a, b), func(x, y float64) float64 { return x / y }},
		{"Maximum", g.Maximum(a, b), math.Max},
		{"Minimum", g.Minimum(a, b), math.Min},
	}
	for _, c := range cases {
		o.output(c.name, c.t, 2, 3, 4)
	}
	// Broadcast on the left operand as well.
	o.output("SubLeft", g.Sub(b, a), 2, 3, 4)
	out := o.run()
	for _, c := range cases {
		want := make([]float64, len(as))
		for i, v := range as {
			want[i] = c.f(float64(v), float64(bs[(i/4)%3]))
		}
		near(t, c.name, out[c.name], want)
	}
	want := make([]float64, len(as))
	for i, v := range as {
		want[i] = float64(bs[(i/4)%3]) - float64(v)
	}
	near(t, "SubLeft", out["SubLeft"], want)
}

// ---- build errors ----

func TestOpBuildErrorsNameTheOp(t *testing.T) {
	cases := []struct {
		op    string
		build func(g *Graph)
	}{
		{"Conv1D", func(g *Graph) {
			x := g.Input("x", F32, 1, 4, 9)
			w := g.Input("w", F32, 6, 3, 3) // Cin/groups = 2 expected
			g.Conv1D(x, w, nil, 1, 0, 0, 1, 2)
		}},
		{"Conv1D", func(g *Graph) {
			x := g.Input("x", F32, 1, 4, 3)
			w := g.Input("w", F32, 4, 4, 3)
			g.Conv1D(x, w, nil, 1, 0, 0, 2, 1) // dilated kernel spans 5 > 3
		}},
		{"ConvTranspose1D", func(g *Graph) {
			x := g.Input("x", F32, 1, 4, 9)
			w := g.Input("w", F32, 3, 2, 3) // first axis must be Cin = 4
			g.ConvTranspose1D(x, w, nil, 2, 1, 0, 1, 1)
		}},
		{"ConvTranspose1D", func(g *Graph) {
			x := g.Input("x", F32, 1, 3, 9)
			w := g.Input("w", F32, 3, 2, 3)
			g.ConvTranspose1D(x, w, nil, 2, 1, 0, 1, 2) // 3 channels, 2 groups
		}},
		{"GroupNorm", func(g *Graph) {
			x := g.Input("x", F32, 1, 4, 5)
			b := g.Input("b", F32, 4)
			g.GroupNorm(x, 2, nil, &b, 1e-5) // a bias without a weight would be dropped
		}},
		{"Attention", func(g *Graph) {
			q := g.Input("q", F32, 1, 3, 4, 8) // 3 heads over 2 KV heads
			k := g.Input("k", F32, 1, 2, 5, 8)
			v := g.Input("v", F32, 1, 2, 5, 8)
			g.Attention(q, k, v, nil, nil, 0)
		}},
		{"Attention", func(g *Graph) {
			q := g.Input("q", F32, 1, 4, 4, 8)
			k := g.Input("k", F32, 1, 2, 5, 6) // head dim differs
			v := g.Input("v", F32, 1, 2, 5, 8)
			g.Attention(q, k, v, nil, nil, 0)
		}},
		{"Attention", func(g *Graph) {
			q := g.Input("q", F32, 1, 4, 4, 8)
			k := g.Input("k", F32, 1, 2, 5, 8)
			v := g.Input("v", F32, 1, 2, 5, 8)
			m := g.Input("m", F32, 1, 1, 4, 5)
			g.Attention(q, k, v, &m, nil, 0) // mask of rank > 2
		}},
	}
	for i, c := range cases {
		g := NewGraph("bad")
		g.Label("block.7")
		c.build(g)
		// Later ops must not replace the first error.
		g.Output("y", g.Neg(g.Input("z", F32, 2)))
		err := g.Err()
		if err == nil {
			t.Fatalf("case %d (%s): no error", i, c.op)
		}
		if msg := err.Error(); !strings.Contains(msg, c.op+"(") || !strings.Contains(msg, "block.7") {
			t.Errorf("case %d: error %q does not name %s and the label", i, msg, c.op)
		}
		cpu, cerr := NewCPU(1)
		if cerr != nil {
			t.Fatal(cerr)
		}
		if _, cerr = cpu.Compile(g); cerr == nil || !strings.Contains(cerr.Error(), c.op) {
			t.Errorf("case %d: Compile error %v does not name %s", i, cerr, c.op)
		}
		cpu.Close()
	}
}
