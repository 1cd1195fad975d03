package miocodec

import (
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/parity"
)

// TestGoldenFamily is what `voxpipe golden --family miocodec` runs: every case checked and
// none left over.
func TestGoldenFamily(t *testing.T) {
	r := parity.OpenT(t, "miocodec")
	be, err := engine.NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if err := Golden(r, be); err != nil {
		t.Fatal(err)
	}
	parity.Require(t, r.Finish())
}
