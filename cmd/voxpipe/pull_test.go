package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// pullHub is a local hub in Hugging Face's layout serving a few MB as the catalog's
// meanvc2-q4_k file, with its sha256 in X-Linked-Etag; it demands token when set, and cuts
// the first cut responses short.
type pullHub struct {
	srv   *httptest.Server
	data  []byte
	token string
	cut   atomic.Int32
	auth  atomic.Value // the last Authorization header
}

const pullPath = "/audio-cpp/audio.cpp-gguf/resolve/main/MeanVC2-GGUF/meanvc2-120ms-40ms-q4_k.gguf"

func newPullHub(t *testing.T) *pullHub {
	h := &pullHub{data: bytes.Repeat([]byte("voxpipe pull test data\n"), 100_000)} // 2.3 MB
	sum := sha256.Sum256(h.data)
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.auth.Store(r.Header.Get("Authorization"))
		if r.URL.Path != pullPath {
			http.NotFound(w, r)
			return
		}
		if h.token != "" && r.Header.Get("Authorization") != "Bearer "+h.token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Linked-Size", strconv.Itoa(len(h.data)))
		w.Header().Set("X-Linked-Etag", `"`+hex.EncodeToString(sum[:])+`"`)
		if h.cut.Add(-1) >= 0 {
			w.Header().Set("Content-Length", strconv.Itoa(len(h.data)))
			w.Write(h.data[:len(h.data)/3])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(h.data))
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// pull through HF_ENDPOINT with HF_TOKEN from the environment: the file lands in --dir,
// checked; progress goes to stderr a line per tenth (not a terminal); --list shows it.
func TestPullCommand(t *testing.T) {
	h := newPullHub(t)
	h.token = "hf_test"
	t.Setenv("HF_ENDPOINT", h.srv.URL)
	t.Setenv("HF_TOKEN", "hf_test")
	dir := t.TempDir()
	stdout, stderr, code := runCmd(t, "pull", "meanvc2-q4_k", "--dir", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, stderr, stdout)
	}
	got, err := os.ReadFile(filepath.Join(dir, "meanvc2-120ms-40ms-q4_k.gguf"))
	if err != nil || !bytes.Equal(got, h.data) {
		t.Fatalf("pulled file: %d bytes, %v", len(got), err)
	}
	if h.auth.Load() != "Bearer hf_test" {
		t.Errorf("hub saw Authorization %q", h.auth.Load())
	}
	for _, want := range []string{"sha256", "matches the hub's", "saved " + filepath.Join(dir, "meanvc2-120ms-40ms-q4_k.gguf"), "--vc-model meanvc2-q4_k"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "meanvc2-q4_k: 100%") || strings.Contains(stderr, "\r") {
		t.Errorf("progress lines:\n%q", stderr)
	}
	stdout, _, code = runCmd(t, "pull", "meanvc2-q4_k", "--dir", dir)
	if code != 0 || !strings.Contains(stdout, "in the cache already") {
		t.Errorf("second pull: exit %d\n%s", code, stdout)
	}

	stdout, _, code = runCmd(t, "pull", "--list", "--dir", dir)
	if code != 0 {
		t.Fatalf("--list: exit %d", code)
	}
	rows := map[string]string{}
	for _, l := range strings.Split(stdout, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = l
		}
	}
	for name, want := range map[string][]string{
		"NAME":             {"FILE", "SIZE", "IN CACHE", "FOR"},
		"meanvc2-q4_k":     {"MeanVC2-GGUF/meanvc2-120ms-40ms-q4_k.gguf", "342 MB", " yes "},
		"meanvc2":          {"MeanVC2-GGUF/meanvc2-120ms-40ms-fp32.gguf", "1.63 GB", " no ", "CPU"},
		"meanvc2-40ms":     {"(voxpipe import)", " no "},
		"miotts-1.7b-q8_0": {"MioTTS-1.7B-GGUF/miotts-1.7b-q8_0.gguf"},
		"miocodec":         {"MioCodec-25Hz-44.1kHz-v2-GGUF/miocodec-25hz-44khz-v2-q8_0.gguf"},
		"miocodec-f16":     {"miocodec-25hz-44khz-v2-f16.gguf"},
	} {
		for _, w := range want {
			if !strings.Contains(rows[name], w) {
				t.Errorf("--list row %s lacks %q: %q", name, w, rows[name])
			}
		}
	}
}

// --hub beats HF_ENDPOINT, --token beats HF_TOKEN; without a token the 401 says what to set.
func TestPullFlagsAndErrors(t *testing.T) {
	h := newPullHub(t)
	h.token = "flag-token"
	t.Setenv("HF_ENDPOINT", "http://127.0.0.1:1") // nothing listens there
	t.Setenv("HF_TOKEN", "")
	_, stderr, code := runCmd(t, "pull", "meanvc2-q4_k", "--dir", t.TempDir(), "--hub", h.srv.URL)
	if code == 0 || !strings.Contains(stderr, "401") || !strings.Contains(stderr, "set HF_TOKEN") {
		t.Errorf("401: exit %d: %s", code, stderr)
	}
	t.Setenv("HF_TOKEN", "env-token")
	_, stderr, code = runCmd(t, "pull", "meanvc2-q4_k", "--dir", t.TempDir(), "--hub", h.srv.URL, "--token", "flag-token", "--quiet")
	if code != 0 || h.auth.Load() != "Bearer flag-token" {
		t.Errorf("--hub/--token: exit %d, Authorization %q: %s", code, h.auth.Load(), stderr)
	}
	// HF_ENDPOINT alone points at nothing: a network error with the retry hint.
	_, stderr, code = runCmd(t, "pull", "meanvc2-q4_k", "--dir", t.TempDir())
	if code == 0 || !strings.Contains(stderr, "127.0.0.1:1/audio-cpp/audio.cpp-gguf/resolve/main/") || !strings.Contains(stderr, "run `voxpipe pull meanvc2-q4_k` again") {
		t.Errorf("unreachable hub: exit %d: %s", code, stderr)
	}
	_, stderr, code = runCmd(t, "pull", "no-such-model")
	if code == 0 || !strings.Contains(stderr, "pull --list") {
		t.Errorf("unknown name: exit %d: %s", code, stderr)
	}
}

// A cut download says how to resume; the second pull resumes and ends with the right bytes.
func TestPullResumeHint(t *testing.T) {
	h := newPullHub(t)
	h.cut.Store(1)
	t.Setenv("HF_TOKEN", "")
	dir := t.TempDir()
	_, stderr, code := runCmd(t, "pull", "meanvc2-q4_k", "--dir", dir, "--hub", h.srv.URL, "--quiet")
	if code == 0 || !strings.Contains(stderr, "run `voxpipe pull meanvc2-q4_k` again: it resumes") {
		t.Fatalf("cut: exit %d: %s", code, stderr)
	}
	stdout, _, _ := runCmd(t, "pull", "--list", "--dir", dir)
	if !strings.Contains(stdout, "partial (") {
		t.Errorf("--list does not show the part:\n%s", stdout)
	}
	stdout, stderr, code = runCmd(t, "pull", "meanvc2-q4_k", "--dir", dir, "--hub", h.srv.URL, "--quiet")
	if code != 0 || !strings.Contains(stdout, "resuming at") {
		t.Fatalf("resume: exit %d: %s\n%s", code, stderr, stdout)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "meanvc2-120ms-40ms-q4_k.gguf")); !bytes.Equal(got, h.data) {
		t.Error("resumed file differs")
	}
}

// Names only the original checkpoints provide print the import command instead.
func TestPullImportHint(t *testing.T) {
	dir := t.TempDir()
	stdout, stderr, code := runCmd(t, "pull", "meanvc2-40ms", "miotts-0.6b-q8_0", "--dir", dir)
	if code == 0 || !strings.Contains(stderr, "voxpipe import") {
		t.Errorf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"voxpipe import --family meanvc2 --from MEANVC2_DIR --out " + filepath.Join(dir, "meanvc2-40ms-40ms-fp32.gguf") + " --dtype f32",
		"voxpipe import --family miotts --from MioTTS-0.6B --out " + filepath.Join(dir, "miotts-0.6b-q8_0.gguf") + " --dtype q8_0",
		"ASLP-lab/MeanVC2", "Aratako/MioTTS-0.6B",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

// Model flags take a pulled name: a missing one says to pull it; a pulled one is the cached
// file (here a bad one, so the load fails on that path); a path stays a path.
func TestResolvePulledNameInModelFlags(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("VOXPIPE_MODELS", dir)
	_, stderr, code := runCmd(t, "bench", "meanvc2", "--model", "meanvc2")
	if code == 0 || !strings.Contains(stderr, "--model: meanvc2 is not in the model cache") || !strings.Contains(stderr, "run `voxpipe pull meanvc2` first") {
		t.Errorf("not pulled: exit %d: %s", code, stderr)
	}
	_, stderr, code = runCmd(t, "tts", "--model", "miotts-1.7b-q8_0", "--codec", "miocodec", "--voice", "x.wav", "hi")
	if code == 0 || !strings.Contains(stderr, "run `voxpipe pull miotts-1.7b-q8_0` first") {
		t.Errorf("tts, not pulled: exit %d: %s", code, stderr)
	}
	cached := filepath.Join(dir, "meanvc2-120ms-40ms-fp32.gguf")
	if err := os.WriteFile(cached, []byte("not a gguf"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = runCmd(t, "bench", "meanvc2", "--model", "meanvc2", "--seconds", "1")
	if code == 0 || !strings.Contains(stderr, cached) {
		t.Errorf("pulled: exit %d, want the load to name %s: %s", code, cached, stderr)
	}

	// The helper itself, on a string flag and on serve's list flag.
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	model := fs.String("model", "", "")
	var vc listFlag
	fs.Var(&vc, "vc-model", "")
	own := filepath.Join(t.TempDir(), "own.gguf")
	os.WriteFile(own, []byte("x"), 0o644)
	if err := fs.Parse([]string{"--model", own, "--vc-model", "meanvc2," + own}); err != nil {
		t.Fatal(err)
	}
	if err := resolveModelFlags(fs, "model", "vc-model", "codec"); err != nil {
		t.Fatal(err)
	}
	if *model != own || len(vc) != 2 || vc[0] != cached || vc[1] != own {
		t.Errorf("resolved --model %q, --vc-model %q", *model, vc)
	}
	if err := fs.Parse([]string{"--vc-model", "meanvc2-40ms"}); err != nil {
		t.Fatal(err)
	}
	if err := resolveModelFlags(fs, "vc-model"); err == nil || !strings.Contains(err.Error(), "--vc-model: meanvc2-40ms") {
		t.Errorf("import entry not built: %v", err)
	}
}
