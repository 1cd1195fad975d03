package engine

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

// convWeights uploads random values (normal·scale, one stream per name) as a persistent
// buffer of shape.
func convWeights(t *testing.T, be Backend, name string, scale float64, shape ...int64) *Buffer {
	t.Helper()
	seed := uint64(0)
	for _, c := range name {
		seed = seed*131 + uint64(c)
	}
	rng := rand.New(rand.NewPCG(31, seed))
	v := make([]float32, numel(shape))
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	b, err := Upload(be, name, v, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Conv1D (groups, stride, dilation, asymmetric padding, bias) on a transposed input view,
// causal Conv1D without bias on a time slice, a depthwise Conv1D, ConvTranspose1D (groups,
// stride 4, padding, output padding, bias) of a conv's output, and Conv2D (groups, strides,
// padding, bias, a transposed weight the builder copies) on a sliced input give on Vulkan
// the CPU backend's outputs within 2e-5 of each output's largest magnitude (the backends sum
// in different orders).
func TestVulkanConvMatchesCPU(t *testing.T) {
	v := vulkanBackend(t)
	cpu, err := NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	const B, Cin, Cout, T = 2, 6, 9, 37
	var progs []Program
	for _, be := range []Backend{cpu, v} {
		var bufs []*Buffer
		w := func(name string, scale float64, shape ...int64) *Buffer {
			b := convWeights(t, be, name, scale, shape...)
			bufs = append(bufs, b)
			return b
		}
		g := NewGraph("conv")
		g.Label("conv")
		x := g.Transpose(g.Input("x_tc", F32, B, T, Cin), 1, 2) // [B, Cin, T], strided
		b1 := g.Persistent(w("c1.bias", 1, Cout))
		h := g.Conv1D(x, g.Persistent(w("c1.weight", 0.3, Cout, Cin/3, 5)), &b1, 2, 3, 1, 2, 3)
		g.Output("conv1d", h)
		causal := g.Conv1D(g.Slice(x, 2, 4, T), g.Persistent(w("c2.weight", 0.3, Cout, Cin, 3)), nil, 1, 2, 0, 1, 1)
		g.Output("causal", causal)
		dw := g.Conv1D(x, g.Persistent(w("dw.weight", 0.3, 2*Cin, 1, 7)), nil, 1, 3, 3, 1, Cin)
		g.Output("depthwise", dw)
		bt := g.Persistent(w("up.bias", 1, 6))
		up := g.ConvTranspose1D(h, g.Persistent(w("up.weight", 0.3, Cout, 2, 8)), &bt, 4, 2, 1, 1, 3)
		g.Output("convt1d", up)
		x2 := g.Slice(g.Input("x2", F32, B, Cin, 11, 16), 3, 1, 14) // [B, Cin, 11, 13], strided
		b2 := g.Persistent(w("c3.bias", 1, Cout))
		w2 := g.Transpose(g.Persistent(w("c3.weight", 0.3, Cout, Cin/3, 5, 3)), 2, 3) // [Cout, 2, 3, 5]
		g.Output("conv2d", g.Conv2D(x2, w2, &b2, 2, 1, 1, 2, 3))
		p, err := be.Compile(g)
		if err != nil {
			t.Fatalf("%s: %v", be.Name(), err)
		}
		defer p.Close()
		defer func() {
			for _, b := range bufs {
				b.Free()
			}
		}()
		for _, name := range []string{"x_tc", "x2"} {
			rng := rand.New(rand.NewPCG(33, uint64(len(name))))
			f := p.Input(name)
			for i := range f {
				f[i] = float32(rng.NormFloat64())
			}
		}
		if err := p.Run(); err != nil {
			t.Fatalf("%s: %v", be.Name(), err)
		}
		progs = append(progs, p)
	}
	for _, o := range []string{"conv1d", "causal", "depthwise", "convt1d", "conv2d"} {
		want, got := progs[0].Output(o), progs[1].Output(o)
		if len(want) == 0 || len(got) != len(want) {
			t.Fatalf("%s: %d values on Vulkan, %d on the CPU", o, len(got), len(want))
		}
		scale := 0.0
		for _, w := range want {
			scale = math.Max(scale, math.Abs(float64(w)))
		}
		for i := range want {
			w, g := float64(want[i]), float64(got[i])
			if math.IsNaN(g) || math.Abs(g-w) > 2e-5*scale {
				t.Fatalf("%s[%d] = %v on Vulkan, %v on the CPU (scale %v)", o, i, g, w, scale)
			}
		}
	}
}

// A conv lowering names what it cannot run: a weight in another encoding than F32.
func TestVulkanConvRefusesF16(t *testing.T) {
	x := vulkan.Tensor{Shape: []int64{1, 4, 8}, Stride: []int64{32, 8, 1}}
	n := vulkanNode{IP: [8]int64{1, 0, 0, 1, 1}, Src: []vulkan.Tensor{x, x}, SrcType: []DType{F32, F16}, Dst: x, DstType: F32}
	for _, op := range []cgo.Op{cgo.OpConv1D, cgo.OpConv2D, cgo.OpConvTranspose1D} {
		_, err := vulkanLowerings[op](n)
		if err == nil || !strings.Contains(err.Error(), "on a F16 weight") || !strings.Contains(err.Error(), opName(op)) {
			t.Errorf("%s with an F16 weight: %v", opName(op), err)
		}
	}
}
