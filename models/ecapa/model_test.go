package ecapa

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

func openGolden(t *testing.T) (*parity.Run, *gguf.Model, engine.Backend) {
	t.Helper()
	r := paritytest.Open(t, "meanvc2")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	be, err := engine.NewCPU(min(runtime.NumCPU(), 2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	return r, m, be
}

func TestGoldenECAPA(t *testing.T) {
	r, m, be := openGolden(t)
	if err := GoldenECAPA(r, m, be); err != nil {
		t.Fatal(err)
	}
	paritytest.Require(t, r.Stages())
	if len(r.Stages()) != len(stageNames) {
		t.Errorf("%d stages, want %d", len(r.Stages()), len(stageNames))
	}
}

// TestEmbed checks the plain path against the stages graph and the per-layer form.
func TestEmbed(t *testing.T) {
	r, m, be := openGolden(t)
	head, err := Load(m.Sub("speaker_ecapa"), be)
	if err != nil {
		t.Fatal(err)
	}
	defer head.Close()
	hs, shape, err := r.F32("spk.wavlm.hidden_states")
	if err != nil {
		t.Fatal(err)
	}
	T := shape[1]
	emb, err := head.Embed(hs, T)
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := r.F32("spk.embedding")
	if s := parity.Compare("embed", emb, want, 1e-4); !s.OK() {
		t.Error(s)
	}
	layers := make([][]float32, shape[0])
	for i := range layers {
		layers[i] = hs[i*T*shape[2] : (i+1)*T*shape[2]]
	}
	emb2, err := head.EmbedLayers(layers, T)
	if err != nil {
		t.Fatal(err)
	}
	if s := parity.Compare("embed layers", emb2, emb, 0); !s.OK() {
		t.Error(s)
	}
	if _, err := head.Embed(hs[:len(hs)-1], T); err == nil {
		t.Errorf("one value short: no error")
	}
	// A shorter reference compiles another program and still runs.
	short := make([]float32, 0, shape[0]*(T-5)*shape[2])
	for i := 0; i < shape[0]; i++ {
		short = append(short, hs[i*T*shape[2]:(i*T+T-5)*shape[2]]...)
	}
	if _, err := head.Embed(short, T-5); err != nil {
		t.Errorf("T-5 frames: %v", err)
	}
	if _, err := head.Embed(hs, 0); err == nil {
		t.Errorf("0 frames: no error")
	}
}

// TestTensorTable checks Tensors against the golden model file: same names, same shapes.
func TestTensorTable(t *testing.T) {
	_, m, be := openGolden(t)
	head, err := Load(m.Sub("speaker_ecapa"), be)
	if err != nil {
		t.Fatal(err)
	}
	defer head.Close()
	sub := m.Sub("speaker_ecapa")
	specs := Tensors(head.Dims)
	if len(specs) != sub.Len() {
		t.Errorf("table has %d tensors, the file %d", len(specs), sub.Len())
	}
	for _, s := range specs {
		mt, ok := sub.Tensor(s.Name)
		if !ok {
			t.Errorf("%s: not in the file", s.Name)
			continue
		}
		if fmt.Sprint(mt.Shape) != fmt.Sprint(s.Shape) {
			t.Errorf("%s: table %v, file %v", s.Name, s.Shape, mt.Shape)
		}
	}
	real := RealTensors()
	if len(real) != len(specs) {
		t.Errorf("real table %d tensors, tiny %d", len(real), len(specs))
	}
	for _, s := range real {
		switch s.Name {
		case "linear.weight":
			if fmt.Sprint(s.Shape) != "[256 3072]" {
				t.Errorf("real linear.weight %v", s.Shape)
			}
		case "layer1.conv.weight":
			if fmt.Sprint(s.Shape) != "[512 1024 5]" {
				t.Errorf("real layer1.conv.weight %v", s.Shape)
			}
		}
	}
}

// editSource hides one tensor or changes one tensor's shape.
type editSource struct {
	src   *gguf.Model
	drop  string
	shape map[string][]int
}

func (e editSource) Has(name string) bool { return name != e.drop && e.src.Has(name) }
func (e editSource) Prefix() string       { return e.src.Prefix() }
func (e editSource) Get(name string) ([]float32, []int, error) {
	d, s, err := e.src.Get(name)
	if ns, ok := e.shape[name]; ok {
		s = ns
	}
	return d, s, err
}

func TestBadWeights(t *testing.T) {
	_, m, be := openGolden(t)
	sub := m.Sub("speaker_ecapa")
	for _, c := range []struct {
		src  editSource
		want string
	}{
		{editSource{src: sub, drop: "layer3.Res2Conv1dReluBn.bns.4.running_var"}, "speaker_ecapa/layer3.Res2Conv1dReluBn.bns.4.running_var"},
		{editSource{src: sub, drop: "layer1.conv.weight"}, "speaker_ecapa/layer1.conv.weight"},
		{editSource{src: sub, shape: map[string][]int{"layer4.SE_Connect.linear2.weight": {32, 4}}}, "speaker_ecapa/layer4.SE_Connect.linear2.weight"},
		{editSource{src: sub, shape: map[string][]int{"bn.running_mean": {191}}}, "speaker_ecapa/bn.running_mean"},
		{editSource{src: sub, shape: map[string][]int{"conv.weight": {64, 64, 1}}}, "speaker_ecapa/conv.weight"},
	} {
		_, err := Load(c.src, be)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error naming %s, got %v", c.want, err)
		}
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`{"vc":{},"speaker_ecapa":{"dilations":[1,2,3,5],"stats_eps":1e-8}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Dilations[3] != 5 || c.StatsEps != 1e-8 || c.BatchNormEps != 1e-5 {
		t.Errorf("parsed %+v", c)
	}
	for _, bad := range []string{
		`{"speaker_ecapa":{"l2_normalize":true}}`,
		`{"speaker_ecapa":{"res2_passthrough":"first_chunk"}}`,
		`{"speaker_ecapa":{"conv_relu_bn_order":"conv,bn,relu"}}`,
		`{"speaker_ecapa":{"dilations":[2,3,4]}}`,
		`{"speaker_ecapa":`,
	} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func finite(x []float32) bool {
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return false
		}
	}
	return len(x) > 0
}

// TestRealDims builds the published head from RealTensors with random weights and runs it.
func TestRealDims(t *testing.T) {
	if testing.Short() {
		t.Skip("real-size weights")
	}
	be, err := engine.NewCPU(min(runtime.NumCPU(), 2))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	head, err := Load(weights.Random(RealTensors(), 7), be)
	if err != nil {
		t.Fatal(err)
	}
	defer head.Close()
	if head.Dims != RealDims {
		t.Errorf("dims %+v, want %+v", head.Dims, RealDims)
	}
	const T = 40
	rng := rand.New(rand.NewPCG(9, 10))
	hs := make([]float32, RealDims.Layers*T*RealDims.Feat)
	for i := range hs {
		hs[i] = float32(rng.NormFloat64())
	}
	emb, err := head.Embed(hs, T)
	if err != nil {
		t.Fatal(err)
	}
	if len(emb) != RealDims.Emb || !finite(emb) {
		t.Errorf("embedding of %d values, finite %v", len(emb), finite(emb))
	}
}
