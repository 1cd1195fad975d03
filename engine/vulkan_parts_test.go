package engine

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// A weight larger than the device binds at once is held in parts of whole rows (here the
// limit is lowered to 8 rows' bytes: 21 rows make parts of 8, 8 and 5). Its bytes read back
// as written, across part boundaries too; GatherRows from it (indices in every part) and
// Linear by it (Q8_0, F16, Q4_K and F32, the last a Matmul; with and without bias, x with a
// leading axis) give bit for bit what the same graph gives with the weight whole; a view
// inside one part reads that part; any other op on the whole weight is a compile error that
// names it.
func TestVulkanBuffersInParts(t *testing.T) {
	v := vulkanBackend(t)
	rng := rand.New(rand.NewPCG(45, 46))
	const n = 21
	idx := []int32{20, 0, 8, 7, 15, 16, 3, 20}
	for _, c := range []struct {
		dt DType
		k  int64
	}{{Q8_0, 96}, {F16, 40}, {Q4_K, 256}, {F32, 37}} {
		name := dtypeName(c.dt)
		wf := make([]float32, n*c.k)
		for i := range wf {
			wf[i] = float32(rng.NormFloat64() * 0.5)
		}
		raw, _ := lqEncode(t, wf, c.dt)
		bias := make([]float32, n)
		for i := range bias {
			bias[i] = float32(rng.NormFloat64())
		}
		row := int64(len(raw)) / n
		outs := map[bool]map[string][]float32{}
		for _, inParts := range []bool{false, true} {
			v.LimitBufferBytes(0)
			if inParts {
				v.LimitBufferBytes(8*row + 5)
			}
			w := lqUpload(t, v, "embed", c.dt, raw, n, c.k)
			defer w.Free()
			if m := w.mem.(vkMem); inParts && len(m.parts) != 3 {
				t.Fatalf("%s: %d parts of %d bytes for %d bytes", name, len(m.parts), m.partBytes, len(raw))
			}
			back := make([]byte, len(raw))
			if err := w.Read(0, back); err != nil || !bytes.Equal(back, raw) {
				t.Fatalf("%s in parts %v: read back %v", name, inParts, err)
			}
			bb, err := Upload(v, "b", bias, n)
			if err != nil {
				t.Fatal(err)
			}
			defer bb.Free()
			p := lqRun(t, v, func(g *Graph) func() {
				g.Label("embed")
				g.Output("rows", g.GatherRows(g.Persistent(w), g.Input("idx", I32, int64(len(idx)))))
				g.Label("head")
				bt := g.Persistent(bb)
				x := g.Input("x", F32, 2, 3, c.k)
				g.Output("y", g.Linear(x, g.Persistent(w), &bt))
				g.Output("y0", g.Linear(x, g.Persistent(w), nil))
				if c.dt == F32 { // rows 1…2 and 17…18: each inside one part
					g.Output("first", g.Scale(g.Slice(g.Persistent(w), 0, 1, 3), 2, 0))
					g.Output("last", g.Scale(g.Slice(g.Persistent(w), 0, 17, 19), 2, 0))
				}
				return func() {}
			}, idx)
			outs[inParts] = map[string][]float32{}
			for _, o := range []string{"rows", "y", "y0", "first", "last"} {
				outs[inParts][o] = p.Output(o)
			}
		}
		for o, want := range outs[false] {
			got := outs[true][o]
			if len(got) != len(want) {
				t.Fatalf("%s %s: %d values in parts, %d whole", name, o, len(got), len(want))
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s %s[%d]: %v with the weight in parts, %v whole", name, o, i, got[i], want[i])
				}
			}
		}
	}

	// Bytes written across a part boundary at odd offsets read back, their neighbours kept.
	v.LimitBufferBytes(64)
	w, err := Upload(v, "table", make([]float32, 40), 10, 4) // 16-byte rows: parts of 4 rows
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	if m := w.mem.(vkMem); len(m.parts) != 3 || m.partBytes != 64 {
		t.Fatalf("a 160-byte table under a 64-byte limit: %d parts of %d bytes", len(m.parts), m.partBytes)
	}
	if err := w.Write(61, []byte{1, 2, 3, 4, 5, 6, 7}); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 11)
	if err := w.Read(59, back); err != nil || !bytes.Equal(back, []byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 0}) {
		t.Fatalf("bytes 59…69 across the first boundary: %v, %v", back, err)
	}
	if err := w.Read(150, make([]byte, 11)); err == nil {
		t.Error("a read past the end of a buffer in parts")
	}

	// The whole weight as an operand of anything but GatherRows and Linear is refused.
	g := NewGraph("parted")
	g.Label("scaled.table")
	g.Output("y", g.Scale(g.Persistent(w), 2, 0))
	if _, err := v.Compile(g); err == nil || !strings.Contains(err.Error(), `buffer "table"`) || !strings.Contains(err.Error(), "3 parts") || !strings.Contains(err.Error(), "scaled.table") {
		t.Errorf("Scale of a whole table in parts: %v", err)
	}
	g = NewGraph("parted.write")
	g.Assign(g.Persistent(w), g.Input("x", F32, 10, 4))
	if _, err := v.Compile(g); err == nil || !strings.Contains(err.Error(), `writes buffer "table"`) {
		t.Errorf("Assign to a whole table in parts: %v", err)
	}
	// A row wider than the limit cannot be cut.
	if _, err := Upload(v, "wide", make([]float32, 40), 2, 20); err == nil || !strings.Contains(err.Error(), "whole rows") {
		t.Errorf("80-byte rows under a 64-byte limit: %v", err)
	}
}
