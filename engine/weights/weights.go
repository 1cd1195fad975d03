// Package weights binds named tensors from a weight source (a GGUF model view) to the fields
// of a Go struct, one declaration per tensor:
//
//	type Attention struct {
//		Q    weights.Tensor `gguf:"to_q.weight"`
//		QB   weights.Tensor `gguf:"to_q.bias,optional"`
//		Norm struct {
//			W weights.Tensor `gguf:"weight"`
//			B weights.Tensor `gguf:"bias"`
//		} `gguf:"q_norm"`
//	}
//	type DiT struct {
//		Blocks []struct {
//			Attn Attention `gguf:"attn"`
//		} `gguf:"transformer_blocks.%d"`
//		ProjOut weights.Tensor `gguf:"proj_out.weight"`
//	}
//	var w DiT
//	err := weights.Bind(model.Sub("vc"), &w)
//
// Tag rules (the tag key is gguf):
//
//   - On a Tensor field the tag is the tensor's name, joined to the enclosing prefix with a
//     dot: Blocks[0].Attn.Q is "transformer_blocks.0.attn.to_q.weight".
//   - On a struct field the tag is a prefix for the fields inside; an untagged struct field
//     adds no prefix (its fields are bound as if they were the parent's).
//   - On a slice or array of Tensor or of structs the tag holds "%d" exactly once, replaced
//     by the element index. An array binds all its elements; a slice the caller made with
//     len > 0 binds exactly that many elements; an empty slice is sized by probing: element
//     i exists when any tensor of it (optional ones included) is in the source, and probing
//     stops at the first index with none. A required slice that finds no element reports
//     the names of element 0 as missing.
//   - Alternatives separated by "|" name the same tensor or prefix under different spellings;
//     the first that the source has wins ("2|2.1" takes "…2.weight" or else "…2.1.weight").
//   - ",optional" after the name: a missing tensor leaves the field's Data nil (test with
//     Present); on a struct or slice, a group with no tensor present at all is left zero,
//     while a partly present group still reports the missing required tensors.
//   - "-" skips the field. Untagged fields of other types (config values a model keeps next
//     to its weights) are ignored; unexported fields must not be tagged.
//
// Leaf types (models/nn's tensors) bind like Tensor fields but load themselves, through
// BindTo, into buffers of a backend; a model's tensor table (Specs) is read from the same
// declaration, so every tensor's name and shape are written once.
//
// Shape checks: a Tensor whose Shape the caller filled in before Bind must match it, -1
// being a wildcard for one dimension (rank must match). Bind reports every missing,
// misshapen or unloadable tensor at once in a *BindError; misshapen fields are left as they
// were. Mistakes in the struct declaration (bad tags, unsupported field types) are reported
// before anything is loaded.
package weights

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
)

// Tensor is a bound weight: its values row-major in Shape (PyTorch order, outermost first).
type Tensor struct {
	Data  []float32
	Shape []int
}

// Present reports whether the tensor was bound (an optional tensor that the source lacks is
// not).
func (t Tensor) Present() bool { return t.Data != nil }

// Dim returns dimension i of the shape; negative i counts from the end (-1 is the last).
// It panics when i is out of range, like an index expression.
func (t Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.Shape)
	}
	return t.Shape[i]
}

// Source provides tensors by name; *gguf.Model (and its Sub views) implements it.
type Source interface {
	// Get returns a tensor's values as float32 and its shape in PyTorch order.
	Get(name string) ([]float32, []int, error)
	// Has reports whether the source has a tensor of that name.
	Has(name string) bool
}

// prefixer is implemented by sources that are views of a larger namespace
// (gguf.Model.Prefix); error messages then show full names.
type prefixer interface{ Prefix() string }

// Mismatch is a tensor whose shape is not the expected one.
type Mismatch struct {
	Name      string
	Got, Want []int
}

// Failure is a tensor the source has but could not load (an unsupported dtype, say).
type Failure struct {
	Name string
	Err  error
}

// BindError lists every problem Bind found.
type BindError struct {
	// Type is the bound struct type.
	Type string
	// Missing are required tensors the source lacks (for alternatives: "a|b").
	Missing   []string
	Misshapen []Mismatch
	Failed    []Failure
}

func (e *BindError) Error() string {
	var b strings.Builder
	var parts []string
	if n := len(e.Missing); n > 0 {
		parts = append(parts, fmt.Sprintf("%d missing", n))
	}
	if n := len(e.Misshapen); n > 0 {
		parts = append(parts, fmt.Sprintf("%d misshapen", n))
	}
	if n := len(e.Failed); n > 0 {
		parts = append(parts, fmt.Sprintf("%d failed to load", n))
	}
	fmt.Fprintf(&b, "weights: bind %s: %s:", e.Type, strings.Join(parts, ", "))
	for _, n := range e.Missing {
		fmt.Fprintf(&b, "\n  missing   %s", n)
	}
	for _, m := range e.Misshapen {
		fmt.Fprintf(&b, "\n  misshapen %s: shape %v, want %v", m.Name, m.Got, m.Want)
	}
	for _, f := range e.Failed {
		fmt.Fprintf(&b, "\n  failed    %s: %v", f.Name, f.Err)
	}
	return b.String()
}

var tensorType = reflect.TypeFor[Tensor]()

// Leaf is a field type that binds one tensor itself, through its pointer: models/nn's
// tensors, which load straight into backend buffers. Bind treats it like a Tensor field
// (names, alternatives, optional, shape check against Want).
type Leaf interface {
	// Want is the expected shape (nil: any; -1 a wildcard dimension).
	Want() []int
	// Load binds the tensor name of src, whose shape (checked) is shape, to memory from a.
	Load(src Source, name string, shape []int, a engine.Allocator) error
}

var leafType = reflect.TypeFor[Leaf]()

// Requirer is implemented by Leaf types that make an ",optional" field required once the
// model declares it (models/nn: a bias that a layer was declared with).
type Requirer interface{ Required() bool }

// isLeaf reports whether a field of type t binds one tensor.
func isLeaf(t reflect.Type) bool {
	return t == tensorType || reflect.PointerTo(t).Implements(leafType)
}

// maxProbe bounds slice probing (a source holds finitely many tensors, so it stops far
// earlier; this guards against a Source whose Has always says yes).
const maxProbe = 1 << 16

// Bind fills the Tensor fields of the struct dst points to from src (see the package
// documentation for the tags). It returns a *BindError listing every missing, misshapen or
// unloadable tensor, or another error for a mistake in dst's declaration.
func Bind(src Source, dst any) error { return BindTo(src, nil, dst) }

// BindTo is Bind for structs with Leaf fields, which load into buffers from a (a Backend).
func BindTo(src Source, a engine.Allocator, dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("weights: Bind needs a non-nil pointer to a struct, got %T", dst)
	}
	typ := v.Elem().Type()
	name := typ.String()
	if typ.Name() == "" {
		name = "struct{…}" // anonymous: its full spelling would swamp the message
	}
	if err := checkStruct(typ, name, map[reflect.Type]bool{}); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	b := &binder{src: src, alloc: a, e: &BindError{Type: name}}
	if p, ok := src.(prefixer); ok {
		b.display = p.Prefix()
	}
	b.bindStruct(v.Elem(), "")
	if len(b.e.Missing)+len(b.e.Misshapen)+len(b.e.Failed) > 0 {
		return b.e
	}
	return nil
}

type tag struct {
	alts     []string // alternatives, at least one
	optional bool
	skip     bool
	tagged   bool
}

func parseTag(f reflect.StructField) (tag, error) {
	s, ok := f.Tag.Lookup("gguf")
	if !ok {
		return tag{}, nil
	}
	if s == "-" {
		return tag{skip: true, tagged: true}, nil
	}
	t := tag{tagged: true}
	name, opts, _ := strings.Cut(s, ",")
	for _, o := range strings.Split(opts, ",") {
		switch o {
		case "":
		case "optional":
			t.optional = true
		default:
			return t, fmt.Errorf("unknown option %q", o)
		}
	}
	if name != "" {
		t.alts = strings.Split(name, "|")
		for _, a := range t.alts {
			if a == "" {
				return t, fmt.Errorf("empty alternative in %q", name)
			}
		}
	}
	return t, nil
}

// checkStruct validates the tags of a struct type, recursively; open holds the struct types
// being checked, to refuse recursive types (which probing could not bound).
func checkStruct(typ reflect.Type, path string, open map[reflect.Type]bool) error {
	if open[typ] {
		return fmt.Errorf("%s: recursive type %s cannot be bound", path, typ)
	}
	open[typ] = true
	defer delete(open, typ)
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		fpath := path + "." + f.Name
		t, err := parseTag(f)
		if err != nil {
			return fmt.Errorf("%s: tag %q: %w", fpath, f.Tag.Get("gguf"), err)
		}
		if t.skip {
			continue
		}
		if !f.IsExported() {
			if t.tagged {
				return fmt.Errorf("%s: unexported field cannot be bound", fpath)
			}
			continue
		}
		ft := f.Type
		switch {
		case isLeaf(ft):
			if len(t.alts) == 0 {
				return fmt.Errorf("%s: Tensor field needs a gguf tag with its name", fpath)
			}
			if err := noIndex(t); err != nil {
				return fmt.Errorf("%s: %w", fpath, err)
			}
		case ft.Kind() == reflect.Struct:
			if err := noIndex(t); err != nil {
				return fmt.Errorf("%s: %w", fpath, err)
			}
			if err := checkStruct(ft, fpath, open); err != nil {
				return err
			}
		case ft.Kind() == reflect.Slice || ft.Kind() == reflect.Array:
			et := ft.Elem()
			if !isLeaf(et) && et.Kind() != reflect.Struct {
				if t.tagged {
					return fmt.Errorf("%s: %s cannot be bound (want Tensor, a struct, or a slice or array of them)", fpath, ft)
				}
				continue
			}
			if len(t.alts) == 0 {
				return fmt.Errorf("%s: %s needs a gguf tag with %%d for the index", fpath, ft)
			}
			for _, a := range t.alts {
				if strings.Count(a, "%d") != 1 || strings.Count(a, "%") != 1 {
					return fmt.Errorf("%s: tag %q must hold %%d exactly once (and no other %%)", fpath, a)
				}
			}
			if et.Kind() == reflect.Struct && !isLeaf(et) {
				if err := checkStruct(et, fpath+"[]", open); err != nil {
					return err
				}
			}
		default:
			if t.tagged {
				return fmt.Errorf("%s: %s cannot be bound (want Tensor, a struct, or a slice or array of them)", fpath, ft)
			}
		}
	}
	return nil
}

func noIndex(t tag) error {
	for _, a := range t.alts {
		if strings.Contains(a, "%") {
			return fmt.Errorf("tag %q: %%d only goes on slices and arrays", a)
		}
	}
	return nil
}

type binder struct {
	src     Source
	alloc   engine.Allocator
	display string
	e       *BindError
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

func (b *binder) bindStruct(v reflect.Value, prefix string) {
	typ := v.Type()
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		t, _ := parseTag(f) // validated by checkStruct
		if t.skip || !f.IsExported() {
			continue
		}
		fv := v.Field(i)
		ft := f.Type
		switch {
		case isLeaf(ft):
			b.bindTensor(fv, prefix, t.alts, t.optional)
		case ft.Kind() == reflect.Struct:
			if !t.tagged || len(t.alts) == 0 {
				if t.optional && !b.anyPresent(ft, prefix) {
					continue
				}
				b.bindStruct(fv, prefix)
				continue
			}
			p, ok := b.choosePrefix(ft, prefix, t.alts)
			if !ok && t.optional {
				continue
			}
			b.bindStruct(fv, p)
		case ft.Kind() == reflect.Slice || ft.Kind() == reflect.Array:
			et := ft.Elem()
			if len(t.alts) == 0 || (!isLeaf(et) && et.Kind() != reflect.Struct) {
				continue // untagged, ignored
			}
			b.bindList(fv, prefix, t)
		}
	}
}

// choosePrefix picks the first alternative prefix under which the source has a tensor of
// the struct type; ok is false when it has none (the first alternative is returned).
func (b *binder) choosePrefix(typ reflect.Type, prefix string, alts []string) (string, bool) {
	for _, a := range alts {
		if p := join(prefix, a); b.anyPresent(typ, p) {
			return p, true
		}
	}
	return join(prefix, alts[0]), false
}

func (b *binder) bindList(v reflect.Value, prefix string, t tag) {
	et := v.Type().Elem()
	at := func(i int) []string {
		out := make([]string, len(t.alts))
		for k, a := range t.alts {
			out[k] = join(prefix, strings.Replace(a, "%d", strconv.Itoa(i), 1))
		}
		return out
	}
	present := func(i int) bool {
		for _, name := range at(i) {
			if isLeaf(et) {
				if b.src.Has(name) {
					return true
				}
			} else if b.anyPresent(et, name) {
				return true
			}
		}
		return false
	}
	n := v.Len()
	if v.Kind() == reflect.Slice && n == 0 {
		for n < maxProbe && present(n) {
			n++
		}
		if n == 0 {
			if t.optional {
				return
			}
			n = 1 // bind element 0 so that its names are reported missing
		}
		v.Set(reflect.MakeSlice(v.Type(), n, n))
	} else if t.optional && !present(0) {
		// A pre-sized optional group: nothing of it is present.
		allAbsent := true
		for i := 1; i < n && allAbsent; i++ {
			allAbsent = !present(i)
		}
		if allAbsent {
			return
		}
	}
	for i := 0; i < n; i++ {
		names := at(i)
		if isLeaf(et) {
			b.bindTensor(v.Index(i), "", names, t.optional)
			continue
		}
		p := names[0]
		for _, name := range names {
			if b.anyPresent(et, name) {
				p = name
				break
			}
		}
		b.bindStruct(v.Index(i), p)
	}
}

// anyPresent reports whether the source has any tensor the struct type would bind under
// prefix (slices are probed at index 0).
func (b *binder) anyPresent(typ reflect.Type, prefix string) bool {
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		t, _ := parseTag(f)
		if t.skip || !f.IsExported() {
			continue
		}
		ft := f.Type
		switch {
		case isLeaf(ft):
			for _, a := range t.alts {
				if b.src.Has(join(prefix, a)) {
					return true
				}
			}
		case ft.Kind() == reflect.Struct:
			if len(t.alts) == 0 {
				if b.anyPresent(ft, prefix) {
					return true
				}
				continue
			}
			for _, a := range t.alts {
				if b.anyPresent(ft, join(prefix, a)) {
					return true
				}
			}
		case ft.Kind() == reflect.Slice || ft.Kind() == reflect.Array:
			et := ft.Elem()
			if len(t.alts) == 0 || (!isLeaf(et) && et.Kind() != reflect.Struct) {
				continue
			}
			for _, a := range t.alts {
				name := join(prefix, strings.Replace(a, "%d", "0", 1))
				if isLeaf(et) && b.src.Has(name) {
					return true
				}
				if !isLeaf(et) && b.anyPresent(et, name) {
					return true
				}
			}
		}
	}
	return false
}

// bindTensor binds one Tensor field: names are the alternatives (joined to prefix).
func (b *binder) bindTensor(v reflect.Value, prefix string, alts []string, optional bool) {
	if r, ok := v.Addr().Interface().(Requirer); ok && r.Required() {
		optional = false
	}
	name := ""
	for _, a := range alts {
		if n := join(prefix, a); b.src.Has(n) {
			name = n
			break
		}
	}
	if name == "" {
		if !optional {
			full := make([]string, len(alts))
			for i, a := range alts {
				full[i] = b.display + join(prefix, a)
			}
			b.e.Missing = append(b.e.Missing, strings.Join(full, "|"))
		}
		return
	}
	if l, ok := v.Addr().Interface().(Leaf); ok {
		b.bindLeaf(l, name)
		return
	}
	data, shape, err := b.src.Get(name)
	if err != nil {
		b.e.Failed = append(b.e.Failed, Failure{Name: b.display + name, Err: err})
		return
	}
	t := v.Addr().Interface().(*Tensor)
	if t.Shape != nil && !shapeMatches(shape, t.Shape) {
		b.e.Misshapen = append(b.e.Misshapen, Mismatch{Name: b.display + name, Got: shape, Want: append([]int(nil), t.Shape...)})
		return
	}
	if data == nil {
		data = []float32{} // present, even with no elements
	}
	t.Data, t.Shape = data, shape
}

func (b *binder) bindLeaf(l Leaf, name string) {
	fail := func(err error) { b.e.Failed = append(b.e.Failed, Failure{Name: b.display + name, Err: err}) }
	if b.alloc == nil {
		fail(fmt.Errorf("%T binds to a backend's buffers: use BindTo", l))
		return
	}
	shape, ok := []int(nil), false
	if s, is := b.src.(Shaper); is {
		shape, ok = s.Shape(name)
	}
	if !ok {
		var err error
		if _, shape, err = b.src.Get(name); err != nil {
			fail(err)
			return
		}
	}
	if want := l.Want(); want != nil && !shapeMatches(shape, want) {
		b.e.Misshapen = append(b.e.Misshapen, Mismatch{Name: b.display + name, Got: shape, Want: append([]int(nil), want...)})
		return
	}
	if err := l.Load(b.src, name, shape, b.alloc); err != nil {
		fail(err)
	}
}

func shapeMatches(got, want []int) bool {
	if len(got) != len(want) {
		return false
	}
	for i, w := range want {
		if w != -1 && got[i] != w {
			return false
		}
	}
	return true
}

// Under is the view of src under a dotted prefix ("model.layers.3."): a loader binds one
// layer at a time through it, copies it into buffers and drops it before the next, so the
// float32 copies of a large model never all exist at once. Errors name the full tensor.
func Under(src Source, prefix string) Source { return under{src, prefix} }

type under struct {
	src    Source
	prefix string
}

func (u under) Get(name string) ([]float32, []int, error) { return u.src.Get(u.prefix + name) }
func (u under) Has(name string) bool                      { return u.src.Has(u.prefix + name) }

// Prefix is the full prefix, for the names in binding errors.
func (u under) Prefix() string {
	if q, ok := u.src.(interface{ Prefix() string }); ok {
		return q.Prefix() + u.prefix
	}
	return u.prefix
}

// RawSource hands out tensors as stored (*gguf.Model), for loaders that keep a file's
// encoding instead of converting to float32.
type RawSource interface {
	Raw(name string) ([]byte, gguf.DType, []int, error)
}

// Done tells src, when it can be told (gguf.Model.Done), that a loader has copied raw from
// it, so its file pages may leave resident memory.
func Done(src RawSource, raw []byte) {
	if d, ok := src.(interface{ Done([]byte) }); ok {
		d.Done(raw)
	}
}

// AsRaw is src as a RawSource, when it or the source an Under view wraps is one.
func AsRaw(src Source) (RawSource, bool) {
	switch s := src.(type) {
	case under:
		if r, ok := AsRaw(s.src); ok {
			return rawUnder{r, s.prefix}, true
		}
	case RawSource:
		return s, true
	}
	return nil, false
}

type rawUnder struct {
	src    RawSource
	prefix string
}

func (r rawUnder) Raw(name string) ([]byte, gguf.DType, []int, error) {
	return r.src.Raw(r.prefix + name)
}
func (r rawUnder) Done(raw []byte) { Done(r.src, raw) }

// Shaper is a source that can tell a tensor's shape without reading its data.
type Shaper interface {
	Shape(name string) ([]int, bool)
}

// Shape reports a tensor's shape through the wrapped source when it can tell it without
// reading the data.
func (u under) Shape(name string) ([]int, bool) {
	if s, ok := u.src.(Shaper); ok {
		return s.Shape(u.prefix + name)
	}
	return nil, false
}

// Encoder is implemented by Leaf types whose tensor feeds only Linear or GatherRows and so
// may stay in a quantised file encoding.
type Encoder interface{ Encoded() bool }

// Specs lists the tensors the struct dst points to declares, in field order: every Tensor or
// Leaf field whose expected shape is fully given (no -1), under its first alternative name.
// Slices contribute the elements they hold (size them first). It is the tensor table that
// random-weight generators write, derived from the same declaration Bind reads.
func Specs(dst any) ([]Spec, error) {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("weights: Specs needs a non-nil pointer to a struct, got %T", dst)
	}
	if err := checkStruct(v.Elem().Type(), v.Elem().Type().String(), map[reflect.Type]bool{}); err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	var out []Spec
	specsOf(v.Elem(), "", &out)
	return out, nil
}

func specsOf(v reflect.Value, prefix string, out *[]Spec) {
	typ := v.Type()
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		t, _ := parseTag(f) // validated by checkStruct
		if t.skip || !f.IsExported() {
			continue
		}
		fv, ft := v.Field(i), f.Type
		switch {
		case isLeaf(ft):
			leafSpec(fv, join(prefix, t.alts[0]), out)
		case ft.Kind() == reflect.Struct:
			p := prefix
			if len(t.alts) > 0 {
				p = join(prefix, t.alts[0])
			}
			specsOf(fv, p, out)
		case ft.Kind() == reflect.Slice || ft.Kind() == reflect.Array:
			if len(t.alts) == 0 || (!isLeaf(ft.Elem()) && ft.Elem().Kind() != reflect.Struct) {
				continue
			}
			for k := 0; k < fv.Len(); k++ {
				name := join(prefix, strings.Replace(t.alts[0], "%d", strconv.Itoa(k), 1))
				if isLeaf(ft.Elem()) {
					leafSpec(fv.Index(k), name, out)
				} else {
					specsOf(fv.Index(k), name, out)
				}
			}
		}
	}
}

func leafSpec(v reflect.Value, name string, out *[]Spec) {
	var shape []int
	encoded := false
	if l, ok := v.Addr().Interface().(Leaf); ok {
		shape = l.Want()
		if e, ok := l.(Encoder); ok {
			encoded = e.Encoded()
		}
	} else {
		shape = v.Interface().(Tensor).Shape
	}
	if shape == nil || slices.Contains(shape, -1) {
		return
	}
	*out = append(*out, Spec{Name: name, Shape: append([]int(nil), shape...), Encoded: encoded})
}
