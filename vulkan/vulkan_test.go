package vulkan

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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
	t.Logf("device 0: %s (%s), Vulkan %s, %d MiB device-local, subgroup %d, fp16 %v, int8 %v, int8 dot %v",
		i.Name, i.Type, i.APIVersion, i.DeviceLocalBytes>>20, i.SubgroupSize, i.FP16, i.Int8, i.DotI8)
	if i.Name == "" || i.APIVersion == "0.0.0" || i.SubgroupSize <= 0 {
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

// Every unary op against float64 on odd lengths (not a multiple of the workgroup), with
// tolerances per op: the shaders use the GPU's exp/log/sin/tanh (a few ulp), GELU(erf) an
// erf to 1.5e-7.
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
	} {
		in := upload(t, d, c.in)
		out := upload(t, d, make([]float32, n+1))
		out.Float32s()[n] = 42 // past n: untouched
		if err := d.Unary(c.op, in, out, n, c.p0, c.p1); err != nil {
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
	if err := d.Unary(99, upload(t, d, x), upload(t, d, x), n, 0, 0); err == nil {
		t.Error("unknown unary op: no error")
	}
}

// Binary ops with b repeating (a bias row) against float64.
func TestBinary(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(5, 6))
	const rows, cols = 33, 67
	a := randoms(rng, rows*cols, 1)
	b := randoms(rng, cols, 1)
	ab, bb := upload(t, d, a), upload(t, d, b)
	for op, ref := range []func(x, y float64) float64{
		func(x, y float64) float64 { return x + y }, func(x, y float64) float64 { return x - y },
		func(x, y float64) float64 { return x * y }, func(x, y float64) float64 { return x / y },
		math.Max, math.Min,
	} {
		out := upload(t, d, make([]float32, rows*cols))
		if err := d.Binary(op, ab, bb, out, rows*cols, cols); err != nil {
			t.Fatal(err)
		}
		for i, g := range out.Float32s() {
			want := float64(float32(ref(float64(a[i]), float64(b[i%cols]))))
			if math.Abs(float64(g)-want) > 1e-6*math.Max(1, math.Abs(want)) {
				t.Fatalf("op %d at %d: %v, want %v", op, i, g, want)
			}
		}
	}
	if err := d.Binary(cgo.BAdd, ab, bb, ab, rows*cols, cols+1); err == nil {
		t.Error("b repeating past its end: no error")
	}
}

// Linear against float64 on odd shapes (M, N, K not multiples of the 16×16 tiles), with and
// without bias; bound 1e-5·Σ|x||w| (fp32 sums).
func TestLinear(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {1, 7, 5}, {3, 80, 64}, {16, 512, 256}, {17, 33, 129}, {58, 100, 300}} {
		for _, withBias := range []bool{false, true} {
			x, w := randoms(rng, s.m*s.k, 1), randoms(rng, s.n*s.k, 1)
			var bias []float32
			var bb *Buffer
			if withBias {
				bias = randoms(rng, s.n, 1)
				bb = upload(t, d, bias)
			}
			y := upload(t, d, make([]float32, s.m*s.n))
			if err := d.Linear(upload(t, d, x), upload(t, d, w), bb, y, s.m, s.n, s.k); err != nil {
				t.Fatal(err)
			}
			for i := range s.m {
				for j := range s.n {
					var want, mag float64
					for k := range s.k {
						p := float64(x[i*s.k+k]) * float64(w[j*s.k+k])
						want += p
						mag += math.Abs(p)
					}
					if withBias {
						want += float64(bias[j])
						mag += math.Abs(float64(bias[j]))
					}
					if got := float64(y.Float32s()[i*s.n+j]); math.Abs(got-want) > 1e-5*mag+1e-6 {
						t.Fatalf("%v bias %v: y[%d,%d] = %v, want %v", s, withBias, i, j, got, want)
					}
				}
			}
		}
	}
	small := upload(t, d, make([]float32, 4))
	if err := d.Linear(small, small, nil, small, 2, 2, 4); err == nil {
		t.Error("linear past its buffers: no error")
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
