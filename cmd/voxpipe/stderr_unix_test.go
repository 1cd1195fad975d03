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
	fds := func() int {
		d, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(d)
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
	if after := fds(); after != before {
		t.Errorf("%d open files after, %d before", after, before)
	}
	// fd 2 is the test's stderr again: a second capture sees only its own writes.
	if again, _ := captureStderr(func() error { syscall.Write(2, []byte("x")); return nil }); again != "x" {
		t.Errorf("second capture %q", again)
	}
}
