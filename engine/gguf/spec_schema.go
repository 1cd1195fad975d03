package gguf

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// The schema audio.cpp checks a package spec against when it loads it (its model_spec
// validator; the values below are the sets it accepts). A spec without "schema_version"
// is in the source-layout form: only "family" and "sources" are checked. With
// "schema_version" 1 the typed catalog is checked too, as the audio.cpp that ships
// MeanVC2 does (the typed schema changed before that; the source-layout checks did not).

var (
	specTasks = []string{"vad", "asr", "diar", "sep", "music", "sfx", "edit", "tts", "clone", "vc",
		"s2s", "align", "design", "speaker", "svc", "codec", "midi"}
	specModes      = []string{"offline", "streaming"}
	specCategories = []string{"asr", "tts", "voice_conversion", "audio_generation", "audio_tools",
		"speech_analysis", "community"}
	specStatuses      = []string{"supported", "community", "experimental", "wip", "unsupported"}
	specFormats       = []string{"safetensors", "gguf", "onnx", "ggml", "pytorch"}
	specPrecisions    = []string{"native", "orig", "f32", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q5_k_s", "q4_k_m", "q4_k_s", "q4_k", "q4_0", "q3_k_m", "q3_k_s", "q2_k"}
	specDownloadKinds = []string{"huggingface_snapshot", "local_snapshot", "converter", "unsupported"}
	specDepKinds      = []string{"model", "bundled_model"}
	specScopes        = []string{"request", "session", "load"}
	specOptionTypes   = []string{"bool", "int", "float", "string", "enum", "path", "audio_path",
		"string_list", "float_list", "path_list", "audio_path_list"}
	specRuntimeTags = []string{"gguf", "stream", "server", "cuda", "vulkan", "metal", "cpu"}
	specUITags      = []string{"ASR", "TTS", "Clone", "VC", "Align", "VAD", "Diar", "Codec", "Sep", "Music", "SFX",
		"Edit", "Design", "MIDI", "GGUF", "Stream"}
	// specCapabilities are the capabilities each task may list under "capabilities".
	specCapabilities = map[string][]string{
		"asr":    {"word_timestamps", "segments", "speaker_turns", "vad_chunking", "partial_results"},
		"tts":    {"speaker_reference", "voice_design", "emotion_control", "style_control", "multi_speaker", "long_form", "built_in_voices"},
		"clone":  {"speaker_reference", "emotion_control", "style_control", "multi_speaker", "long_form"},
		"vc":     {"speaker_reference", "singing"},
		"s2s":    {"speaker_reference", "audio_enhancement"},
		"svc":    {"speaker_reference", "singing"},
		"align":  {"word_timestamps"},
		"vad":    {"speech_segments", "chunk_planning"},
		"diar":   {"speaker_turns"},
		"sep":    {"stems"},
		"midi":   {"note_events", "midi_artifact"},
		"music":  {"lyrics", "instrumental", "continuation", "style_control"},
		"sfx":    {"prompt_generation"},
		"edit":   {"prompt_editing", "inpaint"},
		"design": {"voice_design"},
		"codec":  {"encode_decode"},
	}
)

// specProblems collects what is wrong with a spec, each with its JSON path.
type specProblems []string

func (p *specProblems) add(at, msg string) { *p = append(*p, at+": "+msg) }

func (p specProblems) err(prefix string) error {
	if len(p) == 0 {
		return nil
	}
	const show = 12
	list := p
	more := ""
	if len(list) > show {
		list, more = list[:show], fmt.Sprintf("; and %d more", len(p)-show)
	}
	return fmt.Errorf("%s: %s%s", prefix, strings.Join(list, "; "), more)
}

// ValidateSpecJSON checks a package spec (the text of audiocpp.model_spec.json) against the
// schema audio.cpp loads it with; it does not compare it with a file (ValidateModelSpec
// does).
func ValidateSpecJSON(raw []byte) error {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("gguf: model spec does not parse: %w", err)
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("gguf: model spec is not a JSON object")
	}
	var p specProblems
	validateSpecDoc(doc, &p)
	return p.err("gguf: model spec")
}

// validateSpecDoc checks a parsed spec (numbers as json.Number).
func validateSpecDoc(doc map[string]any, p *specProblems) {
	family := specString(doc, "family", "spec", p)
	if v, ok := doc["schema_version"]; ok {
		if n, isNum := v.(json.Number); !isNum || n.String() != "1" {
			p.add("schema_version", fmt.Sprintf("%v, want 1", v))
		} else {
			validateCatalog(doc, family, p)
		}
	}
	sources, ok := doc["sources"]
	if !ok {
		p.add("spec", "missing required field 'sources'")
		return
	}
	list, ok := sources.([]any)
	if !ok {
		p.add("sources", "expected array")
		return
	}
	for i, s := range list {
		validateLayout(s, fmt.Sprintf("sources[%d]", i), p)
	}
}

// validateLayout checks one source: its format, its roots (id → non-empty path, or
// "$gguf") and the references of its files, optional_files, tensors and optional_tensors
// maps ("root:relative path", or for tensors {"source": ref, "prefix": name}) to known
// roots.
func validateLayout(v any, at string, p *specProblems) {
	m, ok := v.(map[string]any)
	if !ok {
		p.add(at, "expected object")
		return
	}
	specEnum(specString(m, "format", at, p), specFormats, at+".format", "format", p)
	rv, ok := m["roots"]
	if !ok {
		p.add(at, "missing required field 'roots'")
		return
	}
	roots, ok := rv.(map[string]any)
	if !ok {
		p.add(at+".roots", "expected object")
		return
	}
	for id, r := range roots {
		if id == "" {
			p.add(at+".roots", "root id must not be empty")
		}
		if s, ok := r.(string); !ok || s == "" {
			p.add(at+".roots."+id, "expected non-empty string")
		}
	}
	for _, name := range []string{"files", "optional_files", "tensors", "optional_tensors"} {
		mv, ok := m[name]
		if !ok {
			continue
		}
		refs, ok := mv.(map[string]any)
		if !ok {
			p.add(at+"."+name, "expected object")
			continue
		}
		for _, id := range sortedKeys(refs) {
			ref, rat := refs[id], at+"."+name+"."+id
			if id == "" {
				p.add(at+"."+name, "resource id must not be empty")
			}
			s, isStr := ref.(string)
			if !isStr {
				obj, isObj := ref.(map[string]any)
				if !isObj {
					p.add(rat, "expected a reference string or object")
					continue
				}
				s = specString(obj, "source", rat, p)
				if pv, ok := obj["prefix"]; ok {
					if ps, ok := pv.(string); !ok || ps == "" {
						p.add(rat+".prefix", "expected non-empty string")
					}
				}
			}
			root, _, found := strings.Cut(s, ":")
			if !found || root == "" {
				if s != "" {
					p.add(rat, fmt.Sprintf("invalid resource reference '%s'", s))
				}
				continue
			}
			if _, ok := roots[root]; !ok {
				p.add(rat, fmt.Sprintf("unknown root '%s'", root))
			}
		}
	}
}

// validateCatalog checks the typed (schema_version 1) fields.
func validateCatalog(doc map[string]any, family string, p *specProblems) {
	specString(doc, "display_name", "spec", p)
	specEnum(specString(doc, "category", "spec", p), specCategories, "category", "category", p)
	status := specString(doc, "status", "spec", p)
	specEnum(status, specStatuses, "status", "status", p)
	tasks := specSet(doc, "tasks", specTasks, p)
	specSet(doc, "modes", specModes, p)
	specSet(doc, "languages", nil, p)

	if rt, ok := specObject(doc, "runtime", "spec", p); ok {
		specStrings(rt["tags"], specRuntimeTags, "runtime.tags", p, true)
	}
	if caps, ok := specObject(doc, "capabilities", "spec", p); ok {
		for _, task := range sortedKeys(caps) {
			at := "capabilities." + task
			allowed := specCapabilities[task]
			switch {
			case !slices.Contains(tasks, task):
				p.add(at, "capability key must be one of this model's tasks")
			case allowed == nil:
				p.add(at, "task does not define typed capabilities")
			default:
				specNonEmptySet(caps[task], allowed, at, p)
			}
		}
	}
	declared := map[string][]string{}
	if opts, ok := specObject(doc, "options", "spec", p); ok {
		for _, scope := range specScopes {
			at := "options." + scope
			rows, ok := opts[scope].([]any)
			if !ok {
				p.add(at, "missing or not an array")
				continue
			}
			for i, row := range rows {
				if name := validateOption(row, family, scope, fmt.Sprintf("%s[%d]", at, i), p); name != "" {
					declared[scope] = append(declared[scope], name)
				}
			}
		}
	}
	defaultDownload := false
	if pd, ok := doc["package_defaults"]; ok {
		if m, ok := pd.(map[string]any); !ok {
			p.add("package_defaults", "expected object")
		} else if d, ok := m["download"]; ok {
			defaultDownload = true
			validateDownload(d, "package_defaults.download", p)
		}
	}
	var ids []string
	if pkgs, ok := doc["packages"].([]any); !ok {
		p.add("packages", "missing or not an array")
	} else {
		if len(pkgs) == 0 && status != "experimental" {
			p.add("packages", "packages must not be empty unless status is experimental")
		}
		defaults := 0
		for i, pv := range pkgs {
			at := fmt.Sprintf("packages[%d]", i)
			pkg, ok := pv.(map[string]any)
			if !ok {
				p.add(at, "expected object")
				continue
			}
			id := specString(pkg, "id", at, p)
			if slices.Contains(ids, id) {
				p.add(at+".id", "duplicate package id '"+id+"'")
			}
			ids = append(ids, id)
			specString(pkg, "display_name", at, p)
			specEnum(specString(pkg, "format", at, p), specFormats, at+".format", "format", p)
			specEnum(specString(pkg, "precision", at, p), specPrecisions, at+".precision", "precision", p)
			specString(pkg, "target_directory", at, p)
			if files, ok := pkg["files"].([]any); !ok || len(files) == 0 {
				p.add(at+".files", "missing or empty")
			} else {
				specStrings(files, nil, at+".files", p, false)
			}
			if d, ok := pkg["default"]; ok {
				if b, ok := d.(bool); !ok {
					p.add(at+".default", "expected bool")
				} else if b {
					defaults++
				}
			}
			if d, ok := pkg["download"]; ok {
				validateDownload(d, at+".download", p)
			} else if !defaultDownload {
				p.add(at+".download", "missing package download and package_defaults.download")
			}
			specOptString(pkg, "strip_prefix", at, p)
			specOptString(pkg, "description", at, p)
		}
		if len(pkgs) > 0 && defaults != 1 {
			p.add("packages", fmt.Sprintf("%d packages marked default, want one", defaults))
		}
	}
	if deps, ok := doc["dependencies"].([]any); !ok {
		p.add("dependencies", "missing or not an array")
	} else {
		for i, dv := range deps {
			validateDependency(dv, family, declared, fmt.Sprintf("dependencies[%d]", i), p)
		}
	}
	if ui, ok := specObject(doc, "ui", "spec", p); ok {
		if rv, ok := ui["recommended_package"]; ok {
			if r, ok := rv.(string); !ok || !slices.Contains(ids, r) {
				p.add("ui.recommended_package", fmt.Sprintf("unknown package '%v'", rv))
			}
		} else if len(ids) > 0 {
			p.add("ui.recommended_package", "missing required field")
		}
		if v, ok := ui["min_vram_gb"]; ok {
			if _, isNum := v.(json.Number); !isNum {
				p.add("ui.min_vram_gb", "expected number")
			}
		}
		specStrings(ui["tags"], specUITags, "ui.tags", p, true)
		specStrings(ui["docs"], nil, "ui.docs", p, true)
		specOptString(ui, "summary", "ui", p)
	}
}

// validateOption checks one option row and returns its name.
func validateOption(v any, family, scope, at string, p *specProblems) string {
	o, ok := v.(map[string]any)
	if !ok {
		p.add(at, "expected object")
		return ""
	}
	name := specString(o, "name", at, p)
	if scope == "request" {
		if strings.Contains(name, ".") && !strings.HasPrefix(name, family+".") {
			p.add(at+".name", "dotted request option '"+name+"' must use namespace "+family+".<name>")
		}
	} else if strings.Contains(name, ".") {
		p.add(at+".name", scope+" option must be local; the public key is derived as "+family+".<name>")
	}
	typ := specString(o, "type", at, p)
	specEnum(typ, specOptionTypes, at+".type", "option type", p)
	preset, hasPreset := o["preset"]
	values, hasValues := o["values"]
	if hasPreset {
		if s, ok := preset.(string); !ok || s == "" {
			p.add(at+".preset", "expected non-empty string")
		}
		if typ != "enum" {
			p.add(at+".preset", "presets are allowed only for enum options")
		}
		if hasValues {
			p.add(at+".values", "enum options must use either preset or values, not both")
		}
	}
	if typ == "enum" {
		if !hasPreset && !hasValues {
			p.add(at+".values", "enum option requires values or preset")
		}
		if hasValues {
			if list, ok := values.([]any); !ok || len(list) == 0 {
				p.add(at+".values", "enum option values must be a non-empty array")
			} else {
				specStrings(list, nil, at+".values", p, false)
			}
		}
	} else if hasValues {
		p.add(at+".values", "values are allowed only for enum options")
	}
	if r, ok := o["required"]; !ok {
		p.add(at, "missing required field 'required'")
	} else if _, ok := r.(bool); !ok {
		p.add(at+".required", "expected bool")
	}
	numeric := typ == "int" || typ == "float" || typ == "float_list"
	num := func(k string) (float64, bool) {
		n, ok := o[k].(json.Number)
		if !ok {
			return 0, false
		}
		f, err := n.Float64()
		return f, err == nil
	}
	if d, ok := o["default"]; ok {
		switch {
		case d == nil:
			p.add(at+".default", "use absent default instead of null")
		case typ == "bool":
			if _, ok := d.(bool); !ok {
				p.add(at+".default", "expected bool default")
			}
		case typ == "int" || typ == "float":
			if _, ok := d.(json.Number); !ok {
				p.add(at+".default", "expected numeric default")
			}
		case typ == "string" || typ == "path" || typ == "audio_path" || typ == "enum":
			s, ok := d.(string)
			if !ok {
				p.add(at+".default", "expected string default")
			} else if list, isList := values.([]any); typ == "enum" && isList && !slices.Contains(list, any(s)) {
				p.add(at+".default", "default is not in enum values")
			}
		case strings.HasSuffix(typ, "_list"):
			if _, ok := d.([]any); !ok {
				p.add(at+".default", "expected array default")
			}
		}
	}
	_, hasMin := o["min"]
	_, hasMax := o["max"]
	if (hasMin || hasMax) && !numeric {
		p.add(at, "min/max are allowed only for int or float options")
	}
	lo, okLo := num("min")
	hi, okHi := num("max")
	if hasMin && !okLo {
		p.add(at+".min", "expected numeric min")
	}
	if hasMax && !okHi {
		p.add(at+".max", "expected numeric max")
	}
	if okLo && okHi && lo > hi {
		p.add(at+".min", "min must not exceed max")
	}
	if d, ok := num("default"); ok {
		if okLo && d < lo {
			p.add(at+".default", "default is below min")
		}
		if okHi && d > hi {
			p.add(at+".default", "default exceeds max")
		}
	}
	specString(o, "description", at, p)
	return name
}

func validateDownload(v any, at string, p *specProblems) {
	d, ok := v.(map[string]any)
	if !ok {
		p.add(at, "expected object")
		return
	}
	kind := specString(d, "kind", at, p)
	specEnum(kind, specDownloadKinds, at+".kind", "download kind", p)
	switch kind {
	case "huggingface_snapshot":
		specString(d, "repo", at, p)
		specOptString(d, "revision", at, p)
		specOptString(d, "strip_prefix", at, p)
		for _, k := range []string{"include", "exclude"} {
			if v, ok := d[k]; ok {
				specStrings(v, nil, at+"."+k, p, true)
			}
		}
		if g, ok := d["gated"]; ok {
			if _, ok := g.(bool); !ok {
				p.add(at+".gated", "expected bool")
			}
		}
	case "local_snapshot":
		specString(d, "path", at, p)
	case "converter":
		specString(d, "converter", at, p)
		specString(d, "description", at, p)
	case "unsupported":
		specString(d, "reason", at, p)
	}
}

func validateDependency(v any, family string, declared map[string][]string, at string, p *specProblems) {
	d, ok := v.(map[string]any)
	if !ok {
		p.add(at, "expected object")
		return
	}
	kind := specString(d, "kind", at, p)
	specEnum(kind, specDepKinds, at+".kind", "dependency kind", p)
	specString(d, "family", at, p)
	scope := specString(d, "scope", at, p)
	specEnum(scope, specScopes, at+".scope", "dependency scope", p)
	option := specString(d, "option", at, p)
	if strings.Contains(option, ".") {
		p.add(at+".option", "dependency option must be local; the public key is derived as "+family+".<option>")
	} else if option != "" && !slices.Contains(declared[scope], option) {
		p.add(at+".option", "dependency option '"+option+"' is not declared in options."+scope)
	}
	required, reqOK := d["required"].(bool)
	if !reqOK {
		p.add(at+".required", "missing or not a bool")
	}
	if _, ok := d["required_for"]; ok {
		p.add(at+".required_for", "use typed required_when conditions")
	}
	if _, ok := d["package"]; ok {
		p.add(at+".package", "dependency package hints are not part of the core contract")
	}
	if rw, ok := d["required_when"]; ok {
		if required {
			p.add(at+".required_when", "required dependencies must not have conditions")
		}
		if list, ok := rw.([]any); !ok || len(list) == 0 {
			p.add(at+".required_when", "must be a non-empty array")
		}
	} else if reqOK && !required {
		p.add(at+".required_when", "optional dependencies require typed conditions")
	}
	if kind == "bundled_model" {
		specString(d, "path", at, p)
	}
}

// specString returns m[key] when it is a non-empty string and records a problem otherwise.
func specString(m map[string]any, key, at string, p *specProblems) string {
	v, ok := m[key]
	if !ok {
		p.add(at, "missing required field '"+key+"'")
		return ""
	}
	s, ok := v.(string)
	if !ok || s == "" {
		p.add(at+"."+key, "expected non-empty string")
	}
	return s
}

func specOptString(m map[string]any, key, at string, p *specProblems) {
	if _, ok := m[key]; ok {
		specString(m, key, at, p)
	}
}

func specObject(m map[string]any, key, at string, p *specProblems) (map[string]any, bool) {
	v, ok := m[key]
	if !ok {
		p.add(at, "missing required field '"+key+"'")
		return nil, false
	}
	o, ok := v.(map[string]any)
	if !ok {
		p.add(key, "expected object")
	}
	return o, ok
}

func specEnum(v string, allowed []string, at, label string, p *specProblems) {
	if v != "" && !slices.Contains(allowed, v) {
		p.add(at, "unknown "+label+" '"+v+"'")
	}
}

// specStrings checks v is an array of non-empty strings (from allowed when not nil).
func specStrings(v any, allowed []string, at string, p *specProblems, required bool) []string {
	if v == nil {
		if required {
			p.add(at, "missing required array")
		}
		return nil
	}
	list, ok := v.([]any)
	if !ok {
		p.add(at, "expected array")
		return nil
	}
	out := make([]string, 0, len(list))
	for i, e := range list {
		s, ok := e.(string)
		if !ok || s == "" {
			p.add(fmt.Sprintf("%s[%d]", at, i), "expected non-empty string")
			continue
		}
		if allowed != nil && !slices.Contains(allowed, s) {
			p.add(fmt.Sprintf("%s[%d]", at, i), "unknown value '"+s+"'")
		}
		out = append(out, s)
	}
	return out
}

// specNonEmptySet checks v is a non-empty array of distinct strings (from allowed).
func specNonEmptySet(v any, allowed []string, at string, p *specProblems) []string {
	list := specStrings(v, allowed, at, p, true)
	if v != nil && len(list) == 0 {
		p.add(at, "array must not be empty")
	}
	for i := range list {
		if slices.Contains(list[:i], list[i]) {
			p.add(at, "duplicate '"+list[i]+"'")
		}
	}
	return list
}

func specSet(doc map[string]any, key string, allowed []string, p *specProblems) []string {
	v, ok := doc[key]
	if !ok {
		p.add("spec", "missing required field '"+key+"'")
		return nil
	}
	return specNonEmptySet(v, allowed, key, p)
}
