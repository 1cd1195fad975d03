//go:build unix

package main

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestCaptureStderrTakesWhatCWrites(t *testing.T) {
	// The process's open files by number and what each is. Other tests' connections may
	// close meanwhile, so a leak is a file that is new after the capture, not a count.
	fds := func() map[string]string {
		d, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		open := map[string]string{}
		for _, e := range d {
			target, _ := os.Readlink("/proc/self/fd/" + e.Name())
			open[e.Name()] = target
		}
		return open
	}
	before := fds()
	want := errors.New("no device")
	// A C library writes to fd 2 directly, as syscall.Write does here; more than a pipe
	// holds, so the capture must drain while f runs.
	line := "ALSA lib pcm.c:2666:(snd_pcm_open_noupdate) Unknown PCM default\n"
	got, err := captureStderr(func() error {
		for range 2000 {
			syscall.Write(2, []byte(line))
		}
		return want
	})
	if err != want {
		t.Errorf("error %v, want f's", err)
	}
	if n := strings.Count(got, line); n != 2000 {
		t.Errorf("captured %d lines of 2000", n)
	}
	for fd, target := range fds() {
		if was, ok := before[fd]; (!ok || was != target) && !strings.HasPrefix(target, "/proc/") {
			t.Errorf("fd %s (%s) is open after the capture, not before", fd, target)
		}
	}
	// fd 2 is the test's stderr again: a second capture sees only its own writes.
	if again, _ := captureStderr(func() error { syscall.Write(2, []byte("x")); return nil }); again != "x" {
		t.Errorf("second capture %q", again)
	}
}
