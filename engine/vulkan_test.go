package engine

import (
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/vulkan"
)

// vulkanBackend opens the first Vulkan device (lavapipe in CI); without one the test skips,
// unless VOXPIPE_REQUIRE_VULKAN is set (make test sets it).
func vulkanBackend(t *testing.T) *Vulkan {
	t.Helper()
	devs, err := vulkan.Devices()
	if err == nil && len(devs) == 0 {
		err = os.ErrNotExist
	}
	if err != nil {
		if os.Getenv("VOXPIPE_REQUIRE_VULKAN") != "" {
			t.Fatalf("Vulkan is required here (VOXPIPE_REQUIRE_VULKAN) but: %v", err)
		}
		t.Skipf("no Vulkan device: %v", err)
	}
	v, err := NewVulkan(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return v
}

// A graph of the ops with shaders (Linear with F32 weights and bias, GELU, a strided view,
// broadcast add, a contiguous copy, in-place elementwise steps) compiles on the Vulkan
// backend and gives the CPU backend's outputs within float32 rounding, run after run with
// new inputs.
func TestVulkanMatchesCPU(t *testing.T) {
	v := vulkanBackend(t)
	cpu, err := NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	const m, k, n = 7, 70, 40
	w, bias, scale := make([]float32, n*k), make([]float32, n), make([]float32, n)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * 0.2)
	}
	for i := range bias {
		bias[i], scale[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	build := func(b Backend) (Program, func()) {
		wb, err := Upload(b, "w", w, n, k)
		if err != nil {
			t.Fatal(err)
		}
		bb, _ := Upload(b, "bias", bias, n)
		sb, _ := Upload(b, "scale", scale, n)
		g := NewGraph("vulkan-vs-cpu")
		g.Label("block")
		x := g.Input("x", F32, m, k)
		r := g.Input("r", F32, n, m)
		bt := g.Persistent(bb)
		h := g.Linear(x, g.Persistent(wb), &bt)                  // [m, n]
		h = g.GELU(h, false)                                     // in place
		h = g.Add(h, g.Transpose(r, 0, 1))                       // a strided view
		h = g.Mul(h, g.Persistent(sb))                           // broadcast over rows
		y := g.Contiguous(g.Transpose(g.Reshape(h, m, n), 0, 1)) // [n, m] copy
		g.Output("y", y)
		g.Output("h", h)
		prog, err := b.Compile(g)
		if err != nil {
			t.Fatalf("%s: %v", b.Name(), err)
		}
		return prog, func() { prog.Close(); wb.Free(); bb.Free(); sb.Free() }
	}
	vp, vclose := build(v)
	defer vclose()
	cp, cclose := build(cpu)
	defer cclose()
	for run := range 3 {
		for _, p := range []Program{vp, cp} {
			x, r := p.Input("x"), p.Input("r")
			rr := rand.New(rand.NewPCG(uint64(run), 1))
			for i := range x {
				x[i] = float32(rr.NormFloat64())
			}
			for i := range r {
				r[i] = float32(rr.NormFloat64())
			}
			if err := p.Run(); err != nil {
				t.Fatal(err)
			}
		}
		for _, out := range []string{"y", "h"} {
			got, want := vp.Output(out), cp.Output(out)
			if len(got) != len(want) || len(got) == 0 {
				t.Fatalf("%s: %d values on Vulkan, %d on the CPU", out, len(got), len(want))
			}
			for i := range want {
				if d := math.Abs(float64(got[i] - want[i])); d > 2e-5*math.Max(1, math.Abs(float64(want[i]))) {
					t.Fatalf("run %d: %s[%d] = %v on Vulkan, %v on the CPU", run, out, i, got[i], want[i])
				}
			}
		}
	}
	if st := vp.Stats(); st.Nodes == 0 || st.IOBytes == 0 {
		t.Errorf("stats %+v", st)
	}
}

// What the Vulkan backend cannot run yet is a compile error naming the op and the label;
// buffers of another backend and encodings without shaders are refused by name.
func TestVulkanRefuses(t *testing.T) {
	v := vulkanBackend(t)
	g := NewGraph("norm")
	g.Label("encoder.norm")
	x := g.Input("x", F32, 4, 8)
	g.Output("y", g.LayerNorm(x, nil, nil, 1e-5))
	if _, err := v.Compile(g); err == nil || !strings.Contains(err.Error(), "LayerNorm") || !strings.Contains(err.Error(), "encoder.norm") {
		t.Errorf("LayerNorm on Vulkan: %v", err)
	}
	host, _ := NewBuffer("host_w", F32, 8, 8)
	defer host.Free()
	g2 := NewGraph("host")
	g2.Output("y", g2.Linear(g2.Input("x", F32, 2, 8), g2.Persistent(host), nil))
	if _, err := v.Compile(g2); err == nil || !strings.Contains(err.Error(), "host_w") {
		t.Errorf("a host buffer on Vulkan: %v", err)
	}
	if _, err := v.Alloc("q", Q8_0, 4, 32); err == nil || !strings.Contains(err.Error(), "Q8_0") {
		t.Errorf("a Q8_0 buffer on Vulkan: %v", err)
	}
}
