//go:build unix

package main

import (
	"bytes"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// captureStderr runs f with the process's stderr (fd 2, which C libraries write to)
// redirected into a buffer, and returns what was written there. ALSA prints dozens of lines
// while it probes devices that are not there; the bridge shows them only when asked.
func captureStderr(f func() error) (string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", f()
	}
	saved, err := unix.Dup(2)
	if err != nil {
		r.Close()
		w.Close()
		return "", f()
	}
	if err := unix.Dup2(int(w.Fd()), 2); err != nil {
		unix.Close(saved)
		r.Close()
		w.Close()
		return "", f()
	}
	var out bytes.Buffer
	drained := make(chan struct{})
	go func() { // drain as it comes: a full pipe would block the writer
		io.Copy(&out, io.LimitReader(r, 1<<20))
		io.Copy(io.Discard, r)
		close(drained)
	}()
	ferr := f()
	unix.Dup2(saved, 2)
	unix.Close(saved)
	w.Close()
	<-drained
	r.Close()
	return out.String(), ferr
}
