package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

// TestServeKeylessGuard: a server without keys trusts whoever reaches it, so it answers only
// to loopback host names (a DNS-rebound evil.example gets 421) and refuses state-changing
// requests from other origins (a cross-site form post gets 403).
func TestServeKeylessGuard(t *testing.T) {
	base := testApp(t, serveOptions{})
	do := func(method, path, host, origin string) int {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader("name=x"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		return status(t, req, "")
	}
	for _, c := range []struct {
		method, path, host, origin string
		want                       int
	}{
		{"GET", "/", "", "", 200},
		{"GET", "/v1/voices", "localhost:8080", "", 200},
		{"GET", "/", "evil.example:8080", "", 421},
		{"GET", "/v1/voices", "evil.example", "", 421},
		{"POST", "/v1/voices", "", "http://evil.example", 403},
		{"DELETE", "/v1/voices/v_0123456789abcdef", "", "http://evil.example", 403},
		{"POST", "/v1/audio/speech", "", "http://evil.example", 403},
		{"POST", "/v1/voices", "", "", 400}, // no Origin (curl): reaches the handler, which wants multipart
	} {
		if got := do(c.method, c.path, c.host, c.origin); got != c.want {
			t.Errorf("%s %s host %q origin %q: %d, want %d", c.method, c.path, c.host, c.origin, got, c.want)
		}
	}
}

// TestServeVoicesBelongToTheirKey: through the whole server, a key's uploaded voice is not
// listed for another key, cannot speak for it (by id or name), and an admin sees it.
func TestServeVoicesBelongToTheirKey(t *testing.T) {
	const a, b, admin = "key-a-0123456789abcdef", "key-b-0123456789abcdef", "key-admin-0123456789ab"
	base := testApp(t, serveOptions{ttsModel: golden.Path(t, "miotts", "model.gguf"), codec: golden.Path(t, "miocodec", "model.gguf"),
		apiKeys: []string{a, b}, adminKeys: []string{admin}})
	do := func(method, path, key, ctype string, body io.Reader) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, body)
		req.Header.Set("Authorization", "Bearer "+key)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	v := struct{ ID string }{upload(t, base, "Private", fixture, a)}
	if _, out := do("GET", "/v1/voices", b, "", nil); strings.Contains(out, v.ID) || strings.Contains(out, "Private") {
		t.Errorf("another key's list shows the voice: %s", out)
	}
	for _, key := range []string{a, admin} {
		if _, out := do("GET", "/v1/voices", key, "", nil); !strings.Contains(out, v.ID) {
			t.Errorf("list for %s lacks the voice: %s", key[:5], out)
		}
	}
	speak := func(key, voice string) int {
		code, _ := do("POST", "/v1/audio/speech", key, "application/json",
			strings.NewReader(`{"input":"Hello.","voice":"`+voice+`","response_format":"pcm","options":{"max_tokens":10}}`))
		return code
	}
	for _, voice := range []string{v.ID, "Private"} {
		if c := speak(b, voice); c != 400 {
			t.Errorf("another key speaks with %s: %d, want 400 unknown_voice", voice, c)
		}
		if c := speak(a, voice); c != 200 {
			t.Errorf("the owner speaks with %s: %d", voice, c)
		}
	}
	if c, _ := do("DELETE", "/v1/voices/"+v.ID, b, "", nil); c != 404 {
		t.Errorf("another key's DELETE: %d", c)
	}
	if c, _ := do("DELETE", "/v1/voices/"+v.ID, admin, "", nil); c != 204 {
		t.Errorf("admin DELETE: %d", c)
	}
}

// TestServeMeanVC2RefBelongsToItsKey: a live session may take another key's voice as its
// MeanVC2 target neither by id nor by name.
func TestServeMeanVC2RefBelongsToItsKey(t *testing.T) {
	const a, b = "key-a-0123456789abcdef", "key-b-0123456789abcdef"
	base := testApp(t, serveOptions{vcModels: []string{tinyVC(t)}, apiKeys: []string{a, b}})
	id := upload(t, base, "Mine", fixture, a)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cb, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(base) + "?token=" + b})
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	for _, ref := range []string{id, "Mine"} {
		sendWait(t, cb, rtc.Message{Type: "session", Voice: "meanvc2", Ref: ref}, rtc.CodeUnknownVoice)
	}
	ca, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(base) + "?token=" + a})
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	ca.Send(rtc.Message{Type: "session", Voice: "meanvc2", Ref: id})
	if !waitReady(ca, "meanvc2", 10*time.Second) {
		t.Errorf("the owner's ref: no ready; messages %+v", ca.Messages())
	}
}
