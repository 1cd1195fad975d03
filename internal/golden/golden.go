// Package golden locates the golden data (tiny models and reference outputs) for parity tests:
// $VOXPIPE_GOLDEN_DIR, or ../shared/golden next to the repository root.
package golden

import (
	"os"
	"path/filepath"
	"testing"
)

// Root is the golden folder, or "" when no repository root is found above the working
// directory and the environment names none.
func Root() string {
	if d := os.Getenv("VOXPIPE_GOLDEN_DIR"); d != "" {
		return d
	}
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "..", "shared", "golden")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Path joins elems under the golden folder and skips the test, saying why, when that file or
// folder is absent.
func Path(tb testing.TB, elems ...string) string {
	tb.Helper()
	p := filepath.Join(append([]string{Root()}, elems...)...)
	if _, err := os.Stat(p); err != nil {
		tb.Skipf("golden data not available (%v); set VOXPIPE_GOLDEN_DIR to the golden folder", err)
	}
	return p
}
