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
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/internal/golden"
)

func testApp(t *testing.T, o serveOptions) string {
	t.Helper()
	o.voice, o.loopback, o.jitter, o.threads = "dsp", true, 40*time.Millisecond, 2
	if o.voicesDir == "" {
		o.voicesDir = t.TempDir()
	}
	if o.ttsSlots == 0 {
		o.ttsSlots, o.ttsWait = 2, time.Second
	}
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
