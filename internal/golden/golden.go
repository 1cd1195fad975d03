// Package golden locates the golden data (tiny models and reference outputs) for parity tests
// and the `voxpipe golden` command: $VOXPIPE_GOLDEN_DIR, or ../shared/golden next to the
// repository root.
//
// The binary links this package (the command's default --dir), so it must not import
// `testing`: Path takes the two methods of testing.TB it needs as an interface.
package golden

import (
	"fmt"
	"os"
	"path/filepath"
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

// Find joins elems under the golden folder and reports, with the way to fix it, when that
// file or folder is absent.
func Find(elems ...string) (string, error) {
	p := filepath.Join(append([]string{Root()}, elems...)...)
	if _, err := os.Stat(p); err != nil {
		return p, fmt.Errorf("golden data not available (%v); set VOXPIPE_GOLDEN_DIR to the golden folder", err)
	}
	return p, nil
}

// Skipper is the part of testing.TB that Path uses.
type Skipper interface {
	Helper()
	Skipf(format string, args ...any)
}

// Path is Find for tests: it skips tb, saying why, when the file or folder is absent.
func Path(tb Skipper, elems ...string) string {
	tb.Helper()
	p, err := Find(elems...)
	if err != nil {
		tb.Skipf("%v", err)
	}
	return p
}
