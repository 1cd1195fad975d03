//go:build !unix

package gguf

// mapFile reads the whole file where memory mapping is not implemented.
func mapFile(path string) ([]byte, func() error, error) {
	return readWhole(path)
}

// dropPages does nothing where the file was read into memory.
func dropPages([]byte) {}
