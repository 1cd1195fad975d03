package main

import (
	"encoding/json"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/ecapa"
	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/models/vocos"
)

// shapesOf maps every logical tensor name of a file to its PyTorch shape.
func shapesOf(t *testing.T, m *gguf.Model) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for _, mt := range m.Tensors() {
		out[mt.Name] = mt.Shape
	}
	return out
}

// --dims tiny writes the golden model's layout: the same tensor names and shapes, and a
// config.json with the same content.
func TestMkmodelMeanVC2TinyMatchesGolden(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "meanvc2", "--dims", "tiny", "--out", out); code != 0 {
		t.Fatalf("mkmodel: %s", stderr)
	}
	made, err := gguf.OpenModel(out)
	if err != nil {
		t.Fatal(err)
	}
	defer made.Close()
	ref, err := gguf.OpenModel(filepath.Join(inspectGoldenDir(t), "meanvc2", "model.gguf"))
	if err != nil {
		t.Skipf("golden model not available: %v", err)
	}
	defer ref.Close()
	got, want := shapesOf(t, made), shapesOf(t, ref)
	for name, s := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("missing %s %v", name, s)
		} else if !slices.Equal(g, s) {
			t.Errorf("%s: shape %v, golden %v", name, g, s)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("extra tensor %s", name)
		}
	}
	if !slices.Equal(made.Namespaces(), ref.Namespaces()) {
		t.Errorf("namespaces %v, golden %v", made.Namespaces(), ref.Namespaces())
	}
	var gotCfg, wantCfg any
	for _, c := range []struct {
		m   *gguf.Model
		dst *any
	}{{made, &gotCfg}, {ref, &wantCfg}} {
		raw, ok := c.m.EmbeddedFile("config.json")
		if !ok {
			t.Fatal("no embedded config.json")
		}
		if err := json.Unmarshal(raw, c.dst); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(gotCfg, wantCfg) {
		a, _ := json.Marshal(gotCfg)
		b, _ := json.Marshal(wantCfg)
		t.Errorf("config.json differs from the golden one:\n%s\n%s", a, b)
	}
}

// A tiny random model loads and converts with finite output in every stored weight type.
func TestMkmodelMeanVC2TinyConverts(t *testing.T) {
	for _, dt := range []string{"f32", "f16", "q8_0"} {
		out := filepath.Join(t.TempDir(), dt+".gguf")
		if _, stderr, code := runCmd(t, "mkmodel", "--family", "meanvc2", "--dims", "tiny", "--dtype", dt, "--seed", "5", "--out", out); code != 0 {
			t.Fatalf("%s: mkmodel: %s", dt, stderr)
		}
		convertsFinite(t, out, 1, nil)
	}
}

// The real config.json is accepted by every parser and agrees with the real tensor table.
func TestMeanVC2RealConfigAgreesWithTensors(t *testing.T) {
	d := mvc2Real()
	raw, err := d.configJSON()
	if err != nil {
		t.Fatal(err)
	}
	vc, err := meanvc2.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(vc.Tensors(), meanvc2.RealTensors()) {
		t.Error("vc/ table of the parsed config differs from meanvc2.RealTensors")
	}
	asr, err := conformer.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(asr.Tensors(), conformer.RealConfig().Tensors()) {
		t.Error("asr/ table of the parsed config differs from conformer.RealConfig")
	}
	if _, err := vocos.ParseConfig(raw); err != nil {
		t.Fatal(err)
	}
	if _, err := ecapa.ParseConfig(raw); err != nil {
		t.Fatal(err)
	}
	var sec struct {
		Wavlm struct {
			Layers int    `json:"encoder_layers"`
			Dim    int    `json:"encoder_embed_dim"`
			States int    `json:"num_hidden_states"`
			Convs  string `json:"conv_feature_layers"`
		} `json:"speaker_wavlm"`
		ECAPA struct {
			Weights  int `json:"feature_weight_len"`
			Feat     int `json:"feat_dim"`
			Channels int `json:"channels"`
			Emb      int `json:"emb_dim"`
		} `json:"speaker_ecapa"`
	}
	if err := json.Unmarshal(raw, &sec); err != nil {
		t.Fatal(err)
	}
	w, e := sec.Wavlm, sec.ECAPA
	if w.Layers != 24 || w.Dim != 1024 || w.States != 25 || w.Convs != "[(512,10,5)] + [(512,3,2)] * 4 + [(512,2,2)] * 2" {
		t.Errorf("speaker_wavlm section %+v", w)
	}
	if e.Weights != 25 || e.Feat != 1024 || e.Channels != 512 || e.Emb != 256 {
		t.Errorf("speaker_ecapa section %+v", e)
	}
	// Every namespace is present, and the F32 weights come to the published ~1.47 GB.
	var bytes int64
	ns := map[string]bool{}
	for _, s := range d.specs() {
		n := int64(4)
		for _, x := range s.Shape {
			n *= int64(x)
		}
		bytes += n
		ns[s.Name[:strings.IndexByte(s.Name, '/')]] = true
	}
	if len(ns) != len(meanvc2.Namespaces) || bytes < 1.46e9 || bytes > 1.48e9 {
		t.Errorf("%d namespaces, %d bytes of F32 weights", len(ns), bytes)
	}
}

// --dims real loads with meanvc2.Load, embeds a reference and converts a few chunks with
// finite, non-silent output.
func TestMkmodelMeanVC2RealConverts(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and loads the 1.47 GB real-size model")
	}
	out := filepath.Join(t.TempDir(), "real.gguf")
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "meanvc2", "--dims", "real", "--out", out); code != 0 {
		t.Fatalf("mkmodel: %s", stderr)
	}
	settleHeap() // the generated weights are garbage now
	convertsFinite(t, out, 2, func(m *meanvc2.Model) {
		c := m.Config
		if c.Dim != 512 || c.BNDim != 256 || m.ASR.Config.NumBlocks != 6 || m.WavLM.Config.Layers != 24 || m.ECAPA.Dims.Layers != 25 || m.Vocoder.Dims.Dim != 320 {
			t.Fatalf("loaded widths: dit %d, bn %d, asr layers %d, wavlm layers %d, ecapa states %d, vocos %d",
				c.Dim, c.BNDim, m.ASR.Config.NumBlocks, m.WavLM.Config.Layers, m.ECAPA.Dims.Layers, m.Vocoder.Dims.Dim)
		}
	})
}

// convertsFinite loads a MeanVC2 file, embeds a synthetic reference and converts six chunks
// and the flush, requiring finite, non-silent output; check, if set, inspects the loaded model.
func convertsFinite(t *testing.T, path string, threads int, check func(*meanvc2.Model)) {
	t.Helper()
	be, err := engine.NewCPU(threads)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	m, err := meanvc2.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if check != nil {
		check(m)
	}
	rate := m.Config.Runtime.SampleRate
	target, err := m.VoiceFromClip(meanvc2.SyntheticSpeech(2*rate, rate, 2), rate)
	if err != nil {
		t.Fatal(err)
	}
	finite := func(what string, v []float32) {
		t.Helper()
		var peak float64
		for i, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("%s: value %d is %v", what, i, x)
			}
			peak = max(peak, math.Abs(float64(x)))
		}
		if len(v) > 0 && peak == 0 {
			t.Errorf("%s: all zero", what)
		}
	}
	finite("speaker embedding", target.Spk)
	finite("timbre memory", target.K)
	s, err := m.NewStream(target)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := s.ChunkSize()
	in := meanvc2.SyntheticSpeech(6*k, rate, 1)
	var total int
	var wave []float32
	for i := range 6 {
		if wave, err = s.Process(wave[:0], in[i*k:(i+1)*k]); err != nil {
			t.Fatal(err)
		}
		finite("chunk output", wave)
		total += len(wave)
	}
	if wave, err = s.Flush(wave[:0]); err != nil {
		t.Fatal(err)
	}
	finite("flush", wave)
	total += len(wave)
	if total < 5*k {
		t.Errorf("%d output samples for %d input", total, 6*k)
	}
}
