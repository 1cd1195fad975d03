package tts_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts"
)

// faulty is a synthesizer with a bug: after one chunk of audio it panics, or fails with an
// error that names a server path. It stands in for a model bug the server must survive.
type faulty struct{ name string }

func (f faulty) Info() stream.SynthInfo { return stream.SynthInfo{Name: f.name, SampleRate: 24000} }

func (f faulty) Synthesize(ctx context.Context, req stream.SynthRequest, out func(stream.SynthChunk) error) error {
	if f.name == "panics" {
		var m map[string]int
		m["boom"]++ // a nil-map write: a real runtime panic
	}
	return errors.New("open /srv/secret/voices/v_0123.wav: no such file or directory")
}

func hardenedServer(t *testing.T) string {
	s := synths(t)
	s.Register(faulty{"panics"})
	s.Register(faulty{"leaks"})
	_, base := newServer(t, tts.Config{Synthesizers: s})
	return base
}

// TestOptionsAndPanicsOverWebSocket: numeric options are checked against the documented
// ranges (max_tokens near MaxInt64 crashed the process), a panicking model becomes that
// context's error, errors name no server path, and the socket goes on serving.
func TestOptionsAndPanicsOverWebSocket(t *testing.T) {
	c := dial(t, hardenedServer(t))
	expect := func(msg map[string]any, code string) tts.ServerMessage {
		t.Helper()
		c.send(msg)
		m := c.next(func(m tts.ServerMessage) bool { return m.Type == "error" || m.Type == "done" })
		if m.Type != "error" || m.Code != code {
			t.Errorf("%v: %+v, want error %s", msg, m, code)
		}
		return m
	}
	for i, o := range []map[string]any{
		{"max_tokens": int64(9223372036854775807)}, {"max_tokens": -1}, {"max_tokens": stream.MaxTokensLimit + 1},
		{"temperature": 100}, {"temperature": -1}, {"temperature": 0.001},
	} {
		expect(map[string]any{"type": "speak", "context_id": "o" + itoa(i), "text": "Hello.", "options": o}, tts.CodeBadMessage)
	}
	m := expect(speak("p", "Hello.", false, map[string]any{"model": "panics"}), tts.CodeSynthesis)
	if strings.Contains(m.Message, "boom") || strings.Contains(m.Message, "goroutine") {
		t.Errorf("panic detail reached the client: %q", m.Message)
	}
	m = expect(speak("q", "Hello.", false, map[string]any{"model": "leaks"}), tts.CodeSynthesis)
	if strings.Contains(m.Message, "/srv") || strings.Contains(m.Message, ".wav") || !strings.Contains(m.Message, "ref ") {
		t.Errorf("error message %q: want a log reference and no path", m.Message)
	}
	// Still serving, with options at the edges of the ranges.
	c.send(speak("ok", "Hello there.", false, map[string]any{"model": "miotts", "options": map[string]any{"max_tokens": 20, "temperature": 2}}))
	if audio, done := c.collect("ok"); done.Type != "done" || len(audio) == 0 {
		t.Errorf("after the faults: %+v, %d bytes", done, len(audio))
	}
}

// TestOptionsAndPanicsOverHTTP: the speech endpoint checks the same table, and a panicking
// model gives that request a 500 while the server goes on.
func TestOptionsAndPanicsOverHTTP(t *testing.T) {
	base := hardenedServer(t)
	post := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+"/v1/audio/speech", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, body := range []string{
		`{"input":"Hi.","options":{"max_tokens":9223372036854775807}}`,
		`{"input":"Hi.","options":{"max_tokens":-1}}`,
		`{"input":"Hi.","options":{"temperature":100}}`,
		`{"input":"Hi.","options":{"temperature":-1}}`,
		`{"input":"Hi.","speed":0}`,
		`{"input":"Hi.","speed":1e308}`,
	} {
		if code, b := post(strings.Replace(body, "{", `{"model":"miotts",`, 1)); code != 400 || !strings.Contains(b, tts.CodeBadMessage) {
			t.Errorf("%s: %d %s", body, code, b)
		}
	}
	if code, b := post(`{"model":"panics","input":"Hi."}`); code != 500 || strings.Contains(b, "boom") {
		t.Errorf("panicking model: %d %s", code, b)
	}
	if code, b := post(`{"model":"leaks","input":"Hi."}`); code != 500 || strings.Contains(b, "/srv") {
		t.Errorf("failing model: %d %s", code, b)
	}
	if code, b := post(`{"model":"miotts","input":"Hello there.","options":{"max_tokens":20}}`); code != 200 || len(b) < 44 {
		t.Errorf("after the faults: %d, %d bytes", code, len(b))
	}
}

func itoa(i int) string { return string(rune('0' + i)) }
