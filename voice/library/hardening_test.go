package library

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/server/auth"
)

const (
	keyA     = "client-key-A-0123456789"
	keyB     = "client-key-B-0123456789"
	keyAdmin = "admin-key-0123456789abc"
)

// serveKeys serves the library behind the real key middleware, as the server does.
func serveKeys(t *testing.T, l *Library) string {
	t.Helper()
	keys, err := auth.NewKeys([]string{keyA, keyB}, keyAdmin)
	if err != nil {
		t.Fatal(err)
	}
	mux := routes(l)
	srv := httptest.NewServer(keys.Middleware(mux, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

// call makes one request with key and returns the status and the decoded JSON body.
func call(t *testing.T, method, url, key string, body io.Reader, ct string) (int, map[string]any, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	req.Header.Set("Authorization", "Bearer "+key)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(raw, &out)
	return resp.StatusCode, out, string(raw)
}

func uploadAs(t *testing.T, base, key, name string, file []byte) (int, map[string]any) {
	t.Helper()
	body, ct := multipartBody(t, name, file)
	code, out, _ := call(t, http.MethodPost, base+"/v1/voices", key, body, ct)
	return code, out
}

func errCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func errMsg(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}

// toneAt is a loud tone at any rate the WAV format allows.
func toneAt(t testing.TB, rate int, seconds float64) []byte {
	t.Helper()
	x := make([]float32, max(int(seconds*float64(rate)), 2))
	for i := range x {
		x[i] = float32(0.5 * math.Sin(float64(i)*0.1+1))
	}
	var b bytes.Buffer
	if err := wav.Write(&b, x, rate, 1); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A voice belongs to the key that uploaded it: another client key cannot get, use, list or
// delete it, and sees the same 404 as for an id that does not exist; a name resolves among
// the caller's own voices; the admin key sees everything; voices from before owners existed
// are the admin's alone.
func TestVoicesBelongToTheirOwner(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	base := serveKeys(t, l)
	code, va := uploadAs(t, base, keyA, "Alice", toneWAV(t, 2, 0.5))
	if code != http.StatusCreated {
		t.Fatalf("A's upload: %d %v", code, va)
	}
	code, vb := uploadAs(t, base, keyB, "Alice", toneWAV(t, 2, 0.4)) // names are per owner
	if code != http.StatusCreated {
		t.Fatalf("B's upload of the same name: %d %v", code, vb)
	}
	idA, idB := va["id"].(string), vb["id"].(string)
	pA, pB := va["owner"].(string), vb["owner"].(string)
	if !strings.HasPrefix(pA, "k_") || !strings.HasPrefix(pB, "k_") || pA == pB {
		t.Fatalf("owners %q and %q", pA, pB)
	}

	// B cannot see A's voice: same answer as for an unknown id.
	for _, c := range []struct {
		method, path, key string
		want              int
	}{
		{"GET", idA, keyB, 404}, {"DELETE", idA, keyB, 404}, {"GET", "v_0000000000000000", keyB, 404},
		{"GET", idA, keyA, 200}, {"GET", idB, keyAdmin, 200},
	} {
		code, out, _ := call(t, c.method, base+"/v1/voices/"+c.path, c.key, nil, "")
		if code != c.want || (code == 404 && errCode(out) != "not_found") {
			t.Errorf("%s %s as %s: %d %v, want %d", c.method, c.path, c.key[:12], code, out, c.want)
		}
	}
	// By name, each client finds its own "Alice".
	for key, want := range map[string]string{keyA: idA, keyB: idB} {
		if code, out, _ := call(t, "GET", base+"/v1/voices/Alice", key, nil, ""); code != 200 || out["id"] != want {
			t.Errorf("GET Alice as %s: %d %v, want %s", key[:12], code, out, want)
		}
	}
	if got := l.List(pA); len(got) != 1 || got[0].ID != idA {
		t.Errorf("A lists %v", got)
	}
	if _, _, err := l.Clip(pB, idA); !errors.Is(err, ErrNotFound) {
		t.Errorf("B's Clip of A's voice: %v, want ErrNotFound", err)
	}
	if len(l.List(auth.Admin)) != 2 || len(l.List("")) != 0 {
		t.Errorf("admin lists %d voices, nobody lists %d", len(l.List(auth.Admin)), len(l.List("")))
	}
	// The admin sees both "Alice"s, but its own voice of a name wins: a client's upload
	// cannot make the admin's names (the server's default voice, say) ambiguous.
	if code, _, _ := call(t, "GET", base+"/v1/voices/Alice", keyAdmin, nil, ""); code != 404 {
		t.Errorf("admin GET of an ambiguous name: %d", code)
	}
	code, vAdm := uploadAs(t, base, keyAdmin, "Alice", toneWAV(t, 2, 0.3))
	if code != 201 || vAdm["owner"] != auth.Admin {
		t.Fatalf("admin upload: %d %v", code, vAdm)
	}
	if code, out, _ := call(t, "GET", base+"/v1/voices/Alice", keyAdmin, nil, ""); code != 200 || out["id"] != vAdm["id"] {
		t.Errorf("admin GET Alice: %d %v, want its own", code, out)
	}
	// A's voice survived B's delete; the admin may delete anyone's.
	if code, _, _ := call(t, "DELETE", base+"/v1/voices/"+idA, keyAdmin, nil, ""); code != 204 {
		t.Errorf("admin delete of A's voice: %d", code)
	}

	// A legacy entry (no owner) is the admin's only.
	legacy := "v_4444444444444444"
	if err := os.WriteFile(filepath.Join(dir, legacy+".wav"), toneWAV(t, 2, 0.5), 0o644); err != nil {
		t.Fatal(err)
	}
	meta := fmt.Sprintf(`{"id":%q,"name":"Old","sample_rate":16000,"seconds":2,"created":"2024-01-01T00:00:00Z"}`, legacy)
	os.WriteFile(filepath.Join(dir, legacy+".json"), []byte(meta), 0o644)
	l2, warn, err := Open(dir)
	if err != nil || len(warn) != 0 {
		t.Fatal(err, warn)
	}
	if _, err := l2.Get(pB, "Old"); !errors.Is(err, ErrNotFound) {
		t.Errorf("client sees the legacy voice: %v", err)
	}
	if v, err := l2.Get(auth.Admin, legacy); err != nil || v.Name != "Old" {
		t.Errorf("admin cannot see the legacy voice: %v %v", v, err)
	}
}

// A second voice with the same name (after trimming) for the same owner is 409 name_taken,
// also when the uploads race: exactly one of them wins.
func TestDuplicateNamesAreRefused(t *testing.T) {
	l, _, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base := serveKeys(t, l)
	if code, out := uploadAs(t, base, keyA, "Alice", toneWAV(t, 2, 0.5)); code != 201 {
		t.Fatalf("first upload: %d %v", code, out)
	}
	code, out := uploadAs(t, base, keyA, "  Alice ", toneWAV(t, 2, 0.5))
	if code != http.StatusConflict || errCode(out) != "name_taken" || !strings.Contains(errMsg(out), `"Alice"`) {
		t.Errorf("duplicate: %d %v, want 409 name_taken naming Alice", code, out)
	}
	var wg sync.WaitGroup
	codes := make([]int, 8)
	clip := toneWAV(t, 2, 0.5)
	for i := range codes {
		wg.Go(func() { codes[i], _ = uploadAs(t, base, keyB, "Bob", clip) })
	}
	wg.Wait()
	won := 0
	for _, c := range codes {
		switch c {
		case 201:
			won++
		case 409:
		default:
			t.Errorf("racing upload: %d", c)
		}
	}
	if won != 1 || len(l.List(auth.Admin)) != 2 {
		t.Errorf("%d racing uploads of one name won; library has %d voices", won, len(l.List(auth.Admin)))
	}
}

// Concurrent uploads never take the library past MaxVoices: the count is checked and the
// slot taken in one step.
func TestConcurrentUploadsRespectTheCap(t *testing.T) {
	l, _, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l.MaxVoices = 3
	base := serveKeys(t, l)
	clip := toneWAV(t, 2, 0.5)
	codes := make([]int, 16)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() {
			var out map[string]any
			codes[i], out = uploadAs(t, base, keyA, fmt.Sprint("voice ", i), clip)
			if codes[i] != 201 && errCode(out) != "library_full" {
				t.Errorf("upload %d: %d %v", i, codes[i], out)
			}
		})
	}
	wg.Wait()
	created := 0
	for _, c := range codes {
		if c == 201 {
			created++
		}
	}
	if n := len(l.List(auth.Admin)); created != 3 || n != 3 {
		t.Errorf("%d uploads succeeded and the library holds %d voices; the cap is 3", created, n)
	}
	// Reopening agrees with what was answered.
	l2, _, _ := Open(l.Dir())
	if n := len(l2.List(auth.Admin)); n != 3 {
		t.Errorf("after reopening: %d voices", n)
	}
}

// Rates the models' resamplers cannot take, or far outside audio rates, are refused at
// upload with a message naming the accepted range; common rates are accepted.
func TestUploadRates(t *testing.T) {
	l, _, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, l)
	for _, c := range []struct {
		rate int
		secs float64
		want int
	}{
		{1, 2, 400}, {44101, 2, 400}, {7999, 2, 400}, {16000000, 0.1, 400}, {200000, 2, 400},
		{8000, 2, 201}, {22050, 2, 201}, {44100, 2, 201}, {192000, 2, 201},
	} {
		code, out := upload(t, srv.URL, fmt.Sprint("r", c.rate), toneAt(t, c.rate, c.secs))
		if code != c.want {
			t.Errorf("%d Hz: %d %v, want %d", c.rate, code, out, c.want)
			continue
		}
		if code == 400 && (errCode(out) != "bad_clip" || !strings.Contains(errMsg(out), "8000 to 192000 Hz")) {
			t.Errorf("%d Hz: %v, want bad_clip naming the range", c.rate, out)
		}
	}
	if n := len(l.List(auth.Admin)); n != 4 {
		t.Errorf("library holds %d voices, want the 4 good rates", n)
	}
}

// Open removes what a crash leaves behind, temporary files and clips without metadata, and
// reports each; real voices, and clips whose metadata is merely damaged, stay.
func TestOpenRemovesLeftovers(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := l.Add(auth.Admin, "Keep", toneWAV(t, 2, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	l.Close() // the server that crashed: its lock went with it
	write(".tmp-123456", []byte("half a clip"))
	write("v_2222222222222222.wav", toneWAV(t, 2, 0.5)) // orphan
	write("v_3333333333333333.wav", toneWAV(t, 2, 0.5)) // damaged metadata: kept
	write("v_3333333333333333.json", []byte("{"))
	l2, warn, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(warn, "\n")
	for _, name := range []string{".tmp-123456", "v_2222222222222222.wav"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", name, err)
		}
		if !strings.Contains(joined, name+": removed") {
			t.Errorf("no warning for %s in %q", name, joined)
		}
	}
	for _, name := range []string{v.ID + ".wav", v.ID + ".json", "v_3333333333333333.wav"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s removed: %v", name, err)
		}
	}
	if len(warn) != 3 || len(l2.List(auth.Admin)) != 1 {
		t.Errorf("warnings %q, voices %v", warn, l2.List(auth.Admin))
	}
}

// Errors that can reach clients name no server path: an unreadable clip says so by id (the
// details go to the log), and a failed write is a plain 500.
func TestErrorsNameNoPath(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	l.Log = slog.New(slog.NewTextHandler(&logs, nil))
	v, err := l.Add(auth.Admin, "Gone", toneWAV(t, 2, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, v.ID+".wav"))
	_, _, err = l.Clip(auth.Admin, "Gone")
	if err == nil || strings.Contains(err.Error(), dir) || err.Error() != "voice "+v.ID+": clip is unreadable" {
		t.Errorf("Clip of a lost file: %v", err)
	}
	if !errors.Is(err, ErrUnreadable) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the cause is lost: %v", err)
	}
	if !strings.Contains(logs.String(), dir) {
		t.Errorf("the log lacks the details: %q", logs.String())
	}

	// The directory vanishes and a file takes its place (a failure even root cannot write
	// through): the upload fails with a 500 that does not show where the library lives.
	srv := serve(t, l)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(dir, []byte("not a directory"), 0o644)
	body, ct := multipartBody(t, "New", toneWAV(t, 2, 0.5))
	resp, err := http.Post(srv.URL+"/v1/voices", ct, body)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || strings.Contains(string(raw), dir) || strings.Contains(string(raw), "/") {
		t.Errorf("failed upload: %d %s", resp.StatusCode, raw)
	}
	if len(l.List(auth.Admin)) != 1 {
		t.Errorf("a failed upload is listed: %v", l.List(auth.Admin))
	}
}
