package gguf

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// specCase is one family's spec with tensor names and embedded files that match it.
type specCase struct {
	name    string
	spec    ModelSpec
	tensors []string
	files   []string
}

func familySpecCases(t *testing.T) []specCase {
	t.Helper()
	get := func(family, variant string) ModelSpec {
		s, err := FamilySpec(family, variant)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	mvc := []string{"vc/proj_out.weight", "vocos/head.out.bias", "asr/encoder.after_norm.weight",
		"speaker_wavlm/mask_emb", "speaker_ecapa/feature_weight"}
	return []specCase{
		{"miotts", get("miotts", ""), []string{"model.embed_tokens.weight", "model.norm.weight"},
			[]string{"config.json", "generation_config.json", "tokenizer_config.json", "vocab.json", "merges.txt"}},
		{"miocodec", get("miocodec", ""), []string{"weights/conv_downsample.weight", "wavlm_weights/mask_emb"},
			[]string{"config.yaml", "wavlm-base-plus-mlx/config.json"}},
		{"meanvc2", get("meanvc2", ""), mvc, []string{"config.json"}},
		{"meanvc2 40ms", get("meanvc2", "40ms"), mvc, []string{"config.json"}},
	}
}

func specKV(t *testing.T, s ModelSpec) KV {
	t.Helper()
	kv := KV{}
	if err := s.SetKV(kv); err != nil {
		t.Fatal(err)
	}
	return kv
}

// Every family's spec passes the schema and the file checks, and reads back as written.
func TestFamilySpecs(t *testing.T) {
	for _, c := range familySpecCases(t) {
		t.Run(c.name, func(t *testing.T) {
			raw, err := c.spec.JSON()
			if err != nil {
				t.Fatal(err)
			}
			if err := ValidateSpecJSON(raw); err != nil {
				t.Fatal(err)
			}
			kv := specKV(t, c.spec)
			if err := ValidateModelSpec(kv, c.tensors, c.files); err != nil {
				t.Fatal(err)
			}
			if v, _ := kv.Uint(KeySpecVersion); v != 1 || kv[KeySpecVersion].Type() != TypeUint32 {
				t.Errorf("version %v", kv[KeySpecVersion])
			}
			back, err := ReadModelSpec(kv)
			if err != nil {
				t.Fatal(err)
			}
			if back.Family != c.spec.Family || back.SchemaVersion != c.spec.SchemaVersion {
				t.Errorf("read back %s v%d", back.Family, back.SchemaVersion)
			}
			var want []SpecNamespace
			for _, n := range c.spec.Namespaces {
				n.Role = n.role()
				want = append(want, n)
			}
			if !reflect.DeepEqual(back.Namespaces, want) {
				t.Errorf("namespaces %+v, want %+v", back.Namespaces, want)
			}
			if len(back.Files) != len(c.spec.Files) {
				t.Errorf("files %+v, want %+v", back.Files, c.spec.Files)
			}
			for _, f := range c.spec.Files {
				found := false
				for _, g := range back.Files {
					found = found || g == f
				}
				if !found {
					t.Errorf("file %+v not read back (%+v)", f, back.Files)
				}
			}
			// The safetensors layout only where every namespace comes from safetensors.
			var doc struct {
				Sources []struct {
					Format string `json:"format"`
				} `json:"sources"`
			}
			if err := json.Unmarshal(raw, &doc); err != nil {
				t.Fatal(err)
			}
			wantSources := 2
			if c.spec.Family == "meanvc2" {
				wantSources = 1
			}
			if len(doc.Sources) != wantSources || doc.Sources[0].Format != "gguf" {
				t.Errorf("sources %+v", doc.Sources)
			}
			if testing.Verbose() {
				t.Logf("%s", raw)
			}
		})
	}
	if _, err := FamilySpec("meanvc2", "80ms"); err == nil {
		t.Error("meanvc2 80ms accepted")
	}
	if _, err := FamilySpec("miotts", "40ms"); err == nil {
		t.Error("miotts 40ms accepted")
	}
	if _, err := FamilySpec("kokoro", ""); err == nil {
		t.Error("unknown family accepted")
	}
}

// edit returns kv with the spec JSON changed by f.
func editSpec(t *testing.T, kv KV, f func(doc map[string]any)) KV {
	t.Helper()
	raw, _ := kv.String(KeySpecJSON)
	var doc map[string]any
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatal(err)
	}
	f(doc)
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	out := KV{}
	for k, v := range kv {
		out[k] = v
	}
	_ = out.Set(KeySpecJSON, string(b))
	return out
}

func TestValidateModelSpecRejects(t *testing.T) {
	cases := familySpecCases(t)
	mio, mvc := cases[0], cases[2]
	mioKV, mvcKV := specKV(t, mio.spec), specKV(t, mvc.spec)
	without := func(kv KV, keys ...string) KV {
		out := KV{}
		for k, v := range kv {
			out[k] = v
		}
		for _, k := range keys {
			delete(out, k)
		}
		return out
	}
	with := func(kv KV, key string, v any) KV {
		out := without(kv)
		if err := out.Set(key, v); err != nil {
			t.Fatal(err)
		}
		return out
	}
	source0 := func(doc map[string]any) map[string]any {
		return doc["sources"].([]any)[0].(map[string]any)
	}
	type check struct {
		name    string
		kv      KV
		tensors []string
		files   []string
		want    string
	}
	checks := []check{
		{"no spec", KV{}, mio.tensors, mio.files, "no embedded model spec"},
		{"family alone", without(mioKV, KeySpecVersion, KeySpecJSON), mio.tensors, mio.files, "audiocpp.model_spec.version and audiocpp.model_spec.json missing"},
		{"version 2", with(mioKV, KeySpecVersion, uint32(2)), mio.tensors, mio.files, "reads only 1"},
		{"version int32", with(mioKV, KeySpecVersion, int32(1)), mio.tensors, mio.files, "want uint32"},
		{"empty family", with(mioKV, KeySpecFamily, ""), mio.tensors, mio.files, "is empty"},
		{"family differs", with(mioKV, KeySpecFamily, "miocodec"), mio.tensors, mio.files, "differs"},
		{"bad json", with(mioKV, KeySpecJSON, "{"), mio.tensors, mio.files, "does not parse"},
		{"not an object", with(mioKV, KeySpecJSON, `["miotts"]`), mio.tensors, mio.files, "not a JSON object"},
		{"golden-style", with(mioKV, KeySpecJSON, `{"family": "miotts", "description": "tiny"}`), mio.tensors, mio.files, "missing required field 'sources'"},
		{"extra namespace", mioKV, append([]string{"extra/x"}, mio.tensors...), mio.files, "namespace extra/ is not declared"},
		{"empty namespace", mvcKV, mvc.tensors[1:], mvc.files, "namespace vc/ is declared but the file has no tensor"},
		{"file not embedded", mioKV, mio.tensors, mio.files[1:], "required file config.json is not embedded"},
		{"unknown root", editSpec(t, mioKV, func(d map[string]any) { source0(d)["tensors"] = map[string]any{"weights": "nope:"} }),
			mio.tensors, mio.files, "unknown root 'nope'"},
		{"tensors not in the file", editSpec(t, mioKV, func(d map[string]any) { source0(d)["tensors"] = map[string]any{"weights": "model:model.safetensors"} }),
			mio.tensors, mio.files, "is not the GGUF file itself"},
		{"no gguf source", editSpec(t, mioKV, func(d map[string]any) { d["sources"] = d["sources"].([]any)[1:] }),
			mio.tensors, mio.files, `no "gguf" source`},
		{"bad format", editSpec(t, mioKV, func(d map[string]any) { source0(d)["format"] = "pt" }), mio.tensors, mio.files, "unknown format 'pt'"},
		{"schema 2", editSpec(t, mvcKV, func(d map[string]any) { d["schema_version"] = 2 }), mvc.tensors, mvc.files, "schema_version: 2, want 1"},
		{"v1 without ui", editSpec(t, mvcKV, func(d map[string]any) { delete(d, "ui") }), mvc.tensors, mvc.files, "missing required field 'ui'"},
		{"v1 unknown task", editSpec(t, mvcKV, func(d map[string]any) { d["tasks"] = []any{"vc", "karaoke"} }), mvc.tensors, mvc.files, "unknown value 'karaoke'"},
		{"v1 capability of another task", editSpec(t, mvcKV, func(d map[string]any) { d["capabilities"] = map[string]any{"tts": []any{"speaker_reference"}} }),
			mvc.tensors, mvc.files, "capability key must be one of this model's tasks"},
		{"v1 dotted session option", editSpec(t, mvcKV, func(d map[string]any) {
			d["options"].(map[string]any)["session"] = []any{map[string]any{"name": "meanvc2.x", "type": "int", "required": false, "description": "x"}}
		}), mvc.tensors, mvc.files, "session option must be local"},
		{"v1 default below min", editSpec(t, mvcKV, func(d map[string]any) {
			d["options"].(map[string]any)["request"].([]any)[0].(map[string]any)["default"] = -1
		}), mvc.tensors, mvc.files, "default is below min"},
		{"v1 two defaults", editSpec(t, mvcKV, func(d map[string]any) {
			d["packages"].([]any)[1].(map[string]any)["default"] = true
		}), mvc.tensors, mvc.files, "2 packages marked default"},
		{"v1 recommended unknown", editSpec(t, mvcKV, func(d map[string]any) { d["ui"].(map[string]any)["recommended_package"] = "x" }),
			mvc.tensors, mvc.files, "unknown package 'x'"},
		{"v1 no packages when supported", editSpec(t, mvcKV, func(d map[string]any) {
			d["status"], d["packages"] = "supported", []any{}
			delete(d["ui"].(map[string]any), "recommended_package")
		}), mvc.tensors, mvc.files, "packages must not be empty unless status is experimental"},
		{"source names differ", with(mvcKV, KeySourceNames, []string{"vc", "vocos", "asr", "speaker_wavlm"}), mvc.tensors, mvc.files, "speaker_ecapa/ has no entry"},
		{"source paths short", with(mvcKV, KeySourcePaths, []string{"a"}), mvc.tensors, mvc.files, "1 paths for 5 names"},
	}
	for _, c := range checks {
		err := ValidateModelSpec(c.kv, c.tensors, c.files)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// WritePackagedSpec writes a file whose spec validates, and refuses one whose spec does
// not match the tensors or files.
func TestWritePackagedSpec(t *testing.T) {
	spec, err := FamilySpec("miocodec", "")
	if err != nil {
		t.Fatal(err)
	}
	long := "weights/" + strings.Repeat("x", 70) + ".weight"
	ts := []WriteTensor{
		{Name: "weights/a.weight", Shape: []int{2, 3}, Data: make([]float32, 6)},
		{Name: long, Shape: []int{4}, Data: make([]float32, 4)},
		{Name: "wavlm_weights/mask_emb", Shape: []int{4}, Data: make([]float32, 4)},
	}
	files := []EmbeddedFile{{Name: "config.yaml", Data: []byte("a: 1\n")}}
	var buf bytes.Buffer
	if err := WritePackagedSpec(&buf, KV{}, spec, ts, files); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewModel(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ValidateModelSpec(); err != nil {
		t.Fatal(err)
	}
	if paths, _ := f.KV.Strings(KeySourcePaths); !reflect.DeepEqual(paths, []string{"model.safetensors", "wavlm-base-plus-mlx/weights.safetensors"}) {
		t.Errorf("tensor_sources.paths %q", paths)
	}
	// The importer's own sources.
	if err := spec.SetSource("weights", "ckpt/model.safetensors"); err != nil {
		t.Fatal(err)
	}
	if err := spec.SetSource("nope", "x"); err == nil {
		t.Error("SetSource of an unknown namespace accepted")
	}
	buf.Reset()
	if err := WritePackagedSpec(&buf, KV{}, spec, ts, nil); err == nil || !strings.Contains(err.Error(), "config.yaml is not embedded") || buf.Len() != 0 {
		t.Errorf("without config.yaml: %v (%d bytes written)", err, buf.Len())
	}
	if err := WritePackagedSpec(&buf, KV{}, spec, ts[:2], files); err == nil || !strings.Contains(err.Error(), "wavlm_weights/ is declared") {
		t.Errorf("without wavlm_weights: %v", err)
	}
	bad := spec
	bad.Namespaces = append([]SpecNamespace{}, spec.Namespaces...)
	bad.Namespaces[1].Source = "../up.safetensors"
	if err := WritePackagedSpec(&buf, KV{}, bad, ts, files); err == nil || !strings.Contains(err.Error(), "inside the model folder") {
		t.Errorf("source outside the folder: %v", err)
	}
}

// The golden models carry the three keys, but a spec without sources: audio.cpp refuses
// them ("missing required field 'sources'"). Kept as a record of that, not a goal.
func TestGoldenModelSpecs(t *testing.T) {
	for _, family := range []string{"meanvc2", "meanvc2_40ms", "miocodec", "miotts"} {
		f, err := Open(goldenFile(t, family, "model.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewModel(f)
		if err != nil {
			f.Close()
			t.Fatal(err)
		}
		spec, err := ReadModelSpec(f.KV)
		if err != nil || spec == nil {
			t.Errorf("%s: spec %v, %v", family, spec, err)
		}
		err = m.ValidateModelSpec()
		if err == nil || !strings.Contains(err.Error(), "missing required field 'sources'") {
			t.Errorf("%s: %v; the golden specs were expected to lack sources", family, err)
		}
		t.Logf("%s: %v", filepath.Join(family, "model.gguf"), err)
		f.Close()
	}
}
