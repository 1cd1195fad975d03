//go:build !unix

package embcache

// processGone cannot probe a pid here, so a named temporary is kept (it is small) rather
// than risk removing one a live writer is still filling.
func processGone(pid int) bool { return false }
