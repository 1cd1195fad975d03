// Package engine is the Go side of voxpipe's inference engine: a graph builder with shape
// checks, a liveness planner that packs intermediates into one arena, persistent buffers that
// survive executions, and the Backend interface (CPU first) that runs a compiled plan in one
// call. Shapes are in PyTorch order.
package engine

import (
	"fmt"
	"slices"
	"strings"

	"github.com/voxpipe/voxpipe/cgo"
)

// DType is a tensor element type.
type DType = cgo.DType

// Element types.
const (
	F32 = cgo.F32
	I32 = cgo.I32
	// Q8_0 and F16 are weight encodings for persistent buffers (GGUF layouts): Linear reads
	// them directly and GatherRows dequantises the rows it picks. F16 is also a KV cache's
	// encoding: a persistent F16 buffer may be viewed (Slice, Reshape), written by ScatterRows
	// from F32 rows and read by Attention as its keys and values; no other op takes them.
	Q8_0 = cgo.Q8_0
	F16  = cgo.F16
	// Q8_0R8 is Q8_0 with rows interleaved by 8 (built by NewBufferRaw from Q8_0 blocks): the
	// layout the decode kernel reads fastest, for Linear weights only.
	Q8_0R8 = cgo.Q8_0R8
	// Q4_K and BF16 are weight encodings kept for their size (a quarter and a half of F32):
	// Linear widens panels of them to f32, GatherRows the rows it picks.
	Q4_K = cgo.Q4_K
	BF16 = cgo.BF16
	// F32P is an F32 Linear weight packed into panels at load (built by UploadRaw from F32
	// values): the layout the small-matrix kernel streams, for Linear weights only.
	F32P = cgo.F32P
	// F16P is an F16 Linear weight in the same panels (built by UploadRaw from F16 values),
	// for Linear weights only.
	F16P = cgo.F16P
)

type tensorKind int

const (
	kindIntermediate tensorKind = iota
	kindInput
	kindPersistent
)

// Tensor is a value in a Graph: a node's result, an input, a persistent buffer, or a view of
// one of those.
type Tensor struct {
	g  *Graph
	id int
}

type tensorInfo struct {
	shape   []int64
	stride  []int64
	dtype   DType
	kind    tensorKind
	base    int   // storage tensor id (itself unless a view)
	offset  int64 // elements from the base's first element
	name    string
	persist *Buffer // kindPersistent
	output  string  // non-empty: graph output under this name
	view    bool    // shares the storage of base
}

type node struct {
	op    cgo.Op
	src   []int
	dst   int
	ip    [8]int64
	fp    [4]float32
	label string
	alias bool // may run in place on src[0]
}

// Graph is a computation being built. Ops check shapes as they are added; the first error
// is kept (with the op, the shapes and the current label) and returned by Err and Compile,
// so model code can build without checking every call.
type Graph struct {
	name    string
	label   string
	tensors []tensorInfo
	nodes   []node
	inputs  map[string]int
	outputs map[string]int
	err     error
	// rowGroups > 1: the Linear nodes that follow take the rows of that many sessions
	// batched together (SetRowGroups).
	rowGroups int
}

// NewGraph starts an empty graph.
func NewGraph(name string) *Graph {
	return &Graph{name: name, inputs: map[string]int{}, outputs: map[string]int{}}
}

// Label sets the model-level name used in errors for the ops that follow (e.g.
// "encoder.layers.3.attn").
func (g *Graph) Label(s string) { g.label = s }

// SetRowGroups declares that the Linear nodes built after it multiply the rows of n
// independent sessions stacked in equal parts (n ≤ 1: one). The kernel for each product is
// then chosen by one session's rows, so with the row-independent kernels (F32, and F16/Q8_0
// where a session has ≤ 8 rows) every session's results are bit for bit what it gets alone.
func (g *Graph) SetRowGroups(n int) { g.rowGroups = n }

// Err is the first build error, if any.
func (g *Graph) Err() error { return g.err }

func (g *Graph) fail(op string, why string, ts ...Tensor) Tensor {
	if g.err == nil {
		shapes := make([]string, len(ts))
		for i, t := range ts {
			shapes[i] = fmt.Sprint(t.Shape())
		}
		where := g.name
		if g.label != "" {
			where += ": " + g.label
		}
		for _, t := range ts {
			// Whatever check tripped, a quantised operand is the likely cause: say so.
			if ti := t.info(); IsQuantized(ti.dtype) && !strings.Contains(why, "quantised weight") {
				why += "; " + quantMisuse(ti)
				break
			}
		}
		g.err = fmt.Errorf("engine: %s: %s(%s): %s", where, op, strings.Join(shapes, ", "), why)
	}
	return g.dummy()
}

// dummy is what a failed op returns: a valid scalar so building can continue.
func (g *Graph) dummy() Tensor {
	return g.newTensor(tensorInfo{shape: []int64{1}, dtype: F32})
}

func (g *Graph) newTensor(ti tensorInfo) Tensor {
	id := len(g.tensors)
	if ti.stride == nil {
		ti.stride = cgo.Contiguous(ti.shape)
	}
	if !ti.view {
		ti.base = id
	}
	g.tensors = append(g.tensors, ti)
	return Tensor{g, id}
}

// view makes a tensor that reads t's storage with another shape, strides and offset.
func (g *Graph) view(t Tensor, shape, stride []int64, offset int64) Tensor {
	ti := t.info()
	if IsQuantized(ti.dtype) && ti.dtype != F16 {
		return g.fail("View", quantMisuse(ti), t)
	}
	return g.newTensor(tensorInfo{shape: shape, stride: stride, dtype: ti.dtype, kind: ti.kind,
		base: ti.base, offset: ti.offset + offset, view: true, persist: ti.persist, name: ti.name})
}

func (t Tensor) info() *tensorInfo { return &t.g.tensors[t.id] }

// Shape is the tensor's shape (PyTorch order).
func (t Tensor) Shape() []int64 { return slices.Clone(t.info().shape) }

// Dim is the size of axis i (negative counts from the end).
func (t Tensor) Dim(i int) int64 {
	s := t.info().shape
	if i < 0 {
		i += len(s)
	}
	if i < 0 || i >= len(s) {
		return 0
	}
	return s[i]
}

// Rank is the number of dimensions.
func (t Tensor) Rank() int { return len(t.info().shape) }

// DType is the element type.
func (t Tensor) DType() DType { return t.info().dtype }

func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func validShape(shape []int64) bool {
	if len(shape) > cgo.MaxDims {
		return false
	}
	for _, d := range shape {
		if d <= 0 {
			return false
		}
	}
	return true
}

// Input declares a graph input filled by the caller before each run.
func (g *Graph) Input(name string, dtype DType, shape ...int64) Tensor {
	if _, dup := g.inputs[name]; dup {
		return g.fail("Input", fmt.Sprintf("input %q declared twice", name))
	}
	if !validShape(shape) {
		return g.fail("Input", fmt.Sprintf("input %q: invalid shape %v", name, shape))
	}
	t := g.newTensor(tensorInfo{shape: slices.Clone(shape), dtype: dtype, kind: kindInput, name: name})
	g.inputs[name] = t.id
	return t
}

// Persistent uses a buffer that lives outside the arena and survives executions: weights,
// caches, streaming state, per-shape constants.
func (g *Graph) Persistent(b *Buffer) Tensor {
	if b == nil {
		return g.fail("Persistent", "nil buffer")
	}
	return g.newTensor(tensorInfo{shape: slices.Clone(b.shape), dtype: b.dtype, kind: kindPersistent, name: b.name, persist: b})
}

// Output marks t as a result readable after each run under name. Outputs live outside the
// arena, so nothing later overwrites them.
func (g *Graph) Output(name string, t Tensor) {
	if g.err != nil {
		return
	}
	if _, dup := g.outputs[name]; dup {
		g.fail("Output", fmt.Sprintf("output %q declared twice", name), t)
		return
	}
	ti := t.info()
	if ti.kind != kindIntermediate || ti.view || ti.output != "" {
		// An input, a persistent buffer, a view or another output: copy it out.
		t = g.copyOf(t)
		ti = t.info()
	}
	ti.output = name
	g.outputs[name] = t.id
}

// addNode appends a node producing a new contiguous tensor of the given shape.
func (g *Graph) addNode(op cgo.Op, shape []int64, dtype DType, src []Tensor, ip [8]int64, fp [4]float32) Tensor {
	for i, s := range src {
		if IsQuantized(s.DType()) && !(op == cgo.OpLinearQ && i == 1) && !(op == cgo.OpGatherRows && i == 0) &&
			!(op == cgo.OpConv2D && i == 1 && s.DType() == F32P && ip[6] == 1) &&
			!(op == cgo.OpConv1D && i == 1 && s.DType() == F32P && ip[4] == 1) &&
			!(op == cgo.OpAttention && (i == 1 || i == 2) && s.DType() == F16) {
			return g.fail(opName(op), quantMisuse(s.info()), src...)
		}
	}
	out := g.newTensor(tensorInfo{shape: shape, dtype: dtype})
	ids := make([]int, len(src))
	for i, s := range src {
		ids[i] = s.id
	}
	g.nodes = append(g.nodes, node{op: op, src: ids, dst: out.id, ip: ip, fp: fp, label: g.label})
	return out
}

func (g *Graph) owns(ts ...Tensor) bool {
	for _, t := range ts {
		if t.g != g {
			return false
		}
	}
	return true
}

// NumNodes is the number of kernel calls so far.
func (g *Graph) NumNodes() int { return len(g.nodes) }

// quantMisuse explains why a Q8_0/F16 tensor cannot go where it was used.
func quantMisuse(ti *tensorInfo) string {
	if ti.dtype == F16 {
		return fmt.Sprintf("F16 tensor %q feeds only Linear (as the weight [out, in]), GatherRows (as the table), ScatterRows (as the table, from F32 rows) and Attention (as keys and values)", ti.name)
	}
	return fmt.Sprintf("%s tensor %q is a quantised weight: it feeds only Linear (as the weight [out, in]) and GatherRows (as the table), without views", dtypeName(ti.dtype), ti.name)
}

var opNames = map[cgo.Op]string{
	cgo.OpCopy: "Copy", cgo.OpConcat: "Concat", cgo.OpPad: "Pad", cgo.OpGatherRows: "GatherRows",
	cgo.OpInterpLinear: "InterpLinear", cgo.OpUnary: "Unary", cgo.OpBinary: "Binary",
	cgo.OpSnakeBeta: "SnakeBeta", cgo.OpLayerNorm: "LayerNorm", cgo.OpRMSNorm: "RMSNorm",
	cgo.OpGroupNorm: "GroupNorm", cgo.OpChannelAffine: "ChannelAffine", cgo.OpSoftmax: "Softmax",
	cgo.OpReduce: "Reduce", cgo.OpCumsum: "Cumsum", cgo.OpMatmul: "Matmul", cgo.OpConv1D: "Conv1D",
	cgo.OpConv2D: "Conv2D", cgo.OpConvTranspose1D: "ConvTranspose1D", cgo.OpRoPE: "RoPE",
	cgo.OpAttention: "Attention", cgo.OpScatterRows: "ScatterRows", cgo.OpLinearQ: "Linear",
}

func opName(op cgo.Op) string {
	if s, ok := opNames[op]; ok {
		return s
	}
	return fmt.Sprintf("Op(%d)", int32(op))
}
