package telephony_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/server"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/telephony"
	"github.com/voxpipe/voxpipe/tts"
	"github.com/voxpipe/voxpipe/voice/library"
)

// TestTwilioHostileInputs: every malformed or abusive input ends its call with a close code
// and a reason that says what was wrong (or is ignored, for events Twilio may add), and
// every call's resources are given back.
func TestTwilioHostileInputs(t *testing.T) {
	srv, base := startServer(t, telephony.Config{StartTimeout: 300 * time.Millisecond,
		PingInterval: 50 * time.Millisecond, ReadTimeout: 400 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
	url := base + "/v1/telephony/twilio"
	lines := loadFixture(t)
	begin := func(t *testing.T) *client {
		c := dial(t, url, nil)
		c.send(lines[0])
		c.send(lines[1])
		return c
	}
	media := func(payload string) string {
		return `{"event":"media","streamSid":"` + streamSid + `","media":{"track":"inbound","chunk":"1","timestamp":"0","payload":"` + payload + `"}}`
	}
	cases := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"bad base64", func(t *testing.T) {
			c := begin(t)
			c.send([]byte(media("not*base64!")))
			c.expectClose(websocket.CloseInvalidFramePayloadData, "bad_media: media payload is not base64")
		}},
		{"huge payload", func(t *testing.T) {
			c := begin(t)
			c.send([]byte(media(strings.Repeat("AAAA", 4000)))) // 12 000 bytes of audio
			c.expectClose(websocket.CloseInvalidFramePayloadData, "bad_media: media payload over")
		}},
		{"1 MB message", func(t *testing.T) {
			c := begin(t)
			c.conn.WriteMessage(websocket.TextMessage, []byte(media(strings.Repeat("A", 1<<20))))
			// The server sends 1009 and closes while the rest of the message is still
			// arriving, so the client sees the close frame, or a reset that overtook it.
			if _, ce := c.drain(5 * time.Second); ce != nil && ce.Code != websocket.CloseMessageTooBig {
				t.Errorf("closed with %d %q, want 1009", ce.Code, ce.Text)
			}
		}},
		{"bad JSON", func(t *testing.T) {
			c := begin(t)
			c.send([]byte(`{"event":"media",`))
			c.expectClose(websocket.CloseInvalidFramePayloadData, "bad_json")
		}},
		{"media before start", func(t *testing.T) {
			c := dial(t, url, nil)
			c.send(lines[0])
			c.send(lines[2])
			c.expectClose(websocket.CloseProtocolError, "bad_message: media before start")
		}},
		{"binary frame", func(t *testing.T) {
			c := begin(t)
			if err := c.conn.WriteMessage(websocket.BinaryMessage, make([]byte, 160)); err != nil {
				t.Fatal(err)
			}
			c.expectClose(websocket.CloseProtocolError, "bad_message: binary frames")
		}},
		{"second start", func(t *testing.T) {
			c := begin(t)
			c.send(lines[1])
			c.expectClose(websocket.CloseProtocolError, "bad_message: a second start")
		}},
		{"a-law", func(t *testing.T) {
			c := dial(t, url, nil)
			c.send([]byte(strings.Replace(string(lines[1]), "audio/x-mulaw", "audio/x-alaw", 1)))
			c.expectClose(websocket.CloseInvalidFramePayloadData, "bad_media: start: media format")
		}},
		{"unknown voice", func(t *testing.T) {
			c := dial(t, url+"?voice=nobody", nil)
			c.send(lines[1])
			c.expectClose(websocket.ClosePolicyViolation, "unknown_voice")
		}},
		{"bad parameter", func(t *testing.T) {
			c := dial(t, url, nil)
			c.send([]byte(strings.Replace(string(lines[1]), `"customParameters":{}`, `"customParameters":{"pitch_semitones":"99"}`, 1)))
			c.expectClose(websocket.ClosePolicyViolation, "bad_params")
		}},
		{"no start", func(t *testing.T) {
			c := dial(t, url, nil)
			c.expectClose(websocket.ClosePolicyViolation, "timeout: no start message within 300ms")
		}},
		{"unknown events are ignored", func(t *testing.T) {
			c := begin(t)
			c.send([]byte(`{"event":"someday-twilio-adds-this","streamSid":"` + streamSid + `"}`))
			c.send([]byte(`{"event":"dtmf","streamSid":"` + streamSid + `","dtmf":{"track":"inbound_track","digit":"5"}}`))
			for _, l := range lines[2:12] {
				c.send(l)
			}
			if m, ok := c.next(nil, 5*time.Second); !ok || m.Event != "media" {
				t.Fatalf("after unknown events: %s (closed %v)", m.raw, c.closed)
			}
			c.send(lines[len(lines)-1])
			c.expectClose(websocket.CloseNormalClosure, "stream stopped")
		}},
		{"speak in vc mode", func(t *testing.T) {
			c := begin(t)
			c.send(map[string]any{"event": "speak", "text": "Hello."})
			if m, _ := c.next(func(m outbound) bool { return m.Event != "media" }, 5*time.Second); m.Event != "error" || m.Code != telephony.CodeBadMessage {
				t.Errorf("speak in vc mode: %s", m.raw)
			}
			c.send(lines[len(lines)-1])
			c.expectClose(websocket.CloseNormalClosure, "stream stopped")
		}},
		{"no reader", func(t *testing.T) {
			// The client answers pings, then stops reading while its media keep coming: the
			// missing pongs end the call.
			c := begin(t)
			for _, l := range lines[2:12] {
				c.send(l)
			}
			c.next(nil, 5*time.Second)
			time.Sleep(200 * time.Millisecond) // answering a few pings
			c.stopReading()
			stopped := time.Now()
			deadline := stopped.Add(5 * time.Second)
			for i := 12; srv.Active() > 0; i++ {
				if time.Now().After(deadline) {
					t.Fatal("a client that stopped reading still holds its call")
				}
				if i < len(lines)-2 {
					c.conn.SetWriteDeadline(time.Now().Add(time.Second))
					if c.conn.WriteMessage(websocket.TextMessage, lines[i]) != nil {
						break
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("the call ended %v after the client stopped reading", time.Since(stopped).Round(time.Millisecond))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t)
			waitIdle(t, srv)
		})
	}
}

// TestTelephonyKeysAndLimits runs calls through server.New on a server with API keys: the
// key comes as ?token=, in the header, or (Twilio) as the token custom parameter; a bad one
// is refused; the key's session limit counts calls, and a finished call gives its slot back.
func TestTelephonyKeysAndLimits(t *testing.T) {
	const key, other = "telephony-test-key-0123456789", "telephony-other-key-0123456789"
	keys, err := auth.NewKeys([]string{key, other})
	if err != nil {
		t.Fatal(err)
	}
	sessions := auth.NewSessionLimit(1)
	rs, err := rtc.NewServer(rtc.Config{Sessions: sessions})
	if err != nil {
		t.Fatal(err)
	}
	ts := tts.NewServer(tts.Config{})
	lib, _, err := library.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tel := telephony.NewServer(telephony.Config{Keys: keys, Sessions: sessions})
	hs := httptest.NewServer(server.New(server.Config{RTC: rs, TTS: ts, Telephony: tel, Library: lib, Keys: keys, Sessions: sessions}))
	defer func() {
		tel.Close()
		rs.Close()
		ts.Close()
		hs.Close()
	}()
	url := "ws" + strings.TrimPrefix(hs.URL, "http") + "/v1/telephony/twilio"
	lines := loadFixture(t)
	withToken := func(tok string) []byte {
		return []byte(strings.Replace(string(lines[1]), `"customParameters":{}`, `"customParameters":{"token":"`+tok+`"}`, 1))
	}
	refused := func(url string, h http.Header, status int) {
		t.Helper()
		_, resp, err := websocket.DefaultDialer.Dial(url, h)
		if err == nil || resp == nil || resp.StatusCode != status {
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			t.Errorf("dial %s: %v, HTTP %d; want %d", url, err, code, status)
		}
	}
	refused(url+"?token=not-a-key-at-all-0000", nil, http.StatusUnauthorized)
	refused(strings.Replace(url, "twilio", "raw", 1), nil, http.StatusUnauthorized) // raw has no start message
	// Twilio: no key at all, or a wrong one, in the start message.
	c := dial(t, url, nil)
	c.send(lines[1])
	c.expectClose(websocket.ClosePolicyViolation, "unauthorized: missing API key")
	c = dial(t, url, nil)
	c.send(withToken("not-a-key-at-all-0000"))
	c.expectClose(websocket.ClosePolicyViolation, "unauthorized: invalid API key")

	// A call with the key in its start message holds the key's one session.
	c = dial(t, url, nil)
	c.send(withToken(key))
	for _, l := range lines[2:8] {
		c.send(l)
	}
	if m, ok := c.next(nil, 5*time.Second); !ok || m.Event != "media" {
		t.Fatalf("a call with its key as a custom parameter: %s (closed %v)", m.raw, c.closed)
	}
	refused(url+"?token="+key, nil, http.StatusTooManyRequests)
	second := dial(t, url, nil)
	second.send(withToken(key))
	second.expectClose(websocket.CloseTryAgainLater, "too_many_sessions")
	// Another key is not limited by this one's calls; a header key works too.
	h := http.Header{"Authorization": {"Bearer " + other}}
	third := dial(t, url, h)
	third.send(lines[1])
	for _, l := range lines[2:8] {
		third.send(l)
	}
	if m, ok := third.next(nil, 5*time.Second); !ok || m.Event != "media" {
		t.Fatalf("another key's call: %s (closed %v)", m.raw, third.closed)
	}
	third.send(lines[len(lines)-1])
	third.expectClose(websocket.CloseNormalClosure, "stream stopped")
	// The first call ends: its slot is free again.
	c.send(lines[len(lines)-1])
	c.expectClose(websocket.CloseNormalClosure, "stream stopped")
	waitIdle(t, tel)
	again := dial(t, url+"?token="+key, nil)
	for _, l := range lines[1:8] {
		again.send(l)
	}
	if m, ok := again.next(nil, 5*time.Second); !ok || m.Event != "media" {
		t.Fatalf("after the first call ended: %s (closed %v)", m.raw, again.closed)
	}
	again.conn.Close()
	waitIdle(t, tel)
}

// TestTelephonyShutdown: closing the server ends its calls with 1001.
func TestTelephonyShutdown(t *testing.T) {
	srv := telephony.NewServer(telephony.Config{})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	c := dial(t, "ws"+strings.TrimPrefix(hs.URL, "http")+"/v1/telephony/twilio", nil)
	lines := loadFixture(t)
	for _, l := range lines[1:8] {
		c.send(l)
	}
	c.next(nil, 5*time.Second)
	srv.Close()
	c.expectClose(websocket.CloseGoingAway, "server shutting down")
	if srv.Active() != 0 {
		t.Errorf("%d calls open after Close", srv.Active())
	}
}

// panicky is a voice whose parameters panic, and a synthesizer that panics: bugs the server
// must survive, ending (or failing) only the call that hit them.
type panicky struct{ stream.Processor }

func (panicky) SetParams(map[string]float64) error {
	var m map[string]int
	m["boom"]++
	return nil
}

type panickySynth struct{}

func (panickySynth) Info() stream.SynthInfo { return stream.SynthInfo{Name: "boom", SampleRate: 24000} }
func (panickySynth) Synthesize(context.Context, stream.SynthRequest, func(stream.SynthChunk) error) error {
	var m map[string]int
	m["boom"]++
	return nil
}

// TestTelephonyPanics: a panic in a call's voice ends that call with 1011 and a log
// reference; a panicking synthesizer fails that utterance; the server goes on.
func TestTelephonyPanics(t *testing.T) {
	voices := stream.NewRegistry()
	voices.Register("boom", func() (stream.Processor, error) {
		d, err := stream.NewDSPVoice()
		return panicky{d}, err
	})
	syn := &stream.Synthesizers{}
	syn.Register(panickySynth{})
	srv, base := startServer(t, telephony.Config{Voices: voices, Synthesizers: syn})
	lines := loadFixture(t)
	c := dial(t, base+"/v1/telephony/twilio?voice=boom&pitch_semitones=1", nil)
	c.send(lines[1])
	_, ce := c.drain(5 * time.Second)
	if ce == nil || ce.Code != websocket.CloseInternalServerErr || !strings.HasPrefix(ce.Text, "internal") || strings.Contains(ce.Text, "boom") {
		t.Errorf("a panicking voice: close %v, want 1011 internal without the panic's detail", ce)
	}
	c = dial(t, base+"/v1/telephony/twilio?mode=tts", nil)
	c.send(lines[1])
	c.send(map[string]any{"event": "speak", "text": "Hello."})
	if m, _ := c.next(nil, 5*time.Second); m.Event != "error" || m.Code != telephony.CodeSynthesis || strings.Contains(m.Message, "boom") {
		t.Errorf("a panicking synthesizer: %s, want error synthesis_failed", m.raw)
	}
	c.send(lines[len(lines)-1])
	c.expectClose(websocket.CloseNormalClosure, "stream stopped")
	// Still serving.
	c = dial(t, base+"/v1/telephony/twilio?voice=dsp", nil)
	for _, l := range lines[1:8] {
		c.send(l)
	}
	if m, ok := c.next(nil, 5*time.Second); !ok || m.Event != "media" {
		t.Fatalf("after the panics: %s (closed %v)", m.raw, c.closed)
	}
	c.conn.Close()
	waitIdle(t, srv)
}
