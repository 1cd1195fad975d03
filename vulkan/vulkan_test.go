package vulkan

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/cgo"
)

// device opens the first Vulkan device (lavapipe in CI). Without Vulkan the tests skip,
// unless VOXPIPE_REQUIRE_VULKAN is set (make test sets it: CI installs Mesa's lavapipe).
func device(t *testing.T) *Device {
	t.Helper()
	devs, err := Devices()
	if err == nil && len(devs) == 0 {
		err = os.ErrNotExist
	}
	if err != nil {
		if os.Getenv("VOXPIPE_REQUIRE_VULKAN") != "" {
			t.Fatalf("Vulkan is required here (VOXPIPE_REQUIRE_VULKAN) but: %v", err)
		}
		t.Skipf("no Vulkan device: %v", err)
	}
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// upload makes a host-visible buffer holding v.
func upload(t *testing.T, d *Device, v []float32) *Buffer {
	t.Helper()
	b, err := d.Alloc(len(v), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Free)
	copy(b.Float32s(), v)
	return b
}

func randoms(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

func TestDevices(t *testing.T) {
	d := device(t)
	i := d.Info
	t.Logf("device 0: %s (%s), Vulkan %s, %d MiB device-local, subgroup %d, fp16 %v, int8 %v, int8 dot %v, buffers ≤ %d MiB",
		i.Name, i.Type, i.APIVersion, i.DeviceLocalBytes>>20, i.SubgroupSize, i.FP16, i.Int8, i.DotI8, i.MaxBufferBytes>>20)
	if i.Name == "" || i.APIVersion == "0.0.0" || i.SubgroupSize <= 0 || i.MaxBufferBytes < 1<<27 {
		t.Errorf("device info %+v", i)
	}
	if _, err := Open(1 << 20); err == nil {
		t.Error("Open of a device that does not exist: no error")
	}
}

// Buffers: host-visible memory round-trips, and device-local buffers are reached by copies.
func TestBuffers(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(1, 2))
	v := randoms(rng, 1001, 1)
	src := upload(t, d, v)
	mid, err := d.Alloc(1001, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mid.Free()
	dst := upload(t, d, make([]float32, 1001))
	if err := src.CopyTo(mid, 1001); err != nil {
		t.Fatal(err)
	}
	if err := mid.CopyTo(dst, 1001); err != nil {
		t.Fatal(err)
	}
	for i, x := range dst.Float32s() {
		if x != v[i] {
			t.Fatalf("value %d came back %v, want %v", i, x, v[i])
		}
	}
	if err := src.CopyTo(dst, 2000); err == nil {
		t.Error("copy past the buffers' ends: no error")
	}
}

// Every unary op against float64 on an odd length (not a multiple of the workgroup), with
// tolerances per op: the shaders use the GPU's exp/log/sin/tanh (a few ulp), GELU(erf) an
// erf to 1.5e-7. Writes stay inside the output.
func TestUnary(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 1000 + 37
	x := randoms(rng, n, 2)
	pos := make([]float32, n)
	for i, v := range x {
		pos[i] = float32(math.Abs(float64(v))) + 0.1
	}
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	for _, c := range []struct {
		op     int
		name   string
		in     []float32
		p0, p1 float32
		ref    func(v float64) float64
		tol    float64
	}{
		{cgo.UNeg, "neg", x, 0, 0, func(v float64) float64 { return -v }, 0},
		{cgo.UExp, "exp", x, 0, 0, math.Exp, 2e-6},
		{cgo.ULog, "log", pos, 0, 0, math.Log, 2e-6},
		{cgo.USin, "sin", x, 0, 0, math.Sin, 2e-6},
		{cgo.UCos, "cos", x, 0, 0, math.Cos, 2e-6},
		{cgo.USqrt, "sqrt", pos, 0, 0, math.Sqrt, 1e-6},
		{cgo.UTanh, "tanh", x, 0, 0, math.Tanh, 2e-6},
		{cgo.USigmoid, "sigmoid", x, 0, 0, sig, 2e-6},
		{cgo.UReLU, "relu", x, 0, 0, func(v float64) float64 { return math.Max(v, 0) }, 0},
		{cgo.USiLU, "silu", x, 0, 0, func(v float64) float64 { return v * sig(v) }, 2e-6},
		{cgo.UGELUErf, "gelu_erf", x, 0, 0, func(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }, 2e-6},
		{cgo.UGELUTanh, "gelu_tanh", x, 0, 0, func(v float64) float64 {
			return 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
		}, 2e-6},
		{cgo.UAbs, "abs", x, 0, 0, math.Abs, 0},
		{cgo.UClamp, "clamp", x, -0.5, 1, func(v float64) float64 { return math.Min(math.Max(v, -0.5), 1) }, 0},
		{cgo.UScale, "scale", x, 1.5, -2, func(v float64) float64 { return 1.5*v - 2 }, 1e-7},
		{cgo.USquare, "square", x, 0, 0, func(v float64) float64 { return v * v }, 1e-7},
		{cgo.URecip, "recip", pos, 0, 0, func(v float64) float64 { return 1 / v }, 1e-6},
		{UCopy, "copy", x, 0, 0, func(v float64) float64 { return v }, 0},
	} {
		out := upload(t, d, make([]float32, n+1))
		out.Float32s()[n] = 42 // past n: untouched
		ds, err := UnaryOp(c.op, Contiguous(upload(t, d, c.in), n), Contiguous(out, n), c.p0, c.p1)
		if err == nil {
			err = d.Run(ds)
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := out.Float32s()
		for i, v := range c.in {
			want := c.ref(float64(v))
			if diff := math.Abs(float64(got[i]) - want); diff > c.tol*math.Max(1, math.Abs(want))+1e-7 {
				t.Fatalf("%s(%v) = %v, want %v (error %.3g)", c.name, v, got[i], want, diff)
			}
		}
		if got[n] != 42 {
			t.Errorf("%s wrote past its %d values", c.name, n)
		}
	}
	if _, err := UnaryOp(99, Contiguous(upload(t, d, x), n), Contiguous(upload(t, d, x), n), 0, 0); err == nil {
		t.Error("unknown unary op: no error")
	}
}

// Strided views: a transposed copy, and a view at an offset, written into a strided output.
func TestStridedCopy(t *testing.T) {
	d := device(t)
	const rows, cols = 37, 23
	src := make([]float32, 5+rows*cols)
	for i := range src {
		src[i] = float32(i)
	}
	in := upload(t, d, src)
	out := upload(t, d, make([]float32, rows*cols))
	// x = the [rows, cols] matrix at offset 5, read transposed: [cols, rows] with strides (1, cols).
	x := Tensor{Buf: in, Off: 5, Shape: []int64{cols, rows}, Stride: []int64{1, cols}}
	ds, err := UnaryOp(UCopy, x, Contiguous(out, cols, rows), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(ds); err != nil {
		t.Fatal(err)
	}
	for c := range cols {
		for r := range rows {
			if got, want := out.Float32s()[c*rows+r], src[5+r*cols+c]; got != want {
				t.Fatalf("[%d,%d] = %v, want %v", c, r, got, want)
			}
		}
	}
	past := Tensor{Buf: in, Off: 6, Shape: []int64{rows, cols}, Stride: []int64{cols, 1}}
	if _, err := UnaryOp(UCopy, past, Contiguous(out, rows, cols), 0, 0); err == nil {
		t.Error("a view reaching past its buffer: no error")
	}
}

// Binary ops with b broadcast along rows (stride 0: a bias row) against float64.
func TestBinary(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(5, 6))
	const rows, cols = 33, 67
	a := randoms(rng, rows*cols, 1)
	b := randoms(rng, cols, 1)
	ab, bb := upload(t, d, a), upload(t, d, b)
	brow := Tensor{Buf: bb, Shape: []int64{rows, cols}, Stride: []int64{0, 1}}
	for op, ref := range []func(x, y float64) float64{
		func(x, y float64) float64 { return x + y }, func(x, y float64) float64 { return x - y },
		func(x, y float64) float64 { return x * y }, func(x, y float64) float64 { return x / y },
		math.Max, math.Min,
	} {
		out := upload(t, d, make([]float32, rows*cols))
		ds, err := BinaryOp(op, Contiguous(ab, rows, cols), brow, Contiguous(out, rows, cols))
		if err == nil {
			err = d.Run(ds)
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range out.Float32s() {
			want := float64(float32(ref(float64(a[i]), float64(b[i%cols]))))
			if math.Abs(float64(g)-want) > 1e-6*math.Max(1, math.Abs(want)) {
				t.Fatalf("op %d at %d: %v, want %v", op, i, g, want)
			}
		}
	}
	if _, err := BinaryOp(cgo.BAdd, Contiguous(ab, rows, cols), Contiguous(bb, rows, cols), Contiguous(ab, rows, cols)); err == nil {
		t.Error("b read past its buffer: no error")
	}
}

// matmulRef is float64 y = a·b (+ bias) for row-major a [batch, m, k] and b [batch, k, n]
// (bT: [batch, n, k]; bBatch false: b shared by every batch), with Σ|terms| for the bound.
func matmulRef(a, b, bias []float32, batch, m, n, k int, bT, bBatch bool) (y, mag []float64) {
	y, mag = make([]float64, batch*m*n), make([]float64, batch*m*n)
	for bi := range batch {
		bo := 0
		if bBatch {
			bo = bi * n * k
		}
		for i := range m {
			for j := range n {
				var s, g float64
				for kk := range k {
					bv := b[bo+kk*n+j]
					if bT {
						bv = b[bo+j*k+kk]
					}
					p := float64(a[(bi*m+i)*k+kk]) * float64(bv)
					s += p
					g += math.Abs(p)
				}
				if bias != nil {
					s += float64(bias[j])
					g += math.Abs(float64(bias[j]))
				}
				y[(bi*m+i)*n+j], mag[(bi*m+i)*n+j] = s, g
			}
		}
	}
	return y, mag
}

// Matmul against float64 on odd shapes (not multiples of the 8×8, 16×16 or 64×64 tiles):
// plain, Bᵀ (a Linear), a batch with b broadcast (stride 0), with and without bias; bound
// 1e-5·Σ|terms|. Each shader runs every shape: the 16×16 tiles, the 64×64 ones, the
// software devices' workgroups of one subgroup (matmul_sg8k, where a and b run along k: the
// Bᵀ shapes; the others then take the device's choice); then the device's own choice.
func TestMatmul(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, shader := range []string{"matmul", "matmul_tiled", "matmul_sg8k", ""} {
		t.Run("shader="+shader, func(t *testing.T) {
			if shader == "matmul_sg8k" && !(d.Info.SubgroupArith && d.Info.SubgroupSize >= 8) {
				t.Skip("the device cannot run " + shader)
			}
			matmulTestShader = shader
			defer func() { matmulTestShader = "" }()
			testMatmul(t, d, rng)
		})
	}
}

func testMatmul(t *testing.T, d *Device, rng *rand.Rand) {
	for _, s := range []struct {
		batch, m, n, k int
		bT, bBatch     bool
	}{{1, 1, 1, 1, true, false}, {1, 1, 7, 5, false, false}, {1, 3, 80, 64, true, false}, {1, 16, 512, 256, true, false},
		{1, 17, 33, 129, false, false}, {3, 58, 100, 30, true, false}, {2, 19, 21, 64, false, true}, {4, 5, 9, 16, true, true},
		{1, 130, 77, 70, true, false}, {2, 65, 129, 33, false, true}, {1, 200, 300, 100, false, false}, {3, 64, 64, 17, true, false}} {
		for _, withBias := range []bool{false, true} {
			nbB := 1
			if s.bBatch {
				nbB = s.batch
			}
			a, b := randoms(rng, s.batch*s.m*s.k, 1), randoms(rng, nbB*s.n*s.k, 1)
			var bias []float32
			var bt *Tensor
			if withBias {
				bias = randoms(rng, s.n, 1)
				v := Contiguous(upload(t, d, bias), int64(s.n))
				bt = &v
			}
			bshape := []int64{int64(s.batch), int64(s.k), int64(s.n)}
			if s.bT {
				bshape = []int64{int64(s.batch), int64(s.n), int64(s.k)}
			}
			bv := Contiguous(upload(t, d, b), bshape...)
			if !s.bBatch {
				bv.Stride[0] = 0 // one b for every batch
			}
			y := upload(t, d, make([]float32, s.batch*s.m*s.n))
			ds, err := MatmulOp(Contiguous(upload(t, d, a), int64(s.batch), int64(s.m), int64(s.k)), bv, bt,
				Contiguous(y, int64(s.batch), int64(s.m), int64(s.n)), s.bT)
			if err == nil {
				err = d.Run(ds)
			}
			if err != nil {
				t.Fatalf("%+v: %v", s, err)
			}
			want, mag := matmulRef(a, b, bias, s.batch, s.m, s.n, s.k, s.bT, s.bBatch)
			for i, g := range y.Float32s() {
				if math.Abs(float64(g)-want[i]) > 1e-5*mag[i]+1e-6 {
					t.Fatalf("%+v bias %v: y[%d] = %v, want %v", s, withBias, i, g, want[i])
				}
			}
		}
	}
	small := upload(t, d, make([]float32, 4))
	if _, err := MatmulOp(Contiguous(small, 2, 4), Contiguous(small, 2, 4), nil, Contiguous(small, 2, 2), true); err == nil {
		t.Error("matmul reading past its buffers: no error")
	}
}

// A program of chained dispatches (y = GELU(x·Wᵀ + b) + x·Wᵀ, through an intermediate
// buffer) recorded once gives the chain's result, and the same bits on every one of 1 000 runs.
func TestProgram(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(9, 10))
	const m, n, k = 13, 40, 70
	x, w, bias := randoms(rng, m*k, 1), randoms(rng, n*k, 0.2), randoms(rng, n, 1)
	xb, wb, bb := upload(t, d, x), upload(t, d, w), upload(t, d, bias)
	h, err := d.Alloc(m*n, false) // device-local intermediate
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	g := upload(t, d, make([]float32, m*n))
	y := upload(t, d, make([]float32, m*n))
	bt := Contiguous(bb, n)
	var ds []Dispatch
	for _, mk := range []func() (Dispatch, error){
		func() (Dispatch, error) {
			return MatmulOp(Contiguous(xb, m, k), Contiguous(wb, n, k), &bt, Contiguous(h, m, n), true)
		},
		func() (Dispatch, error) { return UnaryOp(cgo.UGELUErf, Contiguous(h, m, n), Contiguous(g, m, n), 0, 0) },
		func() (Dispatch, error) {
			return BinaryOp(cgo.BSub, Contiguous(g, m, n), Tensor{Buf: bb, Shape: []int64{m, n}, Stride: []int64{0, 1}}, Contiguous(y, m, n))
		},
		func() (Dispatch, error) {
			return BinaryOp(cgo.BAdd, Contiguous(y, m, n), Contiguous(h, m, n), Contiguous(y, m, n))
		},
	} {
		dp, err := mk()
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, dp)
	}
	prog, err := d.NewProgram(ds)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	lin, mag := matmulRef(x, w, bias, 1, m, n, k, true, false)
	var first []float32
	for run := range 1000 {
		clear(y.Float32s())
		if err := prog.Run(); err != nil {
			t.Fatal(err)
		}
		if run == 0 {
			first = append([]float32(nil), y.Float32s()...)
			for i, got := range first {
				v := lin[i]
				want := 0.5*v*(1+math.Erf(v/math.Sqrt2)) - float64(bias[i%n]) + v
				if math.Abs(float64(got)-want) > 1e-5*mag[i]+1e-5 {
					t.Fatalf("y[%d] = %v, want %v", i, got, want)
				}
			}
			continue
		}
		for i, got := range y.Float32s() {
			if math.Float32bits(got) != math.Float32bits(first[i]) {
				t.Fatalf("run %d: y[%d] = %v, run 0 gave %v", run, i, got, first[i])
			}
		}
	}
}

// A broken shader is an error naming the shader, not a crash.
func TestBadShader(t *testing.T) {
	d := device(t)
	if _, err := d.pipelineFrom("junk", []byte("not SPIR-V at all, just text...."), 2, 8); err == nil {
		t.Error("pipeline from junk: no error")
	}
}

// The committed SPIR-V is what glslc makes of the shaders today (skipped without glslc;
// make shaders-check runs the same comparison).
func TestSPIRVCurrent(t *testing.T) {
	glslc, err := exec.LookPath("glslc")
	if err != nil {
		t.Skip("no glslc")
	}
	srcs, _ := filepath.Glob("shaders/*.comp")
	if len(srcs) == 0 {
		t.Fatal("no shaders")
	}
	for _, src := range srcs {
		name := filepath.Base(src[:len(src)-len(".comp")])
		out := filepath.Join(t.TempDir(), name+".spv")
		if b, err := exec.Command(glslc, "-O", "--target-env=vulkan1.1", "-o", out, src).CombinedOutput(); err != nil {
			t.Fatalf("glslc %s: %v\n%s", src, err, b)
		}
		want, _ := os.ReadFile(out)
		got, err := spirv.ReadFile("spv/" + name + ".spv")
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("spv/%s.spv is not what glslc makes of %s: run go generate ./vulkan", name, src)
		}
	}
}

// Live buffers are counted by kind, and an allocation beyond the device's memory is an error
// naming its size, not a crash; the device works on afterwards.
func TestMemoryInUseAndOutOfMemory(t *testing.T) {
	d := device(t)
	dev0, host0 := d.MemoryInUse()
	a, err := d.Alloc(1000, false)
	if err != nil {
		t.Fatal(err)
	}
	h, err := d.Alloc(500, true)
	if err != nil {
		t.Fatal(err)
	}
	dev1, host1 := d.MemoryInUse()
	if dev1-dev0 < 4000 || host1-host0 < 2000 {
		t.Errorf("after 4000 device + 2000 host bytes: in use grew by %d, %d", dev1-dev0, host1-host0)
	}
	if p := d.MemoryPeak(); p < dev1+host1 {
		t.Errorf("peak %d below the %d in use", p, dev1+host1)
	}
	a.Free()
	h.Free()
	if dev2, host2 := d.MemoryInUse(); dev2 != dev0 || host2 != host0 {
		t.Errorf("after freeing: %d, %d in use; before: %d, %d", dev2, host2, dev0, host0)
	}
	// Beyond what a shader may bind: refused before the driver is asked; with that check
	// off, the driver's own out-of-memory error comes back.
	huge := int(min(d.Info.DeviceLocalBytes*4, 1<<46) / 4)
	if b, err := d.Alloc(huge, false); err == nil || !strings.Contains(err.Error(), "maxStorageBufferRange") {
		if b != nil {
			b.Free()
		}
		t.Errorf("alloc of %d bytes, shaders bind at most %d: %v", 4*huge, d.Info.MaxBufferBytes, err)
	}
	maxBuf := d.Info.MaxBufferBytes
	d.Info.MaxBufferBytes = 0
	b, err := d.Alloc(huge, false)
	d.Info.MaxBufferBytes = maxBuf
	if err == nil {
		b.Free()
		t.Errorf("alloc of %d bytes on a device of %d: no error", 4*huge, d.Info.DeviceLocalBytes)
	} else {
		t.Logf("alloc beyond memory: %v", err)
	}
	v := []float32{1, 2, 3}
	src := upload(t, d, v)
	dst := upload(t, d, make([]float32, 3))
	if err := src.CopyTo(dst, 3); err != nil || dst.Float32s()[2] != 3 {
		t.Errorf("copy after a failed alloc: %v, %v", err, dst.Float32s())
	}
}

// A program puts barriers only where a dispatch reads what an earlier one since the last
// barrier wrote, writes what one wrote, or writes what one read; undeclared dispatches are
// fenced. Its results are those of running the dispatches in order.
func TestProgramBarriers(t *testing.T) {
	d := device(t)
	const n = 1000
	rng := rand.New(rand.NewPCG(3, 4))
	xv := randoms(rng, n, 1)
	x := upload(t, d, xv)
	buf := upload(t, d, make([]float32, 4*n)) // four slices of one buffer, as an arena
	part := func(i int) Tensor { t := Contiguous(buf, n); t.Off = i * n; return t }
	op := func(u int, src, dst Tensor, declare bool) Dispatch {
		dp, err := UnaryOp(u, src, dst, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if declare {
			dp = dp.WithAccess([]Tensor{src}, []Tensor{dst})
		}
		return dp
	}
	xt := Contiguous(x, n)
	for _, c := range []struct {
		name     string
		ds       []Dispatch
		barriers int
	}{
		{"independent reads of x", []Dispatch{op(cgo.UNeg, xt, part(0), true), op(cgo.UExp, xt, part(1), true), op(cgo.USquare, xt, part(2), true)}, 0},
		{"read after write", []Dispatch{op(cgo.UNeg, xt, part(0), true), op(cgo.UExp, part(0), part(1), true)}, 1},
		{"write after read", []Dispatch{op(cgo.UNeg, part(0), part(1), true), op(cgo.UExp, xt, part(0), true)}, 1},
		{"write after write", []Dispatch{op(cgo.UNeg, xt, part(0), true), op(cgo.UExp, xt, part(0), true)}, 1},
		{"undeclared", []Dispatch{op(cgo.UNeg, xt, part(0), true), op(cgo.UExp, xt, part(1), false), op(cgo.USquare, xt, part(2), true)}, 2},
		{"a barrier clears what came before", []Dispatch{op(cgo.UNeg, xt, part(0), true), op(cgo.UExp, part(0), part(1), true),
			op(cgo.USquare, xt, part(2), true), op(cgo.UAbs, part(1), part(3), true)}, 2},
	} {
		p, err := d.NewProgram(c.ds)
		if err != nil {
			t.Fatal(err)
		}
		if p.Barriers != c.barriers {
			t.Errorf("%s: %d barriers, want %d", c.name, p.Barriers, c.barriers)
		}
		clear(buf.Float32s())
		if err := p.Run(); err != nil {
			t.Fatal(err)
		}
		p.Close()
		if c.name == "a barrier clears what came before" {
			for i, v := range xv {
				want := math.Exp(-float64(v))
				if got := buf.Float32s()[3*n+i]; math.Abs(float64(got)-want) > 1e-5*want {
					t.Fatalf("%s: y[%d] = %v, want %v", c.name, i, got, want)
				}
			}
		}
	}
}

// A timed program reports a time for each dispatch of its last run; an untimed one none.
func TestProgramTimes(t *testing.T) {
	d := device(t)
	if !d.Timestamps() {
		t.Skip("the device's queue has no timestamps")
	}
	const n = 1 << 16
	x := upload(t, d, randoms(rand.New(rand.NewPCG(1, 1)), n, 1))
	y := upload(t, d, make([]float32, n))
	var ds []Dispatch
	for _, u := range []int{cgo.UExp, cgo.UTanh, cgo.USin} {
		dp, err := UnaryOp(u, Contiguous(x, n), Contiguous(y, n), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, dp)
	}
	p, err := d.NewTimedProgram(ds)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for range 2 {
		if err := p.Run(); err != nil {
			t.Fatal(err)
		}
		times, err := p.Times()
		if err != nil || len(times) != 3 {
			t.Fatalf("times %v, %v", times, err)
		}
		var sum time.Duration
		for _, v := range times {
			if v < 0 || v > time.Second {
				t.Errorf("dispatch time %v", v)
			}
			sum += v
		}
		if sum <= 0 {
			t.Errorf("times %v add up to nothing", times)
		}
		t.Logf("times %v", times)
	}
	u, err := d.NewProgram(ds)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if times, err := u.Times(); times != nil || err != nil {
		t.Errorf("untimed program: %v, %v", times, err)
	}
}

// New buffers read as zeros, as the CPU backend's do, even where a freed buffer held NaNs:
// models leave cache rows unwritten and mask them, which a NaN there would defeat.
func TestNewBuffersAreZero(t *testing.T) {
	d := device(t)
	const n = 4096
	nan := make([]float32, n)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	src := upload(t, d, nan)
	out := upload(t, d, make([]float32, n))
	for round := range 3 {
		b, err := d.Alloc(n, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.CopyTo(out, n); err != nil {
			t.Fatal(err)
		}
		for i, v := range out.Float32s() {
			if v != 0 {
				t.Fatalf("round %d: new device buffer [%d] = %v", round, i, v)
			}
		}
		if err := src.CopyTo(b, n); err != nil { // dirty it for the next round's allocation
			t.Fatal(err)
		}
		b.Free()
		h, err := d.Alloc(n, true)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range h.Float32s() {
			if v != 0 {
				t.Fatalf("round %d: new host buffer [%d] = %v", round, i, v)
			}
		}
		copy(h.Float32s(), nan)
		h.Free()
	}
}

// A failed submission is an error; a lost (or hung) device stays lost: every later
// submission fails at once with ErrDeviceLost, nothing waits on it, and closing it returns.
// lavapipe never loses its device, so the driver's answers are injected.
func TestDeviceLost(t *testing.T) {
	for _, c := range []struct {
		name   string
		result int
		why    string
	}{{"lost", vkErrorDeviceLost, "driver reported the device lost"}, {"hung", vkTimeout, "did not finish"}} {
		t.Run(c.name, func(t *testing.T) {
			d := device(t)
			x := upload(t, d, []float32{1, -2, 3, -4})
			y := upload(t, d, make([]float32, 4))
			dp, err := UnaryOp(cgo.UAbs, Contiguous(x, 4), Contiguous(y, 4), 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			prog, err := d.NewProgram([]Dispatch{dp})
			if err != nil {
				t.Fatal(err)
			}
			defer prog.Close()
			if err := prog.Run(); err != nil || y.Float32s()[3] != 4 {
				t.Fatalf("first run: %v, y %v", err, y.Float32s())
			}

			// A failure that is not a loss fails that run only.
			d.InjectSubmitResult(vkErrorOutOfHost)
			if err := prog.Run(); err == nil || errors.Is(err, ErrDeviceLost) || d.Lost() {
				t.Fatalf("out of host memory: err %v (lost %v), want a plain error", err, d.Lost())
			}
			if err := prog.Run(); err != nil {
				t.Fatalf("run after a transient failure: %v", err)
			}

			d.InjectSubmitResult(c.result)
			err = prog.Run()
			if !errors.Is(err, ErrDeviceLost) || !d.Lost() {
				t.Fatalf("run on a %s device: err %v, Lost %v; want ErrDeviceLost", c.name, err, d.Lost())
			}
			start := time.Now()
			err = prog.Run()
			if !errors.Is(err, ErrDeviceLost) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("next run: %v, want ErrDeviceLost saying %q", err, c.why)
			}
			if _, err := d.Alloc(16, false); !errors.Is(err, ErrDeviceLost) {
				t.Fatalf("a new device buffer (zeroed by a submission): %v, want ErrDeviceLost", err)
			}
			if err := x.CopyTo(y, 4); !errors.Is(err, ErrDeviceLost) {
				t.Fatalf("a copy: %v, want ErrDeviceLost", err)
			}
			if s := time.Since(start); s > time.Second {
				t.Fatalf("failing on a lost device took %v: it should not wait on it", s)
			}
		})
	}
}
