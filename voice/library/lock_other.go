//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package library

import (
	"errors"
	"os"
)

var errNoLocks = errors.New("no flock on this platform")

// lockFile fails here: Open then warns that the directory must not be shared, and keeps
// leftovers that another process could still be writing until they are old.
func lockFile(f *os.File, exclusive, wait bool) error { return errNoLocks }

func unlockFile(f *os.File) error { return nil }

func isWouldBlock(err error) bool { return false }
