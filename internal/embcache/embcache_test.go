package embcache

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestKey(t *testing.T) {
	a := []float32{0.1, -0.2, 0.3}
	if Key("m", a, 16000) != Key("m", slices.Clone(a), 16000) {
		t.Error("same clip, different keys")
	}
	for _, k := range []string{Key("m2", a, 16000), Key("m", a, 44100), Key("m", []float32{0.1, -0.2, 0.31}, 16000)} {
		if k == Key("m", a, 16000) {
			t.Error("different input, same key")
		}
	}
}

func TestComputeOnceAndSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	c, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	compute := func() ([]float32, error) { calls.Add(1); return []float32{1, 2, 3}, nil }
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if e, err := c.Get("k", compute); err != nil || !slices.Equal(e, []float32{1, 2, 3}) {
				t.Errorf("got %v, %v", e, err)
			}
		})
	}
	wg.Wait()
	if calls.Load() != 1 {
		t.Errorf("computed %d times, want once", calls.Load())
	}
	// A new cache on the same directory (a restart) reads the file instead of computing.
	c2, _ := New(dir)
	e, err := c2.Get("k", func() ([]float32, error) { return nil, errors.New("recomputed") })
	if err != nil || !slices.Equal(e, []float32{1, 2, 3}) {
		t.Errorf("after restart: %v, %v", e, err)
	}
	// A damaged file is recomputed, not trusted.
	os.WriteFile(filepath.Join(dir, "k.emb"), []byte("VXEM\x09\x00\x00\x00junk"), 0o644)
	c3, _ := New(dir)
	if e, err := c3.Get("k", compute); err != nil || !slices.Equal(e, []float32{1, 2, 3}) || calls.Load() != 2 {
		t.Errorf("damaged file: %v, %v, %d computes", e, err, calls.Load())
	}
	// Errors are returned and not cached.
	if _, err := c3.Get("bad", func() ([]float32, error) { return nil, errors.New("boom") }); err == nil {
		t.Error("error not returned")
	}
	if e, err := c3.Get("bad", compute); err != nil || len(e) != 3 {
		t.Errorf("after an error: %v, %v", e, err)
	}
}

// A cache directory that cannot be written (here it was replaced by a regular file, which
// stops root too) costs the file, not the embedding: Get returns it, logs the failure, and
// keeps it in memory so it is computed once.
func TestWriteFailureDoesNotFailGet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "emb")
	c, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	c.Log = slog.New(slog.NewTextHandler(&logs, nil))
	var calls atomic.Int32
	compute := func() ([]float32, error) { calls.Add(1); return []float32{4, 5}, nil }
	for range 2 {
		if e, err := c.Get("k", compute); err != nil || !slices.Equal(e, []float32{4, 5}) {
			t.Fatalf("got %v, %v", e, err)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("computed %d times, want once", calls.Load())
	}
	if !strings.Contains(logs.String(), "not saved") {
		t.Errorf("the failure was not logged: %q", logs.String())
	}
}

// TestNewRemovesStaleTemporaries: a write cut by kill -9 leaves a temporary file; the next
// start removes it, but not one a live process may be writing right now.
func TestNewRemovesStaleTemporaries(t *testing.T) {
	dir := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale, fresh := filepath.Join(dir, ".emb-stale"), filepath.Join(dir, ".emb-fresh")
	killed := filepath.Join(dir, fmt.Sprintf(".emb-%d-123", dead.Process.Pid))
	live := filepath.Join(dir, fmt.Sprintf(".emb-%d-456", os.Getppid()))
	for _, p := range []string{stale, fresh, killed, live} {
		if err := os.WriteFile(p, []byte("half"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := New(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{stale, killed} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s kept: %v", filepath.Base(p), err)
		}
	}
	for _, p := range []string{fresh, live} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed: %v", filepath.Base(p), err)
		}
	}
}
