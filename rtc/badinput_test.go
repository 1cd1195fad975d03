package rtc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

// rawSocket is a signaling socket driven by hand.
type rawSocket struct {
	t  *testing.T
	ws *websocket.Conn
}

func dialRaw(t *testing.T, url string) *rawSocket {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return &rawSocket{t, ws}
}

func (s *rawSocket) send(text string) {
	s.t.Helper()
	if err := s.ws.WriteMessage(websocket.TextMessage, []byte(text)); err != nil {
		s.t.Fatal(err)
	}
}

// expect reads messages until one of type typ arrives and returns it.
func (s *rawSocket) expect(typ string) rtc.Message {
	s.t.Helper()
	s.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var m rtc.Message
		if err := s.ws.ReadJSON(&m); err != nil {
			s.t.Fatalf("waiting for %q: %v", typ, err)
		}
		if m.Type == typ {
			return m
		}
	}
}

func (s *rawSocket) expectError(code string) {
	s.t.Helper()
	m := s.expect("error")
	if m.Code != code {
		s.t.Fatalf("error code %q (%s), want %q", m.Code, m.Message, code)
	}
	if m.Message == "" {
		s.t.Fatalf("error %q without a message", code)
	}
}

// offerFrom builds an offer SDP with a peer that has the given codecs and transceivers.
func offerFrom(t *testing.T, setup func(me *webrtc.MediaEngine, pc func() *webrtc.PeerConnection)) string {
	t.Helper()
	me := &webrtc.MediaEngine{}
	var pc *webrtc.PeerConnection
	get := func() *webrtc.PeerConnection {
		if pc == nil {
			var err error
			pc, err = webrtc.NewAPI(webrtc.WithMediaEngine(me)).NewPeerConnection(webrtc.Configuration{})
			if err != nil {
				t.Fatal(err)
			}
		}
		return pc
	}
	setup(me, get)
	defer pc.Close()
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	return offer.SDP
}

func TestBadInput(t *testing.T) {
	srv, url := startServer(t)
	quote := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "\r", `\r`), "\n", `\n`) }

	t.Run("malformed JSON", func(t *testing.T) {
		s := dialRaw(t, url)
		s.send(`{"type":`)
		s.expectError(rtc.CodeBadJSON)
		s.send(`[1,2,3]`)
		s.expectError(rtc.CodeBadJSON)
		s.send(`{"sdp":"x"}`)
		s.expectError(rtc.CodeBadJSON)
		s.send(`{"type":"teleport"}`)
		s.expectError(rtc.CodeBadMessage)
		s.send(`{"type":"session","params":"loud"}`)
		s.expectError(rtc.CodeBadMessage)
		if err := s.ws.WriteMessage(websocket.BinaryMessage, []byte{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		s.expectError(rtc.CodeBadMessage)
		s.send(`{"type":"ping"}`) // the session survived all of it
		s.expect("pong")
	})
	t.Run("bad SDP", func(t *testing.T) {
		s := dialRaw(t, url)
		s.send(`{"type":"offer","sdp":"hello"}`)
		s.expectError(rtc.CodeBadSDP)
	})
	t.Run("offer without audio", func(t *testing.T) {
		sdp := offerFrom(t, func(me *webrtc.MediaEngine, pc func() *webrtc.PeerConnection) {
			if _, err := pc().CreateDataChannel("data", nil); err != nil {
				t.Fatal(err)
			}
		})
		s := dialRaw(t, url)
		s.send(`{"type":"offer","sdp":"` + quote(sdp) + `"}`)
		s.expectError(rtc.CodeNoAudio)
	})
	t.Run("offer with only PCMU", func(t *testing.T) {
		sdp := offerFrom(t, func(me *webrtc.MediaEngine, pc func() *webrtc.PeerConnection) {
			if err := me.RegisterCodec(webrtc.RTPCodecParameters{RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypePCMU, ClockRate: 8000}, PayloadType: 0}, webrtc.RTPCodecTypeAudio); err != nil {
				t.Fatal(err)
			}
			if _, err := pc().AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
				t.Fatal(err)
			}
		})
		if !strings.Contains(sdp, "PCMU") {
			t.Fatalf("test offer lacks PCMU:\n%s", sdp)
		}
		s := dialRaw(t, url)
		s.send(`{"type":"offer","sdp":"` + quote(sdp) + `"}`)
		s.expectError(rtc.CodeUnsupportedCodec)
	})
	t.Run("unknown voice and bad params", func(t *testing.T) {
		s := dialRaw(t, url)
		s.send(`{"type":"session","mode":"vc","voice":"darth"}`)
		s.expectError(rtc.CodeUnknownVoice)
		s.send(`{"type":"session","mode":"vc","voice":"dsp","params":{"pitch_semitones":99}}`)
		s.expectError(rtc.CodeBadParams)
		s.send(`{"type":"session","mode":"vc","voice":"dsp","params":{"wobble":1}}`)
		s.expectError(rtc.CodeBadParams)
		s.send(`{"type":"candidate","candidate":{"candidate":"candidate:1 1 udp 1 1.2.3.4 5 typ host"}}`)
		s.expectError(rtc.CodeBadCandidate)
		s.send(`{"type":"ping"}`)
		s.expect("pong")
	})
	t.Run("oversized message", func(t *testing.T) {
		s := dialRaw(t, url)
		err := s.ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"offer","sdp":"`+strings.Repeat("a", 300<<10)+`"}`))
		if err != nil {
			// The server may close before the client has written it all: that is the clean
			// close we want, seen from the writer's side.
			t.Logf("write cut short: %v", err)
			return
		}
		s.ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			var m rtc.Message
			err := s.ws.ReadJSON(&m)
			if err == nil {
				continue
			}
			if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
				t.Fatalf("read after oversized message: %v, want close 1009", err)
			}
			break
		}
	})
	t.Run("client vanishes mid-call", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: url, Voice: "dsp"})
		if err != nil {
			t.Fatal(err)
		}
		pcm, _ := rtcclient.ClickTrain(1, 200*time.Millisecond)
		packets, _ := rtcclient.EncodeFrames(pcm)
		if err := c.SendPackets(ctx, packets[:20]); err != nil {
			t.Fatal(err)
		}
		c.Abort()
	})
	t.Run("other sessions keep serving", func(t *testing.T) {
		in := speech(t)[:48000]
		_, got := roundTrip(t, url, rtcclient.Options{Voice: "dsp"}, in)
		if rms(got.PCM) < 0.01 {
			t.Fatal("a normal session after the bad ones got silence back")
		}
	})
	// Every session above must end: no peer connection or goroutine left behind (goleak in
	// TestMain checks the goroutines when the package's tests finish).
	deadline := time.Now().Add(15 * time.Second)
	for srv.Active() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := srv.Active(); n > 0 {
		t.Fatalf("%d sessions still active after their clients left", n)
	}
}

func TestVoiceChangeWithoutRenegotiation(t *testing.T) {
	_, url := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, msg := range []rtc.Message{
		{Type: "session", Mode: "vc", Voice: "dsp", Params: map[string]float64{"pitch_semitones": 5}},
		{Type: "session", Mode: "vc", Voice: "passthrough"},
		{Type: "session", Mode: "vc", Voice: "dsp", Passthrough: ptr(true)},
	} {
		if err := c.Send(msg); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var readies []rtc.Message
		for _, m := range c.Messages() {
			if m.Type == "ready" {
				readies = append(readies, m)
			}
			if m.Type == "error" {
				t.Fatalf("error: %s %s", m.Code, m.Message)
			}
		}
		if len(readies) == 4 {
			if readies[2].Voice != "passthrough" || readies[3].Voice != "dsp" {
				t.Fatalf("ready voices %q, %q", readies[2].Voice, readies[3].Voice)
			}
			for _, m := range c.Messages() {
				if m.Type == "answer" && m.SDP == "" {
					t.Fatal("empty answer")
				}
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("expected 4 ready messages (initial + 3 changes); got %v", c.Messages())
}

func ptr[T any](v T) *T { return &v }

func TestMessageFloodIsRateLimited(t *testing.T) {
	_, url := startServer(t)
	s := dialRaw(t, url)
	for range 300 {
		s.send(`{"type":"session","mode":"vc","voice":"dsp","params":{"pitch_semitones":3}}`)
	}
	s.expectError(rtc.CodeRateLimited)
	time.Sleep(100 * time.Millisecond) // the bucket refills: the socket still works
	s.send(`{"type":"ping"}`)
	s.expect("pong")
}
