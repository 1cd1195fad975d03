package atomicfile

import (
	"errors"
	"io"
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

// WriteFunc streams the content; when the writer fails, the old file stays and no temporary
// file is left.
func TestWriteFuncKeepsTheOldFileOnFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFunc(path, 0o644, ".tmp-*", func(w io.Writer) error { _, err := io.WriteString(w, "old"); return err }); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := WriteFunc(path, 0o644, ".tmp-*", func(w io.Writer) error {
		io.WriteString(w, "half")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("error %v, want the writer's", err)
	}
	b, _ := os.ReadFile(path)
	st, _ := os.Stat(path)
	if string(b) != "old" || st.Mode().Perm() != 0o644 {
		t.Errorf("content %q, mode %v", b, st.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file", len(entries))
	}
}
