package meanvc2

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
	"github.com/voxpipe/voxpipe/internal/vulkantest"
	"github.com/voxpipe/voxpipe/models/nn"
)

func goldenModel(t *testing.T) (*parity.Run, *gguf.Model) {
	t.Helper()
	r := paritytest.Open(t, Family)
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return r, m
}

func cpu(t *testing.T) engine.Backend {
	t.Helper()
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	return be
}

func TestGoldenDiT(t *testing.T) {
	r, m := goldenModel(t)
	GoldenDiT(r, m, cpu(t))
	paritytest.Require(t, r.Stages())
}

// writeModel rewrites the golden model with edits: a tensor dropped, one reshaped (its data
// cut to fit), the family changed.
func writeModel(t *testing.T, m *gguf.Model, drop, reshape string, shape []int, family string) string {
	t.Helper()
	var ts []gguf.WriteTensor
	for _, mt := range m.Tensors() {
		if mt.Name == drop {
			continue
		}
		data, sh, err := m.Get(mt.Name)
		if err != nil {
			t.Fatal(err)
		}
		if mt.Name == reshape {
			n := 1
			for _, d := range shape {
				n *= d
			}
			sh, data = shape, data[:n]
		}
		ts = append(ts, gguf.WriteTensor{Name: mt.Name, Shape: sh, Data: data})
	}
	return writeTensors(t, m, ts, family)
}

func TestLoadErrorsNameTheProblem(t *testing.T) {
	_, m := goldenModel(t)
	be := cpu(t)
	for _, tc := range []struct {
		name, drop, reshape string
		shape               []int
		family              string
		want                []string
	}{
		{name: "missing", drop: "vc/transformer_blocks.2.attn.k_norm.weight", family: Family,
			want: []string{"missing", "vc/transformer_blocks.2.attn.k_norm.weight"}},
		{name: "misshapen", reshape: "vc/temporal_timbre.out_proj.weight", shape: []int{32, 64}, family: Family,
			want: []string{"misshapen", "vc/temporal_timbre.out_proj.weight", "[32 64]", "[32 128]"}},
		{name: "family", family: "miotts", want: []string{"family", `"miotts"`, "meanvc2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeModel(t, m, tc.drop, tc.reshape, tc.shape, tc.family)
			bad, err := gguf.OpenModel(p)
			if err != nil {
				t.Fatal(err)
			}
			defer bad.Close()
			d, err := LoadDiTFromModel(bad, be)
			if err == nil {
				d.Close()
				t.Fatal("loaded a bad model")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			t.Log(err)
		})
	}
}

// stepper runs golden steps from a state: the reference's conditions and noise, the
// reference's timbre memory.
type stepper struct {
	d      *DiT
	timbre Timbre
	cond   []float32
	noise  []float32
}

func newStepper(t *testing.T) *stepper {
	t.Helper()
	r, m := goldenModel(t)
	d, err := LoadDiTFromModel(m, cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	spk, _, err := r.Cases.Get("spk.embedding")
	if err != nil {
		t.Fatal(err)
	}
	tb, err := d.Timbre(spk)
	if err != nil {
		t.Fatal(err)
	}
	cond, _, err := r.Cases.Get("dit.cond")
	if err != nil {
		t.Fatal(err)
	}
	noise, _, err := r.Cases.Get("dit.noise")
	if err != nil {
		t.Fatal(err)
	}
	return &stepper{d: d, timbre: tb, cond: cond, noise: noise}
}

// run denoises steps from..to−1 on st and returns the mel frames.
func (sp *stepper) run(t *testing.T, st *State, from, to int) []float32 {
	t.Helper()
	c := sp.d.Config
	nc, nx := c.Window()*c.BNDim, c.Window()*c.MelDim
	var out []float32
	for j := from; j < to; j++ {
		mel, err := st.Denoise(sp.noise[j*nx:(j+1)*nx], sp.cond[j*nc:(j+1)*nc], sp.timbre)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, mel...)
	}
	return out
}

func rel(a, b []float32) float64 {
	s := parity.Compare("", a, b, 0)
	if s.Err != "" {
		return math.Inf(1)
	}
	return s.Rel
}

// The caches hold keys before RoPE, so a stream started at another offset gives the same
// mel: only relative positions matter.
func TestRoPEOffsetInvariance(t *testing.T) {
	sp := newStepper(t)
	a, b := sp.d.NewState(), sp.d.NewState()
	defer a.Close()
	defer b.Close()
	b.SetOffset(1200)
	ma, mb := sp.run(t, a, 0, 5), sp.run(t, b, 0, 5)
	if e := rel(mb, ma); e > 1e-4 {
		t.Errorf("mel at offset 1200 differs from offset 0: rel %.3g", e)
	}
	if b.Offset() != 1200+5*sp.d.Config.ChunkSize {
		t.Errorf("offset %d after 5 steps from 1200", b.Offset())
	}
}

// The fused q/k/v projection gives the bits of the three separate ones: a stream's mel
// frames are identical with and without it (the golden DiT's 64-wide projections fuse).
func TestFusedQKVIsExact(t *testing.T) {
	sp := newStepper(t)
	if sp.d.qkv[0] == nil {
		t.Fatal("the golden DiT's q/k/v were not fused")
	}
	a := sp.d.NewState()
	defer a.Close()
	fused := sp.run(t, a, 0, 4)
	saved := sp.d.qkv
	sp.d.qkv = make([]*nn.Linear, len(saved)) // separate products, in new programs
	defer func() { sp.d.qkv = saved }()
	b := sp.d.NewState()
	defer b.Close()
	separate := sp.run(t, b, 0, 4)
	if !slices.Equal(fused, separate) {
		t.Errorf("fused q/k/v changed the mel frames: rel %.3g", rel(fused, separate))
	}
}

// At the reset offset the stream restarts: offset 0, caches dropped (run_rt.py).
func TestOffsetReset(t *testing.T) {
	sp := newStepper(t)
	c := sp.d.Config
	fresh, st := sp.d.NewState(), sp.d.NewState()
	defer fresh.Close()
	defer st.Close()
	want := sp.run(t, fresh, 0, 1)
	sp.run(t, st, 3, 6) // fill the caches with something else
	st.SetOffset(c.OffsetReset)
	got := sp.run(t, st, 0, 1)
	if st.LastStep().Offset != 0 || st.Offset() != c.ChunkSize {
		t.Errorf("after the reset step: step offset %d, next %d", st.LastStep().Offset, st.Offset())
	}
	for l := range c.Depth {
		if _, _, n, _ := st.KV(l); n != c.ChunkSize {
			t.Errorf("layer %d holds %d rows after the reset step, want %d", l, n, c.ChunkSize)
		}
	}
	if e := rel(got, want); e > 1e-6 {
		t.Errorf("step after the reset differs from a fresh stream's first: rel %.3g", e)
	}
	// Reset does the same for a whole stream.
	st.Reset()
	if got := sp.run(t, st, 0, 1); rel(got, want) > 1e-6 {
		t.Errorf("step after Reset differs from a fresh stream's first")
	}
}

// Without injected noise the seeded generator makes runs reproducible, and the carry
// repeats the previous draw's last rows.
func TestSeededNoise(t *testing.T) {
	sp := newStepper(t)
	c := sp.d.Config
	a, b := sp.d.NewState(), sp.d.NewState()
	defer a.Close()
	defer b.Close()
	nc := c.Window() * c.BNDim
	var ma, mb []float32
	for j := range 3 {
		x, err := a.Step(sp.cond[j*nc:(j+1)*nc], sp.timbre, nil)
		if err != nil {
			t.Fatal(err)
		}
		ma = append(ma, x...)
		x, err = b.Step(sp.cond[j*nc:(j+1)*nc], sp.timbre, nil)
		if err != nil {
			t.Fatal(err)
		}
		mb = append(mb, x...)
	}
	if !slices.Equal(ma, mb) {
		t.Error("two streams with the same seed differ")
	}
	for _, v := range ma {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatal("non-finite mel")
		}
	}
	b.Reset()
	b.Seed(7)
	n, blk := c.Window()*c.MelDim, c.BlockSize*c.MelDim
	x1, _ := b.Noise(nil)
	x1 = slices.Clone(x1) // shared with the next call
	prevTail := x1[n-blk:]
	x2, _ := b.Noise(nil)
	if !slices.Equal(x2[:blk], prevTail) {
		t.Error("the first rows of a step's noise are not the previous step's last rows")
	}
	if slices.Equal(x2[blk:], x1[blk:]) {
		t.Error("the generator repeated itself")
	}
}

func TestBadInputs(t *testing.T) {
	sp := newStepper(t)
	c := sp.d.Config
	st := sp.d.NewState()
	defer st.Close()
	if _, err := sp.d.Timbre(make([]float32, c.SpkDim+1)); err == nil {
		t.Error("Timbre accepted a wrong-sized embedding")
	}
	cond := sp.cond[:c.Window()*c.BNDim]
	if _, err := st.Step(cond[:10], sp.timbre, nil); err == nil {
		t.Error("Step accepted a short cond")
	}
	if _, err := st.Step(cond, sp.timbre, make([]float32, 7)); err == nil {
		t.Error("Step accepted short noise")
	}
	if _, err := st.Step(cond, Timbre{}, nil); err == nil {
		t.Error("Step accepted an empty timbre")
	}
	if err := st.SetKV(0, nil, nil, c.CacheFrames(0)+1); err == nil {
		t.Error("SetKV accepted more rows than the capacity")
	}
	st.Close()
	if _, err := st.Step(cond, sp.timbre, nil); err == nil {
		t.Error("Step ran on a closed state")
	}
}

// The DiT runs on the Vulkan backend (lavapipe in CI) and passes every golden stage: its
// weights stay F32 there, its programs are compiled onto the shaders and recorded into one
// command buffer each.
func TestGoldenDiTVulkan(t *testing.T) {
	vulkantest.Require(t)
	be, err := engine.NewVulkan(0)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	r, m := goldenModel(t)
	GoldenDiT(r, m, be)
	paritytest.Require(t, r.Stages())
}
