package engine

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/ggufpack"
	"github.com/voxpipe/voxpipe/internal/q8test"
	"github.com/voxpipe/voxpipe/vulkan"
)

// lqEncode encodes v in dt as a GGUF file stores it and returns the bytes and the values the
// engine dequantises from them.
func lqEncode(t *testing.T, v []float32, dt DType) ([]byte, []float32) {
	t.Helper()
	gt := map[DType]gguf.DType{F32: gguf.F32, Q8_0: gguf.Q8_0, F16: gguf.F16, BF16: gguf.BF16, Q4_K: gguf.Q4_K}[dt]
	raw, err := ggufpack.Encode(nil, v, gt)
	if err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, len(v))
	if err := gguf.Dequantize(deq, raw, gt); err != nil {
		t.Fatal(err)
	}
	return raw, deq
}

// lqUpload puts raw (dt, shape) on be.
func lqUpload(t *testing.T, be Backend, name string, dt DType, raw []byte, shape ...int64) *Buffer {
	t.Helper()
	b, err := UploadRaw(be, name, dt, raw, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lqRun compiles build's graph on be, fills its inputs (x: normal values, idx: the indices)
// and runs it.
func lqRun(t *testing.T, be Backend, build func(g *Graph) func(), idx []int32) Program {
	t.Helper()
	g := NewGraph("linearq")
	free := build(g)
	t.Cleanup(free)
	p, err := be.Compile(g)
	if err != nil {
		t.Fatalf("%s: %v", be.Name(), err)
	}
	t.Cleanup(p.Close)
	for name, id := range g.inputs {
		if g.tensors[id].dtype == I32 {
			copy(p.InputInt32(name), idx)
			continue
		}
		rng := rand.New(rand.NewPCG(41, uint64(len(name))))
		for i, f := 0, p.Input(name); i < len(f); i++ {
			f[i] = float32(rng.NormFloat64())
		}
	}
	if err := p.Run(); err != nil {
		t.Fatalf("%s: %v", be.Name(), err)
	}
	return p
}

// Linear with an F16, BF16, Q8_0 or Q4_K weight (and bias) and GatherRows from a table in
// each encoding, on Vulkan and on the CPU: Vulkan's products within 1e-5·(Σ|x·w| + |b|) of
// float64 sums over the dequantised weight, and of the CPU's where it computes in f32 (its
// Q8_0 kernel for ≤ 8 rows rounds x to int8: there 1e-2, its documented bound, unless
// Vulkan rounds x the same way in integer dot products: then both are within 1e-5 of sums
// over the rounded x); gathered rows bit for bit the CPU's. Run with the device's default
// and with integer dot products on (VOXPIPE_VULKAN_INT8_DOT=1) where it has them; 3 and 17
// rows take the row-pair shaders, 40 the 64×64 tiles (in fp32: the binary16 tiles are
// tested in the vulkan package).
func TestVulkanLinearQGather(t *testing.T) {
	for _, dot := range []string{"", "1"} { // the device's default; integer dot products where it has them
		t.Run("int8_dot="+dot, func(t *testing.T) {
			t.Setenv("VOXPIPE_VULKAN_INT8_DOT", dot)
			t.Setenv("VOXPIPE_VULKAN_F16", "0")
			t.Setenv("VOXPIPE_VULKAN_TILE_ROWS", "24") // tiles from 24 rows, as on a GPU
			testVulkanLinearQGather(t)
		})
	}
}

func testVulkanLinearQGather(t *testing.T) {
	v := vulkanBackend(t)
	cpu, err := NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	rng := rand.New(rand.NewPCG(43, 44))
	idx := []int32{4, 0, 6, 6, 2, 1}
	for _, c := range []struct {
		dt   DType
		n, k int64
	}{{F16, 70, 77}, {BF16, 70, 96}, {Q8_0, 70, 288}, {Q4_K, 33, 512}, {F32, 7, 37}} {
		wf := make([]float32, c.n*c.k)
		for i := range wf {
			wf[i] = float32(rng.NormFloat64() * 0.5)
		}
		bias := make([]float32, c.n)
		for i := range bias {
			bias[i] = float32(rng.NormFloat64())
		}
		raw, deq := lqEncode(t, wf, c.dt)
		for _, m := range []int64{3, 17, 40} { // 40: the tiled shader's rows
			var progs []Program
			for _, be := range []Backend{cpu, v} {
				progs = append(progs, lqRun(t, be, func(g *Graph) func() {
					w := lqUpload(t, be, "w", c.dt, raw, c.n, c.k)
					bb, err := Upload(be, "b", bias, c.n)
					if err != nil {
						t.Fatal(err)
					}
					g.Label("embed")
					g.Output("rows", g.GatherRows(g.Persistent(w), g.Input("idx", I32, int64(len(idx)))))
					if c.dt != F32 {
						g.Label("proj")
						bt := g.Persistent(bb)
						x := g.Input("x", F32, m, c.k)
						g.Output("y", g.Linear(x, g.Persistent(w), &bt))
						g.Output("y0", g.Linear(x, g.Persistent(w), nil))
					}
					return func() { w.Free(); bb.Free() }
				}, idx))
			}
			cp, vp := progs[0], progs[1]
			want, got := cp.Output("rows"), vp.Output("rows")
			if len(got) != len(idx)*int(c.k) || len(want) != len(got) {
				t.Fatalf("%s: %d rows values on Vulkan, %d on the CPU", dtypeName(c.dt), len(got), len(want))
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) || want[i] != deq[int64(idx[i/int(c.k)])*c.k+int64(i)%c.k] {
					t.Fatalf("%s: gathered value %d: %v on Vulkan, %v on the CPU", dtypeName(c.dt), i, got[i], want[i])
				}
			}
			if c.dt == F32 {
				continue
			}
			// A Q8_0 product of a few rows may round x to int8 per block of 32 (the CPU's
			// kernel does; so does Vulkan's where the device has integer dot products): the
			// float64 sums are then over x rounded the same way, and the two backends agree
			// as closely as both do with them.
			x, xr := vp.Input("x"), q8test.RoundX(vp.Input("x"))
			cpuTol := 1e-5
			if c.dt == Q8_0 && m <= 8 && !v.dev.Int8Dot() {
				cpuTol = 1e-2
			}
			for _, o := range []string{"y", "y0"} {
				gy, cy := vp.Output(o), cp.Output(o)
				for i := range m {
					for j := range c.n {
						var s, a, sr float64
						for l := range c.k {
							p := float64(x[i*c.k+l]) * float64(deq[j*c.k+l])
							s, a = s+p, a+math.Abs(p)
							sr += float64(xr[i*c.k+l]) * float64(deq[j*c.k+l])
						}
						if o == "y" {
							s, a = s+float64(bias[j]), a+math.Abs(float64(bias[j]))
							sr += float64(bias[j])
						}
						g, cv := float64(gy[i*c.n+j]), float64(cy[i*c.n+j])
						exact := math.Abs(g-s) <= 1e-5*a || c.dt == Q8_0 && m <= 8 && math.Abs(g-sr) <= 1e-5*a
						if math.IsNaN(g) || !exact || math.Abs(g-cv) > cpuTol*a {
							t.Fatalf("%s M=%d %s[%d, %d] = %v on Vulkan, %v on the CPU, %v in float64 (%v over x rounded to int8; Σ|x·w| %v)", dtypeName(c.dt), m, o, i, j, g, cv, s, sr, a)
						}
					}
				}
			}
		}
	}
}

// The lowerings on hand-built nodes: each encoding the shaders read gives one dispatch; the
// CPU's repacks (Q8_0R8, F32P), an F32 weight, wrong index or output types are errors that
// name them.
func TestVulkanQuantLowerings(t *testing.T) {
	v := vulkanBackend(t)
	buf := func(n int) *vulkan.Buffer {
		b, err := v.dev.Alloc(n, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Free)
		return b
	}
	w := vulkan.Tensor{Buf: buf(1024), Shape: []int64{4, 256}} // room for F32 [4, 256]
	x, y := vulkan.Contiguous(buf(512), 2, 256), vulkan.Contiguous(buf(8), 2, 4)
	bias, idx := vulkan.Contiguous(buf(4), 4), vulkan.Contiguous(buf(3), 3)
	rows := vulkan.Contiguous(buf(768), 3, 256)
	linear := func(wt DType, srcs ...DType) vulkanNode {
		n := vulkanNode{IP: [8]int64{2}, Src: []vulkan.Tensor{x, w, bias}, SrcType: []DType{F32, wt, F32}, Dst: y, DstType: F32}
		if len(srcs) > 0 {
			n.SrcType = srcs
			n.Src = n.Src[:len(srcs)]
		}
		return n
	}
	gather := func(tt, it, dt DType) vulkanNode {
		tab := w
		if tt == F32 || tt == I32 {
			tab = vulkan.Contiguous(w.Buf, 4, 256)
		}
		return vulkanNode{Src: []vulkan.Tensor{tab, idx}, SrcType: []DType{tt, it}, Dst: rows, DstType: dt}
	}
	lowerLinear, lowerGather := vulkanLowerings[cgo.OpLinearQ], vulkanLowerings[cgo.OpGatherRows]
	if lowerLinear == nil || lowerGather == nil {
		t.Fatal("LinearQ and GatherRows have no Vulkan lowering")
	}
	for _, dt := range []DType{F16, BF16, Q8_0, Q4_K} {
		if ds, err := lowerLinear(linear(dt)); err != nil || len(ds) != 1 {
			t.Errorf("Linear over %s: %d dispatches, %v", dtypeName(dt), len(ds), err)
		}
		if ds, err := lowerLinear(linear(dt, F32, dt)); err != nil || len(ds) != 1 {
			t.Errorf("Linear over %s without bias: %d dispatches, %v", dtypeName(dt), len(ds), err)
		}
		if ds, err := lowerGather(gather(dt, I32, F32)); err != nil || len(ds) != 1 {
			t.Errorf("GatherRows from %s: %d dispatches, %v", dtypeName(dt), len(ds), err)
		}
	}
	for _, dt := range []DType{F32, I32} {
		if ds, err := lowerGather(gather(dt, I32, dt)); err != nil || len(ds) != 1 {
			t.Errorf("GatherRows from %s: %d dispatches, %v", dtypeName(dt), len(ds), err)
		}
	}
	for _, c := range []struct {
		name string
		err  func() error
		want string
	}{
		{"Linear Q8_0R8", func() error { _, err := lowerLinear(linear(Q8_0R8)); return err }, "Q8_0R8 weight is the CPU's repacked layout"},
		{"Linear F32P", func() error { _, err := lowerLinear(linear(F32P)); return err }, "F32P weight"},
		{"Linear F32", func() error { _, err := lowerLinear(linear(F32)); return err }, "F32 have no Vulkan shader"},
		{"Linear I32 bias", func() error { _, err := lowerLinear(linear(Q8_0, F32, Q8_0, I32)); return err }, "I32 bias"},
		{"Linear bad K", func() error {
			n := linear(Q8_0, F32, Q8_0)
			n.Src[1].Shape = []int64{4, 48}
			_, err := lowerLinear(n)
			return err
		}, "vulkan: linearq: "},
		{"GatherRows Q8_0R8", func() error { _, err := lowerGather(gather(Q8_0R8, I32, F32)); return err }, "Q8_0R8"},
		{"GatherRows F32 indices", func() error { _, err := lowerGather(gather(Q8_0, F32, F32)); return err }, "F32 indices"},
		{"GatherRows into I32", func() error { _, err := lowerGather(gather(Q4_K, I32, I32)); return err }, "the shader writes F32"},
	} {
		if err := c.err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (want %q)", c.name, err, c.want)
		}
	}
}

// A graph with a Q8_0R8 weight (the CPU's repack) does not compile on Vulkan, and the error
// names the node and the encoding.
func TestVulkanLinearQRefusesRepack(t *testing.T) {
	v := vulkanBackend(t)
	raw, _ := lqEncode(t, make([]float32, 8*64), Q8_0)
	packed := make([]byte, cgo.WeightBytes(Q8_0R8, 8, 64))
	if err := cgo.RepackQ8_0R8(packed, raw, 8, 64); err != nil {
		t.Fatal(err)
	}
	// Alloc refuses the encoding; the buffer goes into device memory behind its back.
	w, err := AllocBuffer(func(bytes int64) (Memory, error) { return v.deviceMemory(bytes, []int64{8, 64}) }, "w.r8", Q8_0R8, 8, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	if err := w.mem.Write(0, packed); err != nil {
		t.Fatal(err)
	}
	g := NewGraph("r8")
	g.Label("dec.proj")
	g.Output("y", g.Linear(g.Input("x", F32, 1, 64), g.Persistent(w), nil))
	if _, err := v.Compile(g); err == nil || !strings.Contains(err.Error(), "Q8_0R8") || !strings.Contains(err.Error(), "dec.proj") {
		t.Errorf("a Q8_0R8 Linear on Vulkan: %v", err)
	}
}
