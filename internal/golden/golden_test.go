package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// skipRecorder records a skip instead of ending the test.
type skipRecorder struct{ msg string }

func (s *skipRecorder) Helper()                       {}
func (s *skipRecorder) Skipf(format string, a ...any) { s.msg = fmt.Sprintf(format, a...) }

func TestFindAndPath(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("VOXPIPE_GOLDEN_DIR", dir)
	if err := os.MkdirAll(filepath.Join(dir, "fam"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, err := Find("fam"); err != nil || p != filepath.Join(dir, "fam") {
		t.Errorf("Find(fam) = %q, %v", p, err)
	}
	if _, err := Find("fam", "cases.gguf"); err == nil || !strings.Contains(err.Error(), "VOXPIPE_GOLDEN_DIR") {
		t.Errorf("absent file: %v", err)
	}
	var rec skipRecorder
	if p := Path(&rec, "fam"); rec.msg != "" || p != filepath.Join(dir, "fam") {
		t.Errorf("present folder: %q skipped %q", p, rec.msg)
	}
	Path(&rec, "nope")
	if !strings.Contains(rec.msg, "golden data not available") {
		t.Errorf("absent folder not skipped: %q", rec.msg)
	}
}
