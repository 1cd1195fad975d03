package meanvc2

import (
	"testing"

	"github.com/voxpipe/voxpipe/internal/parity"
)

// The whole family check: every component's stages and the end-to-end stream, with no case
// of cases.gguf left unchecked.
func TestGolden(t *testing.T) {
	r := parity.OpenT(t, Family)
	if err := Golden(r, cpu(t)); err != nil {
		t.Fatal(err)
	}
	parity.Require(t, r.Finish())
}
