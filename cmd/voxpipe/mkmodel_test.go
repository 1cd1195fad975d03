package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// Every model mkmodel lays out, at every size, embeds a complete package spec that agrees
// with its tensor table and embedded files: checked on the layout, without drawing the
// (for the real sizes, gigabytes of) weights.
func TestMkmodelSpecAllLayouts(t *testing.T) {
	cases := []struct {
		family string
		o      mkOptions
	}{
		{"miotts", mkOptions{dims: "tiny"}},
		{"miotts", mkOptions{dims: "real", size: "0.6b"}},
		{"miotts", mkOptions{dims: "real", size: "1.7b"}},
		{"miocodec", mkOptions{dims: "real"}},
		{"meanvc2", mkOptions{dims: "tiny", variant: "120ms"}},
		{"meanvc2", mkOptions{dims: "tiny", variant: "40ms"}},
		{"meanvc2", mkOptions{dims: "real", variant: "120ms"}},
		{"meanvc2", mkOptions{dims: "real", variant: "40ms"}},
	}
	for _, c := range cases {
		c.o.dtype, c.o.seed = gguf.F32, 1
		tag := c.family + " " + c.o.dims + " " + c.o.size + c.o.variant
		m, err := mkFamilies[c.family](c.o)
		if err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		if err := m.check(); err != nil {
			t.Errorf("%s: %v", tag, err)
			continue
		}
		if m.spec.Family != c.family || len(m.table) == 0 {
			t.Errorf("%s: spec family %q, %d tensors", tag, m.spec.Family, len(m.table))
		}
		var ns []string
		for _, n := range m.spec.Namespaces {
			ns = append(ns, n.Name)
			if n.Source == "" {
				t.Errorf("%s: namespace %q without a source file", tag, n.Name)
			}
		}
		want := map[string][]string{"miotts": {""}, "miocodec": {"weights", "wavlm_weights"},
			"meanvc2": {"vc", "vocos", "asr", "speaker_wavlm", "speaker_ecapa"}}[c.family]
		if !slices.Equal(ns, want) {
			t.Errorf("%s: namespaces %q, want %q", tag, ns, want)
		}
	}
}

// The files mkmodel writes pass gguf.ValidateModelSpec as written, and inspect shows the
// spec: family, version, namespaces with their sources, files.
func TestMkmodelWritesAValidSpec(t *testing.T) {
	type want struct {
		schema  int
		sources []string
		files   []string
	}
	runs := []struct {
		args []string
		want want
	}{
		{[]string{"--family", "miotts", "--dims", "tiny"}, want{0, []string{"model.safetensors"},
			[]string{"config.json", "generation_config.json", "merges.txt", "tokenizer_config.json", "vocab.json", "tokenizer.json"}}},
		{[]string{"--family", "meanvc2", "--dims", "tiny"}, want{1, []string{"meanvc2_120ms_40ms.safetensors", "vocos.pt",
			"fastu2pp_160ms.pt", "wavlm_large_finetune.pth", "wavlm_large_finetune.pth"}, []string{"config.json"}}},
		{[]string{"--family", "meanvc2", "--dims", "tiny", "--variant", "40ms", "--dtype", "q8_0"}, want{1, []string{"meanvc2_40ms_40ms.safetensors", "vocos.pt",
			"fastu2pp_80ms.pt", "wavlm_large_finetune.pth", "wavlm_large_finetune.pth"}, []string{"config.json"}}},
	}
	for _, r := range runs {
		tag := strings.Join(r.args, " ")
		out := filepath.Join(t.TempDir(), "m.gguf")
		if _, stderr, code := runCmd(t, append([]string{"mkmodel", "--out", out}, r.args...)...); code != 0 {
			t.Fatalf("%s: mkmodel: %s", tag, stderr)
		}
		m, err := gguf.OpenModel(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.ValidateModelSpec(); err != nil {
			t.Errorf("%s: %v", tag, err)
		}
		raw, _ := m.File.KV.String(gguf.KeySpecJSON)
		if err := gguf.ValidateSpecJSON([]byte(raw)); err != nil {
			t.Errorf("%s: %v", tag, err)
		}
		m.Close()

		stdout, stderr, code := inspectCmd(t, "--json", "--tensors=false", out)
		if code != 0 {
			t.Fatalf("%s: inspect: %s", tag, stderr)
		}
		var rep inspectReport
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatal(err)
		}
		sp := rep.ModelSpec
		if sp == nil || !sp.Valid || sp.Problem != "" || sp.Version != 1 || sp.SchemaVersion != r.want.schema || sp.Family != r.args[1] {
			t.Fatalf("%s: inspect model_spec %+v", tag, sp)
		}
		var sources, files []string
		for _, n := range sp.Namespaces {
			sources = append(sources, n.Source)
		}
		for _, f := range sp.Files {
			files = append(files, f.Name)
		}
		if !slices.Equal(sources, r.want.sources) || !slices.Equal(files, r.want.files) {
			t.Errorf("%s: sources %q, files %q", tag, sources, files)
		}
		text, _, _ := inspectCmd(t, "--tensors=false", out)
		norm := strings.Join(strings.Fields(text), " ")
		if !strings.Contains(norm, "model spec: family "+r.args[1]+", version 1") || !strings.Contains(norm, "; valid") ||
			!strings.Contains(norm, "from "+r.want.sources[0]) {
			t.Errorf("%s: inspect text lacks the spec:\n%s", tag, text)
		}
	}
}
