package hub

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A local hub in Hugging Face's URL layout: /{repo}/resolve/main/{path}, answering with
// X-Linked-Size and X-Linked-Etag (the sha256, quoted) and, when it has a CDN, a redirect to
// another host that serves the bytes.
type fakeHub struct {
	data        []byte
	sha         string // X-Linked-Etag; "" for none
	etag        string // ETag on the data response
	token       string // the hub demands this bearer token when set
	ignoreRange bool   // the data server answers every request with the whole file (200)
	cutAfter    int    // the first data response stops after this many bytes (0: never)
	stall       bool   // the data server sends a little, then nothing
	model       Model

	hub, cdn *httptest.Server
	mu       sync.Mutex
	hubAuth  []string // Authorization headers the hub saw
	cdnAuth  []string // … and the data server
	ranges   []string // Range headers the data server saw
	cuts     int
}

func testData(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func shaHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

const testSize = 3 << 20

// newFakeHub serves data as test/repo's Dir/test.gguf; withCDN puts the bytes on a second
// server, named "localhost" where the hub is "127.0.0.1".
func newFakeHub(t *testing.T, withCDN bool) *fakeHub {
	t.Helper()
	data := testData(testSize)
	f := &fakeHub{data: data, sha: shaHex(data)}
	f.model = Model{Name: "test", Family: "meanvc2", Repo: "test/repo", Path: "Dir/test.gguf", File: "test.gguf", Size: testSize}
	f.hub = httptest.NewServer(http.HandlerFunc(f.serveHub))
	t.Cleanup(f.hub.Close)
	if withCDN {
		f.cdn = httptest.NewServer(http.HandlerFunc(f.serveData))
		t.Cleanup(f.cdn.Close)
	}
	return f
}

func (f *fakeHub) serveHub(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.hubAuth = append(f.hubAuth, r.Header.Get("Authorization"))
	f.mu.Unlock()
	if r.URL.Path != "/test/repo/resolve/main/Dir/test.gguf" {
		http.Error(w, "Entry not found", http.StatusNotFound)
		return
	}
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		http.Error(w, "Invalid credentials", http.StatusUnauthorized)
		return
	}
	w.Header().Set("X-Linked-Size", strconv.Itoa(len(f.data)))
	if f.sha != "" {
		w.Header().Set("X-Linked-Etag", `"`+f.sha+`"`)
	}
	if f.cdn != nil {
		to := strings.Replace(f.cdn.URL, "127.0.0.1", "localhost", 1) + "/blobs/xyz?sig=1"
		http.Redirect(w, r, to, http.StatusFound)
		return
	}
	f.serveData(w, r)
}

func (f *fakeHub) serveData(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	if r.Host != "" && f.cdn != nil && strings.HasPrefix(r.Host, "localhost") {
		f.cdnAuth = append(f.cdnAuth, r.Header.Get("Authorization"))
	}
	f.ranges = append(f.ranges, r.Header.Get("Range"))
	cut := f.cutAfter > 0 && f.cuts == 0
	if cut {
		f.cuts++
	}
	f.mu.Unlock()
	if f.etag != "" {
		w.Header().Set("ETag", f.etag)
	}
	switch {
	case f.stall:
		w.Header().Set("Content-Length", strconv.Itoa(len(f.data)))
		w.Write(f.data[:1000])
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return
	case cut: // the connection drops mid-file
		w.Header().Set("Content-Length", strconv.Itoa(len(f.data)))
		w.Write(f.data[:f.cutAfter])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	case f.ignoreRange:
		r.Header.Del("Range")
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.data))
}

func (f *fakeHub) client() *Client {
	return &Client{Hub: f.hub.URL, IdleTimeout: 2 * time.Second}
}

func checkFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes, sha256 %s; want %d bytes, %s", path, len(got), shaHex(got), len(want), shaHex(want))
	}
	if _, err := os.Stat(path + ".part"); !os.IsNotExist(err) {
		t.Errorf("the part file is still there (%v)", err)
	}
}

// The hub redirects to a CDN on another host: the token goes to the hub and not to the CDN,
// the file arrives whole, and the sha256 from X-Linked-Etag (on the redirect) is checked.
func TestHubPullRedirectTokenAndChecksum(t *testing.T) {
	f := newFakeHub(t, true)
	f.token = "secret"
	c := f.client()
	c.Token = "secret"
	var last Progress
	c.Progress = func(p Progress) { last = p }
	dir := t.TempDir()
	res, err := c.Pull(context.Background(), f.model, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(dir, "test.gguf"), f.data)
	if !res.Checked || res.SHA256 != f.sha || res.Bytes != testSize || res.Resumed != 0 {
		t.Errorf("result %+v", res)
	}
	if last.Done != testSize || last.Total != testSize {
		t.Errorf("last progress %+v", last)
	}
	if len(f.hubAuth) != 1 || f.hubAuth[0] != "Bearer secret" {
		t.Errorf("hub saw Authorization %q, want the token", f.hubAuth)
	}
	if len(f.cdnAuth) != 1 || f.cdnAuth[0] != "" {
		t.Errorf("CDN saw Authorization %q, want none", f.cdnAuth)
	}
	// A second pull finds it in place and fetches nothing.
	res, err = c.Pull(context.Background(), f.model, dir)
	if err != nil || !res.Already || len(f.hubAuth) != 1 {
		t.Errorf("second pull: %+v, %v, %d requests", res, err, len(f.hubAuth))
	}
}

// The connection drops after 1 MiB: the part keeps it, and the next pull asks for the rest
// with a Range request and ends with the right sha256.
func TestHubPullResumesAfterCut(t *testing.T) {
	f := newFakeHub(t, true)
	f.cutAfter = 1 << 20
	dir := t.TempDir()
	_, err := f.client().Pull(context.Background(), f.model, dir)
	var ie *InterruptedError
	if !errors.As(err, &ie) || !IsInterrupted(err) {
		t.Fatalf("want an interrupted download, got %v", err)
	}
	part := filepath.Join(dir, "test.gguf.part")
	if st, err := os.Stat(part); err != nil || st.Size() != 1<<20 || ie.Have != 1<<20 {
		t.Fatalf("part after the cut: %v, %v; error says %d bytes", st, err, ie.Have)
	}
	if _, err := os.Stat(filepath.Join(dir, "test.gguf")); !os.IsNotExist(err) {
		t.Fatal("a cut download is in place under the final name")
	}
	res, err := f.client().Pull(context.Background(), f.model, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(dir, "test.gguf"), f.data)
	if res.Resumed != 1<<20 || !res.Checked {
		t.Errorf("result %+v, want resumed from 1 MiB and checked", res)
	}
	if got := f.ranges[len(f.ranges)-1]; got != "bytes=1048576-" {
		t.Errorf("resume asked for Range %q", got)
	}
}

// A server that ignores Range answers 200 with the whole file: the part starts over.
func TestHubPullServerIgnoringRange(t *testing.T) {
	f := newFakeHub(t, false)
	f.ignoreRange = true
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "test.gguf.part"), f.data[:500_000], 0o644); err != nil {
		t.Fatal(err)
	}
	var notes []string
	c := f.client()
	c.Logf = func(format string, a ...any) { notes = append(notes, format) }
	res, err := c.Pull(context.Background(), f.model, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(dir, "test.gguf"), f.data)
	if res.Resumed != 0 || f.ranges[0] != "bytes=500000-" {
		t.Errorf("result %+v, range %q", res, f.ranges)
	}
	if !strings.Contains(strings.Join(notes, "\n"), "ignored the range") {
		t.Errorf("no note about the restart: %q", notes)
	}
}

// A part that is not a prefix of the file (another version) fails the checksum after the
// resume: the download starts over by itself and ends right.
func TestHubPullResumedWrongPartStartsOver(t *testing.T) {
	f := newFakeHub(t, false)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "test.gguf.part"), make([]byte, 700_000), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := f.client().Pull(context.Background(), f.model, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(dir, "test.gguf"), f.data)
	if res.Resumed != 0 || len(f.ranges) != 2 || f.ranges[1] != "" {
		t.Errorf("result %+v, ranges %q", res, f.ranges)
	}
}

// A complete part: the server says 416 to the range; the part is verified and moved in place.
func TestHubPullCompletePart(t *testing.T) {
	f := newFakeHub(t, true)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "test.gguf.part"), f.data, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := f.client().Pull(context.Background(), f.model, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, filepath.Join(dir, "test.gguf"), f.data)
	if !res.Checked || res.Resumed != testSize {
		t.Errorf("result %+v", res)
	}
}

// A wrong checksum is an error, and the bad file is neither in place nor kept as a part.
func TestHubPullWrongChecksum(t *testing.T) {
	f := newFakeHub(t, true)
	f.sha = shaHex([]byte("something else"))
	dir := t.TempDir()
	_, err := f.client().Pull(context.Background(), f.model, dir)
	if err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("want a checksum error, got %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

// No X-Linked-Etag: a sha256 ETag is used; with neither, only the size is checked.
func TestHubPullChecksumSources(t *testing.T) {
	f := newFakeHub(t, false)
	f.sha, f.etag = "", `"`+shaHex(testData(testSize))+`"`
	res, err := f.client().Pull(context.Background(), f.model, t.TempDir())
	if err != nil || !res.Checked {
		t.Errorf("with a sha256 ETag: %+v, %v", res, err)
	}
	f.etag = `"0123abcd"` // not a sha256
	dir := t.TempDir()
	res, err = f.client().Pull(context.Background(), f.model, dir)
	if err != nil || res.Checked || res.SHA256 != "" {
		t.Errorf("without a checksum: %+v, %v", res, err)
	}
	checkFile(t, filepath.Join(dir, "test.gguf"), f.data)
}

func TestHubPullHTTPErrors(t *testing.T) {
	f := newFakeHub(t, true)
	f.token = "secret"
	m404 := f.model
	m404.Path = "Dir/missing.gguf"
	_, err := f.client().Pull(context.Background(), m404, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), f.hub.URL+"/test/repo/resolve/main/Dir/missing.gguf") {
		t.Errorf("404: %v", err)
	}
	_, err = f.client().Pull(context.Background(), f.model, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "set HF_TOKEN") {
		t.Errorf("401 without a token: %v", err)
	}
	c := f.client()
	c.Token = "wrong"
	_, err = c.Pull(context.Background(), f.model, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "was refused") {
		t.Errorf("401 with a wrong token: %v", err)
	}
}

// A connection that goes quiet is given up after the idle timeout, keeping what came.
func TestHubPullStalledConnection(t *testing.T) {
	f := newFakeHub(t, false)
	f.stall = true
	c := f.client()
	c.IdleTimeout = 150 * time.Millisecond
	start := time.Now()
	_, err := c.Pull(context.Background(), f.model, t.TempDir())
	if !IsInterrupted(err) || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("want a stalled, interrupted download, got %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v to notice", d)
	}
}

// A file far larger than the catalog says is refused before it is fetched.
func TestHubPullRefusesOversize(t *testing.T) {
	f := newFakeHub(t, false)
	m := f.model
	m.Size = 1 << 20
	dir := t.TempDir()
	_, err := f.client().Pull(context.Background(), m, dir)
	if err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Fatalf("want a refusal, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "test.gguf")); !os.IsNotExist(err) {
		t.Error("the oversize file is in place")
	}
}

func TestHubHelpers(t *testing.T) {
	for _, c := range []struct {
		in          string
		start, size int64
		ok          bool
	}{
		{"bytes 100-199/1000", 100, 1000, true},
		{"bytes */1000", 0, 1000, true},
		{"bytes 0-9/*", 0, -1, true},
		{"items 0-9/10", 0, -1, false},
		{"bytes x-9/10", 0, 10, false},
	} {
		start, size, ok := parseContentRange(c.in)
		if start != c.start || size != c.size || ok != c.ok {
			t.Errorf("%q: %d %d %v", c.in, start, size, ok)
		}
	}
	sum := shaHex([]byte("x"))
	for in, want := range map[string]string{
		`"` + sum + `"`:                      sum,
		`W/"` + strings.ToUpper(sum) + `"`:   sum,
		`"d41d8cd98f00b204e9800998ecf8427e"`: "",
		`"` + sum[:63] + `g"`:                "",
	} {
		if got := sha256Tag(in); got != want {
			t.Errorf("sha256Tag(%q) = %q", in, got)
		}
	}
}

func TestHubCatalog(t *testing.T) {
	names, files := map[string]bool{}, map[string]bool{}
	for _, m := range Catalog() {
		if names[m.Name] || files[m.File] {
			t.Errorf("%s: duplicate name or file", m.Name)
		}
		names[m.Name], files[m.File] = true, true
		switch {
		case m.Size <= 0 || m.About == "" || m.Use == "" || !strings.HasSuffix(m.File, ".gguf"):
			t.Errorf("%s: incomplete entry %+v", m.Name, m)
		case m.Published() && (m.Repo != Repo || filepath.Base(m.Path) != m.File || m.Import != nil):
			t.Errorf("%s: published entry %+v", m.Name, m)
		case !m.Published() && (m.Import == nil || !strings.Contains(m.ImportCommand("D"), "voxpipe import --family "+m.Family+" --from ")):
			t.Errorf("%s: import entry %+v", m.Name, m)
		}
	}
	for _, n := range []string{"meanvc2", "meanvc2-q4_k", "meanvc2-40ms", "miotts-1.7b-q8_0", "miotts-0.6b-q8_0", "miocodec", "miocodec-f16"} {
		if !names[n] {
			t.Errorf("%s is not in the catalog", n)
		}
	}
	m, _ := Lookup("meanvc2")
	if got := m.URL("https://huggingface.co/"); got != "https://huggingface.co/audio-cpp/audio.cpp-gguf/resolve/main/MeanVC2-GGUF/meanvc2-120ms-40ms-fp32.gguf" {
		t.Errorf("URL %s", got)
	}
}

// A model flag's value: an existing path stays; a catalog name becomes the cached file or
// an error that says to pull it; anything else stays for the loader to report.
func TestResolve(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("VOXPIPE_MODELS", dir)
	if d, _ := Dir(); d != dir {
		t.Fatalf("Dir() = %s, want $VOXPIPE_MODELS", d)
	}
	own := filepath.Join(t.TempDir(), "own.gguf")
	os.WriteFile(own, []byte("x"), 0o644)
	for _, v := range []string{"", own, "no-such-file.gguf"} {
		if got, err := Resolve(v); got != v || err != nil {
			t.Errorf("Resolve(%q) = %q, %v", v, got, err)
		}
	}
	_, err := Resolve("meanvc2")
	if !errors.Is(err, ErrNotPulled) || !strings.Contains(err.Error(), "run `voxpipe pull meanvc2` first") {
		t.Errorf("not pulled: %v", err)
	}
	_, err = Resolve("meanvc2-40ms")
	if !errors.Is(err, ErrNotPulled) || !strings.Contains(err.Error(), "voxpipe import") {
		t.Errorf("import entry not built: %v", err)
	}
	p := filepath.Join(dir, "meanvc2-120ms-40ms-fp32.gguf")
	os.WriteFile(p, []byte("x"), 0o644)
	if got, err := Resolve("meanvc2"); got != p || err != nil {
		t.Errorf("pulled: %q, %v", got, err)
	}
}
