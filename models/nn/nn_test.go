package nn

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
)

type block struct {
	Norm LayerNorm `gguf:"norm"`
	FF   Linear    `gguf:"ff"`
}

type model struct {
	Embed  Embedding `gguf:"embed"`
	Blocks []block   `gguf:"blocks.%d"`
	Conv   Conv1d    `gguf:"conv"`
}

func declare(n, d int) *model {
	m := &model{Embed: NewEmbedding(10, d), Blocks: make([]block, n), Conv: NewConv1d(d, d, 3, d, true)}
	for i := range m.Blocks {
		m.Blocks[i] = block{Norm: NewLayerNorm(d), FF: NewLinear(d, 2*d, false)}
	}
	return m
}

// q8Source serves a Mem with its 2-D tensors as Q8_0, like a quantised file.
type q8Source struct{ weights.Mem }

func (q q8Source) Raw(name string) ([]byte, gguf.DType, []int, error) {
	t := q.Mem[name]
	if len(t.Shape) != 2 {
		return nil, gguf.BF16, t.Shape, nil // an encoding the engine does not keep: converted
	}
	raw, err := gguf.QuantizeQ8_0(t.Data)
	return raw, gguf.Q8_0, t.Shape, err
}

func TestSpecsAndBind(t *testing.T) {
	specs := Specs(declare(2, 32))
	var names []string
	for _, s := range specs {
		names = append(names, s.Name)
	}
	want := "embed.weight blocks.0.norm.weight blocks.0.norm.bias blocks.0.ff.weight blocks.1.norm.weight blocks.1.norm.bias blocks.1.ff.weight conv.weight conv.bias"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("specs %s\nwant  %s", got, want)
	}
	if !specs[0].Encoded || specs[1].Encoded || !specs[3].Encoded || !reflect.DeepEqual(specs[7].Shape, []int{32, 1, 3}) {
		t.Errorf("specs %+v", specs)
	}
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	src := weights.Random(specs, 1)

	m := declare(2, 32)
	if err := Bind(src, be, m); err != nil {
		t.Fatal(err)
	}
	if dt := m.Blocks[1].FF.Weight.Buf.DType(); dt != engine.F32P { // packed for the small-matrix kernel
		t.Errorf("F32 source: Linear weight %v, want F32P", dt)
	}
	if dt := m.Blocks[1].Norm.Weight.Buf.DType(); dt != engine.F32 {
		t.Errorf("F32 source: norm weight %v, want F32", dt)
	}
	Free(m)
	if m.Blocks[0].FF.Weight.Present() {
		t.Error("Free left a buffer")
	}

	q := declare(0, 32) // slices sized by probing
	q.Blocks = nil
	if err := Bind(q8Source{src}, be, q); err != nil {
		t.Fatal(err)
	}
	defer Free(q)
	if len(q.Blocks) != 2 || q.Blocks[0].FF.Weight.Buf.DType() != engine.Q8_0R8 || q.Embed.Weight.Buf.DType() != engine.Q8_0 ||
		q.Blocks[0].Norm.Weight.Buf.DType() != engine.F32 {
		t.Errorf("quantised source: %d blocks, ff %v, embed %v", len(q.Blocks), q.Blocks[0].FF.Weight.Buf.DType(), q.Embed.Weight.Buf.DType())
	}

	bad := declare(2, 16)
	err = Bind(src, be, bad)
	var be2 *weights.BindError
	if !errors.As(err, &be2) || len(be2.Misshapen) == 0 || bad.Embed.Weight.Present() {
		t.Errorf("misshapen bind: %v", err)
	}
}

// A bias a layer was declared with is required despite the ",optional" tag; a layer declared
// without one binds with or without it.
func TestDeclaredBias(t *testing.T) {
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	type net struct {
		A Linear `gguf:"a"`
		B Linear `gguf:"b"`
	}
	src := weights.Random([]weights.Spec{{Name: "a.weight", Shape: []int{4, 3}}, {Name: "b.weight", Shape: []int{4, 3}}}, 1)
	w := net{A: NewLinear(3, 4, false), B: NewLinear(3, 4, true)}
	err = Bind(src, be, &w)
	var be2 *weights.BindError
	if !errors.As(err, &be2) || len(be2.Missing) != 1 || be2.Missing[0] != "b.bias" || w.A.Weight.Present() {
		t.Fatalf("bind without b.bias: %v", err)
	}
	w = net{A: NewLinear(3, 4, false), B: NewLinear(3, 4, false)}
	if err := Bind(src, be, &w); err != nil || w.B.Bias.Present() {
		t.Fatalf("bind of biasless layers: %v", err)
	}
	Free(&w)

	// Shape-only buffers plan a graph without memory.
	s := declare(1, 32)
	ShapeOnly(s)
	if b := s.Blocks[0].FF.Weight.Buf; b == nil || b.Shape()[0] != 64 || b.Raw() != nil {
		t.Errorf("shape-only weight %v", b)
	}
}

// An ungrouped Conv1d with rows of 64 values or more loads packed (F32P) and convolves as the
// same layer kept in F32 does, within float32 rounding; grouped and 1-wide ones stay F32.
func TestConv1dPacked(t *testing.T) {
	type net struct {
		Packed    Conv1d `gguf:"a"`
		Plain     Conv1d `gguf:"a"` // the same weights, declared without NewConv1d: unpacked
		Depthwise Conv1d `gguf:"dw"`
		Pointwise Conv1d `gguf:"pw"`
	}
	declareNet := func() *net {
		return &net{Packed: NewConv1d(32, 24, 3, 1, true), Plain: Conv1d{Weight: Shaped(24, 32, 3), Bias: Shaped(24)},
			Depthwise: NewConv1d(32, 32, 5, 32, true), Pointwise: NewConv1d(32, 24, 1, 1, false)}
	}
	be, err := engine.NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	m := declareNet()
	if err := Bind(weights.Random(Specs(declareNet()), 3), be, m); err != nil {
		t.Fatal(err)
	}
	defer Free(m)
	for _, c := range []struct {
		name string
		got  engine.DType
		want engine.DType
	}{{"packed", m.Packed.Weight.Buf.DType(), engine.F32P}, {"plain", m.Plain.Weight.Buf.DType(), engine.F32},
		{"depthwise", m.Depthwise.Weight.Buf.DType(), engine.F32}, {"pointwise", m.Pointwise.Weight.Buf.DType(), engine.F32}} {
		if c.got != c.want {
			t.Errorf("%s conv weight %v, want %v", c.name, c.got, c.want)
		}
	}
	g := engine.NewGraph("conv1d")
	x := g.Input("x", engine.F32, 2, 32, 11)
	g.Output("packed", m.Packed.Forward(g, x, 2, 3, 1, 2))
	g.Output("plain", m.Plain.Forward(g, x, 2, 3, 1, 2))
	prog, err := be.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for i := range prog.Input("x") {
		prog.Input("x")[i] = float32(i%13-6) * 0.1
	}
	if err := prog.Run(); err != nil {
		t.Fatal(err)
	}
	got, want := prog.Output("packed"), prog.Output("plain")
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("%d outputs packed, %d plain", len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("output %d: packed %v, plain %v", i, got[i], want[i])
		}
	}
}
