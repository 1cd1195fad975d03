//go:build unix

package embcache

import "syscall"

// processGone reports whether no process has this pid (signal 0 probes without sending).
func processGone(pid int) bool { return syscall.Kill(pid, 0) == syscall.ESRCH }
