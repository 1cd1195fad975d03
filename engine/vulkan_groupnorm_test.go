package engine

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// gnCompare is compareBackends with every input normal, plus a mean of 3 for names starting
// with "x" (statistics far from 0).
func gnCompare(t *testing.T, v *Vulkan, build func(b Backend, g *Graph) func(), outs []string, tol float64) {
	t.Helper()
	compareBackends(t, v, build, func(name string, f []float32, _ []int32) {
		rng := rand.New(rand.NewPCG(7, uint64(len(name))))
		for i := range f {
			f[i] = float32(rng.NormFloat64())
			if strings.HasPrefix(name, "x") {
				f[i] = 2*f[i] + 3
			}
		}
	}, outs, tol)
}

// gnParams uploads n values c·0.1 + off (c = 0..n−1, sign-alternating) as a persistent buffer.
func gnParams(t *testing.T, be Backend, name string, n int, off float32) *Buffer {
	t.Helper()
	v := make([]float32, n)
	for i := range v {
		v[i] = off + float32(i%5)*0.1*float32(1-2*(i%2))
	}
	b, err := Upload(be, name, v, int64(n))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// GroupNorm (one group, several, instance norm; with weight and bias, weight only, none; a
// 4-axis input; a group of 280 000 values), ChannelAffine on 3 and 4 axes, SnakeBeta on a
// transposed input, and a chain of the three, on Vulkan as on the CPU within 2e-5·max(1, |y|).
func TestVulkanGroupNormChannelAffineSnake(t *testing.T) {
	v := vulkanBackend(t)
	gnCompare(t, v, func(be Backend, g *Graph) func() {
		var bufs []*Buffer
		param := func(name string, n int, off float32) Tensor {
			b := gnParams(t, be, name, n, off)
			bufs = append(bufs, b)
			return g.Persistent(b)
		}
		w6, b6 := param("w6", 6, 1), param("b6", 6, 0)
		w9, b9 := param("w9", 9, 1), param("b9", 9, 0)
		x6 := g.Input("x6", F32, 2, 6, 37)
		x9 := g.Input("x9", F32, 2, 9, 1001)
		x4d := g.Input("x4d", F32, 2, 6, 5, 7)
		big := g.Input("xbig", F32, 1, 4, 70000)
		xt := g.Input("xt", F32, 2, 37, 6) // [B, T, C]
		g.Output("gn3", g.GroupNorm(x6, 3, &w6, &b6, 1e-5))
		g.Output("gn1", g.GroupNorm(x6, 1, nil, nil, 1e-5))
		g.Output("in9", g.GroupNorm(x9, 9, &w9, nil, 1e-5))
		g.Output("gn4d", g.GroupNorm(x4d, 3, &w6, &b6, 1e-6))
		g.Output("big", g.GroupNorm(big, 1, nil, nil, 1e-5))
		g.Output("ca", g.ChannelAffine(x9, w9, b9))
		g.Output("ca4d", g.ChannelAffine(x4d, w6, b6))
		al, beta := param("al", 6, -0.3), param("be", 6, 0.2)
		g.Output("snake", g.SnakeBeta(g.Transpose(xt, 1, 2), al, beta))
		// A chain: each op reads what the one before wrote.
		h := g.GroupNorm(x6, 2, &w6, &b6, 1e-5)
		h = g.SnakeBeta(h, al, beta)
		g.Output("chain", g.ChannelAffine(h, w6, b6))
		return func() {
			for _, b := range bufs {
				b.Free()
			}
		}
	}, []string{"gn3", "gn1", "in9", "gn4d", "big", "ca", "ca4d", "snake", "chain"}, 2e-5)
}
