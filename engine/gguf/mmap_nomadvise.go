//go:build unix && !linux

package gguf

// dropPages does nothing here: the syscall package has Madvise on Linux only, and on macOS
// and the BSDs MADV_DONTNEED on a file mapping is only a hint anyway. The pages a model load
// has copied out of stay resident until the file is unmapped (Close), which costs memory
// while loading, not correctness.
func dropPages([]byte) {}
