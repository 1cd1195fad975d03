package miocodec

import (
	"fmt"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

// TestGoldenFamily is what `voxpipe golden --family miocodec` runs: every case checked and
// none left over.
func TestGoldenFamily(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
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

// The frozen-statistics stages hold the engine to what the reference documents at each
// context: 1e-4 where its own deviation is float noise, its deviation (plus the margin) on a
// decoder whose receptive field is wider than the context — not a stricter 1e-4.
func TestFrozenStageFollowsTheReference(t *testing.T) {
	for _, c := range []struct {
		ctx             int
		ours, reference float64
		ok              bool
	}{
		{96, 3.272e-5, 3.24e-5, true},  // this folder: within 1e-4
		{104, 6.1e-6, 9.10e-6, true},   // below the reference's float noise
		{112, 9e-5, 1.01e-5, true},     // float noise of ours up to the manifest's 1e-4
		{112, 2e-4, 1.01e-5, false},    // not noise: worse than the manifest allows
		{96, 4.106e-3, 4.10e-3, true},  // a wider receptive field: the reference's own deviation
		{96, 4.5e-3, 4.10e-3, false},   // clearly worse than the reference
		{96, 4.106e-3, 3.24e-5, false}, // that deviation where the reference is exact
	} {
		s := frozenStage(SweepPoint{Context: c.ctx, MaxAbs: c.ours * 5, MaxRel: c.ours}, c.reference)
		if s.OK() != c.ok || s.Name != fmt.Sprintf("chunk.long_tokens.gnfrozen_ctx%d", c.ctx) {
			t.Errorf("ours %.4g, reference %.4g: %s (want ok=%v)", c.ours, c.reference, s, c.ok)
		}
	}
}
