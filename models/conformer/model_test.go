package conformer

import (
	"fmt"
	"github.com/voxpipe/voxpipe/models/nn"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

func cpu(t testing.TB) engine.Backend {
	t.Helper()
	be, err := engine.NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	return be
}

// TestGoldenASR runs the front end and the encoder on the MeanVC2 golden cases: windows and
// offsets from the audio, the encoder teacher-forced per window, and the free-running chain
// from the audio (the "chain:" lines).
func TestGoldenASR(t *testing.T) {
	r := paritytest.Open(t, "meanvc2")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	GoldenASR(r, m, cpu(t))
	paritytest.Require(t, r.Stages())
}

// TestGoldenTensorList: Tensors() of the golden model's config names exactly the asr/
// tensors of the file, with their shapes.
func TestGoldenTensorList(t *testing.T) {
	r := paritytest.Open(t, "meanvc2")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	model, err := LoadGGUF(m, cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	c := model.Config
	if c.OutputSize != 32 || c.Heads != 4 || c.LinearUnits != 64 || c.NumBlocks != 2 || c.CNNKernel != 9 || c.SubsampleChannels != 32 {
		t.Errorf("golden config %+v, want the manifest's d 32, 4 heads, FFN 64, 2 layers, kernel 9", c)
	}
	asr := m.Sub(Namespace)
	specs := c.Tensors()
	if len(specs) != asr.Len() {
		t.Errorf("Tensors() lists %d tensors, the file has %d under %s/", len(specs), asr.Len(), Namespace)
	}
	for _, s := range specs {
		mt, ok := asr.Tensor(s.Name)
		if !ok {
			t.Errorf("%s: not in the file", s.Name)
			continue
		}
		if !slices.Equal(mt.Shape, s.Shape) {
			t.Errorf("%s: shape %v, file has %v", s.Name, s.Shape, mt.Shape)
		}
	}
}

// hiding is a model view without one tensor (a damaged file).
type hiding struct {
	*gguf.Model
	name string
}

func (h hiding) Has(name string) bool { return name != h.name && h.Model.Has(name) }
func (h hiding) Get(name string) ([]float32, []int, error) {
	if name == h.name {
		return nil, nil, fmt.Errorf("tensor %q not found", name)
	}
	return h.Model.Get(name)
}

// TestGoldenMissingTensor: a model file lacking a tensor fails to load with an error that
// names it in full (namespace included).
func TestGoldenMissingTensor(t *testing.T) {
	r := paritytest.Open(t, "meanvc2")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	raw, _ := m.EmbeddedFile("config.json")
	cfg, err := ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	name := "encoder.encoders.1.conv_module.streaming_conv.depthwise_conv.weight"
	_, err = Load(hiding{m.Sub(Namespace), name}, cfg, cpu(t))
	if err == nil || !strings.Contains(err.Error(), "asr/"+name) {
		t.Fatalf("error %v does not name asr/%s", err, name)
	}
	t.Log(err)
}

// TestRealConfigTensors checks the real-size table against the shapes audio.cpp's loader
// expects (shared/reference/audiocpp.md §2.2).
func TestRealConfigTensors(t *testing.T) {
	specs := RealConfig().Tensors()
	if len(specs) != 6+6*37+2 {
		t.Errorf("%d tensors, want 230", len(specs))
	}
	want := map[string][]int{
		"encoder.embed.conv.0.weight":                                          {256, 1, 3, 3},
		"encoder.embed.conv.2.weight":                                          {256, 256, 3, 3},
		"encoder.embed.out.0.weight":                                           {256, 4864},
		"encoder.encoders.5.feed_forward_macaron.w_1.weight":                   {2048, 256},
		"encoder.encoders.5.feed_forward.w_2.weight":                           {256, 2048},
		"encoder.encoders.0.self_attn.linear_pos.weight":                       {256, 256},
		"encoder.encoders.0.self_attn.pos_bias_u":                              {4, 64},
		"encoder.encoders.3.conv_module.streaming_conv.pointwise_conv1.weight": {512, 256, 1},
		"encoder.encoders.3.conv_module.streaming_conv.depthwise_conv.weight":  {256, 1, 9},
		"encoder.encoders.3.conv_module.streaming_conv.pointwise_conv2.weight": {256, 256, 1},
		"encoder.encoders.3.conv_module.streaming_conv.norm.weight":            {256},
		"encoder.after_norm.bias":                                              {256},
	}
	seen := map[string]bool{}
	for _, s := range specs {
		if seen[s.Name] {
			t.Errorf("%s listed twice", s.Name)
		}
		seen[s.Name] = true
		if w, ok := want[s.Name]; ok && !slices.Equal(w, s.Shape) {
			t.Errorf("%s: %v, want %v", s.Name, s.Shape, w)
		}
	}
	for n := range want {
		if !seen[n] {
			t.Errorf("%s missing", n)
		}
	}
}

// mapSource is an in-memory weight source.
type mapSource map[string]weights.Tensor

func (m mapSource) Get(name string) ([]float32, []int, error) {
	t, ok := m[name]
	if !ok {
		return nil, nil, fmt.Errorf("tensor %q not found", name)
	}
	return slices.Clone(t.Data), slices.Clone(t.Shape), nil
}

func (m mapSource) Has(name string) bool { _, ok := m[name]; return ok }

func tinyConfig() Config {
	c := RealConfig()
	c.OutputSize, c.Heads, c.LinearUnits, c.NumBlocks, c.CNNKernel, c.SubsampleChannels = 16, 2, 24, 2, 5, 8
	return c
}

// randomSource has every tensor of c with random values (norm weights near 1).
func randomSource(c Config, seed uint64) mapSource {
	rng := rand.New(rand.NewPCG(seed, 1))
	src := mapSource{}
	for _, s := range c.Tensors() {
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		fan := float64(s.Shape[len(s.Shape)-1])
		if len(s.Shape) > 1 {
			fan = float64(n / s.Shape[0])
		}
		data := make([]float32, n)
		for i := range data {
			v := rng.NormFloat64() / math.Sqrt(fan)
			if strings.HasSuffix(s.Name, "norm.weight") || strings.Contains(s.Name, "norm_") && strings.HasSuffix(s.Name, ".weight") {
				v = 1 + 0.1*rng.NormFloat64()
			}
			data[i] = float32(v)
		}
		src[s.Name] = weights.Tensor{Data: data, Shape: slices.Clone(s.Shape)}
	}
	return src
}

// TestLoadReportsTensors: a missing or misshapen tensor is named in the error, and dims the
// config leaves zero come from the tensors.
func TestLoadReportsTensors(t *testing.T) {
	be := cpu(t)
	c := tinyConfig()
	src := randomSource(c, 1)

	free := defaultConfig()
	m, err := Load(src, free, be)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Config; got.OutputSize != 16 || got.Heads != 2 || got.LinearUnits != 24 || got.NumBlocks != 2 || got.CNNKernel != 5 || got.SubsampleChannels != 8 {
		t.Errorf("dims from tensors: %+v", got)
	}
	m.Close()

	missing := "encoder.encoders.1.self_attn.linear_pos.weight"
	bad := maps(src)
	delete(bad, missing)
	if _, err := Load(bad, c, be); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing tensor: error %v does not name %s", err, missing)
	}
	bad = maps(src)
	wrong := "encoder.encoders.0.conv_module.streaming_conv.pointwise_conv2.weight"
	bad[wrong] = weights.Tensor{Data: make([]float32, 16*8), Shape: []int{16, 8, 1}}
	if _, err := Load(bad, c, be); err == nil || !strings.Contains(err.Error(), wrong) {
		t.Errorf("misshapen tensor: error %v does not name %s", err, wrong)
	}
	// A config that disagrees with the tensors is refused, naming both.
	c2 := c
	c2.LinearUnits = 32
	if _, err := Load(src, c2, be); err == nil || !strings.Contains(err.Error(), "linear_units") {
		t.Errorf("config mismatch: error %v", err)
	}
}

func maps(m mapSource) mapSource {
	out := mapSource{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestStatesIndependent: one Model serves several streams; interleaving two streams' windows
// gives each exactly what it gets alone, and Reset restarts a stream.
func TestStatesIndependent(t *testing.T) {
	c := tinyConfig()
	m, err := Load(randomSource(c, 2), c, cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rng := rand.New(rand.NewPCG(3, 3))
	win := func() []float32 {
		w := make([]float32, 19*80)
		for i := range w {
			w[i] = float32(rng.NormFloat64()*3 + 5)
		}
		return w
	}
	a, b := [][]float32{win(), win(), win()}, [][]float32{win(), win(), win()}
	run := func(st *State, ws [][]float32, w int) []float32 {
		out, err := st.Forward(ws[w], 8+4*w)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(out)
	}
	alone := func(ws [][]float32) [][]float32 {
		st, err := m.NewState()
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		var outs [][]float32
		for w := range ws {
			outs = append(outs, run(st, ws, w))
		}
		return outs
	}
	wantA, wantB := alone(a), alone(b)
	sa, _ := m.NewState()
	sb, _ := m.NewState()
	defer sa.Close()
	defer sb.Close()
	for w := range a {
		if got := run(sa, a, w); !slices.Equal(got, wantA[w]) {
			t.Fatalf("stream a window %d differs when interleaved", w)
		}
		if got := run(sb, b, w); !slices.Equal(got, wantB[w]) {
			t.Fatalf("stream b window %d differs when interleaved", w)
		}
	}
	if len(wantA[0]) != 4*c.OutputSize {
		t.Errorf("%d outputs per window, want 4×%d", len(wantA[0]), c.OutputSize)
	}
	// The caches matter (the second window depends on the first) and Reset clears them.
	sa.Reset()
	if got := run(sa, a, 1); slices.Equal(got, wantA[1]) {
		t.Error("window 1 from zero caches equals window 1 after window 0: caches unused")
	}
	sa.Reset()
	if got := run(sa, a, 0); !slices.Equal(got, wantA[0]) {
		t.Error("Reset did not restore the initial state")
	}
	// The one allocation is the engine's: cgo.Context.Execute passes &failed to C, which
	// escapes. Forward itself adds none.
	if n := testing.AllocsPerRun(5, func() { sa.Forward(a[0], 8) }); n > 1 {
		t.Errorf("Forward allocates %v times per window", n)
	}
}

func TestForwardErrors(t *testing.T) {
	c := tinyConfig()
	m, err := Load(randomSource(c, 4), c, cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st, err := m.NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Forward(make([]float32, 19*80+1), 8); err == nil {
		t.Error("partial frame accepted")
	}
	if _, err := st.Forward(make([]float32, 6*80), 8); err == nil {
		t.Error("6-frame window accepted")
	}
	if _, err := st.Forward(make([]float32, 19*80), 7); err == nil {
		t.Error("offset below the cache length accepted")
	}
	// Another window length compiles its own program: 11 frames give 2 outputs.
	out, err := st.Forward(make([]float32, 11*80), 8)
	if err != nil || len(out) != 2*c.OutputSize {
		t.Errorf("11-frame window: %d values, %v", len(out), err)
	}
	st.Close()
	if _, err := st.Forward(make([]float32, 19*80), 8); err == nil {
		t.Error("closed state ran")
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`{"asr": {"output_size": 64, "attention_heads": 2, "input_layer": "conv2d",
		"global_cmvn": null, "fbank": {"num_mel_bins": 80}}, "runtime": {"bn_window": 11, "bn_stride": 8,
		"required_cache_size": 4, "asr_offset_init": 4, "asr_offset_step": 2}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.OutputSize != 64 || c.Heads != 2 || c.NumBlocks != 0 || c.Stream.Window != 11 || c.Stream.RequiredCache != 4 ||
		c.Stream.ChunkSamples != 2560 || c.Stream.SamplesCacheInit != -0.5 || c.Fbank.Preemphasis != 0.97 {
		t.Errorf("parsed %+v", c)
	}
	for _, bad := range []string{
		`{"asr": {"input_layer": "conv2d6"}}`,
		`{"asr": {"pos_enc_layer_type": "abs_pos"}}`,
		`{"asr": {"global_cmvn": {"mean": [1]}}}`,
		`{"asr": {"macaron_style": false}}`,
		`{"asr": {"fbank": {"dither": 1.0}}}`,
		`{"runtime": {"bn_window": 5}}`,
	} {
		c, err := ParseConfig([]byte(bad))
		if err == nil {
			_, err = NewFrontEnd(c)
		}
		if err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// The fused q/k/v projection gives the bits of the three separate ones: the same windows
// give identical features with and without it.
func TestFusedQKVIsExact(t *testing.T) {
	c := tinyConfig()
	c.OutputSize = 32 // a multiple of the packed layout's 32 rows: fusable
	m, err := Load(randomSource(c, 5), c, cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.qkv[0] == nil {
		t.Fatalf("q/k/v of width %d were not fused", c.OutputSize)
	}
	rng := rand.New(rand.NewPCG(8, 1))
	var wins [][]float32
	for range 3 {
		w := make([]float32, 19*80)
		for i := range w {
			w[i] = float32(rng.NormFloat64()*3 + 5)
		}
		wins = append(wins, w)
	}
	run := func() (out []float32) {
		st, err := m.NewState()
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		for i, w := range wins {
			y, err := st.Forward(w, 8+4*i)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, y...)
		}
		return out
	}
	fused := run()
	saved := m.qkv
	m.qkv = make([]*nn.Linear, len(saved))
	defer func() { m.qkv = saved }()
	if separate := run(); !slices.Equal(fused, separate) {
		t.Error("fused q/k/v changed the features")
	}
}

// TestForwardBatchMatchesAlone: windows of several streams encoded as one batch give each
// stream bit for bit its output and caches alone, over several windows (the caches carry),
// with the streams at different offsets and batches of changing size; bad batches are
// refused before any state changes.
func TestForwardBatchMatchesAlone(t *testing.T) {
	c := tinyConfig()
	m, err := Load(randomSource(c, 2), c, cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rng := rand.New(rand.NewPCG(7, 3))
	const streams, windows = 5, 4
	ws := make([][][]float32, streams)
	for s := range ws {
		for range windows {
			w := make([]float32, 19*80)
			for i := range w {
				w[i] = float32(rng.NormFloat64()*3 + 5)
			}
			ws[s] = append(ws[s], w)
		}
	}
	offset := func(s, w int) int { return 8 + 4*(w+s) }
	var want [streams][windows][]float32
	for s := range streams {
		st, _ := m.NewState()
		for w := range windows {
			out, err := st.Forward(ws[s][w], offset(s, w))
			if err != nil {
				t.Fatal(err)
			}
			want[s][w] = slices.Clone(out)
		}
	}
	states := make([]*State, streams)
	for s := range states {
		states[s], _ = m.NewState()
	}
	for w := range windows {
		// Window w runs streams 0..w+1 batched (a growing batch), the rest alone after.
		n := min(w+2, streams)
		var wins [][]float32
		var offs []int
		for s := range n {
			wins, offs = append(wins, ws[s][w]), append(offs, offset(s, w))
		}
		outs, err := m.ForwardBatch(states[:n], wins, offs)
		if err != nil {
			t.Fatal(err)
		}
		for s := n; s < streams; s++ {
			out, err := states[s].Forward(ws[s][w], offset(s, w))
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, out)
		}
		for s := range streams {
			if !slices.Equal(outs[s], want[s][w]) {
				t.Fatalf("window %d of stream %d in a batch of %d differs from the stream alone", w, s, n)
			}
		}
	}
	before := slices.Clone(states[0].AttCache())
	for _, bad := range []struct {
		what    string
		states  []*State
		windows [][]float32
		offsets []int
	}{
		{"a state twice", []*State{states[0], states[0]}, [][]float32{ws[0][0], ws[0][1]}, []int{8, 8}},
		{"windows of two lengths", states[:2], [][]float32{ws[0][0], ws[1][0][:11*80]}, []int{8, 8}},
		{"an offset below the cache", states[:2], [][]float32{ws[0][0], ws[1][0]}, []int{8, 7}},
		{"fewer offsets", states[:2], [][]float32{ws[0][0], ws[1][0]}, []int{8}},
		{"no state", nil, nil, nil},
	} {
		if _, err := m.ForwardBatch(bad.states, bad.windows, bad.offsets); err == nil {
			t.Errorf("%s: no error", bad.what)
		}
	}
	if !slices.Equal(before, states[0].AttCache()) {
		t.Error("a refused batch changed a cache")
	}
}
