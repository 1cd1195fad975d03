package meanvc2

import (
	"testing"

	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

// The whole family check for both published variants (golden folders meanvc2/ and
// meanvc2_40ms/): every component's stages and the end-to-end stream, with no case of
// cases.gguf left unchecked.
func TestGolden(t *testing.T) {
	for _, folder := range []string{Family, Family + "_40ms"} {
		t.Run(folder, func(t *testing.T) {
			r := paritytest.Open(t, folder)
			if err := Golden(r, cpu(t)); err != nil {
				t.Fatal(err)
			}
			paritytest.Require(t, r.Finish())
		})
	}
}
