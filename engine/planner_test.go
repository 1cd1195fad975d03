package engine

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// randomGraph builds a random DAG of elementwise ops, matmuls, reductions and views over a
// few inputs, with several outputs, like a model layer stack would.
func randomGraph(rng *rand.Rand, nodes int) *Graph {
	g := NewGraph("random")
	d := int64(8 + rng.IntN(24))
	x := g.Input("x", F32, 4, d)
	w, _ := NewBufferFrom("w", make([]float32, d*d), d, d)
	wt := g.Persistent(w)
	live := []Tensor{x} // all [4, d]
	for i := 0; i < nodes; i++ {
		a := live[rng.IntN(len(live))]
		b := live[rng.IntN(len(live))]
		var t Tensor
		switch rng.IntN(8) {
		case 0:
			t = g.Add(a, b)
		case 1:
			t = g.Mul(a, b)
		case 2:
			t = g.SiLU(a)
		case 3:
			t = g.Scale(a, 0.5, 1)
		case 4:
			t = g.Matmul(a, wt)
		case 5:
			t = g.Transpose(a, 0, 1)
			t = g.Contiguous(g.Transpose(g.Contiguous(t), 0, 1))
		case 6:
			t = g.Sub(a, g.Mean(a, -1))
		case 7:
			t = g.Reshape(a, -1)
			t = g.Reshape(g.Exp(t), a.Shape()...)
		}
		live = append(live, t)
		if len(live) > 6 {
			live = live[rng.IntN(2)+1:] // older values die
			live = append(live, x)
		}
		if rng.IntN(10) == 0 {
			g.Output("o"+string(rune('a'+i%26))+strings.Repeat("x", i/26), t)
		}
	}
	g.Output("final", live[len(live)-1])
	return g
}

func TestPlannerNeverOverlapsLiveTensors(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		g := randomGraph(rng, 5+rng.IntN(60))
		if g.Err() != nil {
			t.Fatalf("trial %d: build: %v", trial, g.Err())
		}
		p, err := planMemory(g, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.validate(); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if p.arenaBytes > p.naiveBytes {
			t.Fatalf("trial %d: arena %d bytes exceeds naive %d", trial, p.arenaBytes, p.naiveBytes)
		}
		n, err := planMemory(g, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.validate(); err != nil {
			t.Fatalf("naive plan: %v", err)
		}
	}
}

func TestPlannerReusesMemoryAlongAChain(t *testing.T) {
	g := NewGraph("chain")
	x := g.Input("x", F32, 1000)
	for range 100 {
		x = g.Add(g.SiLU(x), x)
	}
	g.Output("y", x)
	p, err := planMemory(g, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	one := g.storageBytes(int(g.outputs["y"]))
	t.Logf("arena %d bytes, naive %d bytes (%d nodes)", p.arenaBytes, p.naiveBytes, len(g.nodes))
	if p.arenaBytes > 3*one {
		t.Fatalf("a 200-node chain needs %d bytes of arena; two or three tensors (%d each) should do", p.arenaBytes, one)
	}
}

func TestShapeErrorsNameTheOpAndLabel(t *testing.T) {
	g := NewGraph("wavlm")
	a := g.Input("a", F32, 2, 3)
	b := g.Input("b", F32, 4, 5)
	g.Label("encoder.layers.3.ffn")
	g.Matmul(a, b)
	g.Add(a, b) // after the first error, ops are no-ops
	err := g.Err()
	if err == nil {
		t.Fatal("mismatched matmul accepted")
	}
	for _, want := range []string{"wavlm", "encoder.layers.3.ffn", "Matmul", "[2 3]", "[4 5]", "inner dims"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	for i, bad := range []func(g *Graph){
		func(g *Graph) { g.Reshape(g.Input("x", F32, 6), 4, -1) },
		func(g *Graph) { g.Conv1D(g.Input("x", F32, 1, 3, 10), g.Input("w", F32, 4, 2, 3), nil, 1, 0, 0, 1, 1) },
		func(g *Graph) { g.Add(g.Input("x", F32, 3), g.Input("y", F32, 4)) },
		func(g *Graph) { g.Slice(g.Input("x", F32, 3), 0, 2, 9) },
		func(g *Graph) { g.Pad(g.Input("x", F32, 3), 0, 3, 0, PadReflect, 0) },
		func(g *Graph) { g.Input("x", F32, 0) },
		func(g *Graph) {
			g.Attention(g.Input("q", F32, 1, 4, 5, 8), g.Input("k", F32, 1, 3, 5, 8), g.Input("v", F32, 1, 3, 5, 8), nil, nil, 0)
		},
	} {
		g := NewGraph("bad")
		bad(g)
		if g.Err() == nil {
			t.Errorf("bad graph %d accepted", i)
		}
	}
}

func TestMaskErrorsNameTheirOp(t *testing.T) {
	g := NewGraph("masks")
	q := g.Input("q", F32, 1, 2, 3, 4)
	bad := g.Input("m", F32, 5, 7)
	g.Attention(q, q, q, &bad, nil, 0)
	if err := g.Err(); err == nil || !strings.Contains(err.Error(), "Attention") {
		t.Fatalf("bad attention mask: %v", err)
	}
	g = NewGraph("masks")
	x := g.Input("x", F32, 3, 4)
	m := g.Input("m", F32, 2, 4)
	g.Softmax(x, &m, 1)
	if err := g.Err(); err == nil || !strings.Contains(err.Error(), "Softmax") {
		t.Fatalf("bad softmax mask: %v", err)
	}
}
