package library

import (
	"bytes"
	"encoding/json"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/server/auth"
)

func speechWAV(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func toneWAV(t testing.TB, seconds, amp float64) []byte {
	x := make([]float32, int(seconds*16000))
	for i := range x {
		x[i] = float32(amp * math.Sin(float64(i)*0.1))
	}
	var b bytes.Buffer
	if err := wav.Write(&b, x, 16000, 1); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func multipartBody(t testing.TB, name string, file []byte) (*bytes.Buffer, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	if name != "" {
		mw.WriteField("name", name)
	}
	if file != nil {
		fw, _ := mw.CreateFormFile("file", "clip.wav")
		fw.Write(file)
	}
	mw.Close()
	return &b, mw.FormDataContentType()
}

// routes serves l's endpoints on the paths server/ gives them.
func routes(l *Library) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/voices", l.Upload)
	mux.HandleFunc("GET /v1/voices/{id}", l.Show)
	mux.HandleFunc("DELETE /v1/voices/{id}", l.Remove)
	return mux
}

func serve(t *testing.T, l *Library) *httptest.Server {
	mux := routes(l)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func upload(t *testing.T, url, name string, file []byte) (int, map[string]any) {
	t.Helper()
	body, ct := multipartBody(t, name, file)
	resp, err := http.Post(url+"/v1/voices", ct, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func TestUploadListDeleteSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	l, warn, err := Open(dir)
	if err != nil || len(warn) > 0 {
		t.Fatal(err, warn)
	}
	srv := serve(t, l)
	code, v := upload(t, srv.URL, "Alice", speechWAV(t))
	if code != http.StatusCreated || !ValidID(v["id"].(string)) || v["name"] != "Alice" {
		t.Fatalf("upload: %d %v", code, v)
	}
	id := v["id"].(string)
	code, v2 := upload(t, srv.URL, "Bob", toneWAV(t, 2, 0.5))
	if code != http.StatusCreated {
		t.Fatalf("second upload: %d %v", code, v2)
	}
	if got := l.List(auth.Admin); len(got) != 2 || got[0].ID != id {
		t.Fatalf("list %v", got)
	}
	clip, rate, err := l.Clip(auth.Admin, "Alice")
	if err != nil || rate != 48000 || len(clip) == 0 {
		t.Fatalf("clip by name: %d samples at %d, %v", len(clip), rate, err)
	}
	// Restart: a new library on the same directory has both voices and the same audio.
	l2, warn, err := Open(dir)
	if err != nil || len(warn) > 0 || len(l2.List(auth.Admin)) != 2 {
		t.Fatalf("reopen: %v %v %v", l2.List(auth.Admin), warn, err)
	}
	clip2, _, _ := l2.Clip(auth.Admin, id)
	if len(clip2) != len(clip) {
		t.Errorf("clip after restart: %d samples, was %d", len(clip2), len(clip))
	}
	// Delete over HTTP; a second delete and unknown ids are 404; paths never reach the disk.
	for _, c := range []struct {
		path string
		want int
	}{{id, 204}, {id, 404}, {"v_0000000000000000", 404}, {"..%2f..%2fetc%2fpasswd", 404}, {"v_../../x", 404}} {
		req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/v1/voices/"+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("DELETE %s: %d, want %d", c.path, resp.StatusCode, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, id+".wav")); !os.IsNotExist(err) {
		t.Errorf("clip file still there after delete: %v", err)
	}
	// A damaged metadata file is skipped with a warning, not fatal.
	os.WriteFile(filepath.Join(dir, "v_1111111111111111.json"), []byte("{"), 0o644)
	l3, warn, err := Open(dir)
	if err != nil || len(warn) != 1 || len(l3.List(auth.Admin)) != 1 {
		t.Errorf("damaged entry: %v %v %v", l3.List(auth.Admin), warn, err)
	}
}

func TestBadUploads(t *testing.T) {
	l, _, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l.MaxBytes = 1 << 20
	srv := serve(t, l)
	for _, c := range []struct {
		name, what string
		file       []byte
		want       int
		msg        string
	}{
		{"x", "not audio", []byte("hello, this is not a wav file"), 400, "not a WAV"},
		{"x", "silent", toneWAV(t, 2, 0), 400, "silent"},
		{"x", "too short", toneWAV(t, 0.3, 0.5), 400, "at least"},
		{"x", "too long", toneWAV(t, 31, 0.5), 400, "limit"},
		{"x", "too big", toneWAV(t, 40, 0.5), 413, "size limit"},
		{"", "no name", toneWAV(t, 2, 0.5), 400, "name"},
		{"x", "no file", nil, 400, "file"},
		{strings.Repeat("n", 101), "long name", toneWAV(t, 2, 0.5), 400, "name"},
	} {
		code, out := upload(t, srv.URL, c.name, c.file)
		e, _ := out["error"].(map[string]any)
		if code != c.want || e == nil || !strings.Contains(e["message"].(string), c.msg) {
			t.Errorf("%s: %d %v, want %d mentioning %q", c.what, code, out, c.want, c.msg)
		}
	}
	resp, err := http.Post(srv.URL+"/v1/voices", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("JSON body: %d", resp.StatusCode)
	}
	if len(l.List(auth.Admin)) != 0 {
		t.Errorf("bad uploads stored voices: %v", l.List(auth.Admin))
	}
}

// FuzzUpload sends arbitrary multipart bodies: the handler must answer without panicking
// and only ever store clips that pass the checks.
func FuzzUpload(f *testing.F) {
	good, ct := multipartBody(f, "a", toneWAV(f, 1.5, 0.3))
	f.Add(good.Bytes(), strings.TrimPrefix(ct, "multipart/form-data; boundary="))
	bad, ct2 := multipartBody(f, "b", []byte("RIFF\x10\x00\x00\x00WAVEfmt "))
	f.Add(bad.Bytes(), strings.TrimPrefix(ct2, "multipart/form-data; boundary="))
	dir := f.TempDir()
	l, _, err := Open(dir)
	if err != nil {
		f.Fatal(err)
	}
	l.MaxBytes = 256 << 10
	mux := routes(l)
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/voices", bytes.NewReader(body))
		req.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		if rec.Code != 201 && rec.Code != 400 && rec.Code != 413 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		for _, v := range l.List(auth.Admin) {
			l.Delete(auth.Admin, v.ID)
		}
	})
}
