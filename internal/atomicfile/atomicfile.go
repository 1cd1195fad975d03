// Package atomicfile writes a file whole or not at all: the data goes to a temporary file in
// the same directory, is synced, and is renamed over the target, so a crash or a full disk
// leaves the old file or the new one, never half of one.
package atomicfile

import (
	"io"
	"os"
	"path/filepath"
)

// Write writes data to path with mode perm. The temporary file is named by pattern
// (os.CreateTemp's, e.g. ".tmp-*"), so a caller can recognise and clean up leftovers of a
// crash; it is removed if anything fails.
func Write(path string, data []byte, perm os.FileMode, pattern string) error {
	return WriteFunc(path, perm, pattern, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc is Write for content streamed by write (a file too large to hold in memory).
func WriteFunc(path string, perm os.FileMode, pattern string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), pattern)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	err = write(tmp)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	return err
}
