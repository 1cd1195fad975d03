package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/internal/vulkantest"
	"github.com/voxpipe/voxpipe/vulkan"
)

// vulkanBackend opens the first Vulkan device (lavapipe in CI); without one the test skips,
// unless VOXPIPE_REQUIRE_VULKAN is set (make test sets it).
func vulkanBackend(t *testing.T) *Vulkan {
	t.Helper()
	vulkantest.Require(t)
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
	// Compiled once, run 1 000 times: the same inputs give the same bits every time (the
	// recorded command buffer is replayed; its arena and persistent weights are reused), the
	// outputs cleared before each run.
	first := map[string][]float32{"y": slices.Clone(vp.Output("y")), "h": slices.Clone(vp.Output("h"))}
	for run := range 1000 {
		for out := range first {
			clear(vp.Output(out)) // each run must write them again
		}
		if err := vp.Run(); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		for out, want := range first {
			if got := vp.Output(out); !slices.Equal(got, want) {
				t.Fatalf("run %d of the same inputs: %s differs from the first run", run, out)
			}
		}
	}
}

// What the Vulkan backend cannot run is a compile error naming the op and the label (here
// a strided view of 5 axes: the shaders take 4); buffers of another backend and encodings
// without shaders are refused by name.
func TestVulkanRefuses(t *testing.T) {
	v := vulkanBackend(t)
	g := NewGraph("five")
	g.Label("decoder.permute")
	x := g.Input("x", F32, 2, 3, 2, 3, 2)
	g.Output("y", g.Contiguous(g.Transpose(x, 0, 4)))
	if _, err := v.Compile(g); err == nil || !strings.Contains(err.Error(), "Copy") || !strings.Contains(err.Error(), "decoder.permute") {
		t.Errorf("a 5-axis copy on Vulkan: %v", err)
	}
	host, _ := NewBuffer("host_w", F32, 8, 8)
	defer host.Free()
	g2 := NewGraph("host")
	g2.Output("y", g2.Linear(g2.Input("x", F32, 2, 8), g2.Persistent(host), nil))
	if _, err := v.Compile(g2); err == nil || !strings.Contains(err.Error(), "host_w") {
		t.Errorf("a host buffer on Vulkan: %v", err)
	}
	if _, err := v.Alloc("q", Q8_0R8, 8, 32); err == nil || !strings.Contains(err.Error(), "Q8_0R8") {
		t.Errorf("a Q8_0R8 buffer on Vulkan: %v", err)
	}
}

// compareBackends builds a graph on the CPU and on Vulkan with the same inputs (fill) and
// checks every output within tol relative (and 1e-6 absolute).
func compareBackends(t *testing.T, v *Vulkan, build func(b Backend, g *Graph) func(), fill func(name string, f []float32, i []int32), outs []string, tol float64) {
	t.Helper()
	cpu, err := NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	var progs []Program
	for _, b := range []Backend{cpu, v} {
		g := NewGraph("compare")
		free := build(b, g)
		defer free()
		p, err := b.Compile(g)
		if err != nil {
			t.Fatalf("%s: %v", b.Name(), err)
		}
		defer p.Close()
		for name, id := range g.inputs {
			if g.tensors[id].dtype == I32 {
				fill(name, nil, p.InputInt32(name))
			} else {
				fill(name, p.Input(name), nil)
			}
		}
		if err := p.Run(); err != nil {
			t.Fatalf("%s: %v", b.Name(), err)
		}
		progs = append(progs, p)
	}
	for _, o := range outs {
		want, got := progs[0].Output(o), progs[1].Output(o)
		if len(want) == 0 || len(got) != len(want) {
			t.Fatalf("%s: %d values on Vulkan, %d on the CPU", o, len(got), len(want))
		}
		for i := range want {
			w, g := float64(want[i]), float64(got[i])
			if math.IsNaN(g) || math.Abs(g-w) > tol*math.Abs(w)+1e-6 {
				t.Fatalf("%s[%d] = %v on Vulkan, %v on the CPU", o, i, g, w)
			}
		}
	}
}

// Every unary and binary op on Vulkan against the CPU backend: unary ops on a strided
// (transposed) view, binary ops between that view and a broadcast row or a contiguous
// operand. Log, Sqrt, Recip and Div get positive operands. Tolerance 2e-5 relative (the
// shaders' exp, tanh and sin differ from the CPU's in the last bits).
func TestVulkanElementwiseMatchCPU(t *testing.T) {
	v := vulkanBackend(t)
	const rows, cols = 7, 33
	unary := []string{"neg", "exp", "log", "sin", "cos", "sqrt", "tanh", "sigmoid", "relu", "silu",
		"abs", "square", "recip", "gelu", "gelu_tanh", "clamp", "scale"}
	binary := []string{"add", "sub", "mul", "div", "max", "min"}
	outs := slices.Clone(unary)
	for _, b := range binary {
		outs = append(outs, b+"_row", b+"_full")
	}
	compareBackends(t, v, func(be Backend, g *Graph) func() {
		xt := g.Transpose(g.Input("x", F32, rows, cols), 0, 1) // [cols, rows], strided
		row := g.Input("row", F32, 1, rows)                    // broadcast over xt's rows
		full := g.Input("full", F32, cols, rows)
		pos := g.Scale(g.Abs(xt), 1, 0.1)
		un := map[string]Tensor{
			"neg": g.Neg(xt), "exp": g.Exp(xt), "log": g.Log(pos), "sin": g.Sin(xt), "cos": g.Cos(xt),
			"sqrt": g.Sqrt(pos), "tanh": g.Tanh(xt), "sigmoid": g.Sigmoid(xt), "relu": g.ReLU(xt),
			"silu": g.SiLU(xt), "abs": g.Abs(xt), "square": g.Square(xt), "recip": g.Recip(pos),
			"gelu": g.GELU(xt, false), "gelu_tanh": g.GELU(xt, true), "clamp": g.Clamp(xt, -0.5, 0.7),
			"scale": g.Scale(xt, -1.5, 0.25),
		}
		bin := map[string]func(a, b Tensor) Tensor{
			"add": g.Add, "sub": g.Sub, "mul": g.Mul, "div": g.Div, "max": g.Maximum, "min": g.Minimum,
		}
		for _, name := range unary {
			g.Output(name, un[name])
		}
		for _, name := range binary {
			r, f := row, full
			if name == "div" { // positive divisors
				r, f = g.Scale(g.Abs(row), 1, 0.5), g.Scale(g.Abs(full), 1, 0.5)
			}
			g.Output(name+"_row", bin[name](xt, r))
			g.Output(name+"_full", bin[name](xt, f))
		}
		return func() {}
	}, randomFill(21), outs, 2e-5)
}

// Matmul on Vulkan against the CPU backend with strided operands that are not broadcast:
// a transposed a, a b whose batch axes are permuted, and both batched.
func TestVulkanMatmulStridedMatchCPU(t *testing.T) {
	v := vulkanBackend(t)
	const batch, m, k, n = 3, 5, 37, 11
	compareBackends(t, v, func(be Backend, g *Graph) func() {
		at := g.Transpose(g.Input("a_km", F32, k, m), 0, 1)          // [m, k], strided
		b := g.Input("b", F32, k, n)                                 // [k, n]
		ab := g.Permute(g.Input("a_bkm", F32, k, batch, m), 1, 2, 0) // [batch, m, k], strided
		bb := g.Transpose(g.Input("b_bnk", F32, batch, n, k), 1, 2)  // [batch, k, n], strided
		g.Output("y2", g.Matmul(at, b))
		g.Output("y3", g.Matmul(ab, bb))
		return func() {}
	}, randomFill(31), []string{"y2", "y3"}, 2e-5)
}

func randomFill(seed uint64) func(string, []float32, []int32) {
	return func(name string, f []float32, _ []int32) {
		rng := rand.New(rand.NewPCG(seed, uint64(len(name))))
		for i := range f {
			f[i] = float32(rng.NormFloat64())
		}
	}
}

// Norms and softmax: LayerNorm with weight and bias, without affine, RMSNorm with weight,
// softmax with a scale and a broadcast mask holding −∞ (one row masked out entirely).
func TestVulkanNormsAndSoftmax(t *testing.T) {
	v := vulkanBackend(t)
	const rows, n = 6, 300
	w, b := make([]float32, n), make([]float32, n)
	for i := range w {
		w[i], b[i] = 1+float32(i%7)/10, float32(i%5)/10-0.2
	}
	fill := func(name string, f []float32, i []int32) {
		randomFill(3)(name, f, i)
		if name == "mask" {
			for j := range f {
				if j%n%3 == 0 || j/n == 2 {
					f[j] = float32(math.Inf(-1))
				}
			}
		}
	}
	compareBackends(t, v, func(be Backend, g *Graph) func() {
		wb, _ := Upload(be, "w", w, n)
		bb, _ := Upload(be, "b", b, n)
		x := g.Input("x", F32, 2, rows/2, n)
		mask := g.Input("mask", F32, rows/2, n)
		wt, bt := g.Persistent(wb), g.Persistent(bb)
		g.Output("ln", g.LayerNorm(x, &wt, &bt, 1e-5))
		g.Output("ln0", g.LayerNorm(x, nil, nil, 1e-6))
		g.Output("rms", g.RMSNorm(x, &wt, 1e-6))
		g.Output("sm", g.Softmax(x, &mask, 0.7))
		return func() { wb.Free(); bb.Free() }
	}, fill, []string{"ln", "ln0", "rms", "sm"}, 2e-5)
}

// An attention block as the models build it: RoPE on q and k (both pair layouts, positions
// in the thousands), k and v concatenated after a cache along time, grouped-query attention
// with a mask (−∞ entries, one query row masked out) and a per-head bias, through strided
// views (permuted heads); with a short cache (one block of keys) and a long one (three
// blocks, one row's first block masked out entirely).
func TestVulkanAttentionBlock(t *testing.T) {
	v := vulkanBackend(t)
	const H, Hk, Tq, D = 4, 2, 9, 32
	for _, c := range []struct{ Tc, mode int }{{5, RoPEInterleaved}, {5, RoPEHalf}, {150, RoPEHalf}} {
		Tc, mode := int64(c.Tc), c.mode
		Tk := Tc + Tq
		fill := func(name string, f []float32, p []int32) {
			randomFill(uint64(5+mode))(name, f, p)
			switch name {
			case "qpos":
				for i := range p {
					p[i] = int32(3000 + int(Tc) + i)
				}
			case "kpos":
				for i := range p {
					p[i] = int32(3000 + i)
				}
			case "mask":
				for j := range f {
					row, key := j/int(Tk), j%int(Tk)
					if key > int(Tc)+row || row == 4 || row == 2 && key < 70 {
						f[j] = float32(math.Inf(-1))
					}
				}
			}
		}
		compareBackends(t, v, func(be Backend, g *Graph) func() {
			x := g.Input("x", F32, Tq, H*D)    // a layer's q projection, time-major
			kv := g.Input("kv", F32, Tq, Hk*D) // and its k/v projection
			ck := g.Input("cache_k", F32, 1, Hk, Tc, D)
			cv := g.Input("cache_v", F32, 1, Hk, Tc, D)
			qpos := g.Input("qpos", I32, Tq)
			kpos := g.Input("kpos", I32, Tk)
			mask := g.Input("mask", F32, Tq, Tk)
			bias := g.Input("bias", F32, H, Tq, Tk)
			heads := func(t Tensor, h int64) Tensor { return g.Permute(g.Reshape(t, 1, Tq, h, D), 0, 2, 1, 3) }
			q := g.RoPE(heads(x, H), qpos, D, mode, 10000)
			k := g.Concat(2, ck, heads(kv, Hk))
			vv := g.Concat(2, cv, heads(g.Scale(kv, -0.5, 0.1), Hk))
			k = g.RoPE(k, kpos, D/2, mode, 10000)
			a := g.Attention(q, k, vv, &mask, &bias, 0)
			g.Output("q", q)
			g.Output("k", k)
			g.Output("att", g.Reshape(g.Permute(a, 0, 2, 1, 3), Tq, H*D))
			return func() {}
		}, fill, []string{"q", "k", "att"}, 3e-5)
	}
}

// With timestamps enabled, a profile of Vulkan runs gives each kind of op its calls and
// device time, and per op and shapes; without StartProfile nothing is collected.
func TestVulkanProfile(t *testing.T) {
	v := vulkanBackend(t)
	if !v.dev.Timestamps() {
		t.Skip("no timestamps on this device")
	}
	v.EnableTimestamps()
	g := NewGraph("profiled")
	x := g.Input("x", F32, 64, 256)
	h := g.Softmax(g.GELU(x, false), nil, 1)
	g.Output("y", g.Add(h, x))
	p, err := v.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(); err != nil { // not profiled
		t.Fatal(err)
	}
	v.StartProfile()
	for range 3 {
		if err := p.Run(); err != nil {
			t.Fatal(err)
		}
	}
	ops, shapes := v.StopProfile()
	calls := map[string]int64{}
	for _, o := range ops {
		calls[o.Op] = o.Calls
		if o.Time <= 0 {
			t.Errorf("%s: time %v", o.Op, o.Time)
		}
	}
	if calls["Softmax"] != 3 || calls["Binary"] != 3 || calls["Unary"] != 3 {
		t.Errorf("calls by op %v, want 3 each of Unary, Softmax, Binary", calls)
	}
	if len(shapes) != 3 || shapes[0].In0 == nil {
		t.Errorf("by shape: %+v", shapes)
	}
}

// Device buffers are written and read back at any byte offset and length: bytes that share a
// word with the range are kept (quantised rows are not word-aligned).
func TestVulkanBufferReadWrite(t *testing.T) {
	v := vulkanBackend(t)
	b, err := v.Alloc("b", F32, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	want := make([]byte, 40)
	for i := range want {
		want[i] = byte(i + 1)
	}
	if err := b.Write(0, want); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ off, n int }{{5, 7}, {0, 3}, {37, 3}, {12, 8}, {1, 1}} {
		p := make([]byte, c.n)
		for i := range p {
			p[i] = byte(200 + i)
		}
		if err := b.Write(int64(c.off), p); err != nil {
			t.Fatal(err)
		}
		copy(want[c.off:], p)
		got := make([]byte, 40)
		if err := b.Read(0, got); err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("after writing %d bytes at %d: %v, want %v", c.n, c.off, got, want)
		}
		part := make([]byte, c.n)
		if err := b.Read(int64(c.off), part[:c.n]); err != nil || string(part[:c.n]) != string(p) {
			t.Fatalf("read of %d bytes at %d: %v (%v), want %v", c.n, c.off, part[:c.n], err, p)
		}
	}
	if err := b.Write(38, make([]byte, 3)); err == nil {
		t.Error("write past the end: no error")
	}
	if err := b.Read(-1, make([]byte, 2)); err == nil {
		t.Error("read before the start: no error")
	}
	vals, err := b.Values()
	if err != nil || len(vals) != 10 {
		t.Errorf("Values: %d values, %v", len(vals), err)
	}
}

// A run the driver fails comes back as an error naming the program (its graph) and the
// device, ErrDeviceLost when the device is lost; the program's later runs fail at once.
func TestVulkanRunErrorNamesProgram(t *testing.T) {
	v := vulkanBackend(t)
	g := NewGraph("probe.step")
	g.Output("y", g.Abs(g.Input("x", F32, 4)))
	p, err := v.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Run(); err != nil {
		t.Fatal(err)
	}
	v.dev.InjectSubmitResult(-4) // VK_ERROR_DEVICE_LOST
	err = p.Run()
	if err == nil || !errors.Is(err, vulkan.ErrDeviceLost) || !strings.Contains(err.Error(), "probe.step") || !strings.Contains(err.Error(), v.dev.Info.Name) {
		t.Fatalf("a run on a lost device: %v", err)
	}
	if err := p.Run(); !errors.Is(err, vulkan.ErrDeviceLost) {
		t.Fatalf("the next run: %v", err)
	}
}

// Closing the backend before what was made on it (a model closed after its backend, as a
// test's cleanups may order them) frees all of it: closing a program or freeing a buffer
// afterwards does nothing, running or reading one is an error, and nothing new is made.
func TestVulkanClosedBeforeItsPrograms(t *testing.T) {
	vulkantest.Require(t)
	v, err := NewVulkan(0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := Upload(v, "w", []float32{1, -2, 3, -4}, 4)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGraph("close.probe")
	g.Output("y", g.Add(g.Input("x", F32, 4), g.Persistent(w)))
	p, err := v.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(); err != nil {
		t.Fatal(err)
	}
	if dev, _ := v.dev.MemoryInUse(); dev == 0 {
		t.Fatal("no device memory in use before the close")
	}
	v.Close()
	if dev, host := v.dev.MemoryInUse(); dev != 0 || host != 0 {
		t.Errorf("after the close: %d bytes of device memory and %d of host memory still counted", dev, host)
	}
	if err := p.Run(); err == nil {
		t.Error("a run after the close: no error")
	}
	p.Close()
	w.Free()
	if _, err := v.Alloc("late", F32, 4); !errors.Is(err, vulkan.ErrClosed) {
		t.Errorf("an allocation after the close: %v", err)
	}
	if _, err := v.Compile(g); err == nil {
		t.Error("a compile after the close: no error")
	}
	v.Close() // twice: nothing
}
