package weights_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
)

var _ weights.Source = (*gguf.Model)(nil)

// tinyModel writes a small GGUF in the audio.cpp packaging (namespace "enc", one long name
// stored as _audiocpp.<index>) and returns its Model view.
func tinyModel(t *testing.T, extra ...gguf.WriteTensor) *gguf.Model {
	t.Helper()
	type spec struct {
		name  string
		shape []int
	}
	specs := []spec{
		{"enc/embed.weight", []int{10, 4}},
		{"enc/layers.0.attn.q.weight", []int{4, 4}},
		{"enc/layers.0.attn.q.bias", []int{4}},
		{"enc/layers.0.norm.weight", []int{4}},
		{"enc/layers.1.attn.q.weight", []int{4, 4}},
		{"enc/layers.1.attn.q.bias", []int{4}},
		{"enc/layers.1.norm.1.weight", []int{4}}, // the other spelling
		{"enc/layers.2.attn.q.weight", []int{4, 4}},
		{"enc/layers.2.attn.q.bias", []int{4}},
		{"enc/layers.2.norm.weight", []int{4}},
		{"enc/convs.0.weight", []int{4, 1, 3}},
		{"enc/convs.1.weight", []int{4, 1, 3}},
		{"enc/convs.2.weight", []int{4, 1, 3}},
		{"enc/heads.0.w", []int{2}},
		{"enc/heads.1.w", []int{2}},
		{"enc/" + strings.Repeat("long_", 14) + "bias", []int{3}},
		{"enc/scale", nil},
		{"dec/out.weight", []int{2, 4}},
	}
	var names []string
	var ranks []int32
	var dims []int64
	var ts []gguf.WriteTensor
	for i, s := range specs {
		names = append(names, s.name)
		ranks = append(ranks, int32(len(s.shape)))
		n := 1
		for _, d := range s.shape {
			dims = append(dims, int64(d))
			n *= d
		}
		data := make([]float32, n)
		for j := range data {
			data[j] = float32(i) + float32(j)/100
		}
		phys := s.name
		if len(phys) >= 64 {
			phys = fmt.Sprintf("_audiocpp.%d", i)
		}
		shape := s.shape
		if len(shape) == 0 {
			shape = []int{1}
		}
		ts = append(ts, gguf.WriteTensor{Name: phys, Shape: shape, Type: gguf.F16, Data: data})
	}
	for _, e := range extra {
		names = append(names, e.Name)
		ranks = append(ranks, int32(len(e.Shape)))
		for _, d := range e.Shape {
			dims = append(dims, int64(d))
		}
		ts = append(ts, e)
	}
	kv := gguf.KV{}
	for k, v := range map[string]any{gguf.KeyTensorNames: names, gguf.KeyTensorRanks: ranks, gguf.KeyTensorShapes: dims} {
		if err := kv.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kv, ts); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	m, err := gguf.NewModel(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type layer struct {
	Attn struct {
		Q  weights.Tensor `gguf:"q.weight"`
		QB weights.Tensor `gguf:"q.bias"`
		K  weights.Tensor `gguf:"k.weight,optional"`
	} `gguf:"attn"`
	Norm weights.Tensor `gguf:"norm.weight|norm.1.weight"`
}

type encoder struct {
	Embed  weights.Tensor   `gguf:"embed.weight"`
	Layers []layer          `gguf:"layers.%d"`
	Convs  []weights.Tensor `gguf:"convs.%d.weight"`
	Heads  [2]struct {
		W weights.Tensor `gguf:"w"`
	} `gguf:"heads.%d"`
	Long    weights.Tensor `gguf:"long_long_long_long_long_long_long_long_long_long_long_long_long_long_bias"`
	Scale   weights.Tensor `gguf:"scale"`
	Missing weights.Tensor `gguf:"not_there,optional"`
	Extra   struct {
		A weights.Tensor `gguf:"a"`
		B weights.Tensor `gguf:"b,optional"`
	} `gguf:"extra,optional"`
	Absent []layer `gguf:"absent.%d,optional"`
	Dim    int     // config next to the weights: ignored
	Note   string  `gguf:"-"`
	hidden int
}

func TestBind(t *testing.T) {
	m := tinyModel(t)
	var w encoder
	w.Embed.Shape = []int{10, -1} // an expected shape with a wildcard
	if err := weights.Bind(m.Sub("enc"), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(w.Embed.Shape, []int{10, 4}) || len(w.Embed.Data) != 40 || w.Embed.Dim(-1) != 4 || w.Embed.Dim(0) != 10 {
		t.Errorf("embed: %v %d", w.Embed.Shape, len(w.Embed.Data))
	}
	if len(w.Layers) != 3 {
		t.Fatalf("%d layers, want 3 (probed)", len(w.Layers))
	}
	for i, l := range w.Layers {
		if !l.Attn.Q.Present() || !reflect.DeepEqual(l.Attn.Q.Shape, []int{4, 4}) || !l.Attn.QB.Present() || l.Attn.K.Present() {
			t.Errorf("layer %d: %+v", i, l.Attn)
		}
		if !l.Norm.Present() {
			t.Errorf("layer %d norm missing", i)
		}
	}
	// Layer 1's norm came from the second spelling; values identify the tensor index.
	if w.Layers[1].Norm.Data[0] != 6 || w.Layers[0].Norm.Data[0] != 3 {
		t.Errorf("norm values %v %v", w.Layers[0].Norm.Data[0], w.Layers[1].Norm.Data[0])
	}
	if len(w.Convs) != 3 || !reflect.DeepEqual(w.Convs[2].Shape, []int{4, 1, 3}) {
		t.Errorf("convs: %d", len(w.Convs))
	}
	if !w.Heads[1].W.Present() || w.Heads[1].W.Data[0] != 14 {
		t.Errorf("heads: %+v", w.Heads)
	}
	if !w.Long.Present() || w.Long.Data[0] != 15 {
		t.Errorf("long: %+v", w.Long)
	}
	if !w.Scale.Present() || len(w.Scale.Shape) != 0 || len(w.Scale.Data) != 1 {
		t.Errorf("scalar: %+v", w.Scale)
	}
	if w.Missing.Present() || w.Extra.A.Present() || w.Absent != nil {
		t.Error("optional fields should stay empty")
	}

	// A pre-sized slice binds exactly that many elements.
	var two struct {
		Layers []layer `gguf:"layers.%d"`
	}
	two.Layers = make([]layer, 2)
	if err := weights.Bind(m.Sub("enc"), &two); err != nil || len(two.Layers) != 2 {
		t.Errorf("pre-sized: %v, %d", err, len(two.Layers))
	}
	// The whole file, without a view: names carry the namespace.
	var whole struct {
		Out  weights.Tensor `gguf:"dec/out.weight"`
		Head struct {
			W weights.Tensor `gguf:"w"`
		} `gguf:"enc/heads.0"`
	}
	if err := weights.Bind(m, &whole); err != nil || !whole.Out.Present() || !whole.Head.W.Present() {
		t.Errorf("whole file: %v", err)
	}
}

func TestBindReportsEverything(t *testing.T) {
	m := tinyModel(t, gguf.WriteTensor{Name: "enc/q4", Shape: []int{32}, Type: gguf.Q4_0, Raw: make([]byte, 18)})
	var w struct {
		Embed  weights.Tensor   `gguf:"embed.weight"`
		Gone   weights.Tensor   `gguf:"gone.weight"`
		Layers [4]layer         `gguf:"layers.%d"`
		Convs  []weights.Tensor `gguf:"convs.%d.weight"`
		Q4     weights.Tensor   `gguf:"q4"`
		Extra  struct {
			A weights.Tensor `gguf:"w"`
			B weights.Tensor `gguf:"b"`
		} `gguf:"heads.0,optional"` // partly present: B is reported
		NoElem []struct {
			X weights.Tensor `gguf:"x"`
			Y weights.Tensor `gguf:"y,optional"`
		} `gguf:"blocks.%d"`
		Alt weights.Tensor `gguf:"alt1|alt2"`
	}
	w.Embed.Shape = []int{4, 10}
	w.Convs = make([]weights.Tensor, 3)
	w.Convs[1].Shape = []int{4, 3} // wrong rank
	w.Convs[2].Shape = []int{-1, 1, 3}
	err := weights.Bind(m.Sub("enc"), &w)
	var be *weights.BindError
	if !errors.As(err, &be) {
		t.Fatalf("error %v is not a *BindError", err)
	}
	t.Logf("%v", err)
	wantMissing := []string{
		"enc/gone.weight",
		"enc/layers.3.attn.q.weight", "enc/layers.3.attn.q.bias", "enc/layers.3.norm.weight|enc/layers.3.norm.1.weight",
		"enc/heads.0.b",
		"enc/blocks.0.x",
		"enc/alt1|enc/alt2",
	}
	if !reflect.DeepEqual(be.Missing, wantMissing) {
		t.Errorf("missing\n%q\nwant\n%q", be.Missing, wantMissing)
	}
	if len(be.Misshapen) != 2 || be.Misshapen[0].Name != "enc/embed.weight" || be.Misshapen[1].Name != "enc/convs.1.weight" ||
		!reflect.DeepEqual(be.Misshapen[0].Got, []int{10, 4}) || !reflect.DeepEqual(be.Misshapen[0].Want, []int{4, 10}) {
		t.Errorf("misshapen %+v", be.Misshapen)
	}
	if len(be.Failed) != 1 || be.Failed[0].Name != "enc/q4" || !strings.Contains(be.Failed[0].Err.Error(), "Q4_0 not supported") {
		t.Errorf("failed %+v", be.Failed)
	}
	msg := err.Error()
	for _, s := range append(wantMissing, "7 missing, 2 misshapen, 1 failed to load", "misshapen enc/convs.1.weight: shape [4 1 3], want [4 3]") {
		if !strings.Contains(msg, s) {
			t.Errorf("message lacks %q", s)
		}
	}
	// Good tensors were still bound, misshapen ones left as they were.
	if !w.Layers[2].Attn.Q.Present() || !w.Convs[2].Present() || w.Convs[1].Present() || w.Embed.Present() || !w.Extra.A.Present() {
		t.Error("partial binding")
	}
	if !reflect.DeepEqual(w.Convs[1].Shape, []int{4, 3}) {
		t.Errorf("misshapen field changed: %v", w.Convs[1].Shape)
	}
}

func TestBindDeclarationErrors(t *testing.T) {
	m := tinyModel(t)
	type rec struct {
		Sub []rec `gguf:"sub.%d"`
	}
	cases := []struct {
		dst  any
		want string
	}{
		{nil, "non-nil pointer to a struct"},
		{struct{}{}, "non-nil pointer to a struct"},
		{new(int), "non-nil pointer to a struct"},
		{&struct{ A weights.Tensor }{}, "A: Tensor field needs a gguf tag"},
		{&struct {
			A weights.Tensor `gguf:"a,required"`
		}{}, `unknown option "required"`},
		{&struct {
			A weights.Tensor `gguf:"a.%d"`
		}{}, "only goes on slices"},
		{&struct {
			A []weights.Tensor `gguf:"a"`
		}{}, "must hold %d exactly once"},
		{&struct {
			A []weights.Tensor `gguf:"a.%d.%d"`
		}{}, "must hold %d exactly once"},
		{&struct {
			A []weights.Tensor `gguf:"a.%s%d"`
		}{}, "no other %"},
		{&struct {
			N int `gguf:"n"`
		}{}, "int cannot be bound"},
		{&struct {
			N []float32 `gguf:"n.%d"`
		}{}, "[]float32 cannot be bound"},
		{&struct {
			a weights.Tensor `gguf:"a"`
		}{}, "unexported"},
		{&struct {
			A weights.Tensor `gguf:"a||b"`
		}{}, "empty alternative"},
		{&struct {
			S struct {
				A weights.Tensor
			} `gguf:"s"`
		}{}, "S.A: Tensor field needs a gguf tag"},
		{&rec{}, "recursive type"},
	}
	for _, c := range cases {
		err := weights.Bind(m, c.dst)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "weights: ") {
			t.Errorf("%T: error %v, want %q", c.dst, err, c.want)
		}
		var be *weights.BindError
		if errors.As(err, &be) {
			t.Errorf("%T: a declaration error should not be a BindError", c.dst)
		}
	}
}

// mapSource is a Source without a Prefix method.
type mapSource map[string][]int

func (s mapSource) Has(name string) bool { _, ok := s[name]; return ok }
func (s mapSource) Get(name string) ([]float32, []int, error) {
	shape, ok := s[name]
	if !ok {
		return nil, nil, fmt.Errorf("no %s", name)
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	return make([]float32, n), shape, nil
}

func TestBindPlainSource(t *testing.T) {
	src := mapSource{"a.0.w": {2}, "a.1.w": {2}, "a.3.w": {2}, "empty": {0, 5}}
	var w struct {
		A []struct {
			W weights.Tensor `gguf:"w"`
		} `gguf:"a.%d"`
		Empty weights.Tensor `gguf:"empty"`
		B     weights.Tensor `gguf:"b"`
	}
	err := weights.Bind(src, &w)
	// Probing stops at the first gap (a.2), and the message has no prefix.
	if len(w.A) != 2 || err == nil || !strings.Contains(err.Error(), "missing   b") {
		t.Errorf("%d elements, %v", len(w.A), err)
	}
	if !w.Empty.Present() || len(w.Empty.Data) != 0 {
		t.Errorf("a tensor with no elements is still present: %+v", w.Empty)
	}
}

func TestUnder(t *testing.T) {
	src := mapSource{"layers.3.w": {2, 4}, "w": {1}}
	var w struct {
		W weights.Tensor `gguf:"w"`
		X weights.Tensor `gguf:"x"`
	}
	err := weights.Bind(weights.Under(src, "layers.3."), &w)
	var be *weights.BindError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "layers.3.x") {
		t.Fatalf("missing tensor not named with its full name: %v", err)
	}
	if !slices.Equal(w.W.Shape, []int{2, 4}) {
		t.Errorf("bound %v", w.W.Shape)
	}
	if _, ok := weights.Under(src, "layers.3.").(weights.Shaper).Shape("w"); ok {
		t.Error("shape without a Shaper underneath")
	}
}
