// Package paritytest holds the test-only helpers around parity: opening a family's golden
// cases with a skip when the golden folder is absent, and failing a test on failed stages.
// Only tests import it, so `testing` stays out of the binary.
package paritytest

import (
	"testing"

	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/internal/parity"
)

// Open opens a family's cases for a test, skipping when the golden folder is absent; the
// cases are closed when the test ends.
func Open(tb testing.TB, family string) *parity.Run {
	tb.Helper()
	golden.Path(tb, family, "cases.gguf")
	r, err := parity.Open(golden.Root(), family)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}

// Require fails tb for every failed stage, logging each line.
func Require(tb testing.TB, stages []parity.Stage) {
	tb.Helper()
	for _, s := range stages {
		if s.OK() {
			tb.Log(s.String())
		} else {
			tb.Error(s.String())
		}
	}
}
