package cgo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func benchBuf(b *testing.B, rng *rand.Rand, n int64) *Buffer {
	b.Helper()
	buf, err := Alloc(int(4 * n))
	if err != nil {
		b.Fatal(err)
	}
	f := buf.Float32s()
	for i := range f {
		f[i] = float32(rng.Float64()*2 - 1)
	}
	return buf
}

func tensorOf(buf *Buffer, shape ...int64) Tensor {
	return Tensor{Data: buf.Ptr(), DType: F32, Shape: shape, Stride: Contiguous(shape)}
}

// BenchmarkMatmul compares VX_OP_MATMUL on a 2-thread context with cblas_sgemm using
// OpenBLAS's own threads, at model shapes (M x K x N, B given as an nn.Linear weight [N, K]).
//
// "ours-2t" and "openblas-*t" make one cgo call per multiplication. The "-in-one-call"
// variants run many multiplications per cgo call (ours: a plan of 16 identical nodes), which
// is closer to a real plan: while a cgo call lasts, Go's sysmon wakes every 20us for the
// first millisecond or so and preempts the compute threads, which costs a 0.5 ms call far
// more than a long Execute.
func BenchmarkMatmul(b *testing.B) {
	Init()
	rng := rand.New(rand.NewPCG(1, 1))
	gflops := func(b *testing.B, flop float64) {
		b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	}
	for _, s := range [][3]int64{{160, 512, 512}, {16, 512, 1536}, {1, 1024, 3072}} {
		M, K, N := s[0], s[1], s[2]
		flop := 2 * float64(M*K*N)
		name := fmt.Sprintf("%dx%dx%d", M, K, N)
		a, w, c := benchBuf(b, rng, M*K), benchBuf(b, rng, N*K), benchBuf(b, rng, M*N)
		ts := []Tensor{tensorOf(a, M, K), tensorOf(w, N, K), tensorOf(c, M, N)}
		for _, nodes := range []int{1, 16} {
			sub := name + "/ours-2t"
			if nodes > 1 {
				sub += "-in-one-call"
			}
			b.Run(sub, func(b *testing.B) {
				ctx := newCtx(b, 2)
				defer ctx.Close()
				plan := make([]Node, nodes)
				for i := range plan {
					plan[i] = Node{Op: OpMatmul, Src: []int{0, 1}, Dst: 2, IP: [8]int64{1}}
				}
				p, err := NewPlan(plan, ts)
				if err != nil {
					b.Fatal(err)
				}
				defer p.Free()
				if err := ctx.Execute(p); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for b.Loop() {
					if err := ctx.Execute(p); err != nil {
						b.Fatal(err)
					}
				}
				gflops(b, flop*float64(nodes))
			})
		}
		for _, threads := range []int{2, 1} {
			b.Run(fmt.Sprintf("%s/openblas-%dt", name, threads), func(b *testing.B) {
				benchOpenBLASSgemm(threads, int(M), int(N), int(K), true, a, w, c, 1)
				b.ResetTimer()
				for b.Loop() {
					benchOpenBLASSgemm(threads, int(M), int(N), int(K), true, a, w, c, 1)
				}
				gflops(b, flop)
			})
			settleOpenBLAS()
		}
		b.Run(name+"/openblas-2t-in-one-call", func(b *testing.B) {
			benchOpenBLASSgemm(2, int(M), int(N), int(K), true, a, w, c, 1)
			b.ResetTimer()
			benchOpenBLASSgemm(2, int(M), int(N), int(K), true, a, w, c, b.N)
			gflops(b, flop)
		})
		settleOpenBLAS()
		a.Free()
		w.Free()
		c.Free()
	}
}

// settleOpenBLAS gives OpenBLAS's own worker threads, which spin for a while after a
// multi-threaded call, time to go to sleep before the next measurement.
func settleOpenBLAS() { time.Sleep(300 * time.Millisecond) }

// BenchmarkDispatch: a plan of 1000 tiny nodes (1x1x1 matmuls) on a 2-thread context gives
// the executor's per-node cost; parallel_for gives the pool's cost of one parallel call.
func BenchmarkDispatch(b *testing.B) {
	Init()
	rng := rand.New(rand.NewPCG(2, 2))
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("plan-1000-tiny-nodes/%dt", threads), func(b *testing.B) {
			ctx := newCtx(b, threads)
			defer ctx.Close()
			x, y, z := benchBuf(b, rng, 1), benchBuf(b, rng, 1), benchBuf(b, rng, 1)
			defer x.Free()
			defer y.Free()
			defer z.Free()
			nodes := make([]Node, 1000)
			for i := range nodes {
				nodes[i] = Node{Op: OpMatmul, Src: []int{0, 1}, Dst: 2}
			}
			p, err := NewPlan(nodes, []Tensor{tensorOf(x, 1, 1), tensorOf(y, 1, 1), tensorOf(z, 1, 1)})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Free()
			for b.Loop() {
				if err := ctx.Execute(p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/node")
		})
	}
	for _, n := range []int{2, 16} {
		b.Run(fmt.Sprintf("parallel_for-n%d/2t", n), func(b *testing.B) {
			ctx := newCtx(b, 2)
			defer ctx.Close()
			ctx.benchParallelFor(n, 1000)
			b.ResetTimer()
			ctx.benchParallelFor(n, b.N)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/call")
		})
	}
}

// BenchmarkAttention: full self-attention at T=500 and a GQA decode step.
func BenchmarkAttention(b *testing.B) {
	Init()
	rng := rand.New(rand.NewPCG(3, 3))
	cases := []struct {
		name                    string
		B, H, Hk, Tq, Tk, D, Dv int64
	}{
		{"self-T500-H8-D64", 1, 8, 8, 500, 500, 64, 64},
		{"decode-Tk500-H16-Hk8-D128", 1, 16, 8, 1, 500, 128, 128},
		{"decode-Tk128-H16-Hk8-D128", 1, 16, 8, 1, 128, 128, 128}, // MioTTS 0.6B, a cache bucket
		{"dit-step", 1, 2, 2, 16, 52, 64, 64},                     // MeanVC2: 16 frames over the cache
	}
	for _, c := range cases {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/%dt", c.name, threads), func(b *testing.B) {
				ctx := newCtx(b, threads)
				defer ctx.Close()
				q := benchBuf(b, rng, c.B*c.H*c.Tq*c.D)
				k := benchBuf(b, rng, c.B*c.Hk*c.Tk*c.D)
				v := benchBuf(b, rng, c.B*c.Hk*c.Tk*c.Dv)
				o := benchBuf(b, rng, c.B*c.H*c.Tq*c.Dv)
				defer q.Free()
				defer k.Free()
				defer v.Free()
				defer o.Free()
				p, err := NewPlan([]Node{{Op: OpAttention, Src: []int{0, 1, 2}, Dst: 3, FP: [4]float32{0.125}}},
					[]Tensor{tensorOf(q, c.B, c.H, c.Tq, c.D), tensorOf(k, c.B, c.Hk, c.Tk, c.D),
						tensorOf(v, c.B, c.Hk, c.Tk, c.Dv), tensorOf(o, c.B, c.H, c.Tq, c.Dv)})
				if err != nil {
					b.Fatal(err)
				}
				defer p.Free()
				flop := 2 * float64(c.B*c.H*c.Tq*c.Tk*(c.D+c.Dv))
				for b.Loop() {
					if err := ctx.Execute(p); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkAttentionDecodeCold: a MioTTS 0.6B decode step's attention over a cache bucket
// with its tail hidden, the cache coming from memory as in a model (64 MiB written between
// runs), decode kernel and the GEMM path it replaced alternating run by run.
func BenchmarkAttentionDecodeCold(b *testing.B) {
	Init()
	rng := rand.New(rand.NewPCG(5, 5))
	const H, Hk, Tk, D, seen = 16, 8, 128, 128, 96
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("%dt", threads), func(b *testing.B) {
			ctx := newCtx(b, threads)
			defer ctx.Close()
			bufs := []*Buffer{benchBuf(b, rng, H*D), benchBuf(b, rng, Hk*Tk*D), benchBuf(b, rng, Hk*Tk*D),
				benchBuf(b, rng, Tk), benchBuf(b, rng, H*D)}
			for _, x := range bufs {
				defer x.Free()
			}
			mask := bufs[3].Float32s()
			for i := range mask {
				mask[i] = 0
				if i >= seen {
					mask[i] = float32(math.Inf(-1))
				}
			}
			p, err := NewPlan([]Node{{Op: OpAttention, Src: []int{0, 1, 2, 3}, Dst: 4, FP: [4]float32{0.088}, IP: [8]int64{1}}},
				[]Tensor{tensorOf(bufs[0], 1, H, 1, D), tensorOf(bufs[1], 1, Hk, Tk, D), tensorOf(bufs[2], 1, Hk, Tk, D),
					tensorOf(bufs[3], 1, Tk), tensorOf(bufs[4], 1, H, 1, D)})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Free()
			defer setAttentionDecodeKernel(true)
			junk := make([]byte, 64<<20)
			var spent [2]time.Duration
			for i := 0; b.Loop(); i++ {
				for j := 0; j < len(junk); j += 64 {
					junk[j]++
				}
				setAttentionDecodeKernel(i%2 == 0)
				t0 := time.Now()
				if err := ctx.Execute(p); err != nil {
					b.Fatal(err)
				}
				spent[i%2] += time.Since(t0)
			}
			half := float64(max(b.N/2, 1))
			b.ReportMetric(float64(spent[0].Nanoseconds())/half/1e3, "kernel-µs")
			b.ReportMetric(float64(spent[1].Nanoseconds())/half/1e3, "gemm-µs")
		})
	}
}

// BenchmarkConv1D: a conformer depthwise conv and a general k=7 conv.
func BenchmarkConv1D(b *testing.B) {
	Init()
	rng := rand.New(rand.NewPCG(4, 4))
	cases := []struct {
		name                         string
		Cin, Cout, T, K, pad, groups int64
	}{
		{"depthwise-C512-K31-T100", 512, 512, 100, 31, 15, 512},
		{"dense-C512-K7-T200", 512, 512, 200, 7, 3, 1},
	}
	for _, c := range cases {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/%dt", c.name, threads), func(b *testing.B) {
				ctx := newCtx(b, threads)
				defer ctx.Close()
				x := benchBuf(b, rng, c.Cin*c.T)
				w := benchBuf(b, rng, c.Cout*c.Cin/c.groups*c.K)
				y := benchBuf(b, rng, c.Cout*c.T)
				defer x.Free()
				defer w.Free()
				defer y.Free()
				p, err := NewPlan([]Node{{Op: OpConv1D, Src: []int{0, 1}, Dst: 2, IP: [8]int64{1, c.pad, c.pad, 1, c.groups}}},
					[]Tensor{tensorOf(x, 1, c.Cin, c.T), tensorOf(w, c.Cout, c.Cin/c.groups, c.K), tensorOf(y, 1, c.Cout, c.T)})
				if err != nil {
					b.Fatal(err)
				}
				defer p.Free()
				flop := 2 * float64(c.Cout*c.T*c.Cin/c.groups*c.K)
				junk := make([]byte, 64<<20)
				var el time.Duration
				for i := 0; i < b.N; i++ {
					for j := 0; j < len(junk); j += 64 {
						junk[j]++
					}
					t0 := time.Now()
					if err := ctx.Execute(p); err != nil {
						b.Fatal(err)
					}
					el += time.Since(t0)
				}
				b.ReportMetric(float64(el.Nanoseconds())/float64(b.N), "cold-ns")
				_ = flop
			})
		}
	}
}

// BenchmarkConv2DSubsampling: the conformer's subsampling front, as MeanVC2's ASR runs it a
// window at a time: Conv2D 1→256 (3×3, stride 2) over 19×80 fbank frames, ReLU, Conv2D
// 256→256 (3×3, stride 2), kernels packed (F32P) as models/nn loads them; 8 copies of the
// kernels, so they come from memory as a model's do.
func BenchmarkConv2DSubsampling(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 5))
	const copies = 8
	x, h, y := benchBuf(b, rng, 19*80), benchBuf(b, rng, 256*9*39), benchBuf(b, rng, 256*4*19)
	defer x.Free()
	defer h.Free()
	defer y.Free()
	tensors := []Tensor{tensorOf(x, 1, 1, 19, 80), tensorOf(h, 1, 256, 9, 39), tensorOf(y, 1, 256, 4, 19)}
	var nodes []Node
	stride2 := [8]int64{2, 2, 0, 0, 1, 1, 1}
	for range copies {
		w0 := f32pWeight(b, randFloats(rng, 256*9), 256, 9)
		w1 := f32pWeight(b, randFloats(rng, 256*256*9), 256, 256*9)
		defer w0.Free()
		defer w1.Free()
		s0, s1 := []int64{256, 1, 3, 3}, []int64{256, 256, 3, 3}
		tensors = append(tensors, Tensor{Data: w0.Ptr(), DType: F32P, Shape: s0, Stride: Contiguous(s0)},
			Tensor{Data: w1.Ptr(), DType: F32P, Shape: s1, Stride: Contiguous(s1)})
		n := len(tensors)
		nodes = append(nodes, Node{Op: OpConv2D, Src: []int{0, n - 2}, Dst: 1, IP: stride2},
			Node{Op: OpUnary, Src: []int{1}, Dst: 1, IP: [8]int64{UReLU}},
			Node{Op: OpConv2D, Src: []int{1, n - 1}, Dst: 2, IP: stride2})
	}
	p, err := NewPlan(nodes, tensors)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Free()
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("%dt", threads), func(b *testing.B) {
			ctx := newCtx(b, threads)
			defer ctx.Close()
			for b.Loop() {
				if err := ctx.Execute(p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*copies), "µs/front")
		})
	}
}

func randFloats(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.Float64()*2 - 1)
	}
	return v
}
