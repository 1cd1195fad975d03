package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/models/miotts"
)

func inspectCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"inspect"}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

// inspectGoldenDir is the golden folder (see internal/golden).
func inspectGoldenDir(*testing.T) string { return golden.Root() }

func goldenModelPath(t *testing.T, family string) string {
	t.Helper()
	p := filepath.Join(inspectGoldenDir(t), family, "model.gguf")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("golden data not available (%v); set VOXPIPE_GOLDEN_DIR to the golden folder", err)
	}
	return p
}

func TestInspectGoldenModels(t *testing.T) {
	cases := []struct {
		family     string
		tensors    int
		namespaces []string
		embedded   []string
		text       []string // lines the text output must contain
	}{
		{"meanvc2", 494, []string{"asr", "speaker_ecapa", "speaker_wavlm", "vc", "vocos"}, []string{"config.json"},
			[]string{"GGUF v3", "tensors: 494", "F32: 494 tensors", "general.name", `"meanvc2-tiny-golden"`,
				"audiocpp.tensor_names string[494]", "config.json 4257 bytes", "vc/ 103 tensors",
				"input_embed.proj.weight F32 [64, 144] 36864", "encoder.layers.0.self_attn.relative_attention_bias.weight F32 [320, 2] 2560 stored as _audiocpp.240"}},
		{"miocodec", 236, []string{"wavlm_weights", "weights"}, []string{"config.yaml", "wavlm-base-plus-mlx/config.json"},
			[]string{"weights/ ", "conv_downsample.weight F32 [64, 64, 2] 32768", `["weights", "wavlm_weights"]`}},
		{"miotts", 24, []string{""}, []string{"config.json", "generation_config.json", "tokenizer_config.json", "vocab.json", "merges.txt"},
			[]string{"(no namespace) 24 tensors", "model.embed_tokens.weight F32 [13568, 64] 3473408", "tokenizer_config.json 2258991 bytes",
				"audiocpp.embedded_files.data uint8[2274926]"}},
	}
	for _, c := range cases {
		t.Run(c.family, func(t *testing.T) {
			path := goldenModelPath(t, c.family)
			stdout, stderr, code := inspectCmd(t, path)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			norm := strings.Join(strings.Fields(stdout), " ") // columns are padded by a tabwriter
			for _, s := range c.text {
				if !strings.Contains(norm, s) {
					t.Errorf("text output lacks %q", s)
				}
			}
			if testing.Verbose() && c.family == "meanvc2" {
				lines := strings.SplitN(stdout, "\n", 40)
				t.Logf("first lines:\n%s", strings.Join(lines[:len(lines)-1], "\n"))
			}

			// JSON: flags after the file work too.
			stdout, stderr, code = inspectCmd(t, path, "--json")
			if code != 0 {
				t.Fatalf("--json exit %d: %s", code, stderr)
			}
			var rep inspectReport
			dec := json.NewDecoder(strings.NewReader(stdout))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&rep); err != nil {
				t.Fatalf("--json output: %v", err)
			}
			if dec.More() {
				t.Error("more than one JSON value")
			}
			if rep.Version != 3 || rep.TensorCount != c.tensors || rep.Alignment != 32 {
				t.Errorf("version %d, %d tensors, alignment %d", rep.Version, rep.TensorCount, rep.Alignment)
			}
			var ns []string
			total, listed := 0, 0
			var bytesSum uint64
			for _, g := range rep.Namespaces {
				ns = append(ns, g.Name)
				total += g.TensorCount
				listed += len(g.Tensors)
				bytesSum += g.Bytes
				for _, tt := range g.Tensors {
					if g.Name != "" && !strings.HasPrefix(tt.Name, g.Name+"/") {
						t.Errorf("tensor %q in namespace %q", tt.Name, g.Name)
					}
				}
			}
			if strings.Join(ns, ",") != strings.Join(c.namespaces, ",") || total != c.tensors || listed != c.tensors {
				t.Errorf("namespaces %q, %d tensors, %d listed", ns, total, listed)
			}
			if bytesSum != rep.TensorBytes || len(rep.DTypes) != 1 || rep.DTypes[0].Bytes != rep.TensorBytes || rep.DTypes[0].DType != "F32" {
				t.Errorf("bytes: namespaces %d, total %d, dtypes %+v", bytesSum, rep.TensorBytes, rep.DTypes)
			}
			var emb []string
			for _, e := range rep.EmbeddedFiles {
				emb = append(emb, e.Name)
				if e.Bytes <= 0 {
					t.Errorf("embedded %s: %d bytes", e.Name, e.Bytes)
				}
			}
			if strings.Join(emb, ",") != strings.Join(c.embedded, ",") {
				t.Errorf("embedded files %q, want %q", emb, c.embedded)
			}
			// The golden specs lack "sources": shown, and reported as audio.cpp would refuse them.
			if sp := rep.ModelSpec; sp == nil || sp.Family != strings.TrimSuffix(c.family, "_40ms") || sp.Version != 1 || sp.Valid ||
				!strings.Contains(sp.Problem, "missing required field 'sources'") {
				t.Errorf("model_spec %+v", sp)
			}
			// Long arrays are summarised, short values given.
			for _, kv := range rep.Metadata {
				switch kv.Key {
				case "audiocpp.embedded_files.data", "audiocpp.tensor_shapes":
					if kv.Value != nil || kv.Len == nil || *kv.Len == 0 || !strings.HasPrefix(kv.Type, "array[") {
						t.Errorf("%s: %+v", kv.Key, kv)
					}
				case "general.alignment":
					if kv.Value != float64(32) || kv.Type != "uint32" {
						t.Errorf("%s: %+v", kv.Key, kv)
					}
				case "general.architecture":
					if kv.Value != "audiocpp" {
						t.Errorf("%s: %+v", kv.Key, kv)
					}
				}
			}

			// --tensors=false keeps the totals, drops the list.
			stdout, _, code = inspectCmd(t, "--json", "--tensors=false", path)
			if code != 0 {
				t.Fatal("--tensors=false failed")
			}
			rep = inspectReport{}
			if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
				t.Fatal(err)
			}
			for _, g := range rep.Namespaces {
				if len(g.Tensors) != 0 || g.TensorCount == 0 {
					t.Errorf("--tensors=false: namespace %q lists %d of %d", g.Name, len(g.Tensors), g.TensorCount)
				}
			}
			stdout, _, _ = inspectCmd(t, "--tensors=false", path)
			if strings.Contains(stdout, "model.embed_tokens.weight") || strings.Contains(stdout, "input_embed.proj.weight") {
				t.Error("--tensors=false text still lists tensors")
			}
		})
	}
}

func TestInspectPlainAndQuantised(t *testing.T) {
	// A plain GGUF (no audio.cpp keys) with a quantised tensor and assorted metadata.
	kv := gguf.KV{}
	for k, v := range map[string]any{
		"general.name": "tiny", "f": float32(1.5), "nan": float32(math.NaN()), "long": strings.Repeat("é", 100),
		"ints": []int32{1, 2, 3}, "many": make([]uint16, 100), "strs": []string{"a", "b"}, "flag": true,
	} {
		if err := kv.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "plain.gguf")
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kv, []gguf.WriteTensor{
		{Name: "w", Shape: []int{2, 32}, Type: gguf.Q8_0, Raw: make([]byte, 68)},
		{Name: "b", Shape: []int{2}, Data: []float32{1, 2}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := inspectCmd(t, path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	norm := strings.Join(strings.Fields(stdout), " ") // columns are padded by a tabwriter
	for _, s := range []string{"Q8_0: 1 tensors, 68 B", "F32: 1 tensors", "(no namespace) 2 tensors", "w Q8_0 [2, 32] 68",
		"b F32 [2] 8", "ints int32[3] [1, 2, 3]", "many uint16[100] nan", `strs string[2] ["a", "b"]`, "… (200 bytes)",
		"flag bool true", "nan float32 NaN", "embedded files (0)"} {
		if !strings.Contains(norm, s) {
			t.Errorf("output lacks %q:\n%s", s, stdout)
		}
	}
	stdout, _, code = inspectCmd(t, "--json", path)
	var rep inspectReport
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil {
		t.Fatalf("--json: %d %s", code, stdout)
	}
	for _, kv := range rep.Metadata {
		if kv.Key == "long" && (!kv.Truncated || *kv.Len != 200 || !strings.HasPrefix(kv.Value.(string), "éé")) {
			t.Errorf("long string: %+v", kv)
		}
	}
}

func TestInspectErrors(t *testing.T) {
	dir := t.TempDir()
	notGGUF := filepath.Join(dir, "x.wav")
	if err := os.WriteFile(notGGUF, []byte("RIFF\x00\x00\x00\x00WAVEfmt "), 0o644); err != nil {
		t.Fatal(err)
	}
	// A valid file cut in the middle of its tensor table.
	var buf bytes.Buffer
	if err := gguf.Write(&buf, gguf.KV{}, []gguf.WriteTensor{{Name: "a", Shape: []int{4}, Data: make([]float32, 4)}}); err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(dir, "cut.gguf")
	if err := os.WriteFile(truncated, buf.Bytes()[:30], 0o644); err != nil {
		t.Fatal(err)
	}
	// A file whose audio.cpp metadata does not fit its tensors.
	kv := gguf.KV{}
	_ = kv.Set(gguf.KeyTensorNames, []string{"a", "b"})
	buf.Reset()
	if err := gguf.Write(&buf, kv, []gguf.WriteTensor{{Name: "a", Shape: []int{4}, Data: make([]float32, 4)}}); err != nil {
		t.Fatal(err)
	}
	hostile := filepath.Join(dir, "hostile.gguf")
	if err := os.WriteFile(hostile, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.gguf")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{filepath.Join(dir, "missing.gguf")}, "no such file or directory"},
		{[]string{notGGUF}, `not a GGUF file: bad magic "RIFF"`},
		{[]string{truncated}, "tensor count 1 cannot fit"},
		{[]string{hostile}, "2 names for 1 tensors"},
		{[]string{empty}, "empty"},
		{[]string{dir}, "is a directory"},
		{nil, "need exactly one FILE.gguf"},
		{[]string{"a.gguf", "b.gguf"}, "need exactly one FILE.gguf"},
		{[]string{"--bogus", "a.gguf"}, "flag provided but not defined"},
	}
	for _, c := range cases {
		stdout, stderr, code := inspectCmd(t, c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stderr %q, want it to mention %q", c.args, code, stderr, c.want)
		}
		if stdout != "" {
			t.Errorf("%q: wrote to stdout: %q", c.args, stdout)
		}
	}
	if _, stderr, code := inspectCmd(t, truncated); !strings.HasPrefix(stderr, "voxpipe inspect: gguf: ") || code != 1 {
		t.Errorf("truncated: %q exit %d", stderr, code)
	}
}

func TestMkmodelTinyMatchesTheGoldenLayout(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "miotts", "--dims", "tiny", "--seed", "3", "--out", out); code != 0 {
		t.Fatalf("mkmodel: %s", stderr)
	}
	made, err := gguf.OpenModel(out)
	if err != nil {
		t.Fatal(err)
	}
	defer made.Close()
	golden := filepath.Join(inspectGoldenDir(t), "miotts", "model.gguf")
	ref, err := gguf.OpenModel(golden)
	if err != nil {
		t.Skipf("golden model not available: %v", err)
	}
	defer ref.Close()
	if !slices.Equal(made.Names(), ref.Names()) {
		t.Fatalf("tensor names differ from the golden model:\n%v\n%v", made.Names(), ref.Names())
	}
	for _, n := range ref.Names() {
		_, a, _ := made.Get(n)
		_, b, _ := ref.Get(n)
		if !slices.Equal(a, b) {
			t.Errorf("%s: shape %v, golden %v", n, a, b)
		}
	}
	if _, ok := made.EmbeddedFile("config.json"); !ok {
		t.Error("no embedded config.json")
	}
	// The model loads as a MioTTS LM (tokenizer included) and generates speech tokens.
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	lm, err := miotts.LoadLM(out, be)
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	n := 0
	if _, err := lm.Generate(context.Background(), "Hello", miotts.GenOptions{MaxNew: 5}, func(int32) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("no speech token generated")
	}
	if _, stderr, code := runCmd(t, "mkmodel", "--family", "meanvc2", "--dims", "tiny", "--out", out); code != 0 {
		t.Errorf("meanvc2 tiny: exit %d, %q", code, stderr)
	}
}
