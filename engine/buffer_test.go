package engine

import (
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/cgo"
)

// deviceMem is memory a program cannot address from the host (what a GPU backend's Alloc
// returns): writes land in a Go slice the CPU backend never sees.
type deviceMem struct{ b []byte }

func (d *deviceMem) Bytes() int64 { return int64(len(d.b)) }
func (d *deviceMem) Free()        { d.b = nil }
func (d *deviceMem) Write(off int64, p []byte) error {
	copy(d.b[off:], p)
	return nil
}
func (d *deviceMem) Read(off int64, p []byte) error {
	copy(p, d.b[off:])
	return nil
}

type deviceAlloc struct{}

func (deviceAlloc) Alloc(name string, dtype DType, shape ...int64) (*Buffer, error) {
	return AllocBuffer(func(n int64) (Memory, error) { return &deviceMem{make([]byte, n)}, nil }, name, dtype, shape...)
}

func TestBackendBuffers(t *testing.T) {
	cpu, err := NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	w, err := Upload(cpu, "w", []float32{1, 2, 3, 4, 5, 6}, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	g := NewGraph("alloc")
	x := g.Input("x", F32, 1, 3)
	g.Output("y", g.Linear(x, g.Persistent(w), nil))
	prog, err := cpu.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	copy(prog.Input("x"), []float32{1, 1, 1})
	if err := prog.Run(); err != nil {
		t.Fatal(err)
	}
	if y := prog.Output("y"); y[0] != 6 || y[1] != 15 {
		t.Errorf("y = %v, want [6 15]", y)
	}

	// Q8_0 blocks are repacked into the decode kernel's layout on upload, into any memory.
	raw := make([]byte, cgo.WeightBytes(Q8_0, 8, 32))
	for _, a := range []Allocator{cpu, deviceAlloc{}} {
		b, err := UploadRaw(a, "q", Q8_0R8, raw, 8, 32)
		if err != nil {
			t.Fatalf("%T: %v", a, err)
		}
		if b.DType() != Q8_0R8 || b.Bytes() != cgo.WeightBytes(Q8_0R8, 8, 32) {
			t.Errorf("%T: %v, %d bytes", a, b.DType(), b.Bytes())
		}
		b.Free()
	}

	// A buffer in another backend's memory has no host view and is refused at compile.
	d, err := Upload(deviceAlloc{}, "d", []float32{1, 2, 3}, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if d.Float32s() != nil || d.Raw() != nil {
		t.Error("device memory has a host view")
	}
	g2 := NewGraph("foreign")
	g2.Output("y", g2.Add(g2.Input("x", F32, 1, 3), g2.Persistent(d)))
	if _, err := cpu.Compile(g2); err == nil || !strings.Contains(err.Error(), "not in host memory") {
		t.Errorf("compile with a device buffer: %v", err)
	}
}
