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
	for _, dt := range []string{"f32", "f16", "bf16", "q8_0", "q4_k"} {
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

// --variant 40ms writes the 40 ms + 40 ms model: the same tensors, and a config.json whose
// values are the golden 40 ms model's (which also spells out derived values and file names
// the loaders do not read: runtime.dit_window_frames, asr.cnn_cache_frames, …); it loads and its
// streams run the 40 ms schedule. An unknown variant is refused with the choices.
func TestMkmodelMeanVC2Variant40ms(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tiny40.gguf")
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "meanvc2", "--dims", "tiny", "--variant", "40ms", "--out", out); code != 0 {
		t.Fatalf("mkmodel: %s", stderr)
	}
	made, err := gguf.OpenModel(out)
	if err != nil {
		t.Fatal(err)
	}
	defer made.Close()
	ref, err := gguf.OpenModel(filepath.Join(inspectGoldenDir(t), "meanvc2_40ms", "model.gguf"))
	if err != nil {
		t.Skipf("golden model not available: %v", err)
	}
	defer ref.Close()
	if !reflect.DeepEqual(shapesOf(t, made), shapesOf(t, ref)) {
		t.Error("tensor shapes differ from the golden 40 ms model's")
	}
	sections := func(m *gguf.Model) map[string]map[string]any {
		raw, ok := m.EmbeddedFile("config.json")
		if !ok {
			t.Fatal("no embedded config.json")
		}
		var v map[string]map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	got, want := sections(made), sections(ref)
	for name, w := range want {
		if len(got[name]) == 0 {
			t.Errorf("config.json has no section %s", name)
		}
		for k, v := range got[name] {
			if !reflect.DeepEqual(v, w[k]) {
				t.Errorf("config.json %s.%s = %v, golden %v", name, k, v, w[k])
			}
		}
	}
	// What the loaders read from it: the DiT's and the ASR front end's 40 ms constants.
	cfg, err := meanvc2.ConfigFromModel(made)
	if err != nil {
		t.Fatal(err)
	}
	rt := cfg.Runtime
	if cfg.ChunkSize != 4 || cfg.BlockSize != 4 || cfg.Window() != 8 || rt.Model != "40ms" || rt.ChunkSize != 4 || rt.BlockSize != 4 ||
		rt.BNWindow != 11 || rt.BNStride != 8 || rt.RequiredCacheSize != 4 || rt.ASROffsetInit != 4 || rt.ASROffsetStep != 2 ||
		rt.ChunkSamples != 2560 || rt.VCChunkFrames != 16 || rt.MaxDiTStepsPerChunk != 4 {
		t.Errorf("parsed config: chunk %d block %d window %d, runtime %+v", cfg.ChunkSize, cfg.BlockSize, cfg.Window(), rt)
	}
	if kv := []int{cfg.CacheFrames(0), cfg.CacheFrames(1), cfg.CacheFrames(2), cfg.CacheFrames(3)}; !slices.Equal(kv, []int{12, 12, 8, 8}) {
		t.Errorf("KV caps %v, want 12 12 8 8", kv)
	}
	raw, _ := made.EmbeddedFile("config.json")
	asr, err := conformer.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	if asr.Stream != conformer.Stream40ms() || asr.WindowsPerChunk() != 2 {
		t.Errorf("asr stream %+v (%d windows per chunk), want %+v (2)", asr.Stream, asr.WindowsPerChunk(), conformer.Stream40ms())
	}
	name, _ := made.File.KV.String("general.name")
	spec, _ := made.File.KV.String("audiocpp.model_spec.json")
	if name != "meanvc2-40ms-40ms-tiny-random" || !strings.Contains(spec, "meanvc2-40ms-40ms") {
		t.Errorf("general.name %q, model_spec.json %s", name, spec)
	}
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	m, err := meanvc2.LoadFromModel(made, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := m.OutputSlack(); got != 960 {
		t.Errorf("OutputSlack %d, want the 40 ms schedule's 960", got)
	}
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "meanvc2", "--dims", "tiny", "--variant", "80ms", "--out", out); code == 0 || !strings.Contains(stderr, "120ms or 40ms") {
		t.Errorf("--variant 80ms: exit %d, %s", code, stderr)
	}
}

// Every preset takes either variant: the config.json it writes parses (meanvc2 and conformer)
// to that variant's streaming constants and nothing else changes — the same tensors, the same
// widths. The name carries the variant. --variant is refused for the other families.
func TestMkmodelMeanVC2Variants(t *testing.T) {
	type want struct {
		chunk, kv0, bnWindow, bnStride, cache, offInit, offStep, windows int
		stream                                                           conformer.StreamConfig
	}
	wants := map[string]want{
		"120ms": {12, 36, 19, 16, 8, 8, 4, 1, conformer.Stream120ms()},
		"40ms":  {4, 12, 11, 8, 4, 4, 2, 2, conformer.Stream40ms()},
	}
	for _, dims := range []string{"real", "tiny"} {
		for _, variant := range meanvc2.Variants {
			base := mvc2Real()
			if dims == "tiny" {
				base = mvc2Tiny()
			}
			d, err := base.withVariant(variant)
			if err != nil {
				t.Fatalf("%s %s: %v", dims, variant, err)
			}
			w := wants[variant]
			tag := dims + " " + variant
			wantName := "meanvc2-" + variant + "-40ms-random"
			if dims == "tiny" {
				wantName = "meanvc2-" + variant + "-40ms-tiny-random"
			}
			if d.name != wantName || d.published() != "meanvc2-"+variant+"-40ms" {
				t.Errorf("%s: name %q (published %q), want %q", tag, d.name, d.published(), wantName)
			}
			if !reflect.DeepEqual(d.specs(), base.specs()) {
				t.Errorf("%s: the tensor table depends on the variant", tag)
			}
			raw, err := d.configJSON()
			if err != nil {
				t.Fatal(err)
			}
			vc, err := meanvc2.ParseConfig(raw)
			if err != nil {
				t.Fatalf("%s: %v", tag, err)
			}
			rt := vc.Runtime
			if vc.ChunkSize != w.chunk || vc.BlockSize != 4 || vc.CacheFrames(0) != w.kv0 || rt.Model != variant ||
				rt.ChunkSize != w.chunk || rt.BlockSize != 4 || rt.BNWindow != w.bnWindow || rt.BNStride != w.bnStride ||
				rt.RequiredCacheSize != w.cache || rt.ASROffsetInit != w.offInit || rt.ASROffsetStep != w.offStep ||
				rt.ChunkSamples != 2560 || rt.VCChunkFrames != 16 || rt.MaxDiTStepsPerChunk != 4 {
				t.Errorf("%s: meanvc2 config chunk %d block %d kv0 %d, runtime %+v", tag, vc.ChunkSize, vc.BlockSize, vc.CacheFrames(0), rt)
			}
			if vc.Dim != base.vc.Dim || vc.BNDim != base.vc.BNDim || !reflect.DeepEqual(vc.Tensors(), base.vc.Tensors()) {
				t.Errorf("%s: DiT widths changed with the variant", tag)
			}
			asr, err := conformer.ParseConfig(raw)
			if err != nil {
				t.Fatalf("%s: %v", tag, err)
			}
			if asr.Stream != w.stream || asr.WindowsPerChunk() != w.windows {
				t.Errorf("%s: asr stream %+v (%d windows per chunk), want %+v (%d)", tag, asr.Stream, asr.WindowsPerChunk(), w.stream, w.windows)
			}
			var sec struct {
				ASR struct {
					AttCache []int `json:"att_cache_shape"`
				} `json:"asr"`
				VC struct {
					Model struct {
						Chunk int `json:"chunk_size"`
					} `json:"model"`
				} `json:"vc"`
			}
			if err := json.Unmarshal(raw, &sec); err != nil {
				t.Fatal(err)
			}
			if len(sec.ASR.AttCache) != 4 || sec.ASR.AttCache[2] != w.cache || sec.VC.Model.Chunk != w.chunk {
				t.Errorf("%s: asr.att_cache_shape %v, vc.model.chunk_size %d", tag, sec.ASR.AttCache, sec.VC.Model.Chunk)
			}
		}
	}
	if _, err := mvc2Tiny().withVariant("80ms"); err == nil || !strings.Contains(err.Error(), "120ms or 40ms") {
		t.Errorf("variant 80ms: %v", err)
	}
	out := filepath.Join(t.TempDir(), "x.gguf")
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "miotts", "--dims", "tiny", "--variant", "40ms", "--out", out); code == 0 || !strings.Contains(stderr, "--variant is for --family meanvc2") {
		t.Errorf("miotts --variant 40ms: exit %d, %s", code, stderr)
	}
	// The default is the 120 ms model, named so.
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "meanvc2", "--dims", "tiny", "--out", out); code != 0 {
		t.Fatalf("mkmodel: %s", stderr)
	}
	m, err := gguf.OpenModel(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cfg, err := meanvc2.ConfigFromModel(m)
	if err != nil {
		t.Fatal(err)
	}
	if name, _ := m.File.KV.String("general.name"); name != "meanvc2-120ms-40ms-tiny-random" || cfg.Runtime.Model != "120ms" || cfg.ChunkSize != 12 {
		t.Errorf("default: general.name %q, variant %q, chunk %d", name, cfg.Runtime.Model, cfg.ChunkSize)
	}
}
