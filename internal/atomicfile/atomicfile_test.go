package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// Write replaces the file whole with the mode asked for, and leaves no temporary file; a
// write that cannot happen leaves the old content and no temporary file either.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := Write(path, []byte("old"), 0o644, ".tmp-*"); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600, ".tmp-*"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	st, _ := os.Stat(path)
	if err != nil || string(b) != "new" || st.Mode().Perm() != 0o600 {
		t.Errorf("content %q, mode %v, %v", b, st.Mode().Perm(), err)
	}
	if err := Write(filepath.Join(dir, "no-such-dir", "f"), []byte("x"), 0o644, ".tmp-*"); err == nil {
		t.Error("a write into a missing directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file", len(entries))
	}
}
