package telephony_test

import (
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/telephony"
	"github.com/voxpipe/voxpipe/voice/voicetest"
)

// synths is the tiny golden MioTTS with the speech fixture as the voice "ref".
func synths(t *testing.T) *stream.Synthesizers { return voicetest.TinyTTS(t) }

// utteranceOf collects the media up to the next mark (or clear, or error) and returns them
// with that message.
func utteranceOf(t *testing.T, c *client) ([]outbound, outbound) {
	t.Helper()
	var media []outbound
	for {
		m, ok := c.next(nil, 60*time.Second)
		if !ok {
			t.Fatalf("socket closed (%v) during an utterance", c.closed)
		}
		if m.Event != "media" {
			return media, m
		}
		media = append(media, m)
	}
}

func start(params map[string]any) map[string]any {
	return map[string]any{"event": "start", "sequenceNumber": "1", "streamSid": streamSid, "start": map[string]any{
		"streamSid": streamSid, "accountSid": accountSid, "callSid": callSid, "tracks": []string{"inbound"},
		"mediaFormat":      map[string]any{"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
		"customParameters": params}}
}

// TestTwilioTTS: a call in tts mode speaks its greeting (from customParameters), then a
// speak message, each paced in real time and followed by a mark; a cancel sends clear and
// the media stop at once; a new speak while one is spoken is a barge-in (clear, then the new
// utterance alone).
func TestTwilioTTS(t *testing.T) {
	syn := synths(t)
	srv, base := startServer(t, telephony.Config{Synthesizers: syn,
		TTSAdmission: func(string) *stream.Admission { return stream.NewAdmission(2, 2*time.Second) }})
	c := dial(t, base+"/v1/telephony/twilio", nil)
	c.send(map[string]any{"event": "connected", "protocol": "Call", "version": "1.0.0"})
	c.send(start(map[string]any{"mode": "tts", "voice": "ref", "text": "Hello, thanks for calling.", "seed": "3", "max_tokens": "40"}))

	checkPaced := func(what string, media []outbound) {
		t.Helper()
		if len(media) < 10 {
			t.Fatalf("%s: %d media messages", what, len(media))
		}
		span := media[len(media)-1].at.Sub(media[0].at)
		want := time.Duration(len(media)-1) * 20 * time.Millisecond
		t.Logf("%s: %d media messages (%v of audio) over %v", what, len(media), time.Duration(len(media))*20*time.Millisecond, span.Round(time.Millisecond))
		if span < want*8/10 {
			t.Errorf("%s: %d messages over %v: not paced in real time", what, len(media), span)
		}
	}
	media, m := utteranceOf(t, c)
	if m.Event != "mark" || m.Mark == nil || m.Mark.Name != "greeting" || m.Sid != streamSid {
		t.Fatalf("after the greeting: %s %+v, want mark greeting", m.raw, m)
	}
	checkPaced("greeting", media)
	pcm, _ := decodeMedia(t, media, streamSid)
	if rms(pcm) < 1e-3 {
		t.Errorf("the greeting is silent (rms %g)", rms(pcm))
	}

	c.send(map[string]any{"event": "speak", "text": "How can I help you today?", "seed": 5, "max_tokens": 30})
	media, m = utteranceOf(t, c)
	if m.Event != "mark" || m.Mark.Name != "utterance-1" {
		t.Fatalf("after a speak: %s, want mark utterance-1 (and no clear: nothing was playing)", m.raw)
	}
	checkPaced("speak", media)

	// Cancel: clear goes out, and media stop within 100 ms.
	c.send(map[string]any{"event": "speak", "text": "Let me read you the whole of our terms and conditions.", "max_tokens": 200, "mark_name": "long"})
	c.next(func(m outbound) bool { return m.Event == "media" }, 60*time.Second)
	time.Sleep(200 * time.Millisecond)
	canceled := time.Now()
	c.send(map[string]any{"event": "cancel"})
	m, _ = c.next(func(m outbound) bool { return m.Event != "media" || m.at.Sub(canceled) > 100*time.Millisecond }, 5*time.Second)
	if m.Event != "clear" || m.Sid != streamSid {
		t.Fatalf("after cancel: %s, want clear", m.raw)
	}
	if d := m.at.Sub(canceled); d > 100*time.Millisecond {
		t.Errorf("clear came %v after cancel", d)
	}
	quiet := time.After(500 * time.Millisecond)
	for done := false; !done; {
		select {
		case m := <-c.msgs:
			t.Errorf("after clear: %s", m.raw)
		case <-quiet:
			done = true
		}
	}

	// Barge-in: a speak while one is spoken clears it and speaks the new one alone.
	c.send(map[string]any{"event": "speak", "text": "Let me read you the whole of our terms and conditions.", "max_tokens": 200, "mark_name": "long"})
	c.next(func(m outbound) bool { return m.Event == "media" }, 60*time.Second)
	c.send(map[string]any{"event": "speak", "text": "Sorry, go ahead.", "max_tokens": 20, "mark_name": "short"})
	m, _ = c.next(func(m outbound) bool { return m.Event != "media" }, 5*time.Second)
	if m.Event != "clear" {
		t.Fatalf("a speak over a speak: %s, want clear", m.raw)
	}
	media, m = utteranceOf(t, c)
	if m.Event != "mark" || m.Mark.Name != "short" {
		t.Fatalf("after the barge-in: %s, want mark short (the interrupted one has none)", m.raw)
	}
	checkPaced("barge-in", media)

	// Errors of a speak are answered and the call goes on; stop ends it.
	c.send(map[string]any{"event": "speak", "text": "   "})
	if m, _ := c.next(nil, 5*time.Second); m.Event != "error" || m.Code != telephony.CodeBadMessage {
		t.Errorf("an empty speak: %s, want error bad_message", m.raw)
	}
	c.send(map[string]any{"event": "stop", "streamSid": streamSid})
	c.expectClose(websocket.CloseNormalClosure, "stream stopped")
	waitIdle(t, srv)
}
