package cgo

import "testing"

// TestProfile: a profiled context counts each node's op and time; StopProfile ends it (a
// second Stop has nothing), and runs without a profile count nothing.
func TestProfile(t *testing.T) {
	ctx, err := NewContext(2)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	buf, err := Alloc(4 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	x := Tensor{Data: buf.Ptr(), DType: F32, Shape: []int64{4096}, Stride: []int64{1}}
	// Two nodes a run: x = x + x (binary add, in place) and a copy of x onto itself.
	p, err := NewPlan([]Node{{Op: OpBinary, Src: []int{0, 0}, Dst: 0}, {Op: OpCopy, Src: []int{0}, Dst: 0}}, []Tensor{x})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Free()
	if err := ctx.Execute(p); err != nil { // not profiled
		t.Fatal(err)
	}
	ctx.StartProfile()
	for range 3 {
		if err := ctx.Execute(p); err != nil {
			t.Fatal(err)
		}
	}
	got, shapes := ctx.StopProfileShapes()
	if len(shapes) != 2 || shapes[0].Calls != 3 || shapes[1].Calls != 3 || len(shapes[0].In0) != 1 || shapes[0].In0[0] != 4096 {
		t.Errorf("shapes %+v, want 3 calls each of two ops on [4096]", shapes)
	}
	calls := map[Op]int64{}
	for _, o := range got {
		calls[o.Op] = o.Calls
		if o.Time <= 0 {
			t.Errorf("op %d: time %v", o.Op, o.Time)
		}
	}
	if len(got) != 2 || calls[OpBinary] != 3 || calls[OpCopy] != 3 {
		t.Errorf("profile %+v, want 3 calls each of binary and copy", got)
	}
	if got := ctx.StopProfile(); got != nil {
		t.Errorf("second stop: %+v", got)
	}
}
