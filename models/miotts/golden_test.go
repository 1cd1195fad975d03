package miotts

import (
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

func TestGolden(t *testing.T) {
	r := paritytest.Open(t, "miotts")
	be, err := engine.NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if err := Golden(r, be); err != nil {
		t.Fatal(err)
	}
	paritytest.Require(t, r.Finish())
}
