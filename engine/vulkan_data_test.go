package engine

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// dmFill gives every F32 input normal values around 0.5 and every I32 input small integers,
// alike for each backend (seeded by the input's name).
func dmFill(name string, f []float32, i []int32) {
	rng := rand.New(rand.NewPCG(41, uint64(len(name))*7919+uint64(name[len(name)-1])))
	for k := range f {
		f[k] = float32(rng.NormFloat64() + 0.5)
	}
	for k := range i {
		i[k] = int32(rng.IntN(200)) - 100
	}
}

// dmProgram compiles g on b and runs it once with dmFill's inputs.
func dmProgram(t *testing.T, b Backend, g *Graph) Program {
	t.Helper()
	p, err := b.Compile(g)
	if err != nil {
		t.Fatalf("%s: %v", b.Name(), err)
	}
	t.Cleanup(p.Close)
	for name, id := range g.inputs {
		if g.tensors[id].dtype == I32 {
			dmFill(name, nil, p.InputInt32(name))
		} else {
			dmFill(name, p.Input(name), nil)
		}
	}
	if err := p.Run(); err != nil {
		t.Fatalf("%s: %v", b.Name(), err)
	}
	return p
}

// dmSame checks output o of got (Vulkan) against want (CPU): bit for bit when exact (data
// movement, I32 words), else within tol·max(1, |cpu|).
func dmSame(t *testing.T, o string, got, want Program, exact bool, tol float64) {
	t.Helper()
	g, w := got.Output(o), want.Output(o)
	if len(w) == 0 || len(g) != len(w) {
		t.Fatalf("%s: %d values on Vulkan, %d on the CPU", o, len(g), len(w))
	}
	for i := range w {
		if exact {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				t.Fatalf("%s[%d] = %v (%#x) on Vulkan, %v (%#x) on the CPU", o, i, g[i], math.Float32bits(g[i]), w[i], math.Float32bits(w[i]))
			}
			continue
		}
		gv, wv := float64(g[i]), float64(w[i])
		if math.IsNaN(gv) || math.Abs(gv-wv) > tol*math.Max(1, math.Abs(wv)) {
			t.Fatalf("%s[%d] = %v on Vulkan, %v on the CPU", o, i, gv, wv)
		}
	}
}

// Pad (every mode, on every axis, of a transposed input, of I32 values with an integer
// fill), InterpLinear up and down, Sum/Mean/Max/Var on every axis and over 3000 values,
// Cumsum on a middle, last and long axis, over 5 contiguous axes, and a chain of them, on
// Vulkan as on the CPU: data movement bit for bit, arithmetic within 1e-5·max(1, |cpu|) (the
// CPU sums in double, the shaders in fp32).
func TestVulkanPadInterpReduceCumsum(t *testing.T) {
	v := vulkanBackend(t)
	cpu, err := NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	exact := map[string]bool{}
	var outs []string
	build := func() *Graph {
		g := NewGraph("data")
		out := func(name string, y Tensor, bits bool) {
			g.Output(name, y)
			if len(outs) < len(g.outputs) {
				outs = append(outs, name)
				exact[name] = bits
			}
		}
		x := g.Input("x", F32, 3, 40, 7)
		xl := g.Input("xl", F32, 2, 3000)
		x5 := g.Input("x5", F32, 2, 3, 2, 5, 4)
		ints := g.Input("ints", I32, 2, 9)
		out("pad0", g.Pad(x, 0, 2, 1, PadReflect, 0), true)
		out("pad1", g.Pad(x, 1, 3, 5, PadConstant, 0.5), true)
		out("pad2", g.Pad(x, -1, 4, 2, PadReplicate, 0), true)
		out("padT", g.Pad(g.Transpose(x, 1, 2), 1, 6, 6, PadReflect, 0), true)
		out("pad5", g.Pad(x5, 3, 4, 4, PadReflect, 0), true)
		out("padI", g.Pad(ints, 1, 1, 2, PadConstant, -3), true)
		out("up", g.InterpLinear(x, 100), false)
		out("down", g.InterpLinear(x, 13), false)
		for ax := range 3 {
			s := string(rune('0' + ax))
			out("sum"+s, g.Sum(x, ax), false)
			out("mean"+s, g.Mean(x, ax), false)
			out("max"+s, g.Max(x, ax), true)
			out("var"+s, g.Var(x, ax), false)
			out("cum"+s, g.Cumsum(x, ax), false)
		}
		out("suml", g.Sum(xl, 1), false)
		out("varl", g.Var(xl, -1), false)
		out("maxl", g.Max(xl, 1), true)
		out("cuml", g.Cumsum(xl, 1), false)
		out("sum5", g.Sum(x5, 3), false)
		out("var5", g.Var(x5, 0), false)
		out("cum5", g.Cumsum(x5, 3), false)
		// A chain: each op reads what the one before wrote.
		h := g.InterpLinear(g.Pad(x, -1, 3, 3, PadReplicate, 0), 20)
		out("chain", g.Mean(g.Cumsum(h, 1), 2), false)
		return g
	}
	cp := dmProgram(t, cpu, build())
	vp := dmProgram(t, v, build())
	for _, o := range outs {
		dmSame(t, o, vp, cp, exact[o], 1e-5)
	}
}

// dmTable is a persistent F32 buffer on a holding i%11 − 5 at value i.
func dmTable(t *testing.T, a Allocator, name string, shape ...int64) *Buffer {
	t.Helper()
	vals := make([]float32, numel(shape))
	for i := range vals {
		vals[i] = float32(i%11) - 5
	}
	b, err := Upload(a, name, vals, shape...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Free)
	return b
}

// ScatterRows as KV-cache writes at run-time positions: a persistent cache with heads
// [2, 6, 3] and one without [8, 4] written through a view (rows 2..7), each run at new
// positions; the cache is copied to an output after the write in the same program and read
// back from the device between runs. Vulkan and the CPU hold the same values bit for bit,
// and earlier runs' rows persist.
func TestVulkanScatterRowsKVCache(t *testing.T) {
	v := vulkanBackend(t)
	cpu, err := NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	type side struct {
		p       Program
		kv, tab *Buffer
	}
	var sides []side
	for _, b := range []Backend{cpu, v} {
		kv, tab := dmTable(t, b, "kv", 2, 6, 3), dmTable(t, b, "tab", 8, 4)
		g := NewGraph("kv")
		rows := g.Input("rows", F32, 2, 2, 3)
		pos := g.Input("pos", I32, 2)
		rows2 := g.Input("rows2", F32, 3, 4)
		pos2 := g.Input("pos2", I32, 3)
		cache := g.Persistent(kv)
		g.ScatterRows(cache, g.Scale(rows, 2, 0), pos)
		g.ScatterRows(g.Slice(g.Persistent(tab), 0, 2, 8), rows2, pos2)
		g.Output("kv", cache)                              // a copy after the write
		g.Output("sum", g.Sum(g.Reshape(cache, 2, 18), 1)) // reads the cache after the write
		p, err := b.Compile(g)
		if err != nil {
			t.Fatalf("%s: %v", b.Name(), err)
		}
		t.Cleanup(p.Close)
		sides = append(sides, side{p, kv, tab})
	}
	steps := []struct{ pos, pos2 []int32 }{
		{[]int32{0, 1}, []int32{5, 0, 3}},
		{[]int32{4, 2}, []int32{1, 4, 2}},
		{[]int32{5, 3}, []int32{3, 1, 0}},
		{[]int32{1, 0}, []int32{2, 1, 4}},
	}
	for step, s := range steps {
		for _, sd := range sides {
			for name, seed := range map[string]uint64{"rows": 1, "rows2": 2} {
				rng := rand.New(rand.NewPCG(uint64(step), seed))
				f := sd.p.Input(name)
				for i := range f {
					f[i] = float32(rng.NormFloat64())
				}
			}
			copy(sd.p.InputInt32("pos"), s.pos)
			copy(sd.p.InputInt32("pos2"), s.pos2)
			if err := sd.p.Run(); err != nil {
				t.Fatal(err)
			}
		}
		dmSame(t, "kv", sides[1].p, sides[0].p, true, 0)
		dmSame(t, "sum", sides[1].p, sides[0].p, false, 1e-5)
		for _, name := range []string{"kv", "tab"} {
			var vals [2][]float32
			for i, sd := range sides {
				b := sd.kv
				if name == "tab" {
					b = sd.tab
				}
				if vals[i], err = b.Values(); err != nil {
					t.Fatal(err)
				}
			}
			for i := range vals[0] {
				if vals[0][i] != vals[1][i] {
					t.Fatalf("step %d: %s[%d] = %v on Vulkan, %v on the CPU", step, name, i, vals[1][i], vals[0][i])
				}
			}
		}
	}
	// Rows 0 and 1 of the viewed table are outside the view: never written. Row 2+5 was
	// written at step 0 and never after: it still holds that step's values.
	tab, _ := sides[1].tab.Values()
	for i := range 8 {
		if tab[i] != float32(i%11)-5 {
			t.Fatalf("table row %d outside the view changed: %v", i/4, tab[:8])
		}
	}
	rng := rand.New(rand.NewPCG(0, 2))
	first := make([]float32, 12)
	for i := range first {
		first[i] = float32(rng.NormFloat64())
	}
	for j := range 4 {
		if got := tab[(2+5)*4+j]; got != first[j] {
			t.Fatalf("table row 7 (written at step 0) = %v, want %v", tab[28:32], first[:4])
		}
	}
}

// What the data lowerings cannot run is a compile error naming the op and the encoding:
// InterpLinear of I32 values.
func TestVulkanPadInterpRefuse(t *testing.T) {
	v := vulkanBackend(t)
	g := NewGraph("refuse")
	g.Label("frontend.resample")
	g.Output("y", g.InterpLinear(g.Input("ints", I32, 2, 9), 4))
	if _, err := v.Compile(g); err == nil || !strings.Contains(err.Error(), "InterpLinear") || !strings.Contains(err.Error(), "I32") {
		t.Errorf("InterpLinear of I32 on Vulkan: %v", err)
	}
}
