package gguf

import (
	"fmt"
	"slices"
	"strings"
)

// MeanVC2Variants are the MeanVC2 models FamilySpec knows: the 120 ms chunk + 40 ms
// lookahead model audio.cpp publishes, and the 40 ms + 40 ms one.
var MeanVC2Variants = []string{"120ms", "40ms"}

// FamilySpec is the package spec of a file of family ("miotts", "miocodec", "meanvc2") in
// the layout audio.cpp publishes (shared/reference/audiocpp.md §2.1–2.2, §3.1, §3.8): its
// namespaces with the checkpoint files they come from, its embedded files and the
// family's catalog entry. variant picks the MeanVC2 model (MeanVC2Variants; "" is 120ms)
// and must be "" for the other families.
//
// A command that packages other files sets their Sources (SetSource) and adds files
// (Files) before writing with WritePackagedSpec, which checks the spec against what is
// written.
//
// MioTTS and MioCodec keep the source-layout form audio.cpp ships their specs in (no
// schema_version: family, sources, descriptive fields; audio.cpp leaves their options and
// capabilities to the model code). MeanVC2 has the typed catalog (schema_version 1) of
// audio.cpp's meanvc2 spec: task vc, offline and streaming, the request option seed, the
// published packages.
func FamilySpec(family, variant string) (ModelSpec, error) {
	if family != "meanvc2" && variant != "" {
		return ModelSpec{}, fmt.Errorf("gguf: family %s has no variant %q", family, variant)
	}
	switch family {
	case "miotts":
		return ModelSpec{
			Family: "miotts",
			Catalog: map[string]any{
				"display_name": "MioTTS",
				"description":  "LLM-based English and Japanese text-to-speech with zero-shot voice cloning (Aratako/MioTTS: a Qwen3 LM that writes MioCodec tokens; needs a MioCodec model).",
				"category":     "tts",
				"status":       "supported",
				"tasks":        []string{"tts", "clone"},
				"modes":        []string{"offline"},
				"languages":    []string{"en", "ja"},
				"runtime":      map[string]any{"tags": []string{"gguf"}},
			},
			// Hugging Face names at the root of the file.
			Namespaces: []SpecNamespace{{Name: "", Role: "weights", Source: "model.safetensors"}},
			Files: []SpecFile{
				{Role: "config", Name: "config.json"},
				{Role: "generation_config", Name: "generation_config.json"},
				{Role: "tokenizer_config", Name: "tokenizer_config.json"},
				{Role: "vocab", Name: "vocab.json"},
				{Role: "merges", Name: "merges.txt"},
				{Role: "tokenizer_json", Name: "tokenizer.json", Optional: true},
			},
		}, nil
	case "miocodec":
		return ModelSpec{
			Family: "miocodec",
			Catalog: map[string]any{
				"display_name": "MioCodec",
				"description":  "Neural speech codec: 44.1 kHz audio to a 25 Hz token stream and back, with speaker conditioning from a WavLM Base+ global encoder (Aratako/MioCodec-25Hz-44.1kHz-v2).",
				"category":     "audio_tools",
				"status":       "supported",
				"tasks":        []string{"vc", "s2s"},
				"modes":        []string{"offline"},
				"languages":    []string{"language_agnostic"},
				"runtime":      map[string]any{"tags": []string{"gguf"}},
			},
			Namespaces: []SpecNamespace{
				{Name: "weights", Source: "model.safetensors"},
				{Name: "wavlm_weights", Source: "wavlm-base-plus-mlx/weights.safetensors"},
			},
			Files: []SpecFile{{Role: "config", Name: "config.yaml"}},
		}, nil
	case "meanvc2":
		return meanVC2Spec(variant)
	}
	return ModelSpec{}, fmt.Errorf("gguf: no package spec for family %q (miotts, miocodec, meanvc2)", family)
}

func meanVC2Spec(variant string) (ModelSpec, error) {
	if variant == "" {
		variant = "120ms"
	}
	if !slices.Contains(MeanVC2Variants, variant) {
		return ModelSpec{}, fmt.Errorf("gguf: meanvc2 variant %q: use 120ms or 40ms", variant)
	}
	// The ASR encoder and the DiT are per variant (HF ASLP-lab/MeanVC2); the vocoder and
	// the speaker model (WavLM-Large and the ECAPA-TDNN head, both in the UniSpeech SV
	// fine-tune) are shared.
	asr, dit := "fastu2pp_160ms.pt", "meanvc2_120ms_40ms.safetensors"
	if variant == "40ms" {
		asr, dit = "fastu2pp_80ms.pt", "meanvc2_40ms_40ms.safetensors"
	}
	model := "meanvc2_" + variant + "_40ms"
	catalog := map[string]any{
		"display_name": "MeanVC2",
		"description": "Lightweight streaming zero-shot voice conversion (MeanVC 2), the " + strings.TrimSuffix(variant, "ms") +
			" ms chunk + 40 ms lookahead model: Fast-U2++ content encoder, WavLM-Large + ECAPA-TDNN speaker encoder, mean-flow DiT, Vocos.",
		"category":     "voice_conversion",
		"status":       "experimental",
		"tasks":        []string{"vc"},
		"modes":        []string{"offline", "streaming"},
		"languages":    []string{"language_agnostic"},
		"capabilities": map[string]any{"vc": []string{"speaker_reference"}},
		"runtime":      map[string]any{"tags": []string{"gguf"}},
		"options": map[string]any{
			"request": []any{map[string]any{
				"name": "seed", "type": "int", "required": false, "min": 0, "default": 42,
				"description": "Random seed of the flow-matching noise; default 42.",
			}},
			"session": []any{},
			"load":    []any{},
		},
		"package_defaults": map[string]any{"download": map[string]any{
			"kind": "huggingface_snapshot", "repo": "audio-cpp/audio.cpp-gguf", "revision": "main", "gated": false,
		}},
		"packages":     []any{},
		"dependencies": []any{},
		"ui":           map[string]any{"tags": []string{"VC", "GGUF"}, "docs": []string{"docs/models/meanvc2.md", "docs/audio_tools.md"}},
	}
	if variant == "120ms" {
		// The packages audio.cpp publishes (only this variant has any).
		pkg := func(id, precision, file, name string, def bool) map[string]any {
			p := map[string]any{
				"id": id, "display_name": name, "format": "gguf", "precision": precision,
				"target_directory": "MeanVC2-GGUF", "files": []string{"MeanVC2-GGUF/" + file}, "strip_prefix": "MeanVC2-GGUF",
			}
			if def {
				p["default"] = true
			}
			return p
		}
		catalog["packages"] = []any{
			pkg(model+"_f32", "f32", "meanvc2-120ms-40ms-fp32.gguf", "MeanVC2 120ms/40ms F32 GGUF", true),
			pkg(model+"_q4_k", "q4_k", "meanvc2-120ms-40ms-q4_k.gguf", "MeanVC2 120ms/40ms Q4_K GGUF", false),
		}
		catalog["ui"].(map[string]any)["recommended_package"] = model + "_f32"
	}
	return ModelSpec{
		Family:        "meanvc2",
		SchemaVersion: 1,
		Catalog:       catalog,
		Namespaces: []SpecNamespace{
			{Name: "vc", Source: dit},
			{Name: "vocos", Source: "vocos.pt"},
			{Name: "asr", Source: asr},
			{Name: "speaker_wavlm", Source: "wavlm_large_finetune.pth"},
			{Name: "speaker_ecapa", Source: "wavlm_large_finetune.pth"},
		},
		// voxpipe's loaders read the model's constants from it (audio.cpp has them in code).
		Files: []SpecFile{{Role: "config", Name: "config.json"}},
	}, nil
}
