package main

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/ckpt"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/ggufpack"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/models/meanvc2"
)

// The originals of the golden models: testdata/ckpt (written by tools/ckptgen/gen.py from
// the golden tensors with torch's own serialisers) for the TorchScript and torch.save files,
// and safetensors written here from the golden tensors.

const impFixtures = "../../testdata/ckpt"

// goldenTensors reads every tensor of a golden model (logical name → raw F32 bytes, shape),
// in file order, and its embedded files.
type impGoldenTensor struct {
	name  string
	shape []int
	raw   []byte
}

func impGoldenModel(t *testing.T, family string) ([]impGoldenTensor, *gguf.Model) {
	t.Helper()
	m, err := gguf.OpenModel(filepath.Join(golden.Path(t, family), "model.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	var out []impGoldenTensor
	for _, mt := range m.Tensors() {
		raw, _, err := m.File.TensorData(mt.Info.Name)
		if err != nil {
			t.Fatal(err)
		}
		if mt.Info.Type != gguf.F32 {
			t.Fatalf("golden %s is %v", mt.FullName, mt.Info.Type)
		}
		out = append(out, impGoldenTensor{mt.FullName, mt.Shape, raw})
	}
	return out, m
}

// impWriteST writes the golden tensors under ns (stripped, then renamed by rename; "" drops)
// as a safetensors file.
func impWriteST(t *testing.T, path string, gts []impGoldenTensor, ns string, rename func(string) string, extra ...ckpt.STensor) {
	t.Helper()
	var ts []ckpt.STensor
	for _, g := range gts {
		rest, ok := strings.CutPrefix(g.name, ns+"/")
		if ns == "" {
			rest, ok = g.name, true
		}
		if !ok {
			continue
		}
		if rename != nil {
			rest = rename(rest)
		}
		if rest == "" {
			continue
		}
		ts = append(ts, ckpt.STensor{Name: rest, DType: ckpt.F32, Shape: g.shape, Data: g.raw})
	}
	ts = append(ts, extra...)
	var b bytes.Buffer
	if err := ckpt.WriteSafetensors(&b, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// impCopyFile copies a fixture into dir.
func impCopyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("fixture (regenerate with tools/ckptgen/gen.py): %v", err)
	}
	os.MkdirAll(filepath.Dir(dst), 0o755)
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// impMeanVC2Originals lays out the MeanVC2 originals of the golden model in a folder, as the
// published files are named.
func impMeanVC2Originals(t *testing.T, dit string) string {
	t.Helper()
	gts, _ := impGoldenModel(t, "meanvc2")
	dir := t.TempDir()
	// The runtime class's unused cache_embed may be in a DiT checkpoint: it is dropped.
	impWriteST(t, filepath.Join(dir, dit), gts, "vc", nil, ckpt.F32Tensor("cache_embed.weight", []int{64, 80}, make([]float32, 64*80)))
	for _, f := range []string{"fastu2pp_160ms.pt", "vocos.pt", "wavlm_large_finetune.pth"} {
		impCopyFile(t, filepath.Join(impFixtures, "meanvc2", f), filepath.Join(dir, f))
	}
	return dir
}

// impSameAsGolden checks the imported file tensor for tensor against the golden model: names
// in the same order, shapes, dtypes and bytes; and the embedded files.
func impSameAsGolden(t *testing.T, path, family string) *gguf.Model {
	return impSameAsGoldenConfig(t, path, family, true)
}

// impJSONSubset reports whether every key of got (recursively) has the same value in want.
func impJSONSubset(got, want any) bool {
	g, ok1 := got.(map[string]any)
	w, ok2 := want.(map[string]any)
	if !ok1 || !ok2 {
		return reflect.DeepEqual(got, want)
	}
	for k, v := range g {
		if wv, ok := w[k]; !ok || !impJSONSubset(v, wv) {
			return false
		}
	}
	return true
}

// impSameAsGoldenConfig is impSameAsGolden; with exact false the embedded JSON files need only
// agree on the keys the import writes (the golden 40 ms config.json also spells out
// derived values no loader reads).
func impSameAsGoldenConfig(t *testing.T, path, family string, exact bool) *gguf.Model {
	t.Helper()
	want, ref := impGoldenModel(t, family)
	got, err := gguf.OpenModel(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { got.Close() })
	if got.Len() != len(want) {
		t.Errorf("%d tensors, golden %d", got.Len(), len(want))
	}
	for i, mt := range got.Tensors() {
		if i >= len(want) {
			break
		}
		w := want[i]
		if mt.FullName != w.name {
			t.Errorf("tensor %d is %s, golden %s", i, mt.FullName, w.name)
			continue
		}
		raw, _, err := got.File.TensorData(mt.Info.Name)
		if err != nil {
			t.Fatal(err)
		}
		if mt.Info.Type != gguf.F32 || !slices.Equal(mt.Shape, w.shape) || !bytes.Equal(raw, w.raw) {
			t.Errorf("%s: %v %v, golden F32 %v (bytes equal: %v)", w.name, mt.Info.Type, mt.Shape, w.shape, bytes.Equal(raw, w.raw))
		}
	}
	if !slices.Equal(got.EmbeddedFiles(), ref.EmbeddedFiles()) {
		t.Errorf("embedded files %v, golden %v", got.EmbeddedFiles(), ref.EmbeddedFiles())
	}
	for _, name := range ref.EmbeddedFiles() {
		a, _ := got.EmbeddedFile(name)
		b, _ := ref.EmbeddedFile(name)
		if strings.HasSuffix(name, ".json") {
			var x, y any
			if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil || exact && !reflect.DeepEqual(x, y) || !impJSONSubset(x, y) {
				t.Errorf("embedded %s differs from the golden one", name)
			}
		} else if !bytes.Equal(a, b) {
			t.Errorf("embedded %s differs from the golden one", name)
		}
	}
	// The metadata keys the golden file carries (general.name and the spec's text aside,
	// which name this file) are there with the same types.
	for _, k := range ref.File.KV.Keys() {
		v, ok := got.File.KV[k]
		switch {
		case strings.HasPrefix(k, "golden."):
		case !ok:
			t.Errorf("metadata %s missing", k)
		case v.Type() != ref.File.KV[k].Type():
			t.Errorf("metadata %s is %v, golden %v", k, v.Type(), ref.File.KV[k].Type())
		}
	}
	if err := got.ValidateModelSpec(); err != nil {
		t.Errorf("spec: %v", err)
	}
	return got
}

// impGoldenRun runs `voxpipe golden` for family on the imported file (with the golden cases).
func impGoldenRun(t *testing.T, family, model string) {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, family)
	os.MkdirAll(dir, 0o755)
	if err := os.Symlink(filepath.Join(golden.Path(t, family), "cases.gguf"), filepath.Join(dir, "cases.gguf")); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(model)
	if err := os.Symlink(abs, filepath.Join(dir, "model.gguf")); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runCmd(t, "golden", "--family", family, "--dir", root)
	if code != 0 || !strings.Contains(stdout, " 0 failed") {
		t.Fatalf("golden %s on the imported file: exit %d\n%s\n%s", family, code, stdout, stderr)
	}
}

func impRun(t *testing.T, args ...string) (string, string) {
	t.Helper()
	stdout, stderr, code := runCmd(t, append([]string{"import"}, args...)...)
	if code != 0 {
		t.Fatalf("import %v: exit %d\n%s\n%s", args, code, stdout, stderr)
	}
	return stdout, stderr
}

// MeanVC2: the DiT safetensors, the Fast-U2++ and Vocos TorchScript archives and the
// speaker torch.save checkpoint import to the golden file, tensor for tensor and byte for
// byte, and the golden parity run passes on the result.
func TestImportMeanVC2(t *testing.T) {
	dir := impMeanVC2Originals(t, "meanvc2_120ms_40ms.safetensors")
	out := filepath.Join(t.TempDir(), "meanvc2.gguf")
	stdout, stderr := impRun(t, "--family", "meanvc2", "--from", dir, "--out", out)
	if !strings.Contains(stdout, "494 tensors") {
		t.Errorf("summary: %s", stdout)
	}
	// What was left out, and why: the unused branches of the originals.
	for _, s := range []string{"cache_embed.*", "encoder.global_cmvn.* ×2", "non_streaming_conv.* ×16", "decoder.*", "ctc.* ×2",
		"*.num_batches_tracked ×29", "vc:", "asr:", "  vc ", "speaker_ecapa"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr lacks %q:\n%s", s, stderr)
		}
	}
	m := impSameAsGolden(t, out, "meanvc2")
	if name, _ := m.File.KV.String("general.name"); name != "meanvc2-120ms-40ms-tiny" {
		t.Errorf("general.name %q", name)
	}
	if src, _ := m.File.KV.Strings(gguf.KeySourcePaths); !slices.Equal(src, []string{"meanvc2_120ms_40ms.safetensors", "vocos.pt",
		"fastu2pp_160ms.pt", "wavlm_large_finetune.pth", "wavlm_large_finetune.pth"}) {
		t.Errorf("tensor_sources.paths %v", src)
	}
	impGoldenRun(t, "meanvc2", out)
}

// The 40 ms + 40 ms model: the variant comes from the file names (or --variant) and only
// changes the streaming constants in config.json, which then match the golden 40 ms file.
func TestImportMeanVC2Variant40ms(t *testing.T) {
	dir := impMeanVC2Originals(t, "meanvc2_40ms_40ms.safetensors")
	os.Rename(filepath.Join(dir, "fastu2pp_160ms.pt"), filepath.Join(dir, "fastu2pp_80ms.pt"))
	out := filepath.Join(t.TempDir(), "m40.gguf")
	impRun(t, "--family", "meanvc2", "--from", dir, "--out", out)
	impSameAsGoldenConfig(t, out, "meanvc2_40ms", false)
	impGoldenRun(t, "meanvc2_40ms", out)
	// Both ASR files in one folder: the variant picks one; without it the choice is refused.
	impCopyFile(t, filepath.Join(impFixtures, "meanvc2", "fastu2pp_160ms.pt"), filepath.Join(dir, "fastu2pp_160ms.pt"))
	impRun(t, "--family", "meanvc2", "--from", dir, "--out", out, "--variant", "40ms")
	impSameAsGoldenConfig(t, out, "meanvc2_40ms", false)
	os.Rename(filepath.Join(dir, "meanvc2_40ms_40ms.safetensors"), filepath.Join(dir, "dit.safetensors"))
	if _, stderr, code := runCmd(t, "import", "--family", "meanvc2", "--from", dir, "--out", out); code == 0 || !strings.Contains(stderr, "--variant") {
		t.Errorf("two ASR checkpoints, no variant: exit %d %s", code, stderr)
	}
}

// Files given one by one with roles, a plain WeNet state dict as the ASR (conv_module.X,
// the encoder at the root of a safetensors file), and a parametrised weight norm in the
// speaker checkpoint import to the same tensors.
func TestImportMeanVC2Roles(t *testing.T) {
	gts, _ := impGoldenModel(t, "meanvc2")
	dir := t.TempDir()
	impWriteST(t, filepath.Join(dir, "dit.safetensors"), gts, "vc", nil)
	impWriteST(t, filepath.Join(dir, "asr.safetensors"), gts, "asr", func(n string) string {
		n = strings.TrimPrefix(n, "encoder.")
		return strings.Replace(n, "conv_module.streaming_conv.", "conv_module.", 1)
	})
	impWriteST(t, filepath.Join(dir, "wavlm.safetensors"), gts, "speaker_wavlm", func(n string) string {
		n = strings.Replace(n, "pos_conv.0.weight_g", "pos_conv.0.parametrizations.weight.original0", 1)
		return strings.Replace(n, "pos_conv.0.weight_v", "pos_conv.0.parametrizations.weight.original1", 1)
	})
	impWriteST(t, filepath.Join(dir, "ecapa.safetensors"), gts, "speaker_ecapa", nil)
	out := filepath.Join(t.TempDir(), "m.gguf")
	impRun(t, "--family", "meanvc2", "--from", "vc="+filepath.Join(dir, "dit.safetensors"),
		"--from", "asr="+filepath.Join(dir, "asr.safetensors"), "--from", filepath.Join(impFixtures, "meanvc2", "vocos.pt"),
		"--from", "speaker_wavlm="+filepath.Join(dir, "wavlm.safetensors"), "--from", "speaker_ecapa="+filepath.Join(dir, "ecapa.safetensors"),
		"--out", out, "--quiet")
	impSameAsGolden(t, out, "meanvc2")
	// A missing part is named.
	_, stderr, code := runCmd(t, "import", "--family", "meanvc2", "--from", filepath.Join(dir, "dit.safetensors"), "--out", out)
	if code == 0 || !strings.Contains(stderr, "missing asr") || !strings.Contains(stderr, "vocos") {
		t.Errorf("missing checkpoints: exit %d %s", code, stderr)
	}
}

// Every --dtype stores the encoded matrices (and only those) in its type, bit for bit what
// the quantiser makes of the golden values, within the type's error of them; the files load
// and run the golden cases within a stated error.
func TestImportMeanVC2DTypes(t *testing.T) {
	dir := impMeanVC2Originals(t, "meanvc2_120ms_40ms.safetensors")
	gts, _ := impGoldenModel(t, "meanvc2")
	byName := map[string]impGoldenTensor{}
	for _, g := range gts {
		byName[g.name] = g
	}
	encoded := map[string]bool{}
	for _, s := range mvc2Tiny().specs() {
		encoded[s.Name] = s.Encoded
	}
	for _, c := range []struct {
		flag   string
		dt     gguf.DType
		tol    float64 // max |error| relative to the tensor's max |value|
		golden float64 // every golden stage's error relative to its max |value|
	}{ // golden: about twice the worst stage measured (7.9e-4, 7.2e-3, 2.3e-2, 8.1e-2; the tiny
		// model's q4_k file is mostly Q8_0, its rows being shorter than a Q4_K block)
		{"f16", gguf.F16, 1e-3, 2e-3}, {"bf16", gguf.BF16, 8e-3, 2e-2}, {"q8_0", gguf.Q8_0, 1e-2, 5e-2}, {"q4_k", gguf.Q4_K, 0.15, 0.15}} {
		out := filepath.Join(t.TempDir(), c.flag+".gguf")
		impRun(t, "--family", "meanvc2", "--from", dir, "--out", out, "--dtype", c.flag, "--quiet")
		m, err := gguf.OpenModel(out)
		if err != nil {
			t.Fatal(err)
		}
		if wt, _ := m.File.KV.String("audiocpp.weight_type"); wt != c.flag {
			t.Errorf("%s: weight_type %q", c.flag, wt)
		}
		counts := map[gguf.DType]int{}
		for _, mt := range m.Tensors() {
			g := byName[mt.FullName]
			want := importStoredType(encoded[mt.FullName], g.shape, c.dt)
			counts[mt.Info.Type]++
			if mt.Info.Type != want {
				t.Errorf("%s: %s stored as %v, want %v", c.flag, mt.FullName, mt.Info.Type, want)
				continue
			}
			raw, _, _ := m.File.TensorData(mt.Info.Name)
			orig := impF32s(g.raw)
			exp, err := ggufpack.Encode(nil, orig, want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(raw, exp) && want != gguf.Q8_0 && want != gguf.Q4_K || (want == gguf.Q8_0 || want == gguf.Q4_K) && !impRowsEqual(t, orig, g.shape, want, raw) {
				t.Errorf("%s: %s: stored bytes are not the quantiser's", c.flag, mt.FullName)
			}
			got, _, err := m.Get(mt.FullName)
			if err != nil {
				t.Fatal(err)
			}
			var amax, emax float64
			for i, v := range orig {
				amax = math.Max(amax, math.Abs(float64(v)))
				emax = math.Max(emax, math.Abs(float64(got[i]-v)))
			}
			if emax > c.tol*amax {
				t.Errorf("%s: %s: max error %g of max |x| %g", c.flag, mt.FullName, emax, amax)
			}
		}
		if counts[c.dt] == 0 {
			t.Errorf("%s: no tensor stored as %v: %v", c.flag, c.dt, counts)
		}
		be, err := engine.NewCPU(1)
		if err != nil {
			t.Fatal(err)
		}
		mm, err := meanvc2.LoadFromModel(m, be)
		if err != nil {
			t.Errorf("%s: the engine does not load it: %v", c.flag, err)
		} else {
			mm.Close()
		}
		be.Close()
		m.Close()
		t.Logf("%s: %v", c.flag, counts)
		// The golden cases run on the encoded copy within its stated error.
		stdout, stderr, code := runCmd(t, "golden", "--family", "meanvc2", "--dir", filepath.Dir(golden.Path(t, "meanvc2")),
			"--model", out, "--min-tol", fmt.Sprint(c.golden))
		if code != 0 {
			t.Errorf("%s: golden cases above %g: %s\n%s", c.flag, c.golden, impWorstStages(stdout, 5), stderr)
		}
		t.Logf("%s: golden cases within %g; worst: %s", c.flag, c.golden, impWorstStages(stdout, 1))
	}
}

// impRowsEqual compares a quantised tensor with the quantiser's rows (the writer encodes a
// chunk of whole rows at a time; the result must not depend on the chunking).
func impRowsEqual(t *testing.T, vals []float32, shape []int, dt gguf.DType, raw []byte) bool {
	cols := shape[len(shape)-1]
	var exp []byte
	for r := 0; r < len(vals); r += cols {
		var err error
		if exp, err = ggufpack.Encode(exp, vals[r:r+cols], dt); err != nil {
			t.Fatal(err)
		}
	}
	return bytes.Equal(exp, raw)
}

func impF32s(raw []byte) []float32 {
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out
}

// impMioCodecOriginals lays out MioCodec's folder: model.safetensors, config.yaml and
// wavlm-base-plus-mlx/{weights.safetensors,config.json}; mlx stores the WavLM convolutions
// in MLX's [out, kernel, in] layout when set.
func impMioCodecOriginals(t *testing.T, mlx bool) string {
	gts, ref := impGoldenModel(t, "miocodec")
	dir := filepath.Join(t.TempDir(), "MioCodec-25Hz-44.1kHz-v2")
	impWriteST(t, filepath.Join(dir, "model.safetensors"), gts, "weights", nil)
	var wl []impGoldenTensor
	for _, g := range gts {
		if rest, ok := strings.CutPrefix(g.name, "wavlm_weights/"); ok {
			if mlx && len(g.shape) == 3 && (strings.HasPrefix(rest, "feature_extractor.conv_layers.") || rest == "encoder.pos_conv.0.weight_v") {
				g.shape = []int{g.shape[0], g.shape[2], g.shape[1]}
				g.raw = impF32Bytes(importSwapLast2(impF32s(g.raw), []int{g.shape[0], g.shape[2], g.shape[1]}))
			}
			wl = append(wl, g)
		}
	}
	impWriteST(t, filepath.Join(dir, "wavlm-base-plus-mlx", "weights.safetensors"), wl, "wavlm_weights", nil)
	for _, f := range ref.EmbeddedFiles() {
		b, _ := ref.EmbeddedFile(f)
		os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func impF32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// MioCodec: model.safetensors + the WavLM-Base+ safetensors (PyTorch or MLX conv layout)
// + config.yaml import to the golden file, and the golden parity run passes on it.
func TestImportMioCodec(t *testing.T) {
	for _, mlx := range []bool{false, true} {
		dir := impMioCodecOriginals(t, mlx)
		out := filepath.Join(t.TempDir(), "miocodec.gguf")
		impRun(t, "--family", "miocodec", "--from", dir, "--out", out)
		impSameAsGolden(t, out, "miocodec")
		if !mlx {
			impGoldenRun(t, "miocodec", out)
		}
	}
}

// impMioTTSOriginals lays out a Hugging Face folder: the weights in two shards with their
// index, config.json, generation_config.json and the tokenizer files.
func impMioTTSOriginals(t *testing.T) string {
	gts, ref := impGoldenModel(t, "miotts")
	dir := filepath.Join(t.TempDir(), "MioTTS-tiny")
	half := len(gts) / 2
	impWriteST(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), gts[:half], "", nil)
	impWriteST(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), gts[half:], "", nil)
	wm := map[string]string{}
	for i, g := range gts {
		wm[g.name] = fmt.Sprintf("model-%05d-of-00002.safetensors", 1+i/half)
	}
	idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": wm})
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
	for _, f := range ref.EmbeddedFiles() {
		b, _ := ref.EmbeddedFile(f)
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// MioTTS: a sharded Hugging Face Qwen3 checkpoint with its config and tokenizer files
// imports to the golden file (tensors, and the embedded files byte for byte), and the
// golden parity run passes on it.
func TestImportMioTTS(t *testing.T) {
	dir := impMioTTSOriginals(t)
	out := filepath.Join(t.TempDir(), "miotts.gguf")
	impRun(t, "--family", "miotts", "--from", dir, "--out", out)
	m := impSameAsGolden(t, out, "miotts")
	for _, f := range m.EmbeddedFiles() {
		a, _ := m.EmbeddedFile(f)
		b, _ := os.ReadFile(filepath.Join(dir, f))
		if !bytes.Equal(a, b) {
			t.Errorf("%s is not embedded byte for byte", f)
		}
	}
	impGoldenRun(t, "miotts", out)

	// What else a Hugging Face folder holds does not get in the way: a training-state
	// pickle the reader refuses is skipped with a warning (named on the command line, it is
	// an error).
	evil := impRezip(t, filepath.Join(impFixtures, "meanvc2", "vocos.pt"), func(n string, d []byte) (string, []byte) {
		if strings.HasSuffix(n, "/data.pkl") {
			return n, []byte("\x80\x02ctransformers.training_args\nTrainingArguments\n)\x81}b.")
		}
		return n, d
	})
	os.WriteFile(filepath.Join(dir, "training_args.bin"), evil, 0o644)
	_, stderr := impRun(t, "--family", "miotts", "--from", dir, "--out", out)
	if !strings.Contains(stderr, "skipping") || !strings.Contains(stderr, "transformers.training_args.TrainingArguments is not allowed") {
		t.Errorf("training_args.bin: %s", stderr)
	}
	impSameAsGolden(t, out, "miotts")
	if _, stderr, code := runCmd(t, "import", "--family", "miotts", "--from", dir, "--from", filepath.Join(dir, "training_args.bin"), "--out", out); code == 0 || !strings.Contains(stderr, "is not allowed") {
		t.Errorf("a refused file named on the command line: exit %d %s", code, stderr)
	}
}

// ---- hostile inputs ----

// impRezip copies a zip archive, letting edit change or add entries.
func impRezip(t *testing.T, src string, edit func(name string, data []byte) (string, []byte), extra ...[2]string) []byte {
	t.Helper()
	zr, err := zip.OpenReader(src)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for _, f := range zr.File {
		rc, _ := f.Open()
		data, _ := io.ReadAll(rc)
		rc.Close()
		name := f.Name
		if edit != nil {
			name, data = edit(name, data)
		}
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Store})
		w.Write(data)
	}
	for _, e := range extra {
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: e[0], Method: zip.Store})
		w.Write([]byte(e[1]))
	}
	zw.Close()
	return b.Bytes()
}

// Hostile originals fail with a clear error and write nothing: a pickle calling
// os.system, a zip entry escaping the archive, a truncated storage, a safetensors header
// claiming a terabyte.
func TestImportHostile(t *testing.T) {
	dir := impMeanVC2Originals(t, "meanvc2_120ms_40ms.safetensors")
	vocos := filepath.Join(impFixtures, "meanvc2", "vocos.pt")
	evilPickle := []byte("\x80\x02cposix\nsystem\nX\x0b\x00\x00\x00echo pwned!\x85R.")
	cases := map[string]struct {
		file string
		data []byte
		want []string
	}{
		"os.system": {"vocos.pt", impRezip(t, vocos, func(n string, d []byte) (string, []byte) {
			if strings.HasSuffix(n, "/data.pkl") {
				return n, evilPickle
			}
			return n, d
		}), []string{"global posix.system is not allowed", "vocos/data.pkl"}},
		"zip slip": {"vocos.pt", impRezip(t, vocos, nil, [2]string{"../x", "x"}), []string{`"../x"`, "refused"}},
		"truncated storage": {"vocos.pt", impRezip(t, vocos, func(n string, d []byte) (string, []byte) {
			if strings.HasSuffix(n, "/data/0") {
				return n, d[:len(d)-4]
			}
			return n, d
		}), []string{"truncated storage", "vocos/data/0"}},
		"1 TB safetensors": {"meanvc2_120ms_40ms.safetensors", func() []byte {
			h := `{"input_embed.proj.weight":{"dtype":"F32","shape":[262144,1048576],"data_offsets":[0,1099511627776]}}`
			return append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...)
		}(), []string{"past the end of the data", "input_embed.proj.weight"}},
	}
	for name, c := range cases {
		d := t.TempDir()
		for _, f := range []string{"meanvc2_120ms_40ms.safetensors", "fastu2pp_160ms.pt", "vocos.pt", "wavlm_large_finetune.pth"} {
			impCopyFile(t, filepath.Join(dir, f), filepath.Join(d, f))
		}
		os.WriteFile(filepath.Join(d, c.file), c.data, 0o644)
		out := filepath.Join(t.TempDir(), "x.gguf")
		_, stderr, code := runCmd(t, "import", "--family", "meanvc2", "--from", d, "--out", out)
		if code == 0 {
			t.Errorf("%s: imported", name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: %q does not mention %q", name, stderr, w)
			}
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: an output file was left", name)
		}
	}
}

// Bad command lines are refused with the choices.
func TestImportFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--family", "meanvc2", "--from", ".", "--out", "x", "--dtype", "q2_k"}, "use f32, f16, bf16, q8_0 or q4_k"},
		{[]string{"--family", "whisper", "--from", ".", "--out", "x"}, "unknown family"},
		{[]string{"--family", "miotts", "--from", ".", "--out", "x", "--variant", "40ms"}, "--variant is for --family meanvc2"},
		{[]string{"--family", "meanvc2", "--out", "x"}, "required"},
	} {
		_, stderr, code := runCmd(t, append([]string{"import"}, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d %s", c.args, code, stderr)
		}
	}
}

// A tensor is streamed, not loaded: copying a 64 MB tensor (kept F32, or converted to F16)
// allocates a few MB of chunks, however large the tensor.
func TestImportStreamsTensors(t *testing.T) {
	const rows, cols = 4096, 4096
	path := filepath.Join(t.TempDir(), "big.safetensors")
	func() {
		data := make([]byte, 4*rows*cols)
		for i := 0; i < len(data); i += 4 {
			binary.LittleEndian.PutUint32(data[i:], math.Float32bits(float32(i%1000)/1000))
		}
		var b bytes.Buffer
		if err := ckpt.WriteSafetensors(&b, []ckpt.STensor{{Name: "w", DType: ckpt.F32, Shape: []int{rows, cols}, Data: data}}, nil); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}()
	c, err := ckpt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, dt := range []gguf.DType{gguf.F32, gguf.F16, gguf.Q8_0} {
		table := []ggufpack.Tensor{{Name: "w", Shape: []int{rows, cols}, Type: dt}}
		w, err := ggufpack.New(io.Discard, gguf.KV{}, table, nil)
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if err := copyTensor(w, table[0], importSource{t: c.Tensors[0]}); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		// Q8_0 encodes each chunk into a fresh slice (garbage, not held): count it apart.
		limit := uint64(8 << 20)
		if dt == gguf.Q8_0 {
			limit = 4*rows*cols*34/128 + 8<<20
		}
		t.Logf("%v: %.1f MB allocated for a %d MB tensor", dt, float64(after.TotalAlloc-before.TotalAlloc)/(1<<20), 4*rows*cols>>20)
		if got := after.TotalAlloc - before.TotalAlloc; got > limit {
			t.Errorf("%v: %d MB allocated to copy a %d MB tensor", dt, got>>20, 4*rows*cols>>20)
		}
	}
}

// impWorstStages are the n golden report lines with the largest relative error.
func impWorstStages(report string, n int) string {
	type line struct {
		rel  float64
		text string
	}
	var lines []line
	for _, l := range strings.Split(report, "\n") {
		if _, after, ok := strings.Cut(l, " rel "); ok {
			var rel float64
			fmt.Sscan(strings.Fields(after)[0], &rel)
			lines = append(lines, line{rel, strings.Join(strings.Fields(l), " ")})
		}
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].rel > lines[j].rel })
	var out []string
	for _, l := range lines[:min(n, len(lines))] {
		out = append(out, l.text)
	}
	return strings.Join(out, "; ")
}
