package wavlm

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
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

func openModel(t testing.TB, r *parity.Run) *gguf.Model {
	t.Helper()
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func onlyPrefix(stages []parity.Stage, prefix string) []parity.Stage {
	var out []parity.Stage
	for _, s := range stages {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s)
		}
	}
	return out
}

// Large switches on the MeanVC2 speaker WavLM.
func TestGoldenMeanVC2(t *testing.T) {
	r := paritytest.Open(t, "meanvc2")
	mf := openModel(t, r)
	GoldenMeanVC2(r, mf.Sub("speaker_wavlm"), cpu(t))
	st := onlyPrefix(r.Stages(), "spk.wavlm.")
	if len(st) != 3 {
		t.Fatalf("%d stages, want 3", len(st))
	}
	paritytest.Require(t, st)
}

// Base+ switches on MioCodec's WavLM: layers 1 and 2 from the prepared 16 kHz reference.
func TestGoldenBasePlusLayers(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	mf := openModel(t, r)
	m, err := Load(mf.Sub("wavlm_weights"), cpu(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Config.Variant != VariantBasePlus || m.Config.Layers != 2 || m.Config.Heads != 2 || m.Config.PosConvGroups != 16 {
		t.Fatalf("config %+v", m.Config)
	}
	wave, _, err := r.F32("global.wavlm_input_16k")
	if err != nil {
		t.Fatal(err)
	}
	states, T, err := m.Hidden(wave, []int{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if T != 125 {
		t.Fatalf("T = %d, want 125", T)
	}
	r.Check("global.wavlm_layer1", states[0], goldenTol)
	r.Check("global.wavlm_layer2", states[1], goldenTol)
	paritytest.Require(t, r.Stages())
}

// The variant switches can be forced; forcing the wrong one on Base+ weights fails at load
// (no per-conv LayerNorm on conv 1).
func TestVariantOverride(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	mf := openModel(t, r)
	_, err := Load(mf.Sub("wavlm_weights"), cpu(t), Options{Variant: VariantLarge})
	if err == nil || !strings.Contains(err.Error(), "feature_extractor.conv_layers.1.2.weight") {
		t.Fatalf("forced Large on Base+ weights: %v", err)
	}
}

// The config inferred from the tiny files lists exactly their tensors (mask_emb included).
func TestTensorsMatchFiles(t *testing.T) {
	for _, c := range []struct{ family, ns string }{{"meanvc2", "speaker_wavlm"}, {"miocodec", "wavlm_weights"}} {
		r := paritytest.Open(t, c.family)
		src := openModel(t, r).Sub(c.ns)
		cfg, err := inferConfig(src, Options{})
		if err != nil {
			t.Fatal(err)
		}
		specs := cfg.Tensors()
		if len(specs) != src.Len() {
			t.Errorf("%s: %d specs, file has %d tensors", c.family, len(specs), src.Len())
		}
		for _, s := range specs {
			mt, ok := src.Tensor(s.Name)
			if !ok {
				t.Errorf("%s: %s not in the file", c.family, s.Name)
				continue
			}
			if !slices.Equal(mt.Shape, s.Shape) {
				t.Errorf("%s: %s shape %v, file %v", c.family, s.Name, s.Shape, mt.Shape)
			}
		}
	}
	if n := len(RealLarge().Tensors()); n != 7*3+2+2+1+3+2+24*19+1 {
		t.Errorf("RealLarge: %d tensors", n)
	}
	if n := len(RealBasePlus().Tensors()); n != 7+2+2+2+1+3+2+12*19+1 {
		t.Errorf("RealBasePlus: %d tensors", n)
	}
}

// mapSource is an in-memory weight source, for tampered copies of a model.
type mapSource struct {
	data   map[string][]float32
	shapes map[string][]int
}

func (s *mapSource) Get(name string) ([]float32, []int, error) {
	d, ok := s.data[name]
	if !ok {
		return nil, nil, fmt.Errorf("no tensor %q", name)
	}
	return slices.Clone(d), slices.Clone(s.shapes[name]), nil
}
func (s *mapSource) Has(name string) bool { _, ok := s.data[name]; return ok }

func copySource(t *testing.T, m *gguf.Model) *mapSource {
	s := &mapSource{data: map[string][]float32{}, shapes: map[string][]int{}}
	for _, n := range m.Names() {
		d, sh, err := m.Get(n)
		if err != nil {
			t.Fatal(err)
		}
		s.data[n], s.shapes[n] = d, sh
	}
	return s
}

func TestBadWeights(t *testing.T) {
	r := paritytest.Open(t, "meanvc2")
	mf := openModel(t, r)
	be := cpu(t)
	for _, c := range []struct {
		name   string
		tamper func(s *mapSource)
		want   string
	}{
		{"missing", func(s *mapSource) { delete(s.data, "encoder.layers.1.fc2.bias") }, "encoder.layers.1.fc2.bias"},
		{"missing conv LN", func(s *mapSource) { delete(s.data, "feature_extractor.conv_layers.3.2.weight") }, "feature_extractor.conv_layers.3.2"},
		{"misshapen", func(s *mapSource) {
			s.shapes["encoder.layers.2.self_attn.k_proj.weight"] = []int{16, 64}
		}, "encoder.layers.2.self_attn.k_proj.weight"},
		{"misshapen grep", func(s *mapSource) {
			s.shapes["encoder.layers.0.self_attn.grep_linear.weight"] = []int{16, 8}
		}, "encoder.layers.0.self_attn.grep_linear.weight"},
		{"missing rel bias", func(s *mapSource) {
			delete(s.data, "encoder.layers.0.self_attn.relative_attention_bias.weight")
		}, "relative_attention_bias.weight"},
	} {
		src := copySource(t, mf.Sub("speaker_wavlm"))
		c.tamper(src)
		m, err := Load(src, be, Options{})
		if err == nil {
			m.Close()
			t.Errorf("%s: loaded", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not name %s", c.name, err, c.want)
		}
	}
}

// The unilm spelling of the Large per-conv LayerNorm ("…{i}.2.1.weight") loads the same.
func TestConvLayerNormSpelling(t *testing.T) {
	r := paritytest.Open(t, "meanvc2")
	mf := openModel(t, r)
	src := copySource(t, mf.Sub("speaker_wavlm"))
	for i := range 7 {
		for _, p := range []string{"weight", "bias"} {
			old := fmt.Sprintf("feature_extractor.conv_layers.%d.2.%s", i, p)
			nw := fmt.Sprintf("feature_extractor.conv_layers.%d.2.1.%s", i, p)
			src.data[nw], src.shapes[nw] = src.data[old], src.shapes[old]
			delete(src.data, old)
		}
	}
	m, err := Load(src, cpu(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Config.Variant != VariantLarge {
		t.Fatalf("variant %s", m.Config.Variant)
	}
	wave, _, _ := r.F32("input.ref_wav")
	res, err := m.Forward(wave, []int{m.Config.Layers}, true)
	if err != nil {
		t.Fatal(err)
	}
	st := r.Check("spk.wavlm.conv_features", res.ConvFeatures, goldenTol)
	if !st.OK() {
		t.Error(st)
	}
}

func TestBucket(t *testing.T) {
	for _, c := range []struct{ r, want int }{
		{0, 0}, {1, 161}, {-1, 1}, {79, 239}, {-79, 79}, {80, 240}, {-80, 80},
		{799, 319}, {800, 319}, {5000, 319}, {-5000, 159},
	} {
		if got := bucket(c.r, 320, 800); got != c.want {
			t.Errorf("bucket(%d) = %d, want %d", c.r, got, c.want)
		}
	}
	// The float32 log branch agrees with exact arithmetic away from integer edges.
	for d := 80; d < 800; d++ {
		v := math.Log(float64(d)/80) / math.Log(10) * 80
		if math.Abs(v-math.Round(v)) < 1e-4 {
			continue
		}
		if got, want := bucket(d, 320, 800), 160+80+int(v); got != min(want, 319) {
			t.Errorf("bucket(%d) = %d, want %d", d, got, want)
		}
	}
}

// Concurrent callers and more lengths than the bias cache holds: results equal a fresh run.
func TestConcurrentAndBiasEviction(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	mf := openModel(t, r)
	m, err := Load(mf.Sub("wavlm_weights"), cpu(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	wave, _, _ := r.F32("global.wavlm_input_16k")
	lengths := []int{4000, 4321, 5000, 6001, 7000, 8000}
	first := make([][]float32, len(lengths))
	for i, n := range lengths {
		s, _, err := m.Hidden(wave[:n], []int{2})
		if err != nil {
			t.Fatal(err)
		}
		first[i] = s[0]
	}
	if len(m.biases) > maxBiases {
		t.Fatalf("%d biases cached", len(m.biases))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(lengths))
	for i, n := range lengths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, err := m.Hidden(wave[:n], []int{2})
			if err == nil && !slices.Equal(s[0], first[i]) {
				err = fmt.Errorf("length %d: result differs from the first run", n)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	m.Trim()
	s, _, err := m.Hidden(wave[:lengths[0]], []int{2})
	if err != nil || !slices.Equal(s[0], first[0]) {
		t.Errorf("after Trim: %v, equal %v", err, err == nil && slices.Equal(s[0], first[0]))
	}
}

func TestBadInput(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	m, err := Load(openModel(t, r).Sub("wavlm_weights"), cpu(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, _, err := m.Hidden(make([]float32, 399), []int{1}); err == nil {
		t.Error("399 samples accepted")
	}
	if _, _, err := m.Hidden(make([]float32, 400), []int{3}); err == nil {
		t.Error("layer 3 of 2 accepted")
	}
	if _, _, err := m.Hidden(make([]float32, 400), []int{0, 1}); err != nil {
		t.Error(err)
	}
}
