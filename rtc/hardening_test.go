package rtc_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
	"github.com/voxpipe/voxpipe/server/auth"
)

const (
	keyA     = "key-a-0123456789abcdef"
	keyB     = "key-b-0123456789abcdef"
	keyAdmin = "key-admin-0123456789ab"
)

// keyedServer serves the rtc routes behind real API keys (A, B, admin) and a per-key limit.
func keyedServer(t *testing.T, cfg rtc.Config, perKey int) string {
	t.Helper()
	keys, err := auth.NewKeys([]string{keyA, keyB}, keyAdmin)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Loopback = true
	cfg.Sessions = auth.NewSessionLimit(perKey)
	srv, err := rtc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := routes(srv)
	h := cfg.Sessions.Middleware(mux, func(p string) bool { return p == "/v1/rtc" })
	hs := httptest.NewServer(keys.Middleware(h, nil))
	t.Cleanup(func() { srv.Close(); hs.Close() })
	return hs.URL
}

func do(t *testing.T, method, url, key string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// newSender makes a WHIP-style sending peer connection (one Opus track).
func newSender(t *testing.T, api *webrtc.API) *webrtc.PeerConnection {
	t.Helper()
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	tr, err := webrtc.NewTrackLocalStaticSample(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.AddTrack(tr); err != nil {
		t.Fatal(err)
	}
	return pc
}

// newViewer makes a WHEP-style receiving peer connection.
func newViewer(t *testing.T, api *webrtc.API) *webrtc.PeerConnection {
	t.Helper()
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionRecvonly}); err != nil {
		t.Fatal(err)
	}
	return pc
}

// TestSessionsBelongToTheirKey: session ids are unguessable; another key can neither view
// (WHEP) nor end (DELETE) a key's session, the admin key can; WHIP sessions and WHEP viewers
// count against the per-key session limit.
func TestSessionsBelongToTheirKey(t *testing.T) {
	base := keyedServer(t, rtc.Config{}, 2)
	api := pionAPI(t)
	loc, code := postSDP(t, newSender(t, api), base+"/v1/whip", keyA)
	if code != http.StatusCreated {
		t.Fatalf("WHIP: %d %s", code, loc)
	}
	id := strings.TrimPrefix(loc, "/v1/whip/")
	if !regexp.MustCompile(`^w[0-9a-f]{32}$`).MatchString(id) {
		t.Errorf("session id %q is not 128 random bits", id)
	}
	if _, code := postSDP(t, newViewer(t, api), base+"/v1/whep/"+id, keyB); code != http.StatusNotFound {
		t.Errorf("another key's WHEP: %d, want 404", code)
	}
	if code := do(t, "DELETE", base+loc, keyB); code != http.StatusNotFound {
		t.Errorf("another key's DELETE: %d, want 404", code)
	}
	vloc, code := postSDP(t, newViewer(t, api), base+"/v1/whep/"+id, keyA)
	if code != http.StatusCreated {
		t.Fatalf("own WHEP: %d %s", code, vloc)
	}
	if code := do(t, "DELETE", base+vloc, keyB); code != http.StatusNotFound {
		t.Errorf("another key's viewer DELETE: %d, want 404", code)
	}
	// A now holds its limit of 2 (one WHIP session, one viewer): every path is refused.
	if _, code := postSDP(t, newSender(t, api), base+"/v1/whip", keyA); code != http.StatusTooManyRequests {
		t.Errorf("third session by WHIP: %d, want 429", code)
	}
	if _, code := postSDP(t, newViewer(t, api), base+"/v1/whep/"+id, keyA); code != http.StatusTooManyRequests {
		t.Errorf("third session by WHEP: %d, want 429", code)
	}
	if _, code := postSDP(t, newSender(t, api), base+"/v1/whip", keyB); code != http.StatusCreated {
		t.Errorf("another key's own WHIP: %d", code)
	}
	if _, code := postSDP(t, newViewer(t, api), base+"/v1/whep/"+id, keyAdmin); code != http.StatusCreated {
		t.Errorf("admin WHEP: %d", code)
	}
	// Ending the viewer gives A a session back.
	if code := do(t, "DELETE", base+vloc, keyA); code != http.StatusOK {
		t.Errorf("own viewer DELETE: %d", code)
	}
	if _, code := postSDP(t, newSender(t, api), base+"/v1/whip", keyA); code != http.StatusCreated {
		t.Errorf("WHIP after a viewer left: %d", code)
	}
	if code := do(t, "DELETE", base+loc, keyAdmin); code != http.StatusOK {
		t.Errorf("admin DELETE: %d", code)
	}
	// Signaling sessions get unguessable ids too. (B: A's ended session may still be
	// giving its place back.)
	c, err := rtcclient.Dial(context.Background(), rtcclient.Options{URL: rtcclient.WSURL(base) + "?token=" + keyB})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ready, ok := c.WaitMessage("ready", "", 10*time.Second)
	if !ok || !regexp.MustCompile(`^s[0-9a-f]{32}$`).MatchString(ready.SessionID) {
		t.Errorf("signaling session id %q", ready.SessionID)
	}
}

// TestWHEPViewerCapUnderConcurrency: concurrent viewers of one session cannot pass the cap
// together (12 of 8 got in before).
func TestWHEPViewerCapUnderConcurrency(t *testing.T) {
	base := keyedServer(t, rtc.Config{}, 0)
	api := pionAPI(t)
	loc, code := postSDP(t, newSender(t, api), base+"/v1/whip", keyA)
	if code != http.StatusCreated {
		t.Fatalf("WHIP: %d %s", code, loc)
	}
	id := strings.TrimPrefix(loc, "/v1/whip/")
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 12 {
		pc := newViewer(t, api)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, code := postSDP(t, pc, base+"/v1/whep/"+id, keyA)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[http.StatusCreated] != 8 || codes[http.StatusServiceUnavailable] != 4 {
		t.Errorf("12 concurrent viewers, cap 8: %v", codes)
	}
}

// TestTTSModeBounds: a text-to-speech session refuses texts over the limit and options out
// of range, synthesises nothing before its media is negotiated, and then runs at most a few
// seconds ahead of playout (a 200 000-character speak took 800 MB before).
func TestTTSModeBounds(t *testing.T) {
	synths := tinyTTS(t)
	srv, err := rtc.NewServer(rtc.Config{Loopback: true, Synthesizers: synths})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer func() { srv.Close(); hs.Close() }()

	// A bare socket that never offers.
	ws, _, err := websocket.DefaultDialer.Dial(rtcclient.WSURL(hs.URL), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	msgs := make(chan rtc.Message, 64)
	go func() {
		defer close(msgs)
		for {
			var m rtc.Message
			if err := ws.ReadJSON(&m); err != nil {
				return
			}
			msgs <- m
		}
	}()
	expect := func(code string) {
		t.Helper()
		for end := time.After(5 * time.Second); ; {
			select {
			case m := <-msgs:
				if m.Type == "error" && m.Code == code {
					return
				}
			case <-end:
				t.Fatalf("no %s error", code)
			}
		}
	}
	send := func(m map[string]any) {
		b, _ := json.Marshal(m)
		if err := ws.WriteMessage(websocket.TextMessage, b); err != nil {
			t.Fatal(err)
		}
	}
	send(map[string]any{"type": "session", "mode": "tts"})
	send(map[string]any{"type": "speak", "text": strings.Repeat("a", 200000)})
	expect(rtc.CodeTextTooLong)
	send(map[string]any{"type": "speak", "text": "Hello.", "max_tokens": int64(9223372036854775807)})
	expect(rtc.CodeBadMessage)
	send(map[string]any{"type": "speak", "text": "Hello.", "max_tokens": -1})
	expect(rtc.CodeBadMessage)
	send(map[string]any{"type": "speak", "context_id": "early", "text": strings.Repeat("Nobody listens yet. ", 200), "max_tokens": 100})
	select {
	case m := <-msgs:
		t.Fatalf("before any offer the server answered %+v: it synthesised for nobody", m)
	case <-time.After(2 * time.Second):
	}
	ws.Close()

	// With media, synthesis follows playout: the last audio is made no sooner than about
	// ttsAhead (2 s) before it plays.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(hs.URL)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Send(map[string]any{"type": "session", "mode": "tts"})
	c.Send(map[string]any{"type": "speak", "context_id": "long", "text": strings.Repeat("This goes on and on. ", 6), "max_tokens": 200})
	speaking, ok := c.WaitMessage("speaking", "", 20*time.Second)
	if !ok {
		t.Fatalf("no speaking event: %+v", c.Messages())
	}
	start := time.Now()
	_ = speaking
	done, ok := c.WaitMessage("done", "", 30*time.Second)
	if !ok || done.Metrics == nil {
		t.Fatalf("no done: %+v", c.Messages())
	}
	took := time.Since(start)
	audio := time.Duration(done.Metrics.AudioMs) * time.Millisecond
	if audio < 4*time.Second {
		t.Skipf("the tiny model spoke only %v; too short to see pacing", audio)
	}
	if took < audio-2*time.Second-500*time.Millisecond {
		t.Errorf("%v of audio was synthesised in %v: more than 2 s ahead of playout", audio, took)
	}
	t.Logf("%v of audio, synthesis done %v after it started speaking", audio, took)
}
