//go:build unix

package gguf

import (
	"fmt"
	"math"
	"os"
	"syscall"
)

// mapFile memory-maps path read-only. Empty files and files too large to map fall back to
// an error or a plain read.
func mapFile(path string) ([]byte, func() error, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := st.Size()
	if !st.Mode().IsRegular() {
		return readWhole(path)
	}
	if size == 0 {
		return nil, nil, fmt.Errorf("file is empty")
	}
	if size > math.MaxInt {
		return nil, nil, fmt.Errorf("file of %d bytes is too large to map", size)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return readWhole(path)
	}
	return data, func() error { return syscall.Munmap(data) }, nil
}
