package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

func tinyVC(t *testing.T) string {
	t.Helper()
	return golden.Path(t, "meanvc2", "model.gguf")
}

// sendSpeech sends the first 2 s of the speech fixture through a session, waits for the
// tail to come back, and returns all the audio received.
func sendSpeech(t *testing.T, ctx context.Context, c *rtcclient.Client) []float32 {
	t.Helper()
	in, err := wav.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	packets, err := rtcclient.EncodeFrames(in.Mono()[:2*48000])
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendPackets(ctx, packets); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	return c.Received().PCM
}

func rmsOf(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s / float64(max(len(x), 1)))
}

// writeClip writes seconds of a 48 kHz clip: a 220 Hz tone at amplitude amp (0: silence).
func writeClip(t *testing.T, dir, name string, seconds, amp float64) string {
	t.Helper()
	x := make([]float32, int(seconds*48000))
	for i := range x {
		x[i] = float32(amp * math.Sin(2*math.Pi*220*float64(i)/48000))
	}
	p := filepath.Join(dir, name)
	if err := wav.WriteFile(p, x, 48000, 1); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConvertMeanVC2(t *testing.T) {
	_, got := convertFixture(t, "--model", tinyVC(t), "--ref", fixture, "--threads", "2")
	if r := rmsOf(got.Mono()); r < 1e-4 {
		t.Errorf("output is silent (RMS %.2g)", r)
	}
}

func TestConvertMeanVC2Errors(t *testing.T) {
	model := tinyVC(t)
	dir := t.TempDir()
	silent := writeClip(t, dir, "silent.wav", 3, 0)
	short := writeClip(t, dir, "short.wav", 0.5, 0.3)
	out := filepath.Join(dir, "o.wav")
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--model", model}, "--ref"},
		{[]string{"--ref", fixture}, "--model"},
		{[]string{"--voice", "meanvc2"}, "--model"},
		{[]string{"--model", model, "--ref", silent}, "silent"},
		{[]string{"--model", model, "--ref", short}, "at least"},
		{[]string{"--model", model, "--ref", filepath.Join(dir, "none.wav")}, "reference clip"},
		{[]string{"--model", model, "--ref", fixture, "--pitch", "3"}, "dsp voice only"},
		{[]string{"--model", model, "--ref", fixture, "--voice", "passthrough"}, "does not go with"},
	} {
		args := append([]string{"convert", fixture, out, "--threads", "2"}, c.args...)
		if _, stderr, code := runCmd(t, args...); code == 0 || !strings.Contains(stderr, c.msg) {
			t.Errorf("%v: exit %d, %q (want an error saying %q)", c.args, code, stderr, c.msg)
		}
	}
}

func TestBridgeMeanVC2OnTheNullBackend(t *testing.T) {
	model := tinyVC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	rep, err := bridge(ctx, bridgeOptions{backend: "null", voice: "dsp", vc: vcOptions{model: model, ref: fixture, threads: 2},
		rate: 48000, period: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bridge ran %.2f s, %d chunks, algorithmic latency %v", float64(rep.frames)/float64(rep.rate), rep.stats.Chunks, rep.algorithm)
	if rep.stats.Voice != "meanvc2" || rep.stats.Chunks == 0 {
		t.Errorf("bridge did not run meanvc2: %+v", rep.stats)
	}
	silent := writeClip(t, t.TempDir(), "silent.wav", 3, 0)
	if _, err := bridge(context.Background(), bridgeOptions{backend: "null", voice: "dsp", vc: vcOptions{model: model, ref: silent, threads: 2}}); err == nil || !strings.Contains(err.Error(), "silent") {
		t.Errorf("silent reference: %v", err)
	}
}

// upload posts a clip to the voice library and returns its id.
// upload adds a clip to the voice library (with an API key, if one is given) and returns its id.
func upload(t *testing.T, base, name, path string, key ...string) string {
	t.Helper()
	clip, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("name", name)
	fw, _ := mw.CreateFormFile("file", filepath.Base(path))
	fw.Write(clip)
	mw.Close()
	req, _ := http.NewRequest("POST", base+"/v1/voices", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	if len(key) > 0 {
		req.Header.Set("Authorization", "Bearer "+key[0])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&v)
	if resp.StatusCode != 201 || v.ID == "" {
		t.Fatalf("upload: %d %+v", resp.StatusCode, v)
	}
	return v.ID
}

// sendWait sends a session message and waits for the error with code that answers it.
func sendWait(t *testing.T, c *rtcclient.Client, m rtc.Message, code string) rtc.Message {
	t.Helper()
	n := len(c.Messages())
	if err := c.Send(m); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range c.Messages()[n:] {
			if r.Type == "error" && r.Code == code {
				return r
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("%+v: no %s error; messages %+v", m, code, c.Messages()[n:])
	return rtc.Message{}
}

// waitReady waits for a ready message naming voice.
func waitReady(c *rtcclient.Client, voice string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if slices.ContainsFunc(c.Messages(), func(m rtc.Message) bool { return m.Type == "ready" && m.Voice == voice }) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// TestServeMeanVC2: --vc-model lists the voice; a session picks an uploaded clip by id and
// gets converted audio; a session without a ref, or with an unknown one, gets a clear error;
// the embedding lands in the library's cache directory.
func TestServeMeanVC2(t *testing.T) {
	o := serveOptions{vcModels: []string{tinyVC(t)}, voicesDir: t.TempDir()}
	base := testApp(t, o)
	resp, err := http.Get(base + "/v1/voices")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Processors []string }
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if !slices.Contains(list.Processors, "meanvc2") {
		t.Fatalf("GET /v1/voices lists %v, no meanvc2", list.Processors)
	}
	id := upload(t, base, "Speaker", fixture)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(base)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if m := sendWait(t, c, rtc.Message{Type: "session", Voice: "meanvc2"}, rtc.CodeBadParams); !strings.Contains(m.Message, `"ref"`) {
		t.Errorf("meanvc2 without a ref: %q", m.Message)
	}
	if m := sendWait(t, c, rtc.Message{Type: "session", Voice: "meanvc2", Ref: "nobody"}, rtc.CodeUnknownVoice); !strings.Contains(m.Message, "nobody") {
		t.Errorf("unknown ref: %q", m.Message)
	}
	if m := sendWait(t, c, rtc.Message{Type: "session", Voice: "dsp", Ref: id}, rtc.CodeBadParams); !strings.Contains(m.Message, "reference") {
		t.Errorf("ref for the dsp voice: %q", m.Message)
	}
	c.Send(rtc.Message{Type: "session", Voice: "meanvc2", Ref: "Speaker"}) // by name
	if !waitReady(c, "meanvc2", 10*time.Second) {
		t.Fatalf("no ready for meanvc2; messages %+v", c.Messages())
	}
	got := sendSpeech(t, ctx, c)
	if r := rmsOf(got); r < 1e-3 {
		t.Errorf("received %d samples with RMS %.2g: no converted audio", len(got), r)
	}
	st := c.Stats()
	if len(st) == 0 || st[len(st)-1].Voice != "meanvc2" {
		t.Errorf("stats do not report meanvc2: %+v", st)
	}
	embs, _ := filepath.Glob(filepath.Join(o.voicesDir, "embeddings", "*"))
	if len(embs) == 0 {
		t.Error("no embedding cached in the voice library directory")
	}
	// The session's steps went through the model's batcher, and /metrics counts them.
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, stage := range []string{"asr", "step"} {
		re := regexp.MustCompile(`voxpipe_vc_batched_total\{model="meanvc2-120ms",stage="` + stage + `"\} (\d+)`)
		if m := re.FindSubmatch(body); m == nil || string(m[1]) == "0" {
			t.Errorf("/metrics: no %s batches counted for meanvc2-120ms: %q", stage, m)
		}
	}
}

func TestServeMeanVC2Options(t *testing.T) {
	model := tinyVC(t)
	dir := t.TempDir()
	silent := writeClip(t, dir, "silent.wav", 3, 0)
	logs := io.Discard
	for _, c := range []struct {
		o   serveOptions
		msg string
	}{
		{serveOptions{vcModels: []string{model}, vcRef: silent}, "silent"},
		{serveOptions{vcRef: fixture}, "--vc-model"},
		{serveOptions{vcModels: []string{model}, vcRef: "nobody"}, "nobody"},
	} {
		c.o.voicesDir, c.o.threads, c.o.voice = t.TempDir(), 2, "dsp"
		a, err := newApp(c.o, nil, logs)
		if err == nil {
			a.close()
		}
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%+v: %v (want an error saying %q)", c.o, err, c.msg)
		}
	}
	// --voice meanvc2 with a default clip serves it to sessions that name no ref.
	o := serveOptions{vcModels: []string{model}, vcRef: fixture, voicesDir: t.TempDir()}
	base := testApp(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(base), Voice: "meanvc2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !waitReady(c, "meanvc2", 10*time.Second) {
		t.Fatalf("no ready for meanvc2: %+v", c.Messages())
	}
}
