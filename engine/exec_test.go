package engine

import (
	"math"
	"math/rand/v2"
	"testing"
)

// run compiles g on a CPU backend (planned or naive memory), fills inputs from fill and
// returns every output.
func run(t *testing.T, g *Graph, naive bool, threads int, fill func(name string, x []float32)) map[string][]float32 {
	t.Helper()
	cpu, err := NewCPU(threads)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	cpu.naive = naive
	prog, err := cpu.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for name := range g.inputs {
		fill(name, prog.Input(name))
	}
	if err := prog.Run(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for name := range g.outputs {
		out[name] = append([]float32(nil), prog.Output(name)...)
	}
	return out
}

func TestPlannedMemoryGivesBitIdenticalResults(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 30; trial++ {
		seed := rng.Uint64()
		build := func() *Graph { return randomGraph(rand.New(rand.NewPCG(seed, 1)), 5+int(seed%50)) }
		fill := func(_ string, x []float32) {
			r := rand.New(rand.NewPCG(seed, 2))
			for i := range x {
				x[i] = float32(r.NormFloat64() * 0.3)
			}
		}
		planned := run(t, build(), false, 2, fill)
		naive := run(t, build(), true, 2, fill)
		for name, a := range planned {
			b := naive[name]
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(a[i] != a[i] && b[i] != b[i]) {
					t.Fatalf("trial %d output %s[%d]: planned %v, naive %v", trial, name, i, a[i], b[i])
				}
			}
		}
	}
}

func TestPersistentStateSurvivesRuns(t *testing.T) {
	// A running sum kept in a persistent buffer: state += x on every run.
	state, err := NewBuffer("state", F32, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer state.Free()
	g := NewGraph("accumulate")
	x := g.Input("x", F32, 3)
	s := g.Persistent(state)
	sum := g.Add(s, x)
	g.Output("sum", sum)
	g.Assign(s, sum)
	cpu, err := NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	prog, err := cpu.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for i := 1; i <= 3; i++ {
		copy(prog.Input("x"), []float32{1, 2, 3})
		if err := prog.Run(); err != nil {
			t.Fatal(err)
		}
	}
	if got := state.Float32s(); got[0] != 3 || got[1] != 6 || got[2] != 9 {
		t.Fatalf("state after 3 runs: %v, want [3 6 9]", got)
	}
	if st := prog.Stats(); st.PersistentBytes != 12 {
		t.Fatalf("persistent bytes %d, want 12", st.PersistentBytes)
	}
}

func TestScatterRowsUpdatesACacheAtRunTimePositions(t *testing.T) {
	// A [2 heads, 6 positions, 3] cache; each run writes 2 new rows at positions from an input.
	cache, err := NewBuffer("kv", F32, 2, 6, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Free()
	g := NewGraph("scatter")
	rows := g.Input("rows", F32, 2, 2, 3)
	pos := g.Input("pos", I32, 2)
	kv := g.Persistent(cache)
	g.ScatterRows(kv, g.Scale(rows, 2, 0), pos)
	g.Output("sum", g.Sum(g.Reshape(kv, 2, 18), 1)) // reads the cache after the write
	cpu, err := NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	prog, err := cpu.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for step, at := range [][]int32{{0, 1}, {4, 2}} {
		for i := range prog.Input("rows") {
			prog.Input("rows")[i] = float32(step*100 + i)
		}
		copy(prog.InputInt32("pos"), at)
		if err := prog.Run(); err != nil {
			t.Fatal(err)
		}
	}
	c := cache.Float32s()
	// Step 1 wrote rows 100.. (×2) at positions 4 and 2 of each head; step 0 rows 0.. at 0, 1.
	want := map[[2]int]float32{{0, 0}: 0, {0, 1}: 6, {0, 4}: 200, {0, 2}: 206, {1, 0}: 12, {1, 4}: 212}
	for k, v := range want {
		if got := c[(k[0]*6+k[1])*3]; got != v {
			t.Errorf("cache[head %d, pos %d, 0] = %v, want %v", k[0], k[1], got, v)
		}
	}
	if c[(0*6+3)*3] != 0 || c[(1*6+5)*3] != 0 {
		t.Error("rows never written are not zero")
	}
	copy(prog.InputInt32("pos"), []int32{6, 0})
	if err := prog.Run(); err == nil {
		t.Fatal("position 6 of a 6-row cache accepted")
	}
}
