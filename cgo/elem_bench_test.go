package cgo

// Benchmarks of the hot elementwise and normalisation kernels on 500x1024 f32 (a typical
// [frames, hidden] activation), for the portable and SIMD paths and 1 and 2 threads.
// Each reports GB/s of compulsory traffic (inputs read + output written) and ns/element.

import (
	"fmt"
	"testing"
)

func elBench(b *testing.B, o elOp, dst elArr, srcs []elArr, bytesPerIter int64) {
	for _, c := range elCfgs {
		b.Run(c.String(), func(b *testing.B) {
			ForcePortable(c.portable)
			defer ForcePortable(false)
			ctx, err := NewContext(c.threads)
			if err != nil {
				b.Fatal(err)
			}
			defer ctx.Close()
			p := elPlan(b, o, dst, srcs)
			defer p.Free()
			if err := ctx.Execute(p); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(bytesPerIter)
			b.ResetTimer()
			for b.Loop() {
				if err := ctx.Execute(p); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(float64(bytesPerIter)/sec/1e9, "GB/s")
			b.ReportMetric(sec*1e9/float64(dst.numel()), "ns/elem")
		})
	}
}

const elBenchRows, elBenchCols = 500, 1024

func BenchmarkBinaryAdd(b *testing.B) {
	r := elRand()
	m := elNewMem(b)
	x := m.randn(r, 0, 1, elBenchRows, elBenchCols)
	y := m.randn(r, 0, 1, elBenchRows, elBenchCols)
	bias := m.randn(r, 0, 1, elBenchCols)
	out := m.f32(elBenchRows, elBenchCols)
	n := int64(elBenchRows * elBenchCols)
	b.Run("same-shape", func(b *testing.B) {
		elBench(b, elOp{op: OpBinary, ip: [8]int64{BAdd}}, out, []elArr{x, y}, 12*n)
	})
	b.Run("row-broadcast", func(b *testing.B) {
		elBench(b, elOp{op: OpBinary, ip: [8]int64{BAdd}}, out, []elArr{x, bias}, 8*n)
	})
}

func BenchmarkLayerNorm(b *testing.B) {
	r := elRand()
	m := elNewMem(b)
	x := m.randn(r, 0, 1, elBenchRows, elBenchCols)
	w := m.randn(r, 1, 0.1, elBenchCols)
	bias := m.randn(r, 0, 0.1, elBenchCols)
	out := m.f32(elBenchRows, elBenchCols)
	elBench(b, elOp{op: OpLayerNorm, fp: [4]float32{1e-5}}, out, []elArr{x, w, bias}, 8*elBenchRows*elBenchCols)
}

func BenchmarkSoftmax(b *testing.B) {
	r := elRand()
	m := elNewMem(b)
	x := m.randn(r, 0, 3, elBenchRows, elBenchCols)
	out := m.f32(elBenchRows, elBenchCols)
	elBench(b, elOp{op: OpSoftmax, fp: [4]float32{1}}, out, []elArr{x}, 8*elBenchRows*elBenchCols)
}

func BenchmarkUnary(b *testing.B) {
	r := elRand()
	m := elNewMem(b)
	x := m.randn(r, 0, 3, elBenchRows, elBenchCols)
	out := m.f32(elBenchRows, elBenchCols)
	for _, f := range []int{UGELUErf, UGELUTanh, USiLU, UExp} {
		b.Run(fmt.Sprint(unaryNames[f]), func(b *testing.B) {
			elBench(b, elOp{op: OpUnary, ip: [8]int64{int64(f)}}, out, []elArr{x}, 8*elBenchRows*elBenchCols)
		})
	}
}
