package tts_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"

	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts"
	"github.com/voxpipe/voxpipe/voice/voicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// synths is the tiny golden MioTTS with the speech fixture as the default voice "ref".
func synths(t *testing.T) *stream.Synthesizers { return voicetest.TinyTTS(t) }

func newServer(t *testing.T, cfg tts.Config) (*tts.Server, string) {
	t.Helper()
	if cfg.Synthesizers == nil {
		cfg.Synthesizers = synths(t)
	}
	srv := tts.NewServer(cfg)
	mux := http.NewServeMux()
	mux.Handle("/v1/tts/ws", srv)
	mux.HandleFunc("/v1/audio/speech", srv.Speech)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
	})
	return srv, hs.URL
}

type client struct {
	t    *testing.T
	conn *websocket.Conn
	msgs chan tts.ServerMessage
}

func dial(t *testing.T, base string) *client {
	t.Helper()
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(base, "http")+"/v1/tts/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, conn: conn, msgs: make(chan tts.ServerMessage, 1024)}
	go func() {
		defer close(c.msgs)
		for {
			var m tts.ServerMessage
			if err := conn.ReadJSON(&m); err != nil {
				return
			}
			c.msgs <- m
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return c
}

func (c *client) send(v any) {
	c.t.Helper()
	if err := c.conn.WriteJSON(v); err != nil {
		c.t.Fatal(err)
	}
}

// next waits for a message that satisfies keep.
func (c *client) next(keep func(tts.ServerMessage) bool) tts.ServerMessage {
	c.t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				c.t.Fatal("socket closed")
			}
			if keep(m) {
				return m
			}
		case <-timeout:
			c.t.Fatal("timed out waiting for a message")
		}
	}
}

// collect gathers a context's audio until its done (or error) message.
func (c *client) collect(id string) ([]byte, tts.ServerMessage) {
	c.t.Helper()
	var audio []byte
	seq := 0
	for {
		m := c.next(func(m tts.ServerMessage) bool { return m.ContextID == id })
		switch m.Type {
		case "audio":
			seq++
			if m.Seq != seq {
				c.t.Fatalf("context %s: seq %d, want %d", id, m.Seq, seq)
			}
			audio = append(audio, m.Data...)
		default:
			return audio, m
		}
	}
}

func speak(id, text string, cont bool, extra map[string]any) map[string]any {
	m := map[string]any{"type": "speak", "context_id": id, "text": text, "continue": cont,
		"options": map[string]any{"max_tokens": 30, "seed": 5}}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

func TestSpeakContextsAndContinue(t *testing.T) {
	_, base := newServer(t, tts.Config{DefaultSlots: 4})
	c := dial(t, base)
	// Two contexts at once, different formats; the second arrives in pieces.
	c.send(speak("a", "Hello there, how are you?", false, nil))
	c.send(speak("b", "Good morning. ", true, map[string]any{"format": map[string]any{"encoding": "mulaw", "sample_rate": 8000}}))
	c.send(speak("b", "Nice to meet you", true, nil))
	c.send(map[string]any{"type": "flush", "context_id": "b"})
	c.send(speak("b", " again.", false, nil))
	// Messages of both contexts interleave on the socket.
	results := map[string][]byte{}
	pending := map[string]bool{"a": true, "b": true}
	seq := map[string]int{}
	flushed := -1 // b's audio bytes when its flush_done came
	for len(pending) > 0 {
		m := c.next(func(tts.ServerMessage) bool { return true })
		switch m.Type {
		case "flush_done":
			if m.ContextID != "b" || flushed >= 0 {
				t.Errorf("unexpected %+v", m)
			}
			flushed = len(results["b"])
		case "audio":
			seq[m.ContextID]++
			if m.Seq != seq[m.ContextID] {
				t.Fatalf("context %s: seq %d, want %d", m.ContextID, m.Seq, seq[m.ContextID])
			}
			results[m.ContextID] = append(results[m.ContextID], m.Data...)
		case "done":
			if m.Metrics == nil || m.Metrics.AudioMs <= 0 || m.Metrics.TTFAMs <= 0 {
				t.Errorf("done %s: metrics %+v", m.ContextID, m.Metrics)
			}
			t.Logf("context %s done: %+v", m.ContextID, *m.Metrics)
			delete(pending, m.ContextID)
		default:
			t.Fatalf("unexpected %+v", m)
		}
	}
	// a: 24 kHz PCM; b: 8 kHz μ-law, three pieces of text → more audio than one piece.
	if len(results["a"]) < 2*2400 || len(results["a"])%2 != 0 {
		t.Errorf("context a: %d bytes of PCM", len(results["a"]))
	}
	if len(results["b"]) < 800 {
		t.Errorf("context b: %d bytes of μ-law", len(results["b"]))
	}
	// flush_done came after the flushed text's audio ("Good morning. Nice to meet you") and
	// before the rest (" again.").
	if flushed <= 0 || flushed >= len(results["b"]) {
		t.Errorf("flush_done after %d of %d bytes of b's audio", flushed, len(results["b"]))
	}
	// The same request again (same seed) gives the same audio.
	c.send(speak("a", "Hello there, how are you?", false, nil))
	again, done := c.collect("a")
	if done.Type != "done" || !bytes.Equal(again, results["a"]) {
		t.Errorf("repeat: %s, %d vs %d bytes equal=%v", done.Type, len(again), len(results["a"]), bytes.Equal(again, results["a"]))
	}
}

func TestCancelStopsAudio(t *testing.T) {
	_, base := newServer(t, tts.Config{})
	c := dial(t, base)
	long := strings.Repeat("This sentence goes on and on. ", 20)
	c.send(map[string]any{"type": "speak", "context_id": "x", "text": long, "options": map[string]any{"max_tokens": 200}})
	first := c.next(func(m tts.ServerMessage) bool { return m.ContextID == "x" })
	if first.Type != "audio" {
		t.Fatalf("first message %+v", first)
	}
	c.send(map[string]any{"type": "cancel", "context_id": "x"})
	after := 0
	for {
		m := c.next(func(m tts.ServerMessage) bool { return m.ContextID == "x" })
		if m.Type == "done" {
			if !m.Canceled {
				t.Errorf("done without canceled: %+v", m)
			}
			// The audio made before the cancel is reported (it was 0 while the piece
			// being spoken was still running).
			if m.Metrics == nil || m.Metrics.AudioMs <= 0 {
				t.Errorf("cancel's done reports no audio after audio was sent: %+v", m.Metrics)
			}
			break
		}
		after++
	}
	// Audio already on the wire may still arrive; nothing may follow the done.
	if after > 2 {
		t.Errorf("%d audio messages after cancel", after)
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case m := <-c.msgs:
		t.Errorf("message after cancel's done: %+v", m)
	default:
	}
	// The socket still works.
	c.send(speak("y", "Still here.", false, nil))
	if _, done := c.collect("y"); done.Type != "done" {
		t.Errorf("after cancel: %+v", done)
	}
}

func TestProtocolErrors(t *testing.T) {
	_, base := newServer(t, tts.Config{MaxText: 50, MaxContexts: 1})
	c := dial(t, base)
	expect := func(send any, code string) {
		t.Helper()
		switch v := send.(type) {
		case string:
			c.conn.WriteMessage(websocket.TextMessage, []byte(v))
		case []byte:
			c.conn.WriteMessage(websocket.BinaryMessage, v)
		default:
			c.send(v)
		}
		m := c.next(func(m tts.ServerMessage) bool { return m.Type == "error" })
		if m.Code != code || m.Message == "" {
			t.Errorf("%v: error %q %q, want %q", send, m.Code, m.Message, code)
		}
	}
	expect("{nope", tts.CodeBadJSON)
	expect([]byte{1, 2, 3}, tts.CodeBadMessage)
	expect(map[string]any{"type": "shout", "context_id": "a"}, tts.CodeBadMessage)
	expect(map[string]any{"type": "speak", "text": "hi"}, tts.CodeBadMessage)
	expect(map[string]any{"type": "flush", "context_id": "nope"}, tts.CodeBadMessage)
	expect(map[string]any{"type": "cancel", "context_id": "nope"}, tts.CodeBadMessage)
	expect(speak("f", "hi", false, map[string]any{"format": map[string]any{"encoding": "aac"}}), tts.CodeBadFormat)
	expect(speak("f", "hi", false, map[string]any{"format": map[string]any{"encoding": "opus", "sample_rate": 44100}}), tts.CodeBadFormat)
	expect(speak("m", "hi", false, map[string]any{"model": "nosuch"}), tts.CodeUnknownModel)
	expect(speak("v", "Hello.", false, map[string]any{"voice": "nobody"}), tts.CodeUnknownVoice)
	expect(speak("l", strings.Repeat("long ", 20), true, nil), tts.CodeTextTooLong)
	c.send(speak("k", "Keep this open", true, nil))
	expect(speak("k2", "second", true, nil), tts.CodeTooMany)
	c.send(map[string]any{"type": "cancel", "context_id": "k"})
	// An oversized message closes the socket (1009).
	big := `{"type":"speak","context_id":"z","text":"` + strings.Repeat("a", 70<<10) + `"}`
	c.conn.WriteMessage(websocket.TextMessage, []byte(big))
	for range c.msgs {
	}
}

func TestBusy(t *testing.T) {
	_, base := newServer(t, tts.Config{DefaultSlots: 1, MaxWait: 30 * time.Millisecond})
	c := dial(t, base)
	long := strings.Repeat("Keep talking for a while. ", 10)
	c.send(map[string]any{"type": "speak", "context_id": "one", "text": long, "options": map[string]any{"max_tokens": 300}})
	c.next(func(m tts.ServerMessage) bool { return m.ContextID == "one" && m.Type == "audio" })
	c.send(speak("two", "Me too.", false, nil))
	m := c.next(func(m tts.ServerMessage) bool { return m.ContextID == "two" })
	if m.Type != "error" || m.Code != tts.CodeBusy || m.RetryAfterMs < 1000 {
		t.Errorf("second context while full: %+v", m)
	}
	// Over HTTP the same is a 503 with Retry-After.
	resp, err := http.Post(base+"/v1/audio/speech", "application/json", strings.NewReader(`{"input":"Hello.","voice":"ref"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("HTTP while full: %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	c.send(map[string]any{"type": "cancel", "context_id": "one"})
	c.next(func(m tts.ServerMessage) bool { return m.ContextID == "one" && m.Type == "done" })
}

func TestSpeechEndpoint(t *testing.T) {
	_, base := newServer(t, tts.Config{})
	post := func(body string) (*http.Response, []byte) {
		t.Helper()
		resp, err := http.Post(base+"/v1/audio/speech", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, b := post(`{"model":"miotts","input":"Hello there.","voice":"ref","response_format":"wav","options":{"max_tokens":30}}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "audio/wav" || string(b[:4]) != "RIFF" {
		t.Fatalf("wav: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), b[:min(len(b), 16)])
	}
	if len(resp.TransferEncoding) == 0 || resp.TransferEncoding[0] != "chunked" {
		t.Errorf("not streamed with chunked transfer: %v", resp.TransferEncoding)
	}
	if rate := binary.LittleEndian.Uint32(b[24:]); rate != 24000 || len(b) < 44+4800 {
		t.Errorf("wav: rate %d, %d bytes", rate, len(b))
	}
	for _, c := range []struct {
		body, ctype string
	}{
		{`{"input":"Hi there.","voice":"ref","response_format":"pcm","options":{"max_tokens":20}}`, "audio/L16"},
		{`{"input":"Hi there.","voice":"ref","response_format":"mulaw","options":{"max_tokens":20}}`, "audio/basic"},
		{`{"input":"Hi there.","voice":"ref","response_format":"opus","speed":1.5,"options":{"max_tokens":20}}`, "audio/ogg"},
		{`{"input":"Hi there.","voice":"ref","response_format":"flac","options":{"max_tokens":20}}`, "audio/flac"},
	} {
		resp, b := post(c.body)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), c.ctype) || len(b) == 0 {
			t.Errorf("%s: %d %q %d bytes", c.body, resp.StatusCode, resp.Header.Get("Content-Type"), len(b))
		}
		if strings.Contains(c.body, "speed") && resp.Header.Get("X-Voxpipe-Note") == "" {
			t.Error("speed ignored without a note")
		}
	}
	for _, c := range []struct {
		body string
		code int
		err  string
	}{
		{`{"input":`, 400, tts.CodeBadJSON},
		{`{"input":""}`, 400, tts.CodeBadMessage},
		{`{"input":"!!! ???"}`, 400, tts.CodeBadMessage},
		{`{"input":"hi","response_format":"aac"}`, 400, tts.CodeBadFormat},
		{`{"input":"hi","stream_format":"ndjson"}`, 400, tts.CodeBadMessage},
		{`{"input":"hi","model":"gpt-5"}`, 404, tts.CodeUnknownModel},
		{`{"input":"hi","voice":"nobody"}`, 400, tts.CodeUnknownVoice},
		{`{"input":"` + strings.Repeat("x", 10001) + `"}`, 400, tts.CodeTextTooLong},
	} {
		resp, b := post(c.body)
		var e struct {
			Error struct{ Code, Message string }
		}
		json.Unmarshal(b, &e)
		if resp.StatusCode != c.code || e.Error.Code != c.err || e.Error.Message == "" {
			t.Errorf("%.40s: %d %s, want %d %s", c.body, resp.StatusCode, b, c.code, c.err)
		}
	}
	// OpenAI's defaults: model tts-1 (the loaded model), voice alloy (the default voice), no
	// response_format (mp3), and instructions (noted as ignored).
	resp, b = post(`{"model":"tts-1","input":"Hi there.","voice":"alloy","instructions":"Speak cheerfully.","options":{"max_tokens":20}}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "audio/mpeg" || len(b) < 2 || b[0] != 0xFF {
		t.Errorf("OpenAI defaults: %d %q % x", resp.StatusCode, resp.Header.Get("Content-Type"), b[:min(len(b), 4)])
	}
	if !strings.Contains(strings.Join(resp.Header.Values("X-Voxpipe-Note"), " "), "instructions") {
		t.Errorf("instructions ignored without a note: %v", resp.Header.Values("X-Voxpipe-Note"))
	}
	// stream_format sse: speech.audio.delta events whose audio is the format's bytes, then
	// speech.audio.done.
	resp, b = post(`{"input":"Hi there.","voice":"ref","response_format":"pcm","stream_format":"sse","options":{"max_tokens":20}}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("sse: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
	var pcm []byte
	for i, ev := range events {
		var e struct{ Type, Audio string }
		if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &e); err != nil {
			t.Fatalf("event %d %q: %v", i, ev, err)
		}
		if want := "speech.audio.delta"; i == len(events)-1 {
			if e.Type != "speech.audio.done" {
				t.Errorf("last event %q", e.Type)
			}
		} else if e.Type != want {
			t.Errorf("event %d type %q", i, e.Type)
		} else {
			d, err := base64.StdEncoding.DecodeString(e.Audio)
			if err != nil {
				t.Fatal(err)
			}
			pcm = append(pcm, d...)
		}
	}
	if len(events) < 2 || len(pcm) < 2400 || len(pcm)%2 != 0 {
		t.Errorf("sse: %d events, %d bytes of PCM", len(events), len(pcm))
	}
	// A client that goes away mid-stream stops the synthesis (the slot comes back).
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/audio/speech",
		strings.NewReader(`{"input":"`+strings.Repeat("Talk talk talk. ", 20)+`","voice":"ref","options":{"max_tokens":300}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Read(make([]byte, 100))
	cancel()
	resp.Body.Close()
}

// TestSlowReaderGetsAllAudio: a client that does not read for a while (so the server's
// socket and queue back up) still gets every audio message of a finished context: nothing
// queued is dropped when a context ends on its own.
func TestSlowReaderGetsAllAudio(t *testing.T) {
	_, base := newServer(t, tts.Config{})
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(base, "http")+"/v1/tts/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.WriteJSON(map[string]any{"type": "speak", "context_id": "s", "text": "Hello there, slow reader.",
		"format":  map[string]any{"encoding": "pcm_s16le", "sample_rate": 48000},
		"options": map[string]any{"max_tokens": 700, "seed": 9}})
	time.Sleep(3 * time.Second) // synthesis runs ahead; nobody reads
	var samples int
	for {
		var m tts.ServerMessage
		if err := conn.ReadJSON(&m); err != nil {
			t.Fatal(err)
		}
		if m.Type == "audio" {
			samples += len(m.Data) / 2
			continue
		}
		if m.Type != "done" || m.Metrics == nil {
			t.Fatalf("%+v", m)
		}
		if want := int(m.Metrics.AudioMs * 48); abs(samples-want) > 480 {
			t.Errorf("%d samples for %.0f ms (want ≈ %d)", samples, m.Metrics.AudioMs, want)
		}
		t.Logf("%d samples for %.0f ms of audio", samples, m.Metrics.AudioMs)
		return
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
