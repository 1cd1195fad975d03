package meanvc2

import (
	"testing"

	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

// The whole family check: every component's stages and the end-to-end stream, with no case
// of cases.gguf left unchecked.
func TestGolden(t *testing.T) {
	r := paritytest.Open(t, Family)
	if err := Golden(r, cpu(t)); err != nil {
		t.Fatal(err)
	}
	paritytest.Require(t, r.Finish())
}
