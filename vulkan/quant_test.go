package vulkan

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/ggufpack"
	"github.com/voxpipe/voxpipe/internal/q8test"
)

// lqGarbage fills the bytes around an encoded operand: halves of NaN, int8 of −1, nibbles of
// 15, so a read outside the operand shows in the result.
const lqGarbage = 0xff

// lqEncode encodes v ([n, k] row-major) in enc with the engine's encoders (cgo's for Q8_0,
// F16, BF16; ggufpack's for Q4_K) and returns the bytes and their dequantised values.
func lqEncode(t *testing.T, v []float32, enc Encoding) ([]byte, []float32) {
	t.Helper()
	var raw []byte
	var gt gguf.DType
	switch enc {
	case EncQ4_K:
		var err error
		if raw, err = ggufpack.QuantizeQ4_K(v); err != nil {
			t.Fatal(err)
		}
		gt = gguf.Q4_K
	case EncF32:
		raw = make([]byte, 4*len(v))
		for i, f := range v {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(f))
		}
		gt = gguf.F32
	default:
		to := map[Encoding]cgo.DType{EncQ8_0: cgo.Q8_0, EncF16: cgo.F16, EncBF16: cgo.BF16}[enc]
		gt = map[Encoding]gguf.DType{EncQ8_0: gguf.Q8_0, EncF16: gguf.F16, EncBF16: gguf.BF16}[enc]
		raw = make([]byte, cgo.EncodeBytes(to, len(v)))
		src := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
		if _, err := cgo.EncodeWeights(raw, src, cgo.F32, to, len(v), 1); err != nil {
			t.Fatal(err)
		}
	}
	deq := make([]float32, len(v))
	if err := gguf.Dequantize(deq, raw, gt); err != nil {
		t.Fatal(err)
	}
	return raw, deq
}

// lqUploadBytes makes a host-visible buffer holding raw from word off, garbage around it,
// and returns it with raw's [n, k] operand.
func lqUploadBytes(t *testing.T, d *Device, raw []byte, off int, n, k int64) (*Buffer, Tensor) {
	t.Helper()
	b, err := d.Alloc(off+(len(raw)+3)/4+2, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Free)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b.Float32s()))), 4*b.Len())
	for i := range mem {
		mem[i] = lqGarbage
	}
	copy(mem[4*off:], raw)
	return b, Tensor{Buf: b, Off: off, Shape: []int64{n, k}}
}

// lqAt is a contiguous tensor of shape at value off of b.
func lqAt(b *Buffer, off int, shape ...int64) Tensor {
	c := Contiguous(b, shape...)
	c.Off = off
	return c
}

// Encodings match the engine's dtype numbers and row sizes.
func TestQuantEncodings(t *testing.T) {
	for _, c := range []struct {
		e Encoding
		d cgo.DType
		k int64
	}{{EncF32, cgo.F32, 7}, {EncI32, cgo.I32, 7}, {EncQ8_0, cgo.Q8_0, 96}, {EncF16, cgo.F16, 77}, {EncBF16, cgo.BF16, 77}, {EncQ4_K, cgo.Q4_K, 512}} {
		if Encoding(c.d) != c.e || c.e.RowBytes(c.k) != cgo.RowBytes(c.d, c.k) {
			t.Errorf("%s: %d, row of %d: %d bytes; cgo %d, %d bytes", c.e, c.e, c.k, c.e.RowBytes(c.k), c.d, cgo.RowBytes(c.d, c.k))
		}
	}
	if EncQ8_0.RowBytes(48) != 0 || EncQ4_K.RowBytes(128) != 0 {
		t.Error("rows that do not fill blocks have a size")
	}
}

// Linear over every encoding against float64 sums of x times the dequantised weights, on odd
// shapes: M 1, 3, 17 (passes of 8 rows), N 5 and 70 (an odd last pair), K below and above
// one loop of the workgroup (F16/BF16 also K 77: a tail, halves at 2 mod 4), with and
// without bias; x, W, bias and y all start mid-buffer (W at a byte that is no multiple of
// its row size), garbage around W, y's neighbours untouched. Bound: 1e-5·(Σ|x·w| + |b|),
// fp32 sums in a different order.
func TestLinearQ(t *testing.T) {
	lqEachShader(t, testLinearQ)
}

// lqEachShader runs test with each of Linear's shaders the device can run: int8 dot products
// for Q8_0 (linearq_dot), subgroup additions (linearq_sg; linearq_sg8 in workgroups of one
// subgroup), the shared-memory tree (linearq),
// the tiles of many rows in fp32 (linearq_tiled) and in binary16 (linearq_tiled_f16), each
// at every M.
func lqEachShader(t *testing.T, test func(t *testing.T)) {
	for _, shader := range []string{"linearq_dot", "linearq_sg", "linearq_sg8", "linearq", "linearq_tiled", "linearq_tiled_f16"} {
		t.Run(shader, func(t *testing.T) {
			info := device(t).Info
			if strings.HasPrefix(shader, "linearq_sg") && !info.SubgroupArith || shader == "linearq_dot" && !(info.SubgroupArith && info.DotI8) ||
				shader == "linearq_sg8" && info.SubgroupSize < 8 || shader == "linearq_tiled_f16" && !info.FP16 {
				t.Skip("the device cannot run " + shader)
			}
			lqTestShader = shader
			defer func() { lqTestShader = "" }()
			test(t)
		})
	}
}

func testLinearQ(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(31, 32))
	cases := []struct {
		enc Encoding
		ks  []int64
	}{
		{EncQ8_0, []int64{64, 288, 2080}},
		{EncF16, []int64{64, 77, 1048}},
		{EncBF16, []int64{64, 77, 1048}},
		{EncQ4_K, []int64{256, 512, 4352}},
	}
	runs := 0
	for _, c := range cases {
		for _, k := range c.ks {
			for _, n := range []int64{5, 70} {
				wf := randoms(rng, int(n*k), 0.5)
				raw, deq := lqEncode(t, wf, c.enc)
				const woff = 3
				_, wt := lqUploadBytes(t, d, raw, woff, n, k)
				if (4*woff)%c.enc.RowBytes(k) == 0 {
					t.Fatal("W starts on a row boundary")
				}
				bias := randoms(rng, int(n), 1)
				bb := upload(t, d, append(make([]float32, 2), bias...))
				bt := lqAt(bb, 2, n)
				for _, m := range []int64{1, 3, 17, 70} {
					if k > 1100 && m != 3 {
						continue // large K: one shape suffices (the loop over units)
					}
					x := randoms(rng, int(m*k), 1)
					xb := upload(t, d, append(make([]float32, 5), x...))
					const sentinel = 12345.5
					yv := make([]float32, 1+m*n+1)
					for i := range yv {
						yv[i] = sentinel
					}
					yb := upload(t, d, yv)
					for _, withBias := range []bool{false, true} {
						var bp *Tensor
						if withBias {
							bp = &bt
						}
						xt, yt := lqAt(xb, 5, m, k), lqAt(yb, 1, m, n)
						if m == 3 { // leading axes: [3, K] as [1, 3, K]
							xt, yt = lqAt(xb, 5, 1, m, k), lqAt(yb, 1, 1, m, n)
						}
						ds, err := LinearQOp(xt, wt, c.enc, bp, yt)
						if err != nil {
							t.Fatal(err)
						}
						if err := d.Run(ds); err != nil {
							t.Fatal(err)
						}
						runs++
						got := yb.Float32s()
						if got[0] != sentinel || got[len(got)-1] != sentinel {
							t.Fatalf("%s K=%d N=%d M=%d: y's neighbours changed: %v, %v", c.enc, k, n, m, got[0], got[len(got)-1])
						}
						lqCheckLinear(t, c.enc.String(), x, deq, bias, withBias, ds.shader, got[1:1+m*n], m, n, k)
					}
				}
			}
		}
	}
	t.Logf("%d products", runs)
}

// lqCheckLinear compares y [m, n] from shader with float64 x·wᵀ (+ bias) within
// 1e-5·(Σ|x·w| + |b|). Where the shader rounds x to int8 (linearq_dot), x is first rounded
// as the shader and the CPU's Q8_0 kernel do: per block of 32, scale amax/127, float32
// x·(127/amax) to the nearest even. Where it stages binary16 tiles (linearq_tiled_f16), x and
// the dequantised w are first rounded to binary16 (to the nearest even): their products are
// then exact in fp32, so only the sums' rounding remains.
func lqCheckLinear(t *testing.T, what string, x, w, bias []float32, withBias bool, shader string, y []float32, m, n, k int64) {
	t.Helper()
	switch shader {
	case "linearq_dot":
		x = q8test.RoundX(x)
	case "linearq_tiled_f16":
		_, x = lqEncode(t, x, EncF16)
		_, w = lqEncode(t, w, EncF16)
	}
	for i := range m {
		for j := range n {
			var s, a float64
			for l := range k {
				p := float64(x[i*k+l]) * float64(w[j*k+l])
				s += p
				a += math.Abs(p)
			}
			if withBias {
				s += float64(bias[j])
				a += math.Abs(float64(bias[j]))
			}
			g := float64(y[i*n+j])
			if math.IsNaN(g) || math.Abs(g-s) > 1e-5*a {
				t.Fatalf("%s K=%d N=%d M=%d bias %v: y[%d, %d] = %v, want %v (Σ|x·w| %v)", what, k, n, m, withBias, i, j, g, s, a)
			}
		}
	}
}

// With the dispatch capped at 2 groups an axis, the shader's loops over W's row pairs and
// x's passes of 8 rows (or the tiled shaders' tiles of 64) cover what the groups do not (150
// rows: 19 passes, 3 tiles, in 2 groups; 150 columns: 75 pairs, 3 tiles).
func TestLinearQGroupLoops(t *testing.T) {
	lqEachShader(t, testLinearQGroupLoops)
}

func testLinearQGroupLoops(t *testing.T) {
	d := device(t)
	old := lqMaxGroups
	lqMaxGroups = 2
	defer func() { lqMaxGroups = old }()
	rng := rand.New(rand.NewPCG(33, 34))
	const m, n, k = 150, 150, 96
	for _, enc := range []Encoding{EncQ8_0, EncF16} {
		wf := randoms(rng, n*k, 0.5)
		raw, deq := lqEncode(t, wf, enc)
		_, wt := lqUploadBytes(t, d, raw, 0, n, k)
		x := randoms(rng, m*k, 1)
		xb := upload(t, d, x)
		yb := upload(t, d, make([]float32, m*n))
		ds, err := LinearQOp(Contiguous(xb, m, k), wt, enc, nil, Contiguous(yb, m, n))
		if err != nil {
			t.Fatal(err)
		}
		if ds.groups != [3]uint32{2, 2, 1} {
			t.Fatalf("groups %v", ds.groups)
		}
		if err := d.Run(ds); err != nil {
			t.Fatal(err)
		}
		lqCheckLinear(t, enc.String()+" in 2×2 groups", x, deq, nil, false, ds.shader, yb.Float32s(), m, n, k)
	}
}

// Bad operands are errors naming the op and what is wrong.
func TestLinearQRefuses(t *testing.T) {
	d := device(t)
	wb, err := d.Alloc(100, true)
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Free()
	xb, yb := upload(t, d, make([]float32, 64)), upload(t, d, make([]float32, 64))
	x, y := Contiguous(xb, 1, 32), Contiguous(yb, 1, 4)
	w := Tensor{Buf: wb, Shape: []int64{4, 32}}
	if _, err := LinearQOp(x, w, EncQ8_0, nil, y); err != nil {
		t.Fatalf("a valid product: %v", err)
	}
	short := w
	short.Off = 70 // 4 rows of 34 bytes need 34 words
	wide := Tensor{Buf: wb, Shape: []int64{4, 48}}
	bias := Contiguous(yb, 5)
	for _, c := range []struct {
		name string
		x, w Tensor
		enc  Encoding
		bias *Tensor
		y    Tensor
		want string
	}{
		{"K not in blocks", Contiguous(xb, 1, 48), wide, EncQ8_0, nil, Contiguous(yb, 1, 4), "not a multiple of Q8_0's block of 32"},
		{"past the buffer", x, short, EncQ8_0, nil, y, "reaches past its buffer"},
		{"F32 weight", x, w, EncF32, nil, y, "not supported"},
		{"x's K", Contiguous(xb, 2, 16), w, EncQ8_0, nil, y, "want x [.., 32]"},
		{"y's N", x, w, EncQ8_0, nil, Contiguous(yb, 1, 5), "want x [.., 32], y [.., 4]"},
		{"bias size", x, w, EncQ8_0, &bias, y, "bias of shape [5]"},
		{"strided x", Tensor{Buf: xb, Shape: []int64{1, 32}, Stride: []int64{1, 2}}, w, EncQ8_0, nil, y, "contiguous"},
		{"y over x", x, w, EncQ8_0, nil, lqAt(xb, 30, 1, 4), "y overlaps x"},
		{"y over W", x, w, EncQ8_0, nil, lqAt(wb, 3, 1, 4), "y overlaps W"},
	} {
		_, err := LinearQOp(c.x, c.w, c.enc, c.bias, c.y)
		if err == nil || !strings.HasPrefix(err.Error(), "vulkan: linearq: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (want %q)", c.name, err, c.want)
		}
	}
}

// GatherRows from tables in every encoding, indices in any order and repeated, some out of
// range (rows of zeros), the table mid-buffer among garbage: every value bit for bit what
// the engine's dequantiser gives (F32 and I32 copied).
func TestGatherRowsQuant(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(35, 36))
	const n = 9
	idx := []int32{8, 0, 3, 3, -1, 7, 1, 9, 8, 2}
	ib := upload(t, d, make([]float32, 1+len(idx)))
	copy(unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(ib.Float32s()))), ib.Len())[1:], idx)
	it := lqAt(ib, 1, int64(len(idx)))
	for _, c := range []struct {
		enc Encoding
		d   int64
	}{{EncF32, 37}, {EncI32, 37}, {EncQ8_0, 96}, {EncF16, 37}, {EncBF16, 37}, {EncQ4_K, 512}} {
		v := randoms(rng, int(n*c.d), 0.7)
		enc := c.enc
		if enc == EncI32 {
			enc = EncF32 // the same bits
		}
		raw, deq := lqEncode(t, v, enc)
		off := 3
		tb, tt := lqUploadBytes(t, d, raw, off, n, c.d)
		if c.enc == EncF32 || c.enc == EncI32 {
			tt = lqAt(tb, off, n, c.d)
		}
		yb := upload(t, d, make([]float32, 2+len(idx)*int(c.d)))
		ds, err := GatherRowsOp(tt, c.enc, it, lqAt(yb, 2, int64(len(idx)), c.d))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Run(ds); err != nil {
			t.Fatal(err)
		}
		lqCheckGathered(t, c.enc.String(), yb.Float32s()[2:], idx, deq, n, c.d)
	}
}

// lqCheckGathered checks y [len(idx), d] against the rows of table [n, d] (values), bit for
// bit, zeros for indices outside it.
func lqCheckGathered(t *testing.T, what string, y []float32, idx []int32, table []float32, n, d int64) {
	t.Helper()
	for i, r := range idx {
		for j := range d {
			want := float32(0)
			if r >= 0 && int64(r) < n {
				want = table[int64(r)*d+j]
			}
			if g := y[int64(i)*d+j]; math.Float32bits(g) != math.Float32bits(want) {
				t.Fatalf("%s: y[%d, %d] (row %d) = %v, want %v", what, i, j, r, g, want)
			}
		}
	}
}

// Bad gathers are errors naming the op.
func TestGatherRefuses(t *testing.T) {
	d := device(t)
	tb, ib, yb := upload(t, d, make([]float32, 64)), upload(t, d, make([]float32, 4)), upload(t, d, make([]float32, 256))
	q := Tensor{Buf: tb, Shape: []int64{4, 32}}
	for _, c := range []struct {
		name   string
		table  Tensor
		enc    Encoding
		idx, y Tensor
		want   string
	}{
		{"Q4_K row of 32", q, EncQ4_K, Contiguous(ib, 4), Contiguous(yb, 4, 32), "not a multiple of Q4_K's block of 256"},
		{"past the buffer", Tensor{Buf: tb, Off: 40, Shape: []int64{4, 32}}, EncQ8_0, Contiguous(ib, 4), Contiguous(yb, 4, 32), "reaches past"},
		{"y's width", q, EncQ8_0, Contiguous(ib, 4), Contiguous(yb, 4, 16), "want [4, 32]"},
		{"y over the table", Contiguous(tb, 4, 8), EncF32, Contiguous(ib, 2), lqAt(tb, 8, 2, 8), "y overlaps table"},
		{"strided F32 table", Tensor{Buf: tb, Shape: []int64{4, 8}, Stride: []int64{1, 4}}, EncF32, Contiguous(ib, 4), Contiguous(yb, 4, 8), "contiguous"},
		{"unknown", q, Encoding(4), Contiguous(ib, 4), Contiguous(yb, 4, 32), "not supported"},
	} {
		_, err := GatherRowsOp(c.table, c.enc, c.idx, c.y)
		if err == nil || !strings.HasPrefix(err.Error(), "vulkan: gather: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (want %q)", c.name, err, c.want)
		}
	}
}

// Decode-shaped products (x rows 1 and 16, W 4096×4096 in device memory) per encoding with
// the shader Linear picks, and a prefill-shaped one (64 rows) with each shader that can take
// it; the bytes are W's, so MB/s is the weight bandwidth a token step gets.
func BenchmarkLinearQ(b *testing.B) {
	devs, err := Devices()
	if err != nil || len(devs) == 0 {
		b.Skip("no Vulkan device")
	}
	d, err := Open(0)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	const n, k = 4096, 4096
	rng := rand.New(rand.NewPCG(1, 1))
	wf := randoms(rng, n*k, 0.5)
	for _, enc := range []Encoding{EncQ8_0, EncF16, EncBF16, EncQ4_K} {
		var raw []byte
		switch enc {
		case EncQ4_K:
			raw, err = ggufpack.QuantizeQ4_K(wf)
		default:
			to := map[Encoding]cgo.DType{EncQ8_0: cgo.Q8_0, EncF16: cgo.F16, EncBF16: cgo.BF16}[enc]
			raw = make([]byte, cgo.EncodeBytes(to, len(wf)))
			_, err = cgo.EncodeWeights(raw, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(wf))), 4*len(wf)), cgo.F32, to, len(wf), 4)
		}
		if err != nil {
			b.Fatal(err)
		}
		words := (len(raw) + 3) / 4
		st, err := d.Alloc(words, true)
		if err != nil {
			b.Fatal(err)
		}
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(st.Float32s()))), 4*words), raw)
		wb, err := d.Alloc(words, false)
		if err == nil {
			err = st.CopyTo(wb, words)
		}
		st.Free()
		if err != nil {
			b.Fatal(err)
		}
		for _, run := range []struct {
			m      int64
			shader string
		}{{1, ""}, {1, "linearq_sg"}, {16, ""}, {16, "linearq_sg"}, {64, "linearq_sg"}, {64, "linearq_sg8"}, {64, "linearq_tiled"}, {64, "linearq_tiled_f16"}} {
			m := run.m
			name := enc.String() + "/M=" + strconv.Itoa(int(m))
			if run.shader != "" {
				name += "/" + run.shader
			}
			b.Run(name, func(b *testing.B) {
				if run.shader == "linearq_tiled_f16" && !d.Info.FP16 {
					b.Skip("no shaderFloat16")
				}
				lqTestShader = run.shader
				defer func() { lqTestShader = "" }()
				xb, err := d.Alloc(int(m*k), false)
				if err != nil {
					b.Fatal(err)
				}
				defer xb.Free()
				yb, err := d.Alloc(int(m*n), false)
				if err != nil {
					b.Fatal(err)
				}
				defer yb.Free()
				ds, err := LinearQOp(Contiguous(xb, m, k), Tensor{Buf: wb, Shape: []int64{n, k}}, enc, nil, Contiguous(yb, m, n))
				if err != nil {
					b.Fatal(err)
				}
				p, err := d.NewProgram([]Dispatch{ds})
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				b.SetBytes(int64(len(raw)))
				for b.Loop() {
					if err := p.Run(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(2*m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
		wb.Free()
	}
}

// A table held in parts (one buffer each, as a table too large for one buffer is): one
// GatherRowsPartOp per part writes the rows of its indices and leaves the others' alone, and
// together they give what one gather from the whole table gives, zeros for indices outside
// the whole table included.
func TestGatherRowsParts(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(37, 38))
	const n = 9
	idx := []int32{8, 0, 3, 4, -1, 7, 1, 9, 8, 5}
	ib := upload(t, d, make([]float32, len(idx)))
	copy(unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(ib.Float32s()))), ib.Len()), idx)
	it := lqAt(ib, 0, int64(len(idx)))
	parts := [][2]int64{{0, 4}, {4, 8}, {8, 9}}
	for _, c := range []struct {
		enc Encoding
		d   int64
	}{{EncF32, 37}, {EncQ8_0, 96}, {EncF16, 37}, {EncQ4_K, 256}} {
		v := randoms(rng, int(n*c.d), 0.7)
		raw, deq := lqEncode(t, v, c.enc)
		rb := c.enc.RowBytes(c.d)
		const sentinel = 12345.5
		yv := make([]float32, len(idx)*int(c.d))
		for i := range yv {
			yv[i] = sentinel
		}
		yb := upload(t, d, yv)
		yt := lqAt(yb, 0, int64(len(idx)), c.d)
		for pi, p := range parts {
			rows := p[1] - p[0]
			pb, pt := lqUploadBytes(t, d, raw[p[0]*rb:p[1]*rb], 1, rows, c.d)
			if c.enc == EncF32 {
				pt = lqAt(pb, 1, rows, c.d)
			}
			ds, err := GatherRowsPartOp(pt, c.enc, p[0], n, it, yt)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Run(ds); err != nil {
				t.Fatal(err)
			}
			got := yb.Float32s()
			for i, r := range idx {
				done := slices.ContainsFunc(parts[:pi+1], func(q [2]int64) bool { return int64(r) >= q[0] && int64(r) < q[1] })
				want := float32(sentinel)
				switch {
				case done:
					want = deq[int64(r)*c.d]
				case r < 0 || r >= n: // the first part writes the zeros
					want = 0
				}
				if g := got[int64(i)*c.d]; math.Float32bits(g) != math.Float32bits(want) {
					t.Fatalf("%s after part %d: y[%d, 0] (row %d) = %v, want %v", c.enc, pi, i, r, g, want)
				}
			}
		}
		lqCheckGathered(t, c.enc.String(), yb.Float32s(), idx, deq, n, c.d)
	}
	if _, err := GatherRowsPartOp(lqAt(ib, 0, 4, 1), EncF32, 7, 9, it, lqAt(ib, 0, int64(len(idx)), 1)); err == nil || !strings.Contains(err.Error(), "from row 7 of a table of 9") {
		t.Errorf("a part past the table's end: %v", err)
	}
}

// Linear into a slice of columns of a wider output (rows ldy apart), as a weight held in
// parts computes one part's outputs: two parts of W fill y's columns [0, 5) and [5, 12) of
// rows 16 wide, the columns past 12 and the values around y untouched.
func TestLinearQColumnSlices(t *testing.T) {
	lqEachShader(t, testLinearQColumnSlices)
}

func testLinearQColumnSlices(t *testing.T) {
	d := device(t)
	rng := rand.New(rand.NewPCG(39, 40))
	const m, n, k, ld = 3, 12, 64, 16
	for _, enc := range []Encoding{EncQ8_0, EncF16} {
		wf := randoms(rng, n*k, 0.5)
		raw, deq := lqEncode(t, wf, enc)
		bias := randoms(rng, n, 1)
		bb := upload(t, d, bias)
		x := randoms(rng, m*k, 1)
		xb := upload(t, d, x)
		const sentinel = 12345.5
		yv := make([]float32, 2+m*ld)
		for i := range yv {
			yv[i] = sentinel
		}
		yb := upload(t, d, yv)
		rb := enc.RowBytes(k)
		for _, p := range [][2]int64{{0, 5}, {5, n}} {
			_, wt := lqUploadBytes(t, d, raw[p[0]*rb:p[1]*rb], 1, p[1]-p[0], k)
			yt := Tensor{Buf: yb, Off: 2 + int(p[0]), Shape: []int64{m, p[1] - p[0]}, Stride: []int64{ld, 1}}
			bt := lqAt(bb, int(p[0]), p[1]-p[0])
			ds, err := LinearQOp(lqAt(xb, 0, m, k), wt, enc, &bt, yt)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Run(ds); err != nil {
				t.Fatal(err)
			}
		}
		got := yb.Float32s()
		y := make([]float32, 0, m*n)
		for i := range m {
			row := got[2+i*ld:]
			y = append(y, row[:n]...)
			for j := n; j < ld && 2+i*ld+j < len(got); j++ {
				if row[j] != sentinel {
					t.Fatalf("%s: y[%d, %d] past the slices changed: %v", enc, i, j, row[j])
				}
			}
		}
		if got[0] != sentinel || got[1] != sentinel {
			t.Fatalf("%s: the values before y changed", enc)
		}
		lqCheckLinear(t, enc.String(), x, deq, bias, true, lqShader(d, enc, m), y, m, n, k)
	}
	// Rows that overlap (a stride shorter than the row) are refused.
	xb := upload(t, d, make([]float32, 2*64))
	_, wt := lqUploadBytes(t, d, make([]byte, 2*68), 0, 2, 64)
	bad := Tensor{Buf: xb, Shape: []int64{2, 2}, Stride: []int64{1, 1}}
	if _, err := LinearQOp(lqAt(xb, 0, 2, 64), wt, EncQ8_0, nil, bad); err == nil || !strings.Contains(err.Error(), "rows of contiguous values") {
		t.Errorf("overlapping rows of y: %v", err)
	}
	// So is x lying between y's rows: the shader would read values others write.
	yx := upload(t, d, make([]float32, 200))
	spread := Tensor{Buf: yx, Shape: []int64{2, 2}, Stride: []int64{100, 1}}
	if _, err := LinearQOp(lqAt(yx, 10, 2, 64), wt, EncQ8_0, nil, spread); err == nil || !strings.Contains(err.Error(), "y overlaps x") {
		t.Errorf("x between the rows of y: %v", err)
	}
}

// Integer dot products and binary16 tiles are each on by default on GPUs that have them,
// off on software devices; VOXPIPE_VULKAN_INT8_DOT and VOXPIPE_VULKAN_F16 override that, and
// any other value is an error naming the choices.
func TestGPUFeaturePolicies(t *testing.T) {
	for _, p := range []struct {
		env, bad      string
		policy        func(DeviceInfo) (bool, error)
		gpu, cpu, old DeviceInfo // with the feature, a software device with it, a GPU without
	}{
		{"VOXPIPE_VULKAN_INT8_DOT", "yes", int8DotPolicy, DeviceInfo{Type: Discrete, DotI8: true, SubgroupArith: true},
			DeviceInfo{Type: CPU, DotI8: true, SubgroupArith: true}, DeviceInfo{Type: Discrete, SubgroupArith: true}},
		{"VOXPIPE_VULKAN_F16", "on", halfTilesPolicy, DeviceInfo{Type: Integrated, FP16: true},
			DeviceInfo{Type: CPU, FP16: true}, DeviceInfo{Type: Discrete}},
	} {
		for _, c := range []struct {
			env  string
			info DeviceInfo
			want bool
		}{{"", p.gpu, true}, {"", p.cpu, false}, {"", p.old, false}, {"0", p.gpu, false}, {"1", p.cpu, true}, {"1", p.old, false}} {
			t.Setenv(p.env, c.env)
			if got, err := p.policy(c.info); err != nil || got != c.want {
				t.Errorf("%s=%q on %+v: %v, %v (want %v)", p.env, c.env, c.info, got, err, c.want)
			}
		}
		t.Setenv(p.env, p.bad)
		if _, err := p.policy(p.gpu); err == nil || !strings.Contains(err.Error(), "0 (never), 1") || !strings.Contains(err.Error(), p.env) {
			t.Errorf("%s=%q: %v", p.env, p.bad, err)
		}
	}
}

// Tiles start at 24 x rows on GPUs and never on software devices that take linearq_sg8,
// unless VOXPIPE_VULKAN_TILE_ROWS says otherwise (0: never); a value that is no count is an
// error naming the choices.
func TestTileRowsPolicy(t *testing.T) {
	gpu := DeviceInfo{Type: Discrete, SubgroupArith: true, SubgroupSize: 32}
	cpu := DeviceInfo{Type: CPU, SubgroupArith: true, SubgroupSize: 8}
	narrow := DeviceInfo{Type: CPU, SubgroupArith: true, SubgroupSize: 4}
	for _, c := range []struct {
		env  string
		info DeviceInfo
		want int64
	}{{"", gpu, 24}, {"", cpu, 0}, {"", narrow, 24}, {"0", gpu, 0}, {"64", gpu, 64}, {"24", cpu, 24}} {
		t.Setenv("VOXPIPE_VULKAN_TILE_ROWS", c.env)
		if got, err := tileRowsPolicy(c.info); err != nil || got != c.want {
			t.Errorf("env %q on %+v: %v, %v (want %v)", c.env, c.info, got, err, c.want)
		}
	}
	for _, bad := range []string{"-1", "many", "1e9999"} {
		t.Setenv("VOXPIPE_VULKAN_TILE_ROWS", bad)
		if _, err := tileRowsPolicy(gpu); err == nil || !strings.Contains(err.Error(), "0: never") {
			t.Errorf("env %q: %v", bad, err)
		}
	}
	t.Setenv("VOXPIPE_VULKAN_TILE_ROWS", "")
	d := device(t)
	want := "Linear: int8 dot products off, tiles never"
	if !lqOneSubgroup(d.Info) {
		want = fmt.Sprintf("Linear: int8 dot products %s, tiles from 24 rows (binary16 %s)", map[bool]string{false: "off", true: "on"}[d.int8Dot], map[bool]string{false: "off", true: "on"}[d.half])
	}
	if got := d.LinearPaths(); got != want {
		t.Errorf("LinearPaths: %q, want %q", got, want)
	}
	for _, c := range []struct {
		rows, m int64
		want    bool
	}{{24, 23, false}, {24, 24, true}, {0, 1000, false}, {2, 2, true}} {
		old := d.tileRow
		d.tileRow = c.rows
		if got := lqTiled(lqShader(d, EncF16, c.m)); got != c.want {
			t.Errorf("tiles from %d rows, %d rows: tiled %v", c.rows, c.m, got)
		}
		d.tileRow = old
	}
}
