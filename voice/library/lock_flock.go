//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package library

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes flock(2)'s lock on f: exclusive or shared, waiting for it or not. A lock
// belongs to the open file, so two opens of one file exclude each other even in one
// process; a process's locks go when it exits, killed or not. On NFS, Linux maps flock to
// the protocol's byte-range locks (NLM or NFSv4), which other clients see.
func lockFile(f *os.File, exclusive, wait bool) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if !wait {
		how |= syscall.LOCK_NB
	}
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func unlockFile(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }

// isWouldBlock reports whether a lock that was not waited for is held by another.
func isWouldBlock(err error) bool { return errors.Is(err, syscall.EWOULDBLOCK) }
