package gguf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"slices"
	"sort"
	"strings"
)

// Keys of the package spec a packaged file carries (shared/reference/audiocpp.md §3.8).
// audio.cpp reads the first three together: any one of them without the others, a version
// other than 1 or an empty family or JSON makes it refuse the file, and the JSON, when
// present, takes priority over every external spec.
const (
	// KeySpecVersion is the uint32 version of the embedding (always SpecVersion).
	KeySpecVersion = "audiocpp.model_spec.version"
	// KeySpecFamily is the model family ("meanvc2", "miotts", "miocodec").
	KeySpecFamily = "audiocpp.model_spec.family"
	// KeySpecJSON is the whole package spec, a JSON object (see ModelSpec).
	KeySpecJSON = "audiocpp.model_spec.json"
	// KeySourceNames and KeySourcePaths record where the tensors came from: one entry per
	// namespace, its tensor prefix ("" for the root) and its original checkpoint file
	// relative to the model folder. The converter writes them; the loader does not read them.
	KeySourceNames = "audiocpp.tensor_sources.names"
	KeySourcePaths = "audiocpp.tensor_sources.paths"

	// SpecVersion is the only KeySpecVersion audio.cpp accepts.
	SpecVersion = 1

	// ggufRoot is the id of the spec root that stands for the GGUF file itself ("$gguf").
	ggufRoot = "weights"
	// modelRoot is the id of the spec root that stands for the model folder, where the
	// embedded files are unpacked (".").
	modelRoot = "model"
)

// SpecNamespace is one tensor namespace of a packaged file and where it came from.
type SpecNamespace struct {
	// Name is the tensor-name prefix in the file (tensors are "<Name>/…"), or "" for
	// tensors without one (MioTTS keeps its Hugging Face names at the root).
	Name string
	// Role is the resource id the loader asks the spec for ("vc", "weights",
	// "wavlm_weights"). Empty means Name, or "weights" for the root namespace.
	Role string
	// Source is the original checkpoint file the namespace was converted from, relative to
	// the model folder ("model.safetensors", "fastu2pp_160ms.pt"). It goes to
	// audiocpp.tensor_sources.paths (when every namespace has one) and, when every
	// namespace comes from a safetensors file, into a second, safetensors layout of the
	// spec that loads the unconverted folder.
	Source string
}

// role is the namespace's resource id.
func (n SpecNamespace) role() string {
	switch {
	case n.Role != "":
		return n.Role
	case n.Name == "":
		return "weights"
	}
	return n.Name
}

// SpecFile is a non-weight file (config, tokenizer) the model needs, embedded in the file.
type SpecFile struct {
	// Role is the resource id the loader asks for ("config", "vocab", "merges").
	Role string
	// Name is the embedded file's name, a relative path ("config.json",
	// "wavlm-base-plus-mlx/config.json").
	Name string
	// Optional files are used when present (MioTTS's tokenizer.json); the others must be
	// embedded.
	Optional bool
}

// ModelSpec is audio.cpp's package spec for one packaged file: what the loader is to find
// in it (tensor namespaces, embedded files) and the family's catalog entry. JSON gives
// the spec; SetKV stores it in a file's metadata; Embed stores it and checks it against the
// file's tensors and embedded files (ValidateModelSpec); WritePackagedSpec writes a whole
// file with it that way. FamilySpec gives the spec of each family voxpipe writes.
//
// The JSON has "family", "schema_version" (when SchemaVersion is 1), the Catalog fields,
// and "sources": first the layout of the GGUF file itself (roots "weights" = "$gguf" and,
// with embedded files, "model" = "."; one "tensors" entry per namespace, a prefix view of
// the file; "files"/"optional_files" for the embedded files), then, when every namespace
// comes from a safetensors file, the layout of the unconverted checkpoint folder.
type ModelSpec struct {
	// Family is the model family; audio.cpp picks the loader by it.
	Family string
	// SchemaVersion is 0 for a spec in the source-layout form (family, sources and
	// descriptive fields, which audio.cpp checks only for family and sources), or 1 for
	// the typed catalog schema, whose fields (display_name, category, status, tasks, modes,
	// languages, runtime, capabilities, options, packages, dependencies, ui) audio.cpp
	// then requires and checks (see ValidateModelSpec).
	SchemaVersion int
	// Catalog holds the spec's other top-level fields ("display_name", "tasks",
	// "options", …), written as given. "family", "schema_version" and "sources" are
	// ignored here.
	Catalog map[string]any
	// Namespaces are the file's tensor namespaces, one per prefix.
	Namespaces []SpecNamespace
	// Files are the embedded files the loader asks for.
	Files []SpecFile
}

// SetSource sets the original checkpoint file of namespace name.
func (s *ModelSpec) SetSource(name, source string) error {
	for i := range s.Namespaces {
		if s.Namespaces[i].Name == name {
			s.Namespaces[i].Source = source
			return nil
		}
	}
	return fmt.Errorf("gguf: model spec %s has no namespace %q", s.Family, name)
}

// check validates the spec's own fields.
func (s ModelSpec) check() error {
	if s.Family == "" {
		return fmt.Errorf("gguf: model spec without a family")
	}
	if s.SchemaVersion != 0 && s.SchemaVersion != 1 {
		return fmt.Errorf("gguf: model spec %s: schema version %d, want 0 or 1", s.Family, s.SchemaVersion)
	}
	if len(s.Namespaces) == 0 {
		return fmt.Errorf("gguf: model spec %s has no tensor namespace", s.Family)
	}
	names, roles := map[string]bool{}, map[string]bool{}
	for _, n := range s.Namespaces {
		if strings.Contains(n.Name, "/") || n.Name == "." || n.Name == ".." {
			return fmt.Errorf("gguf: model spec %s: namespace %q is not one name segment", s.Family, n.Name)
		}
		if names[n.Name] || roles[n.role()] {
			return fmt.Errorf("gguf: model spec %s: namespace %q (role %q) given twice", s.Family, n.Name, n.role())
		}
		names[n.Name], roles[n.role()] = true, true
		if n.Source != "" && !safeRelPath(n.Source) {
			return fmt.Errorf("gguf: model spec %s: source %q of namespace %q is not a relative path inside the model folder", s.Family, n.Source, n.Name)
		}
	}
	files := map[string]bool{}
	for _, f := range s.Files {
		if f.Role == "" || files[f.Role] {
			return fmt.Errorf("gguf: model spec %s: file role %q empty or given twice", s.Family, f.Role)
		}
		files[f.Role] = true
		if !safeRelPath(f.Name) {
			return fmt.Errorf("gguf: model spec %s: file %q is not a relative path", s.Family, f.Name)
		}
	}
	return nil
}

// safeRelPath reports whether p is a clean relative path that stays inside its folder.
func safeRelPath(p string) bool {
	return p != "" && p == path.Clean(p) && !path.IsAbs(p) && p != "." && p != ".." && !strings.HasPrefix(p, "../")
}

// sources is the spec's "sources" array.
func (s ModelSpec) sources() []any {
	withFiles := func(layout map[string]any) {
		files, optional := map[string]any{}, map[string]any{}
		for _, f := range s.Files {
			if f.Optional {
				optional[f.Role] = modelRoot + ":" + f.Name
			} else {
				files[f.Role] = modelRoot + ":" + f.Name
			}
		}
		if len(files) > 0 {
			layout["files"] = files
		}
		if len(optional) > 0 {
			layout["optional_files"] = optional
		}
	}
	roots := map[string]any{ggufRoot: "$gguf"}
	if len(s.Files) > 0 {
		roots[modelRoot] = "."
	}
	tensors := map[string]any{}
	for _, n := range s.Namespaces {
		if n.Name == "" {
			tensors[n.role()] = ggufRoot + ":"
		} else {
			tensors[n.role()] = map[string]any{"source": ggufRoot + ":", "prefix": n.Name}
		}
	}
	packed := map[string]any{"format": "gguf", "roots": roots, "tensors": tensors}
	withFiles(packed)
	out := []any{packed}

	// The unconverted folder loads too when every namespace is a safetensors file.
	unpacked := map[string]any{}
	for _, n := range s.Namespaces {
		if !strings.HasSuffix(n.Source, ".safetensors") && !strings.HasSuffix(n.Source, ".safetensors.index.json") {
			return out
		}
		unpacked[n.role()] = modelRoot + ":" + n.Source
	}
	folder := map[string]any{"format": "safetensors", "roots": map[string]any{modelRoot: "."}, "tensors": unpacked}
	withFiles(folder)
	return append(out, folder)
}

// JSON is the spec as audio.cpp reads it from audiocpp.model_spec.json: one compact JSON
// object, keys sorted.
func (s ModelSpec) JSON() ([]byte, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	doc := make(map[string]any, len(s.Catalog)+3)
	for k, v := range s.Catalog {
		doc[k] = v
	}
	doc["family"] = s.Family
	delete(doc, "schema_version")
	if s.SchemaVersion > 0 {
		doc["schema_version"] = s.SchemaVersion
	}
	doc["sources"] = s.sources()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("gguf: model spec %s: %w", s.Family, err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// SetKV stores the spec in kv: audiocpp.model_spec.version (uint32 1), .family and .json,
// and audiocpp.tensor_sources.names (the namespaces) with .paths (their original files)
// when every namespace has a Source.
func (s ModelSpec) SetKV(kv KV) error {
	raw, err := s.JSON()
	if err != nil {
		return err
	}
	names := make([]string, len(s.Namespaces))
	paths := make([]string, 0, len(s.Namespaces))
	for i, n := range s.Namespaces {
		names[i] = n.Name
		if n.Source != "" {
			paths = append(paths, n.Source)
		}
	}
	vals := map[string]any{KeySpecVersion: uint32(SpecVersion), KeySpecFamily: s.Family, KeySpecJSON: string(raw), KeySourceNames: names}
	delete(kv, KeySourcePaths)
	if len(paths) == len(names) {
		vals[KeySourcePaths] = paths
	}
	for k, v := range vals {
		if err := kv.Set(k, v); err != nil {
			return err
		}
	}
	return nil
}

// Embed stores the spec in kv (SetKV) and checks it (ValidateModelSpec) against the file
// that is to be written: its logical tensor names and embedded file names. A writer that
// streams the file (engine/ggufpack) calls it on the metadata before the header.
func (s ModelSpec) Embed(kv KV, tensorNames, embedded []string) error {
	if err := s.SetKV(kv); err != nil {
		return err
	}
	return ValidateModelSpec(kv, tensorNames, embedded)
}

// WritePackagedSpec is WritePackaged with spec stored in the metadata (Embed; kv itself is
// not modified). It refuses to write a file whose spec does not pass ValidateModelSpec
// against the tensors and files given.
func WritePackagedSpec(w io.Writer, kv KV, spec ModelSpec, tensors []WriteTensor, files []EmbeddedFile) error {
	out := make(KV, len(kv)+5)
	for k, v := range kv {
		out[k] = v
	}
	names := make([]string, len(tensors))
	for i, t := range tensors {
		names[i] = t.Name
	}
	fnames := make([]string, len(files))
	for i, f := range files {
		fnames[i] = f.Name
	}
	if err := spec.Embed(out, names, fnames); err != nil {
		return err
	}
	return WritePackaged(w, out, tensors, files)
}

// ReadModelSpec reads the spec a file's metadata embeds, or returns nil, nil when it has
// none of the three audiocpp.model_spec keys. It fails where audio.cpp's reader does
// (keys not all present, wrong types, version not 1, empty family or JSON, JSON that is
// not an object, a JSON family that differs from the key's) and otherwise reads what it
// can: Namespaces and Files from the first "gguf" source (Sources from
// audiocpp.tensor_sources), the other fields into Catalog. ValidateModelSpec does the
// full check.
func ReadModelSpec(kv KV) (*ModelSpec, error) {
	doc, family, err := readSpecDoc(kv)
	if doc == nil || err != nil {
		return nil, err
	}
	s := &ModelSpec{Family: family, Catalog: map[string]any{}}
	for k, v := range doc {
		switch k {
		case "family", "sources":
		case "schema_version":
			if n, ok := v.(json.Number); ok {
				if i, err := n.Int64(); err == nil {
					s.SchemaVersion = int(i)
				}
			}
		default:
			s.Catalog[k] = v
		}
	}
	layout, _ := firstGGUFSource(doc)
	roots, _ := layout["roots"].(map[string]any)
	resolve := func(ref string) (string, string) {
		root, rel, _ := strings.Cut(ref, ":")
		dir, _ := roots[root].(string)
		return dir, rel
	}
	tensors, _ := layout["tensors"].(map[string]any)
	for role, ref := range tensors {
		n := SpecNamespace{Role: role}
		if m, ok := ref.(map[string]any); ok {
			n.Name, _ = m["prefix"].(string)
			n.Name = strings.Trim(n.Name, "/")
		}
		s.Namespaces = append(s.Namespaces, n)
	}
	for _, list := range []string{"files", "optional_files"} {
		files, _ := layout[list].(map[string]any)
		for role, ref := range files {
			r, _ := ref.(string)
			dir, rel := resolve(r)
			s.Files = append(s.Files, SpecFile{Role: role, Name: path.Join(dir, rel), Optional: list == "optional_files"})
		}
	}
	// Namespaces in the order of audiocpp.tensor_sources.names (the file's), with their
	// original files; the others sorted.
	srcNames, _ := kv.Strings(KeySourceNames)
	srcPaths, _ := kv.Strings(KeySourcePaths)
	order := func(name string) int {
		if i := slices.Index(srcNames, name); i >= 0 {
			return i
		}
		return len(srcNames)
	}
	sort.Slice(s.Namespaces, func(i, j int) bool {
		a, b := s.Namespaces[i], s.Namespaces[j]
		if oa, ob := order(a.Name), order(b.Name); oa != ob {
			return oa < ob
		}
		return a.Name < b.Name
	})
	for i := range s.Namespaces {
		if j := slices.Index(srcNames, s.Namespaces[i].Name); j >= 0 && len(srcPaths) == len(srcNames) {
			s.Namespaces[i].Source = srcPaths[j]
		}
	}
	sort.Slice(s.Files, func(i, j int) bool {
		if s.Files[i].Optional != s.Files[j].Optional {
			return !s.Files[i].Optional
		}
		return s.Files[i].Role < s.Files[j].Role
	})
	return s, nil
}

// readSpecDoc checks the three keys the way audio.cpp's GGUF reader does and parses the
// JSON object (numbers as json.Number). It returns nil, "", nil without any of the keys.
func readSpecDoc(kv KV) (map[string]any, string, error) {
	hv, hf, hj := kv.Has(KeySpecVersion), kv.Has(KeySpecFamily), kv.Has(KeySpecJSON)
	if !hv && !hf && !hj {
		return nil, "", nil
	}
	if !hv || !hf || !hj {
		var missing []string
		for _, k := range []struct {
			has bool
			key string
		}{{hv, KeySpecVersion}, {hf, KeySpecFamily}, {hj, KeySpecJSON}} {
			if !k.has {
				missing = append(missing, k.key)
			}
		}
		return nil, "", fmt.Errorf("gguf: model spec: %s missing (audio.cpp needs %s, %s and %s together)",
			strings.Join(missing, " and "), KeySpecVersion, KeySpecFamily, KeySpecJSON)
	}
	if v := kv[KeySpecVersion]; v.Type() != TypeUint32 {
		return nil, "", typeErr(KeySpecVersion, v, "uint32")
	} else if u, _ := v.AsUint(); u != SpecVersion {
		return nil, "", fmt.Errorf("gguf: model spec: %s is %d, audio.cpp reads only %d", KeySpecVersion, u, SpecVersion)
	}
	family, err := kv.String(KeySpecFamily)
	if err != nil {
		return nil, "", err
	}
	raw, err := kv.String(KeySpecJSON)
	if err != nil {
		return nil, "", err
	}
	if family == "" || raw == "" {
		return nil, "", fmt.Errorf("gguf: model spec: %s or %s is empty", KeySpecFamily, KeySpecJSON)
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, "", fmt.Errorf("gguf: model spec: %s does not parse: %w", KeySpecJSON, err)
	}
	if dec.More() {
		return nil, "", fmt.Errorf("gguf: model spec: %s holds more than one JSON value", KeySpecJSON)
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, "", fmt.Errorf("gguf: model spec: %s is not a JSON object", KeySpecJSON)
	}
	if f, ok := doc["family"].(string); !ok || f != family {
		return nil, "", fmt.Errorf("gguf: model spec: the JSON's family %v differs from %s %q", doc["family"], KeySpecFamily, family)
	}
	return doc, family, nil
}

// firstGGUFSource is the first source of format "gguf": the layout audio.cpp loads a
// .gguf file with.
func firstGGUFSource(doc map[string]any) (map[string]any, int) {
	sources, _ := doc["sources"].([]any)
	for i, s := range sources {
		if m, ok := s.(map[string]any); ok && m["format"] == "gguf" {
			return m, i
		}
	}
	return nil, -1
}

// ValidateModelSpec checks a file's embedded spec as audio.cpp would load the file, given
// its metadata, logical tensor names and embedded file names:
//
//   - audiocpp.model_spec.version (uint32 1), .family and .json present together, the JSON
//     an object with the same non-empty family;
//   - the schema audio.cpp checks (ValidateSpecJSON): "family" and "sources" always, each
//     source's format, roots and resource references; with "schema_version" 1 the whole
//     typed catalog;
//   - a "gguf" source (what a .gguf path loads through) whose tensor entries are views of
//     the file itself ("$gguf" root) and whose prefixes are exactly the file's namespaces
//     (no tensor outside them, none declared without tensors: the converter's rule), and
//     whose required files are all embedded;
//   - audiocpp.tensor_sources.names, when present, naming the same namespaces, with
//     .paths (when present) one per name.
//
// All problems found are reported together.
func ValidateModelSpec(kv KV, tensorNames, embedded []string) error {
	doc, family, err := readSpecDoc(kv)
	if err != nil {
		return err
	}
	if doc == nil {
		return fmt.Errorf("gguf: no embedded model spec (%s, %s and %s)", KeySpecVersion, KeySpecFamily, KeySpecJSON)
	}
	var p specProblems
	validateSpecDoc(doc, &p)

	actual := map[string]bool{}
	for _, n := range tensorNames {
		actual[Namespace(n)] = true
	}
	layout, idx := firstGGUFSource(doc)
	if _, isList := doc["sources"].([]any); layout == nil && isList {
		p.add("sources", "no \"gguf\" source, so a .gguf file does not load")
	} else if layout != nil {
		at := fmt.Sprintf("sources[%d]", idx)
		roots, _ := layout["roots"].(map[string]any)
		declared := map[string]bool{}
		tensors, _ := layout["tensors"].(map[string]any)
		for _, role := range sortedKeys(tensors) {
			ref := tensors[role]
			src, prefix := "", ""
			switch r := ref.(type) {
			case string:
				src = r
			case map[string]any:
				src, _ = r["source"].(string)
				prefix, _ = r["prefix"].(string)
			}
			root, rel, _ := strings.Cut(src, ":")
			if roots[root] != "$gguf" || rel != "" {
				p.add(at+".tensors."+role, fmt.Sprintf("%q is not the GGUF file itself (a root \"$gguf\", no path)", src))
			}
			prefix = strings.Trim(prefix, "/")
			if declared[prefix] {
				p.add(at+".tensors."+role, fmt.Sprintf("namespace %q declared twice", prefix))
			}
			declared[prefix] = true
		}
		for _, ns := range sortedKeys(actual) {
			if !declared[ns] {
				p.add(at+".tensors", fmt.Sprintf("the file's namespace %s is not declared", nsLabel(ns)))
			}
		}
		for _, ns := range sortedKeys(declared) {
			if !actual[ns] {
				p.add(at+".tensors", fmt.Sprintf("namespace %s is declared but the file has no tensor in it", nsLabel(ns)))
			}
		}
		files, _ := layout["files"].(map[string]any)
		for _, role := range sortedKeys(files) {
			ref, _ := files[role].(string)
			root, rel, _ := strings.Cut(ref, ":")
			dir, _ := roots[root].(string)
			if dir == "$gguf" {
				p.add(at+".files."+role, "a file cannot be read from the GGUF root")
				continue
			}
			name := path.Join(dir, rel)
			switch {
			case !safeRelPath(name):
				p.add(at+".files."+role, fmt.Sprintf("%q leaves the model folder", name))
			case !slices.Contains(embedded, name):
				p.add(at+".files."+role, fmt.Sprintf("required file %s is not embedded", name))
			}
		}
	}

	if kv.Has(KeySourceNames) {
		names, err := kv.Strings(KeySourceNames)
		switch {
		case err != nil:
			p.add(KeySourceNames, err.Error())
		default:
			seen := map[string]bool{}
			for _, n := range names {
				if seen[n] || !actual[n] {
					p.add(KeySourceNames, fmt.Sprintf("%s given twice or without tensors", nsLabel(n)))
				}
				seen[n] = true
			}
			for _, ns := range sortedKeys(actual) {
				if !seen[ns] {
					p.add(KeySourceNames, fmt.Sprintf("the file's namespace %s has no entry", nsLabel(ns)))
				}
			}
			if kv.Has(KeySourcePaths) {
				if paths, err := kv.Strings(KeySourcePaths); err != nil {
					p.add(KeySourcePaths, err.Error())
				} else if len(paths) != len(names) {
					p.add(KeySourcePaths, fmt.Sprintf("%d paths for %d names", len(paths), len(names)))
				}
			}
		}
	} else if kv.Has(KeySourcePaths) {
		p.add(KeySourcePaths, "given without "+KeySourceNames)
	}
	return p.err("gguf: model spec " + family)
}

// ValidateModelSpec checks the file's embedded spec against its tensors and embedded files
// (see the function ValidateModelSpec).
func (m *Model) ValidateModelSpec() error {
	names := make([]string, len(m.tensors))
	for i, t := range m.tensors {
		names[i] = t.FullName
	}
	return ValidateModelSpec(m.File.KV, names, m.emb.names)
}

func nsLabel(ns string) string {
	if ns == "" {
		return "<root>"
	}
	return ns + "/"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
