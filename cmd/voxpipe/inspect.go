package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// inspectReport is what `voxpipe inspect` prints, as text or as one JSON object.
type inspectReport struct {
	File          string             `json:"file"`
	FileBytes     int64              `json:"file_bytes"`
	Version       uint32             `json:"version"`
	Alignment     uint64             `json:"alignment"`
	DataOffset    uint64             `json:"data_offset"`
	TensorCount   int                `json:"tensor_count"`
	TensorBytes   uint64             `json:"tensor_bytes"`
	DTypes        []inspectDType     `json:"dtypes"`
	Metadata      []inspectKV        `json:"metadata"`
	EmbeddedFiles []inspectEmbedded  `json:"embedded_files"`
	Namespaces    []inspectNamespace `json:"namespaces"`
	// ModelSpec is the embedded package spec (audiocpp.model_spec.*), absent without one.
	ModelSpec *inspectSpec `json:"model_spec,omitempty"`
}

// inspectSpec summarises the embedded package spec and whether audio.cpp would load the
// file by it (gguf.ValidateModelSpec).
type inspectSpec struct {
	Family        string `json:"family"`
	Version       uint64 `json:"version"`
	SchemaVersion int    `json:"schema_version"` // 0: the source-layout form
	// Namespaces are the tensor namespaces the spec declares, with the original files
	// they came from (audiocpp.tensor_sources.paths).
	Namespaces []inspectSpecNamespace `json:"namespaces"`
	Files      []inspectSpecFile      `json:"files"`
	Valid      bool                   `json:"valid"`
	Problem    string                 `json:"problem,omitempty"`
}

type inspectSpecNamespace struct {
	Name   string `json:"name"`
	Role   string `json:"role"`
	Source string `json:"source,omitempty"`
}

type inspectSpecFile struct {
	Role     string `json:"role"`
	Name     string `json:"name"`
	Optional bool   `json:"optional,omitempty"`
}

type inspectDType struct {
	DType   string `json:"dtype"`
	Tensors int    `json:"tensors"`
	Bytes   uint64 `json:"bytes"`
}

type inspectKV struct {
	Key  string `json:"key"`
	Type string `json:"type"` // "uint32", "string", "array[uint8]", …
	// Len is the number of elements of an array, or the byte length of a string.
	Len *int `json:"len,omitempty"`
	// Value is the value when short (scalars, strings cut to a few hundred bytes, arrays
	// of a few elements); long arrays leave it out.
	Value     any  `json:"value,omitempty"`
	Truncated bool `json:"truncated,omitempty"`

	textType, text string // the text form: "uint8[4257]" or "string", and the value
}

type inspectEmbedded struct {
	Name  string `json:"name"`
	Bytes int    `json:"bytes"`
}

type inspectNamespace struct {
	// Name is the namespace ("vc" for "vc/…" tensors), "" for names without one.
	Name        string          `json:"name"`
	TensorCount int             `json:"tensor_count"`
	Bytes       uint64          `json:"bytes"`
	Tensors     []inspectTensor `json:"tensors,omitempty"`
}

type inspectTensor struct {
	// Name is the logical name, namespace included.
	Name string `json:"name"`
	// Stored is the name in the GGUF tensor table when it differs (_audiocpp.<index>).
	Stored string `json:"stored_name,omitempty"`
	DType  string `json:"dtype"`
	// Shape is in PyTorch order (outermost first); [] for a scalar.
	Shape []int  `json:"shape"`
	Bytes uint64 `json:"bytes"`
}

func runInspect(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inspect", "inspect FILE.gguf [--json] [--tensors=false]", stderr)
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	tensors := fs.Bool("tensors", true, "list every tensor (false: per-namespace totals only)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return errors.New("need exactly one FILE.gguf")
	}
	rep, err := inspectFile(pos[0], *tensors)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.writeText(stdout)
}

// inspectFile reads a GGUF file's header, metadata and tensor table (tensor data is not
// touched) through the audio.cpp model view, so names and shapes are the logical ones.
func inspectFile(path string, withTensors bool) (*inspectReport, error) {
	m, err := gguf.OpenModel(path)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	f := m.File
	rep := &inspectReport{
		File: path, Version: f.Version, Alignment: f.Alignment, DataOffset: f.DataOffset,
		TensorCount: len(f.Tensors), Metadata: []inspectKV{}, EmbeddedFiles: []inspectEmbedded{},
		DTypes: []inspectDType{}, Namespaces: []inspectNamespace{},
	}
	if st, err := os.Stat(path); err == nil {
		rep.FileBytes = st.Size()
	}

	byType := map[gguf.DType]*inspectDType{}
	for _, t := range f.Tensors {
		rep.TensorBytes += t.Size
		d := byType[t.Type]
		if d == nil {
			d = &inspectDType{DType: t.Type.String()}
			byType[t.Type] = d
		}
		d.Tensors++
		d.Bytes += t.Size
	}
	for _, d := range byType {
		rep.DTypes = append(rep.DTypes, *d)
	}
	sort.Slice(rep.DTypes, func(i, j int) bool { return rep.DTypes[i].Bytes > rep.DTypes[j].Bytes })

	for _, k := range f.KV.Keys() {
		rep.Metadata = append(rep.Metadata, describeKV(k, f.KV[k]))
	}
	for _, n := range m.EmbeddedFiles() {
		b, _ := m.EmbeddedFile(n)
		rep.EmbeddedFiles = append(rep.EmbeddedFiles, inspectEmbedded{Name: n, Bytes: len(b)})
	}
	for _, ns := range m.Namespaces() {
		v := m.Sub(ns)
		g := inspectNamespace{Name: ns, TensorCount: v.Len()}
		for _, t := range v.Tensors() {
			g.Bytes += t.Info.Size
			if !withTensors {
				continue
			}
			it := inspectTensor{Name: t.FullName, DType: t.Info.Type.String(), Shape: append([]int{}, t.Shape...), Bytes: t.Info.Size}
			if t.Info.Name != t.FullName {
				it.Stored = t.Info.Name
			}
			g.Tensors = append(g.Tensors, it)
		}
		rep.Namespaces = append(rep.Namespaces, g)
	}
	rep.ModelSpec = inspectModelSpec(m)
	return rep, nil
}

// inspectModelSpec reads and checks m's embedded package spec; nil without one.
func inspectModelSpec(m *gguf.Model) *inspectSpec {
	spec, err := gguf.ReadModelSpec(m.File.KV)
	if spec == nil && err == nil {
		return nil
	}
	out := &inspectSpec{Namespaces: []inspectSpecNamespace{}, Files: []inspectSpecFile{}}
	out.Family, _ = m.File.KV.String(gguf.KeySpecFamily)
	out.Version, _ = m.File.KV.Uint(gguf.KeySpecVersion)
	if err != nil {
		out.Problem = err.Error()
		return out
	}
	out.SchemaVersion = spec.SchemaVersion
	for _, n := range spec.Namespaces {
		out.Namespaces = append(out.Namespaces, inspectSpecNamespace{Name: n.Name, Role: n.Role, Source: n.Source})
	}
	for _, f := range spec.Files {
		out.Files = append(out.Files, inspectSpecFile{Role: f.Role, Name: f.Name, Optional: f.Optional})
	}
	if err := m.ValidateModelSpec(); err != nil {
		out.Problem = err.Error()
	} else {
		out.Valid = true
	}
	return out
}

const (
	maxInlineString = 120 // bytes of a string value shown
	maxInlineArray  = 8   // elements of an array value shown
)

// describeKV summarises one metadata value: scalars in full, strings cut, arrays shown
// when short and summarised as type[len] otherwise.
func describeKV(key string, v gguf.Value) inspectKV {
	kv := inspectKV{Key: key, Type: v.Type().String(), textType: v.Type().String()}
	if v.Type() == gguf.TypeArray {
		n := v.Len()
		kv.Type = "array[" + v.ElemType().String() + "]"
		kv.Len = &n
		kv.textType = fmt.Sprintf("%s[%d]", v.ElemType(), n)
		if n == 0 || n > maxInlineArray || v.ElemType() == gguf.TypeArray {
			return kv
		}
		var elems []string
		var vals []any
		switch a := v.Any().(type) {
		case []string:
			for _, s := range a {
				if len(s) > 40 {
					return kv
				}
				elems = append(elems, fmt.Sprintf("%q", s))
				vals = append(vals, s)
			}
		default:
			if fs, ok := v.AsFloats(); ok {
				for _, x := range fs {
					elems = append(elems, fmt.Sprint(x))
					vals = append(vals, jsonFloat(x))
				}
			} else if is, ok := v.AsInts(); ok {
				for _, x := range is {
					elems = append(elems, fmt.Sprint(x))
					vals = append(vals, x)
				}
			} else if bs, ok := v.Any().([]bool); ok {
				for _, x := range bs {
					elems = append(elems, fmt.Sprint(x))
					vals = append(vals, x)
				}
			} else if us, ok := v.Any().([]uint64); ok { // above MaxInt64
				for _, x := range us {
					elems = append(elems, fmt.Sprint(x))
					vals = append(vals, x)
				}
			} else {
				return kv
			}
		}
		kv.text = "[" + strings.Join(elems, ", ") + "]"
		kv.Value = vals
		return kv
	}
	switch x := v.Any().(type) {
	case string:
		n := len(x)
		kv.Len = &n
		s := x
		if len(s) > maxInlineString {
			cut := maxInlineString
			for cut > 0 && !isRuneStart(s[cut]) {
				cut--
			}
			s = s[:cut]
			kv.Truncated = true
		}
		kv.Value = s
		kv.text = fmt.Sprintf("%q", s)
		if kv.Truncated {
			kv.text += fmt.Sprintf("… (%d bytes)", n)
		}
	case float32:
		kv.Value = jsonFloat(float64(x))
		kv.text = fmt.Sprint(x)
	case float64:
		kv.Value = jsonFloat(x)
		kv.text = fmt.Sprint(x)
	default:
		kv.Value = x
		kv.text = fmt.Sprint(x)
	}
	return kv
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// jsonFloat keeps NaN and ±Inf, which JSON numbers cannot hold, as strings.
func jsonFloat(x float64) any {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Sprint(x)
	}
	return x
}

func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func shapeString(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func (r *inspectReport) writeText(w io.Writer) error {
	var types []string
	for _, d := range r.DTypes {
		types = append(types, fmt.Sprintf("%s: %d tensors, %s", d.DType, d.Tensors, humanBytes(d.Bytes)))
	}
	fmt.Fprintf(w, "%s: GGUF v%d, %d bytes (%s)\n", r.File, r.Version, r.FileBytes, humanBytes(uint64(max(r.FileBytes, 0))))
	fmt.Fprintf(w, "tensors: %d, %d bytes of data (%s)", r.TensorCount, r.TensorBytes, humanBytes(r.TensorBytes))
	if len(types) > 0 {
		fmt.Fprintf(w, "; %s", strings.Join(types, "; "))
	}
	fmt.Fprintf(w, "\nalignment %d, data section at byte %d\n", r.Alignment, r.DataOffset)

	fmt.Fprintf(w, "\nmetadata (%d keys):\n", len(r.Metadata))
	var rows [][]string
	for _, kv := range r.Metadata {
		rows = append(rows, []string{kv.Key, kv.textType, kv.text})
	}
	writeTable(w, "  ", rows)

	if sp := r.ModelSpec; sp != nil {
		form := "source-layout form"
		if sp.SchemaVersion > 0 {
			form = fmt.Sprintf("schema_version %d", sp.SchemaVersion)
		}
		state := "valid"
		if !sp.Valid {
			state = "INVALID: " + sp.Problem
		}
		fmt.Fprintf(w, "\nmodel spec: family %s, version %d, %s; %s\n", sp.Family, sp.Version, form, state)
		rows = rows[:0]
		for _, n := range sp.Namespaces {
			label := n.Name + "/"
			if n.Name == "" {
				label = "(no namespace)"
			}
			src := ""
			if n.Source != "" {
				src = "from " + n.Source
			}
			rows = append(rows, []string{label, "role " + n.Role, src})
		}
		for _, f := range sp.Files {
			opt := ""
			if f.Optional {
				opt = "(optional)"
			}
			rows = append(rows, []string{f.Name, "file " + f.Role, opt})
		}
		writeTable(w, "  ", rows)
	}

	fmt.Fprintf(w, "\nembedded files (%d):\n", len(r.EmbeddedFiles))
	rows = rows[:0]
	for _, e := range r.EmbeddedFiles {
		rows = append(rows, []string{e.Name, fmt.Sprintf("%d bytes", e.Bytes)})
	}
	writeTable(w, "  ", rows)

	fmt.Fprintf(w, "\nnamespaces (%d):\n", len(r.Namespaces))
	for _, g := range r.Namespaces {
		label := g.Name + "/"
		if g.Name == "" {
			label = "(no namespace)"
		}
		fmt.Fprintf(w, "  %s  %d tensors, %d bytes (%s)\n", label, g.TensorCount, g.Bytes, humanBytes(g.Bytes))
		rows = rows[:0]
		for _, t := range g.Tensors {
			name := t.Name
			if g.Name != "" {
				name = strings.TrimPrefix(name, g.Name+"/")
			}
			stored := ""
			if t.Stored != "" {
				stored = "stored as " + t.Stored
			}
			rows = append(rows, []string{name, t.DType, shapeString(t.Shape), fmt.Sprint(t.Bytes), stored})
		}
		writeTable(w, "    ", rows)
	}
	return nil
}

// writeTable writes rows with every column but the last padded to its widest cell (in
// runes), two spaces apart, without trailing blanks.
func writeTable(w io.Writer, indent string, rows [][]string) {
	var width []int
	for _, row := range rows {
		for i, c := range row {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		b.Reset()
		b.WriteString(indent)
		for i, c := range row {
			b.WriteString(c)
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)+2))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}
