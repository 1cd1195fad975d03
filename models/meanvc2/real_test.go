package meanvc2

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// randomSource is a weights.Source of random tensors with the given shapes (the published
// model's sizes without its weights).
type randomSource map[string]struct {
	data  []float32
	shape []int
}

func (s randomSource) Get(name string) ([]float32, []int, error) {
	t, ok := s[name]
	if !ok {
		return nil, nil, fmt.Errorf("no tensor %s", name)
	}
	return append([]float32(nil), t.data...), t.shape, nil
}

func (s randomSource) Has(name string) bool { _, ok := s[name]; return ok }

// realRandom is the DiT's tensors at the published sizes with random values (scaled by fan-in)
// and a real RoPE table.
func realRandom(rng *rand.Rand) randomSource {
	src := randomSource{}
	for _, s := range RealTensors() {
		n, fan := 1, s.Shape[len(s.Shape)-1]
		for _, d := range s.Shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(rng.NormFloat64() / math.Sqrt(float64(fan)))
		}
		if s.Name == "rotary_embed.inv_freq" {
			for i := range data {
				data[i] = float32(math.Pow(10000, -2*float64(i)/float64(2*n)))
			}
		}
		src[s.Name] = struct {
			data  []float32
			shape []int
		}{data, s.Shape}
	}
	return src
}

// realDiT loads a real-size random DiT (closed with the test) and a random target voice.
func realDiT(t *testing.T, rng *rand.Rand) (*DiT, Timbre) {
	t.Helper()
	d, err := LoadDiT(realRandom(rng), DefaultConfig(), cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	spk := make([]float32, d.Config.SpkDim)
	for i := range spk {
		spk[i] = float32(rng.NormFloat64())
	}
	tb, err := d.Timbre(spk)
	if err != nil {
		t.Fatal(err)
	}
	return d, tb
}

// A real-size model (random weights) loads, converts a few windows with finite output and
// keeps the per-layer cache capacities.
func TestRealSizeStep(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates the 71 MB published model")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	d, tb := realDiT(t, rng)
	c := d.Config
	st := d.NewState()
	defer st.Close()
	cond := make([]float32, c.Window()*c.BNDim)
	var el time.Duration
	for j := range 4 {
		for i := range cond {
			cond[i] = float32(rng.NormFloat64())
		}
		start := time.Now()
		mel, err := st.Step(cond, tb, nil)
		if j > 0 {
			el += time.Since(start)
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(mel) != c.ChunkSize*c.MelDim {
			t.Fatalf("%d mel values", len(mel))
		}
		for _, v := range mel {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("step %d: non-finite mel", j)
			}
		}
	}
	for l := range c.Depth {
		if _, _, n, _ := st.KV(l); n != min(4*c.ChunkSize, c.CacheFrames(l)) {
			t.Errorf("layer %d: %d cached rows after 4 steps", l, n)
		}
	}
	t.Logf("real-size DiT step (2 calls, 1 thread): %v per 120 ms window", el/3)
}

// At real size a batch of MaxBatch states makes products of 256 rows, past where one
// session's products would leave the native kernel: each state's mel frames still equal its
// frames alone (Graph.SetRowGroups keeps the kernel of one session's rows).
func TestRealSizeBatchMatchesAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates the 71 MB published model")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	d, tb := realDiT(t, rng)
	c := d.Config
	const n = MaxBatch
	x0s, conds, tbs := make([][]float32, n), make([][]float32, n), make([]Timbre, n)
	batched, alone := make([]*State, n), make([]*State, n)
	for s := range n {
		x0s[s], conds[s], tbs[s] = make([]float32, c.Window()*c.MelDim), make([]float32, c.Window()*c.BNDim), tb
		for i := range x0s[s] {
			x0s[s][i] = float32(rng.NormFloat64())
		}
		for i := range conds[s] {
			conds[s][i] = float32(rng.NormFloat64())
		}
		batched[s], alone[s] = d.NewState(), d.NewState()
	}
	for step := range 2 {
		mels, err := d.DenoiseBatch(batched, x0s, conds, tbs)
		if err != nil {
			t.Fatal(err)
		}
		for s := range n {
			want, err := alone[s].Denoise(x0s[s], conds[s], tbs[s])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(mels[s], want) {
				t.Fatalf("step %d: state %d of %d batched differs from alone (rel %.3g)", step, s, n, rel(mels[s], want))
			}
		}
	}
}
