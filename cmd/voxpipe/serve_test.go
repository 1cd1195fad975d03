package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
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
	for _, want := range []string{`voxpipe_tts_ttfa_seconds_count{model="miotts"} 2`, `voxpipe_admission_slots{model="miotts"} 2`,
		`voxpipe_decode_rounds_total{model="miotts"} `, `voxpipe_decode_steps_total{model="miotts"} `} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(string(m), `voxpipe_decode_steps_total{model="miotts"} 0`+"\n") {
		t.Error("two utterances spoken, no decode step counted")
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
	// Speech tokens are the audio at 25 a second, over a wall time of at least the 2 s asked.
	if res.TokensPerS <= 0 || res.TokensPerS > res.AudioSeconds*25/2 {
		t.Errorf("tokens/s %.1f for %.1f s of audio in a 2 s run", res.TokensPerS, res.AudioSeconds)
	}
	if res.RTFP50 <= 0 || res.RTFMax < res.RTFP50 {
		t.Errorf("RTF p50 %.2f, max %.2f", res.RTFP50, res.RTFMax)
	}
	t.Logf("%+v", res)

	// --backend goes to the server it starts; one that does not start is an error at once,
	// not a 3-minute wait for it to listen.
	start := time.Now()
	out, err = exec.Command(bin, "bench", "tts-load", "--sessions", "1", "--seconds", "1", "--backend", "nosuch",
		"--model", lm, "--codec", codec, "--voice", filepath.Join("..", "..", "testdata", "speech_en_48k.wav")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "nosuch") || !strings.Contains(string(out), "exited before it listened") {
		t.Errorf("--backend nosuch: %v\n%s", err, out)
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("a server that could not start took %v to report", took)
	}
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

// TestServeBothMeanVC2Variants: serve with both MeanVC2 files lists meanvc2-120ms,
// meanvc2-40ms and the alias meanvc2 with their latencies (the 40 ms model's lower, each the
// one its sessions report), a session converts with meanvc2-40ms, and /metrics then has its
// algorithmic latency.
func TestServeBothMeanVC2Variants(t *testing.T) {
	o := serveOptions{vcModels: []string{golden.Path(t, "meanvc2", "model.gguf"), golden.Path(t, "meanvc2_40ms", "model.gguf")}}
	base := testApp(t, o)
	resp, err := http.Get(base + "/v1/voices")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Processors []string
		LiveVoices []struct {
			Name     string
			Latency  float64 `json:"algorithmic_latency_ms"`
			NeedsRef bool    `json:"needs_ref"`
			Label    string
		} `json:"live_voices"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("live voices: %+v", list.LiveVoices)
	byName := map[string]int{}
	for i, v := range list.LiveVoices {
		byName[v.Name] = i
	}
	for _, name := range []string{"dsp", "passthrough", "meanvc2", "meanvc2-120ms", "meanvc2-40ms"} {
		if _, ok := byName[name]; !ok || !slices.Contains(list.Processors, name) {
			t.Fatalf("%s missing: live voices %+v, processors %v", name, list.LiveVoices, list.Processors)
		}
	}
	get := func(name string) (lat float64, ref bool, label string) {
		v := list.LiveVoices[byName[name]]
		return v.Latency, v.NeedsRef, v.Label
	}
	dsp, dspRef, _ := get("dsp")
	q, qRef, qLabel := get("meanvc2-120ms")
	fast, fastRef, fastLabel := get("meanvc2-40ms")
	alias, aliasRef, _ := get("meanvc2")
	if dspRef || !qRef || !fastRef || !aliasRef {
		t.Errorf("needs_ref: dsp %v, 120ms %v, 40ms %v, meanvc2 %v", dspRef, qRef, fastRef, aliasRef)
	}
	if !(dsp > 40 && dsp < fast && fast < q && q < 1000) || alias != q {
		t.Errorf("latencies: dsp %.1f, 40ms %.1f, 120ms %.1f, meanvc2 %.1f ms", dsp, fast, q, alias)
	}
	if !strings.Contains(fastLabel, "low latency") || !strings.Contains(qLabel, "120 ms") {
		t.Errorf("labels %q, %q", fastLabel, qLabel)
	}

	id := upload(t, base, "Speaker", fixture)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(base)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Send(rtc.Message{Type: "session", Voice: "meanvc2-40ms", Ref: id})
	if !waitReady(c, "meanvc2-40ms", 10*time.Second) {
		t.Fatalf("no ready for meanvc2-40ms; messages %+v", c.Messages())
	}
	var ready rtc.Message
	for _, m := range c.Messages() {
		if m.Type == "ready" && m.Voice == "meanvc2-40ms" {
			ready = m
		}
	}
	if math.Abs(ready.AlgorithmicLatency-fast) > 0.01 {
		t.Errorf("the session reports %.3f ms, the listing %.3f ms", ready.AlgorithmicLatency, fast)
	}
	if r := rmsOf(sendSpeech(t, ctx, c)); r < 1e-3 {
		t.Errorf("no converted audio (RMS %.2g)", r)
	}
	st := c.Stats()
	if len(st) == 0 || st[len(st)-1].Voice != "meanvc2-40ms" {
		t.Fatalf("stats do not report meanvc2-40ms: %+v", st)
	}
	t.Logf("last stats: %+v", st[len(st)-1])
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(m), `voxpipe_vc_algorithmic_latency_seconds{voice="meanvc2-40ms"}`) {
		t.Error("metrics lack the session's algorithmic latency")
	}
}

// Two files of one variant are refused at startup, naming both; --vc-ref is embedded with
// every model.
func TestServeMeanVC2VariantErrors(t *testing.T) {
	q := golden.Path(t, "meanvc2", "model.gguf")
	fast := golden.Path(t, "meanvc2_40ms", "model.gguf")
	silent := writeClip(t, t.TempDir(), "silent.wav", 3, 0)
	for _, c := range []struct {
		o   serveOptions
		msg string
	}{
		{serveOptions{vcModels: []string{q, fast, q}}, "both the 120ms MeanVC2 model"},
		{serveOptions{vcModels: []string{fast, fast}}, "both the 40ms MeanVC2 model"},
		{serveOptions{vcModels: []string{q, fast}, vcRef: silent}, "silent"},
	} {
		o := testDefaults(t, c.o)
		a, err := newApp(o, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
		if err == nil {
			a.close()
		}
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%v: %v (want an error saying %q)", c.o.vcModels, err, c.msg)
		}
	}
	// Repeated and comma-separated flags add up; the first model is also meanvc2.
	var l listFlag
	l.Set(q + "," + fast)
	l.Set(" x.gguf ")
	if len(l) != 3 || l[0] != q || l[1] != fast || l[2] != "x.gguf" {
		t.Errorf("--vc-model list %q", l)
	}
	var out strings.Builder
	a, err := newApp(testDefaults(t, serveOptions{vcModels: []string{fast, q}}), slog.New(slog.NewTextHandler(io.Discard, nil)), &out)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	t.Logf("startup output:\n%s", out.String())
	for _, want := range []string{"loading " + fast, "loading " + q, "live voice meanvc2: MeanVC2 (the 40ms model)", "live voice meanvc2-120ms: MeanVC2 120 ms (quality)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("startup output lacks %q", want)
		}
	}
}

// OpenAI compatibility at the server: /v1/models lists the loaded model and the OpenAI names
// that stand for it, unknown /v1/ paths answer in JSON, a --voice-alias maps a voice name,
// and a malformed alias stops the start.
func TestServeOpenAICompat(t *testing.T) {
	o := ttsOptions(t)
	o.voiceAliases = []string{"alloy=nobody-here"}
	base := testApp(t, o)
	var list struct {
		Object string
		Data   []struct{ ID, Object string }
	}
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if list.Object != "list" || !slices.Contains(ids, "miotts") || !slices.Contains(ids, "tts-1") {
		t.Errorf("/v1/models: %+v", list)
	}
	resp, err = http.Get(base + "/v1/no-such-thing")
	if err != nil {
		t.Fatal(err)
	}
	var e struct{ Error struct{ Code string } }
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 404 || e.Error.Code != "not_found" {
		t.Errorf("unknown /v1/ path: %d %+v", resp.StatusCode, e)
	}
	// The alias sends alloy to a voice that does not exist: the request says so.
	resp, err = http.Post(base+"/v1/audio/speech", "application/json", strings.NewReader(`{"model":"tts-1","voice":"alloy","input":"Hi."}`))
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 400 || e.Error.Code != "unknown_voice" {
		t.Errorf("aliased voice: %d %+v", resp.StatusCode, e)
	}
	if _, stderr, code := runCmd(t, "serve", "--listen", "127.0.0.1:0", "--voices", t.TempDir(), "--voice-alias", "alloy"); code == 0 || !strings.Contains(stderr, "NAME=VOICE") {
		t.Errorf("bad --voice-alias: exit %d %q", code, stderr)
	}
}
