package ggufpack

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine/gguf"
)

// The C encoder (cgo.EncodeWeights, behind Writer.WriteLE) must write exactly the bytes of
// the Go encoders (Encode) for the float32 values engine/ckpt decodes from the same source
// bytes: every source and stored type, every SIMD level, one and two goroutines.

var encSources = []struct {
	name string
	g    gguf.DType
	c    cgo.DType
	size int
}{{"f32", gguf.F32, cgo.F32, 4}, {"f16", gguf.F16, cgo.F16, 2}, {"bf16", gguf.BF16, cgo.BF16, 2}}

var encTargets = []struct {
	g gguf.DType
	c cgo.DType
}{{gguf.F32, cgo.F32}, {gguf.F16, cgo.F16}, {gguf.BF16, cgo.BF16}, {gguf.Q8_0, cgo.Q8_0}}

// decodeLE is engine/ckpt's decoding of little-endian source bytes.
func decodeLE(src []byte, dt gguf.DType) []float32 {
	switch dt {
	case gguf.F16:
		out := make([]float32, len(src)/2)
		for i := range out {
			out[i] = gguf.HalfToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
		return out
	case gguf.BF16:
		out := make([]float32, len(src)/2)
		for i := range out {
			out[i] = gguf.BF16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
		return out
	}
	out := make([]float32, len(src)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return out
}

// putLE stores bits (a float32's) as one element of dt: f32 as is, bf16 its top half, f16
// its own 16 bits (the low half of bits).
func putLE(dst []byte, i int, bits uint32, dt gguf.DType) {
	switch dt {
	case gguf.F32:
		binary.LittleEndian.PutUint32(dst[4*i:], bits)
	case gguf.BF16:
		binary.LittleEndian.PutUint16(dst[2*i:], uint16(bits>>16))
	default:
		binary.LittleEndian.PutUint16(dst[2*i:], uint16(bits))
	}
}

// encEdgeBits are blocks of 32 float32 bit patterns that exercise every branch of the
// encoders: zeros, subnormals, the largest values, products that land on a half, NaNs
// (several payloads and signs, one or more per block, anywhere), infinities, and blocks whose
// largest magnitude straddles the C encoder's fast-path bounds (2^-101) and the range where
// 1/d overflows.
func encEdgeBits(rng *rand.Rand) [][32]uint32 {
	var blocks [][32]uint32
	add := func(f func(j int) uint32) {
		var b [32]uint32
		for j := range b {
			b[j] = f(j)
		}
		blocks = append(blocks, b)
	}
	f := math.Float32bits
	add(func(int) uint32 { return 0 })
	add(func(j int) uint32 { return uint32(j%2) << 31 }) // ±0
	add(func(j int) uint32 { return uint32(j + 1) })     // the smallest subnormals
	add(func(j int) uint32 { return uint32(j)<<31 | uint32(j*12345+1) })
	add(func(j int) uint32 { return 0x007fffff - uint32(j) })
	add(func(j int) uint32 { return 0x7f7fffff ^ uint32(j%2)<<31 }) // ±max
	add(func(j int) uint32 {
		if j == 0 {
			return f(127)
		}
		return f(float32(j-16) + 0.5) // id = 1: each product is its value, a half
	})
	add(func(j int) uint32 {
		if j == 0 {
			return f(-127)
		}
		return f(-(float32(j-16) + 0.5))
	})
	add(func(j int) uint32 { return f(float32(j) - 15.5) }) // amax 16.5: products near halves
	for _, special := range []uint32{0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00123, 0xffbfffff, 0x7fffffff, 0x7f802000, 0xff800100} {
		for _, at := range []int{0, 5, 31} {
			add(func(j int) uint32 {
				if j == at {
					return special
				}
				return f(float32(rng.NormFloat64()))
			})
		}
	}
	// two NaNs (and a NaN then an Inf) in one block: Go's max keeps bits of both
	add(func(j int) uint32 {
		switch j {
		case 3:
			return 0x7f800123
		case 20:
			return 0xffc04000
		}
		return f(float32(j) * 1.25)
	})
	add(func(j int) uint32 {
		switch j {
		case 3:
			return 0x7fc00001
		case 20:
			return 0x7f800000
		}
		return f(float32(j) * -3.5)
	})
	// largest magnitudes around the fast path's lower bound and into the subnormals
	for _, top := range []uint32{0x0d000000, 0x0cffffff, 0x0d000001, 0x00800000, 0x01000000, 0x03ffffff, 0x04000000, 0x00400000, 0x0000007f, 0x0000003f, 0x00000040} {
		add(func(j int) uint32 {
			if j == 7 {
				return top
			}
			return rng.Uint32()&0x80000000 | rng.Uint32N(top+1)
		})
	}
	return blocks
}

// encInput is the source bytes for one test: edge blocks, random bit patterns, and values of
// every magnitude, n values in all (a whole number of 32-value blocks when block is set).
func encInput(rng *rand.Rand, dt gguf.DType, n int) []byte {
	es := dt.BlockBytes()
	src := make([]byte, n*es)
	i := 0
	for _, b := range encEdgeBits(rng) {
		for j := range b {
			if i >= n {
				return src
			}
			bits := b[j]
			if dt == gguf.F16 { // the same kinds of values as halves
				bits = uint32(gguf.Float32ToHalf(math.Float32frombits(bits)))
				if b[j]&0x7f800000 == 0x7f800000 && b[j]&0x7fffff != 0 {
					bits = b[j]>>16&0x8000 | 0x7c00 | uint32(j+1)&0x3ff // NaNs with several payloads
				}
			}
			putLE(src, i, bits, dt)
			i++
		}
	}
	for ; i < n; i++ {
		var bits uint32
		switch i / 64 % 3 {
		case 0: // any bit pattern
			bits = rng.Uint32()
			if dt != gguf.F32 {
				bits = bits<<16 | bits>>16
			}
		case 1: // values of one scale per block, any scale
			scale := math.Pow(2, float64(int(rng.Uint32N(250))-140))
			v := math.Float32bits(float32(rng.NormFloat64() * scale))
			if dt == gguf.F16 {
				v = uint32(gguf.Float32ToHalf(float32(rng.NormFloat64() * math.Pow(2, float64(int(rng.Uint32N(36))-26)))))
			}
			bits = v
		default: // weights-like values
			bits = math.Float32bits(float32(rng.NormFloat64() * 0.02))
			if dt == gguf.F16 {
				bits = uint32(gguf.Float32ToHalf(math.Float32frombits(bits)))
			}
		}
		putLE(src, i, bits, dt)
	}
	return src
}

// encLevels runs f under each SIMD level of the C encoder, restoring the detected one.
func encLevels(t *testing.T, f func(t *testing.T)) {
	all := cgo.Init()
	defer cgo.LimitCPUFeatures(all)
	for _, l := range []struct {
		name string
		mask int
	}{{"portable", 0}, {"avx2", all &^ cgo.CPUAVX512F}, {"all", all}} {
		t.Run(l.name, func(t *testing.T) {
			cgo.LimitCPUFeatures(l.mask)
			f(t)
		})
	}
}

func firstDiff(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("byte %d: %#02x, want %#02x", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("%d bytes, want %d", len(a), len(b))
}

func TestEncodeWeightsMatchesGo(t *testing.T) {
	encLevels(t, func(t *testing.T) {
		for _, s := range encSources {
			for _, tg := range encTargets {
				for _, n := range []int{32, 96, 1056, 3 * 32 * 1001, 2*(64<<10) + 32*7} { // the last two split over goroutines
					rng := rand.New(rand.NewPCG(uint64(n), uint64(s.g)))
					src := encInput(rng, s.g, n)
					want, err := Encode(nil, decodeLE(src, s.g), tg.g)
					if err != nil {
						t.Fatal(err)
					}
					for _, threads := range []int{1, 2} {
						got := make([]byte, cgo.EncodeBytes(tg.c, n)+3)
						m, err := cgo.EncodeWeights(got, src, s.c, tg.c, n, threads)
						if err != nil {
							t.Fatal(err)
						}
						if m != len(want) || !bytes.Equal(got[:m], want) || !bytes.Equal(got[m:], make([]byte, 3)) {
							t.Errorf("%s → %v, %d values, %d threads: %s", s.name, tg.g, n, threads, firstDiff(got[:m], want))
						}
					}
				}
			}
		}
	})
}

// Element types take any count: the SIMD runs of 8 and the portable tail meet anywhere.
func TestEncodeWeightsOddLengths(t *testing.T) {
	encLevels(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 7))
		for _, s := range encSources {
			for _, tg := range encTargets[:3] {
				for _, n := range []int{1, 3, 7, 8, 9, 15, 17, 31, 33, 1001} {
					src := encInput(rng, s.g, n)
					want, _ := Encode(nil, decodeLE(src, s.g), tg.g)
					got := make([]byte, cgo.EncodeBytes(tg.c, n))
					if _, err := cgo.EncodeWeights(got, src, s.c, tg.c, n, 2); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, want) {
						t.Errorf("%s → %v, %d values: %s", s.name, tg.g, n, firstDiff(got, want))
					}
				}
			}
		}
	})
}

func TestEncodeWeightsErrors(t *testing.T) {
	buf := make([]byte, 1<<10)
	for _, c := range []struct {
		name     string
		dst, src []byte
		from, to cgo.DType
		n        int
	}{
		{"q8_0 of 33", buf, buf, cgo.F32, cgo.Q8_0, 33},
		{"q4_k target", buf, buf, cgo.F32, cgo.Q4_K, 256},
		{"q8_0 source", buf, buf, cgo.Q8_0, cgo.F32, 32},
		{"short source", buf, buf[:127], cgo.F32, cgo.F16, 32},
		{"short destination", buf[:63], buf, cgo.F32, cgo.F16, 32},
		{"negative count", buf, buf, cgo.F32, cgo.F32, -1},
	} {
		if _, err := cgo.EncodeWeights(c.dst, c.src, c.from, c.to, c.n, 1); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}

// WriteLE writes the file WriteFloat32 writes, for every source and stored type (Q4_K too),
// rows of odd lengths, chunks of several rows.
func TestWriteLEMatchesWriteFloat32(t *testing.T) {
	encLevels(t, func(t *testing.T) {
		for _, s := range encSources {
			rng := rand.New(rand.NewPCG(11, uint64(s.g)))
			table := []Tensor{
				{Name: "odd.f32", Shape: []int{3, 7}, Type: gguf.F32},
				{Name: "odd.f16", Shape: []int{5, 9}, Type: gguf.F16},
				{Name: "odd.bf16", Shape: []int{1, 33}, Type: gguf.BF16},
				{Name: "q8", Shape: []int{5, 96}, Type: gguf.Q8_0},
				{Name: "q8.big", Shape: []int{700, 224}, Type: gguf.Q8_0},
				{Name: "q4k", Shape: []int{3, 512}, Type: gguf.Q4_K},
				{Name: "scalar", Shape: nil, Type: gguf.F32},
			}
			srcs := make([][]byte, len(table))
			for i, tt := range table {
				n := 1
				for _, d := range tt.Shape {
					n *= d
				}
				srcs[i] = encInput(rng, s.g, n)
				if tt.Type == gguf.Q4_K { // Q4_K of NaN/Inf is not defined by ggml: finite values
					for j := range srcs[i] {
						if s.g != gguf.F16 && j%4 == 3 || s.g == gguf.F16 && j%2 == 1 {
							srcs[i][j] &= 0x3f
						}
					}
				}
			}
			write := func(le bool) []byte {
				var out bytes.Buffer
				w, err := New(&out, gguf.KV{}, table, nil)
				if err != nil {
					t.Fatal(err)
				}
				for i, tt := range table {
					row := max(rowLen(tt), 1) * s.size
					for off := 0; off < len(srcs[i]); off += 3 * row { // three rows a call
						part := srcs[i][off:min(off+3*row, len(srcs[i]))]
						if le {
							err = w.WriteLE(part, s.g)
						} else {
							err = w.WriteFloat32(decodeLE(part, s.g))
						}
						if err != nil {
							t.Fatalf("%s: %v", tt.Name, err)
						}
					}
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				return out.Bytes()
			}
			want, got := write(false), write(true)
			if !bytes.Equal(got, want) {
				t.Errorf("%s sources: %s", s.name, firstDiff(got, want))
			}
		}
	})
}

// With ENCODE_EXHAUSTIVE=1, every float32 bit pattern (and every f16/bf16 one) goes through
// each element conversion, and every float32 through Q8_0 as the largest magnitude of a
// block of its fractions: about a minute on two cores.
func TestEncodeWeightsExhaustive(t *testing.T) {
	if os.Getenv("ENCODE_EXHAUSTIVE") == "" {
		t.Skip("ENCODE_EXHAUSTIVE=1 runs it")
	}
	const chunk = 1 << 20
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	fails := 0
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if fails++; fails < 10 {
			t.Errorf(format, args...)
		}
	}
	for w := range workers {
		wg.Go(func() {
			src := make([]byte, 4*chunk)
			q8src := make([]byte, 4*chunk)
			got := make([]byte, 4*chunk+chunk/32*34)
			for c := uint64(w); c < 1<<32/chunk; c += uint64(workers) {
				for i := range chunk {
					bits := uint32(c*chunk) + uint32(i)
					binary.LittleEndian.PutUint32(src[4*i:], bits)
					// block i/32: element 0 is the pattern, the others its fractions j/32
					v := math.Float32frombits(uint32(c*chunk) + uint32(i&^31))
					if i%32 == 0 {
						binary.LittleEndian.PutUint32(q8src[4*i:], math.Float32bits(v))
					} else {
						binary.LittleEndian.PutUint32(q8src[4*i:], math.Float32bits(v*float32(i%32)/32))
					}
				}
				vals, q8vals := decodeLE(src, gguf.F32), decodeLE(q8src, gguf.F32)
				for _, tg := range encTargets {
					in, fv := src, vals
					if tg.g == gguf.Q8_0 {
						in, fv = q8src, q8vals
					}
					want, _ := Encode(nil, fv, tg.g)
					m, err := cgo.EncodeWeights(got, in, cgo.F32, tg.c, chunk, 1)
					if err != nil || !bytes.Equal(got[:m], want) {
						fail("f32 → %v, patterns %#x…: %v %s", tg.g, c*chunk, err, firstDiff(got[:m], want))
					}
				}
				if c < 1 { // all 16-bit patterns, once
					for _, s := range encSources[1:] {
						h := make([]byte, 2<<16)
						for i := range 1 << 16 {
							binary.LittleEndian.PutUint16(h[2*i:], uint16(i))
						}
						for _, tg := range encTargets {
							want, _ := Encode(nil, decodeLE(h, s.g), tg.g)
							m, _ := cgo.EncodeWeights(got, h, s.c, tg.c, 1<<16, 1)
							if !bytes.Equal(got[:m], want) {
								fail("%s → %v: %s", s.name, tg.g, firstDiff(got[:m], want))
							}
						}
					}
				}
			}
		})
	}
	wg.Wait()
}
