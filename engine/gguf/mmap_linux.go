package gguf

import (
	"os"
	"syscall"
	"unsafe"
)

// dropPages tells the kernel this process is done with the whole pages inside b, a range of
// a read-only file mapping: they leave the resident set (a later read faults them back in
// from the file), so loading a model does not hold the file and the copy at once. Linux only
// (syscall.Madvise); other systems: mmap_nomadvise.go.
func dropPages(b []byte) {
	if len(b) == 0 {
		return
	}
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(&b[0]))
	end := start + uintptr(len(b))
	first := (start + page - 1) &^ (page - 1)
	last := end &^ (page - 1)
	if last <= first {
		return
	}
	_ = syscall.Madvise(b[first-start:last-start], syscall.MADV_DONTNEED)
}
