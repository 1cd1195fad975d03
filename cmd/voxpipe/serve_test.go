package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/internal/golden"
)

// testDefaults fills the settings a test server takes unless the test set them.
func testDefaults(t *testing.T, o serveOptions) serveOptions {
	o.voice, o.loopback, o.jitter, o.threads = "dsp", true, 40*time.Millisecond, 2
	if o.voicesDir == "" {
		o.voicesDir = t.TempDir()
	}
	if o.ttsSlots == 0 {
		o.ttsSlots, o.ttsWait = 2, time.Second
	}
	return o
}

// status sends req (with an API key, if given) and returns the status code.
func status(t *testing.T, req *http.Request, key string) int {
	t.Helper()
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func testApp(t *testing.T, o serveOptions) string {
	t.Helper()
	o = testDefaults(t, o)
	a, err := newApp(o, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(a.handler)
	t.Cleanup(func() {
		a.close()
		hs.Close()
	})
	return hs.URL
}

// TestServeTTSWithVoiceLibrary: a voice uploaded to the library speaks through the
// OpenAI endpoint, survives a restart, and the metrics count the stream.
func TestServeTTSWithVoiceLibrary(t *testing.T) {
	o := serveOptions{ttsModel: golden.Path(t, "miotts", "model.gguf"), codec: golden.Path(t, "miocodec", "model.gguf"), voicesDir: t.TempDir()}
	base := testApp(t, o)
	clip, err := os.ReadFile(filepath.Join("..", "..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("name", "Narrator")
	fw, _ := mw.CreateFormFile("file", "narrator.wav")
	fw.Write(clip)
	mw.Close()
	resp, err := http.Post(base+"/v1/voices", mw.FormDataContentType(), &body)
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if resp.StatusCode != 201 || v.ID == "" {
		t.Fatalf("upload: %d %+v", resp.StatusCode, v)
	}
	speak := func(base, voice string) int {
		resp, err := http.Post(base+"/v1/audio/speech", "application/json",
			strings.NewReader(`{"model":"miotts","input":"Hello from the library.","voice":"`+voice+`","response_format":"pcm","options":{"max_tokens":20}}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Errorf("speech with voice %s: %d %s", voice, resp.StatusCode, b)
		}
		return len(b)
	}
	if n := speak(base, v.ID); n == 0 {
		t.Error("no audio")
	}
	speak(base, "Narrator") // by name too
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`voxpipe_tts_ttfa_seconds_count{model="miotts"} 2`, `voxpipe_admission_slots{model="miotts"} 2`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	resp, _ = http.Get(base + "/v1/voices")
	var list struct {
		Voices     []struct{ ID, Name string }
		Processors []string
		TTSModels  []string `json:"tts_models"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Voices) != 1 || list.Voices[0].Name != "Narrator" || len(list.Processors) == 0 || len(list.TTSModels) != 1 {
		t.Errorf("voices: %+v", list)
	}
	// A restart on the same library directory still speaks with the uploaded voice.
	base2 := testApp(t, o)
	if n := speak(base2, v.ID); n == 0 {
		t.Error("no audio after restart")
	}
}

func TestBenchTTSLoad(t *testing.T) {
	lm := golden.Path(t, "miotts", "model.gguf")
	codec := golden.Path(t, "miocodec", "model.gguf")
	// The bench starts this binary's serve command: build it first.
	bin := filepath.Join(t.TempDir(), "voxpipe")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "bench", "tts-load", "--sessions", "3", "--seconds", "2", "--slots", "1", "--queue", "20ms",
		"--model", lm, "--codec", codec, "--voice", filepath.Join("..", "..", "testdata", "speech_en_48k.wav"), "--json").Output()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	var res ttsLoadResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.Utterances == 0 || res.AudioSeconds <= 0 || res.TTFAMsP50 <= 0 || !res.ServerStarted {
		t.Errorf("figures: %+v", res)
	}
	t.Logf("%+v", res)
}

func TestServeAuth(t *testing.T) {
	// Binding beyond loopback without keys is refused at start.
	if _, stderr, code := runCmd(t, "serve", "--listen", "0.0.0.0:0", "--voices", t.TempDir()); code == 0 || !strings.Contains(stderr, "needs API keys") {
		t.Errorf("public bind without keys: exit %d %q", code, stderr)
	}
	key := "test-key-0123456789abcdef"
	base := testApp(t, serveOptions{apiKeys: []string{key}})
	get := func(path, header string) int {
		req, _ := http.NewRequest("GET", base+path, nil)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		return status(t, req, "")
	}
	for _, c := range []struct {
		path, header string
		want         int
	}{
		{"/v1/voices", "", 401}, {"/v1/voices", "Bearer wrong-key-0123456789", 401}, {"/v1/voices", "Bearer " + key, 200},
		{"/v1/voices?token=" + key, "", 200}, {"/metrics", "", 401}, {"/healthz", "", 200}, {"/", "", 200}, {"/tts.html", "", 200},
	} {
		if got := get(c.path, c.header); got != c.want {
			t.Errorf("GET %s (%q): %d, want %d", c.path, c.header, got, c.want)
		}
	}
}
