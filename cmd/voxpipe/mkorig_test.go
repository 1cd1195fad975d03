package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine/ckpt"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/ggufpack"
	"github.com/voxpipe/voxpipe/engine/weights"
)

// mkorigSame checks that two packaged files hold the same tensors (by logical name: type,
// shape and bytes; the import's namespace order may differ from mkmodel's) and the same
// embedded files (JSON compared as values).
func mkorigSame(t *testing.T, tag, gotPath, wantPath string) {
	t.Helper()
	open := func(p string) *gguf.Model {
		m, err := gguf.OpenModel(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	got, want := open(gotPath), open(wantPath)
	type tensor struct {
		typ   gguf.DType
		shape []int
		raw   []byte
	}
	read := func(m *gguf.Model) map[string]tensor {
		out := map[string]tensor{}
		for _, mt := range m.Tensors() {
			raw, _, err := m.File.TensorData(mt.Info.Name)
			if err != nil {
				t.Fatal(err)
			}
			out[mt.FullName] = tensor{mt.Info.Type, mt.Shape, raw}
		}
		return out
	}
	g, w := read(got), read(want)
	if len(g) != len(w) {
		t.Errorf("%s: %d tensors, mkmodel %d", tag, len(g), len(w))
	}
	bad := 0
	for name, wt := range w {
		gt, ok := g[name]
		switch {
		case !ok:
			t.Errorf("%s: %s missing", tag, name)
		case gt.typ != wt.typ || !slices.Equal(gt.shape, wt.shape) || !bytes.Equal(gt.raw, wt.raw):
			if bad++; bad <= 5 {
				t.Errorf("%s: %s: %v %v, mkmodel %v %v (bytes equal: %v)", tag, name, gt.typ, gt.shape, wt.typ, wt.shape, bytes.Equal(gt.raw, wt.raw))
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d tensors differ", tag, bad)
	}
	gf, wf := slices.Sorted(slices.Values(got.EmbeddedFiles())), slices.Sorted(slices.Values(want.EmbeddedFiles()))
	if !slices.Equal(gf, wf) {
		t.Errorf("%s: embedded files %v, mkmodel %v", tag, gf, wf)
	}
	for _, name := range wf {
		a, _ := got.EmbeddedFile(name)
		b, _ := want.EmbeddedFile(name)
		var x, y any
		if strings.HasSuffix(name, ".json") && json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil {
			if !reflect.DeepEqual(x, y) {
				t.Errorf("%s: embedded %s differs", tag, name)
			}
		} else if !bytes.Equal(a, b) {
			t.Errorf("%s: embedded %s differs", tag, name)
		}
	}
}

// The originals writer is the inverse of import: `mkmodel --originals` at tiny dims (MioTTS
// sharded with its index; MeanVC2's safetensors, TorchScript and torch.save files, both
// variants) imports to exactly the file mkmodel writes for the same seed, tensor for tensor,
// in f32 and in q8_0.
func TestMkmodelOriginalsRoundTrip(t *testing.T) {
	for _, c := range []struct {
		family string
		extra  []string
		files  []string
	}{
		{"miotts", []string{"--shard-mb", "1"}, []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
			"model.safetensors.index.json", "config.json", "generation_config.json", "tokenizer_config.json", "vocab.json", "merges.txt"}},
		{"meanvc2", nil, []string{"meanvc2_120ms_40ms.safetensors", "fastu2pp_160ms.pt", "vocos.pt", "wavlm_large_finetune.pth"}},
		{"meanvc2", []string{"--variant", "40ms"}, []string{"meanvc2_40ms_40ms.safetensors", "fastu2pp_80ms.pt", "vocos.pt", "wavlm_large_finetune.pth"}},
	} {
		tag := strings.Join(append([]string{c.family}, c.extra...), " ")
		tmp := t.TempDir()
		dir := filepath.Join(tmp, "orig")
		args := append([]string{"mkmodel", "--family", c.family, "--dims", "tiny", "--seed", "7", "--originals", dir, "--quiet"}, c.extra...)
		if stdout, stderr, code := runCmd(t, args...); code != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", tag, code, stdout, stderr)
		}
		for _, f := range c.files {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("%s: %v", tag, err)
			}
		}
		formats := map[string]string{}
		for _, f := range c.files {
			if strings.HasSuffix(f, ".pt") || strings.HasSuffix(f, ".pth") {
				ck, err := ckpt.Open(filepath.Join(dir, f))
				if err != nil {
					t.Fatalf("%s: %v", tag, err)
				}
				formats[f] = ck.Format
				ck.Close()
			}
		}
		if c.family == "meanvc2" && (formats["vocos.pt"] != "torchscript" || formats["wavlm_large_finetune.pth"] != "torch") {
			t.Errorf("%s: formats %v", tag, formats)
		}
		for _, dt := range []string{"f32", "q8_0"} {
			want := filepath.Join(tmp, "mkmodel-"+dt+".gguf")
			mk := []string{"mkmodel", "--family", c.family, "--dims", "tiny", "--seed", "7", "--dtype", dt, "--out", want}
			if c.family == "meanvc2" {
				mk = append(mk, "--variant", variantArg(c.extra, "120ms"))
			}
			if _, stderr, code := runCmd(t, mk...); code != 0 {
				t.Fatalf("%s: mkmodel: %s", tag, stderr)
			}
			got := filepath.Join(tmp, "import-"+dt+".gguf")
			impRun(t, "--family", c.family, "--from", dir, "--dtype", dt, "--out", got, "--quiet")
			mkorigSame(t, tag+" "+dt, got, want)
		}
	}
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "miotts", "--originals", t.TempDir(), "--dtype", "q8_0"); code == 0 || !strings.Contains(stderr, "f32, bf16 or f16") {
		t.Errorf("--originals --dtype q8_0: exit %d %s", code, stderr)
	}
}

// variantArg is the value after --variant in args, else def.
func variantArg(args []string, def string) string {
	if i := slices.Index(args, "--variant"); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return def
}

// MioCodec has no tiny mkmodel layout: its originals writer runs on the golden model's table
// (weights/ and wavlm_weights/, the WavLM convolutions stored in MLX's layout), and the
// import gives back what mkmodel's randomTensors draws for that table, tensor for tensor;
// bf16 originals import as the same values rounded to bfloat16.
func TestMkmodelOriginalsMioCodec(t *testing.T) {
	_, ref := impGoldenModel(t, "miocodec")
	var table []weights.Spec
	for _, mt := range ref.Tensors() {
		table = append(table, weights.Spec{Name: mt.FullName, Shape: mt.Shape})
	}
	yml, _ := ref.EmbeddedFile("config.yaml")
	m := &mkModel{table: table, files: []gguf.EmbeddedFile{{Name: "config.yaml", Data: yml}}}
	set, err := origMioCodec(m)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]float32{}
	for _, wt := range randomTensors(table, 5, gguf.F32, io.Discard) {
		want[wt.Name] = wt.Data
	}
	for _, dt := range []ckpt.DType{ckpt.F32, ckpt.BF16} {
		dir := filepath.Join(t.TempDir(), "MioCodec-25Hz-44.1kHz-v2")
		if _, err := set.write(dir, dt, 5, io.Discard); err != nil {
			t.Fatal(err)
		}
		wl, err := ckpt.Open(filepath.Join(dir, "wavlm-base-plus-mlx", "weights.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if tt, ok := wl.Tensor("feature_extractor.conv_layers.1.0.weight"); !ok || !importMLXConv("feature_extractor.conv_layers.1.0.weight", tt.Shape) {
			t.Errorf("the WavLM convolutions are not in MLX's layout")
		}
		wl.Close()
		out := filepath.Join(t.TempDir(), "miocodec.gguf")
		impRun(t, "--family", "miocodec", "--from", dir, "--out", out, "--quiet")
		got, err := gguf.OpenModel(out)
		if err != nil {
			t.Fatal(err)
		}
		if got.Len() != len(table) {
			t.Errorf("%v: %d tensors, table %d", dt, got.Len(), len(table))
		}
		bad := 0
		for _, mt := range got.Tensors() {
			raw, _, err := got.File.TensorData(mt.Info.Name)
			if err != nil {
				t.Fatal(err)
			}
			w := want[mt.FullName]
			if dt == ckpt.BF16 {
				w = slices.Clone(w)
				for i, v := range w {
					w[i] = bf16Round(v)
				}
			}
			if mt.Info.Type != gguf.F32 || !slices.Equal(impF32s(raw), w) {
				if bad++; bad <= 5 {
					t.Errorf("%v: %s differs from mkmodel's draw", dt, mt.FullName)
				}
			}
		}
		if b, _ := got.EmbeddedFile("config.yaml"); !bytes.Equal(b, yml) {
			t.Errorf("%v: config.yaml not embedded", dt)
		}
		if _, ok := got.EmbeddedFile("wavlm-base-plus-mlx/config.json"); !ok {
			t.Errorf("%v: the WavLM config.json is not embedded", dt)
		}
		got.Close()
	}
}

// bf16Round is v rounded to bfloat16 and widened back.
func bf16Round(v float32) float32 {
	return math.Float32frombits(uint32(ggufpack.Float32ToBF16(v)) << 16)
}
