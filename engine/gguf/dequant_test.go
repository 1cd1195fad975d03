package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goldenFile returns the path of a file under the golden folder, or skips the test when it
// is not there.
func goldenFile(t testing.TB, rel ...string) string {
	t.Helper()
	dir := goldenDir(t)
	path := filepath.Join(append([]string{dir}, rel...)...)
	if _, err := os.Stat(path); err != nil {
		t.Skipf("golden data not available (%v); set VOXPIPE_GOLDEN_DIR to the golden folder", err)
	}
	return path
}

func openGolden(t testing.TB, rel ...string) *File {
	t.Helper()
	f, err := Open(goldenFile(t, rel...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestGoldenDequant checks every decoder against ggml's own dequantised values, bit for bit.
func TestGoldenDequant(t *testing.T) {
	want := openGolden(t, "quant", "expected_dequant_f32.gguf")
	src := openGolden(t, "quant", "source_f32.gguf")
	for _, c := range []struct {
		file string
		typ  DType
		tol  float64 // rough bound on the rel-RMS quantisation error, informative
	}{
		{"f16", F16, 3e-4}, {"bf16", BF16, 3e-3}, {"q8_0", Q8_0, 1e-2}, {"q4_k", Q4_K, 1e-1},
	} {
		t.Run(c.file, func(t *testing.T) {
			f := openGolden(t, "quant", c.file+".gguf")
			for _, m := range []string{"mat_a", "mat_b"} {
				ti, ok := f.Tensor(m)
				if !ok || ti.Type != c.typ {
					t.Fatalf("%s: tensor %s missing or not %s (%+v)", c.file, m, c.typ, ti)
				}
				got, shape, err := f.Float32(m)
				if err != nil {
					t.Fatal(err)
				}
				exp, eshape, err := want.Float32(m + "." + c.file)
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(shape) != fmt.Sprint(eshape) || len(got) != len(exp) {
					t.Fatalf("%s: shape %v, want %v", m, shape, eshape)
				}
				bad := 0
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(exp[i]) {
						if bad < 5 {
							t.Errorf("%s.%s[%d] = %v (%#08x), want %v (%#08x)", m, c.file, i, got[i],
								math.Float32bits(got[i]), exp[i], math.Float32bits(exp[i]))
						}
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("%s.%s: %d of %d values differ", m, c.file, bad, len(got))
				}
				// Sanity: close to the source values.
				orig, _, err := src.Float32(m)
				if err != nil {
					t.Fatal(err)
				}
				var num, den float64
				for i := range orig {
					e := float64(got[i]) - float64(orig[i])
					num += e * e
					den += float64(orig[i]) * float64(orig[i])
				}
				rel := math.Sqrt(num / den)
				t.Logf("%s %v %s: bit-exact, rel-RMS error vs source %.2g", m, shape, c.typ, rel)
				if rel > c.tol {
					t.Errorf("%s: rel-RMS error %.3g above %.3g", m, rel, c.tol)
				}
			}
		})
	}
}

func TestDequantizeErrors(t *testing.T) {
	cases := []struct {
		n    int
		src  int
		typ  DType
		want string
	}{
		{31, 34, Q8_0, "not a multiple of the block size 32"},
		{32, 33, Q8_0, "33 bytes for 32 elements, want 34"},
		{256, 143, Q4_K, "want 144"},
		{32, 18, Q4_0, "Q4_0 not supported"},
		{1, 1, DType(99), "unknown dtype 99"},
	}
	for _, c := range cases {
		err := Dequantize(make([]float32, c.n), make([]byte, c.src), c.typ)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s n=%d src=%d: error %v, want %q", c.typ, c.n, c.src, err, c.want)
		}
	}
}

// TestQ4KLayout decodes hand-built super-blocks, one field at a time, to pin the packing.
func TestQ4KLayout(t *testing.T) {
	blk := make([]byte, 144)
	binary.LittleEndian.PutUint16(blk[0:], Float32ToHalf(0.5)) // d
	binary.LittleEndian.PutUint16(blk[2:], Float32ToHalf(2))   // dmin
	// Sub-block scales sc[j] = j+1 and mins m[j] = 10+j, packed as the format says.
	var sc, mn [8]uint8
	for j := range sc {
		sc[j], mn[j] = uint8(j+1)|uint8(j%2)<<5, uint8(10+j)|uint8(j/4)<<5 // use the high bits too
	}
	q := blk[4:16]
	for j := 0; j < 4; j++ {
		q[j] = sc[j]&63 | (sc[j+4]>>4)<<6
		q[j+4] = mn[j]&63 | (mn[j+4]>>4)<<6
		q[j+8] = sc[j+4]&0xF | (mn[j+4]&0xF)<<4
	}
	for j := 0; j < 8; j++ {
		s, m := q4kScaleMin(q, j)
		if s != sc[j] || m != mn[j] {
			t.Fatalf("sub-block %d: scale %d min %d, want %d %d", j, s, m, sc[j], mn[j])
		}
	}
	for l := 0; l < 128; l++ {
		blk[16+l] = uint8(l%16) | uint8((l+3)%16)<<4
	}
	out := make([]float32, 256)
	if err := Dequantize(out, blk, Q4_K); err != nil {
		t.Fatal(err)
	}
	for i, y := range out {
		c, half, l := i/64, (i%64)/32, i%32
		b := blk[16+32*c+l]
		qv := b & 0xF
		if half == 1 {
			qv = b >> 4
		}
		j := 2*c + half
		want := float32(float32(0.5*float64(sc[j]))*float32(qv)) - float32(2*float64(mn[j]))
		if y != want {
			t.Fatalf("value %d = %v, want %v", i, y, want)
		}
	}
}

func TestBF16AndQ8Edges(t *testing.T) {
	// BF16: every pattern is the upper half of the float32.
	for _, b := range []uint16{0, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x0001, 0x7fc1} {
		got := BF16ToFloat32(b)
		if math.Float32bits(got) != uint32(b)<<16 {
			t.Errorf("bf16 %#04x -> %#08x", b, math.Float32bits(got))
		}
	}
	// Q8_0 with d = 0: all zeros; with d = 1: the int8 values.
	blk := make([]byte, 68)
	binary.LittleEndian.PutUint16(blk[34:], 0x3c00)
	for j := 0; j < 32; j++ {
		blk[2+j] = uint8(int8(j - 16))
		blk[36+j] = uint8(int8(-128 + 9*j))
	}
	out := make([]float32, 64)
	if err := Dequantize(out, blk, Q8_0); err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 32; j++ {
		if out[j] != 0 || out[32+j] != float32(int8(-128+9*j)) {
			t.Fatalf("q8_0 value %d: %v %v", j, out[j], out[32+j])
		}
	}
}

// benchData builds n elements' worth of random bytes of type t with finite scales.
func benchData(t DType, n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n/t.BlockSize()*t.BlockBytes())
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	h := func(off int) { binary.LittleEndian.PutUint16(b[off:], Float32ToHalf(r.Float32()*0.1)) }
	switch t {
	case F16:
		for i := 0; i < len(b); i += 2 {
			h(i)
		}
	case Q8_0:
		for i := 0; i < len(b); i += 34 {
			h(i)
		}
	case Q4_K:
		for i := 0; i < len(b); i += 144 {
			h(i)
			h(i + 2)
		}
	}
	return b
}

// BenchmarkDequantize reports throughput in MB/s of encoded input (b.SetBytes) for 1 Mi
// elements (4 MiB of float32 output).
func BenchmarkDequantize(b *testing.B) {
	const n = 1 << 20
	for _, typ := range []DType{F32, F16, BF16, Q8_0, Q4_K} {
		b.Run(typ.String(), func(b *testing.B) {
			src := benchData(typ, n)
			dst := make([]float32, n)
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				if err := Dequantize(dst, src, typ); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Melem/s")
		})
	}
}
