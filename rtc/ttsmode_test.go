package rtc_test

import (
	"context"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice/voicetest"
)

func rmsOf(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s / float64(max(1, len(x))))
}

// tinyTTS is the tiny golden MioTTS with the speech fixture as its default voice "ref".
func tinyTTS(t *testing.T) *stream.Synthesizers { return voicetest.TinyTTS(t) }

// TestTTSOverWebRTC: a session in text-to-speech mode plays synthesised speech on its Opus
// track, silence between texts, and a cancel silences it within a frame or two.
func TestTTSOverWebRTC(t *testing.T) {
	synths := tinyTTS(t)
	srv, err := rtc.NewServer(rtc.Config{Loopback: true, Synthesizers: synths})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer func() { srv.Close(); hs.Close() }()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(hs.URL), Events: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// speak before the mode is set is refused.
	c.Send(map[string]any{"type": "speak", "text": "Too early."})
	if m, ok := c.WaitMessage("error", rtc.CodeBadMessage, 5*time.Second); !ok || !strings.Contains(m.Message, "mode") {
		t.Fatalf("speak outside tts mode: %+v %v", m, ok)
	}
	c.Send(map[string]any{"type": "session", "mode": "tts"})
	c.Send(map[string]any{"type": "speak", "context_id": "a", "text": "Hello over WebRTC.", "max_tokens": 40})
	if _, ok := c.WaitMessage("speaking", "", 20*time.Second); !ok {
		t.Fatalf("no speaking event; messages %+v", c.Messages())
	}
	done, ok := c.WaitMessage("done", "", 30*time.Second)
	if !ok || done.ContextID != "a" || done.Metrics == nil || done.Metrics.AudioMs <= 0 {
		t.Fatalf("done: %+v %v", done, ok)
	}
	// The events came on the data channel too.
	var dcDone bool
	for end := time.Now().Add(5 * time.Second); !dcDone && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, m := range c.Events() {
			dcDone = dcDone || m.Type == "done" && m.ContextID == "a"
		}
	}
	if !dcDone {
		t.Errorf("no done event on the data channel: %+v", c.Events())
	}
	// Wait until the utterance has played out, then look at what came back.
	time.Sleep(time.Duration(done.Metrics.AudioMs)*time.Millisecond + 300*time.Millisecond)
	got := c.Received().PCM
	if r := rmsOf(got); r < 0.01 {
		t.Errorf("received audio RMS %.4f: no speech", r)
	}
	if tail := got[max(0, len(got)-4800):]; rmsOf(tail) > 1e-3 {
		t.Errorf("no silence after the utterance: RMS %.4f", rmsOf(tail))
	}
	t.Logf("%d samples back, speech RMS %.3f, metrics %+v", len(got), rmsOf(got), *done.Metrics)

	// A long text, cancelled once it speaks: done canceled, then silence.
	c.Send(map[string]any{"type": "speak", "context_id": "b", "text": strings.Repeat("This goes on and on. ", 30)})
	c.Send(map[string]any{"type": "speak", "context_id": "c", "text": "Queued behind it.", "max_tokens": 20})
	deadline := time.Now().Add(20 * time.Second)
	for {
		var speaking bool
		for _, m := range c.Messages() {
			speaking = speaking || m.Type == "speaking" && m.ContextID == "b"
		}
		if speaking || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	c.Send(map[string]any{"type": "cancel"})
	canceled := map[string]bool{}
	for end := time.Now().Add(10 * time.Second); len(canceled) < 2 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, m := range c.Messages() {
			if m.Type == "done" && m.Canceled {
				canceled[m.ContextID] = true
			}
		}
	}
	if !canceled["b"] || !canceled["c"] {
		t.Fatalf("cancel: done events %v; messages %+v", canceled, c.Messages())
	}
	n := len(c.Received().PCM)
	time.Sleep(600 * time.Millisecond)
	after := c.Received().PCM[n:]
	// Frames already on the wire may still arrive; after that only silence.
	if len(after) < 9600 || rmsOf(after[4800:]) > 1e-3 {
		t.Errorf("after cancel: %d samples, RMS %.4f", len(after), rmsOf(after[min(4800, len(after)):]))
	}
}
