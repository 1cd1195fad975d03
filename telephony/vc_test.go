package telephony_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/telephony"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// replay sends the recorded call's messages: media in bursts of burst messages every
// burst×20 ms (what a network that delays packets and then delivers them at once does), the
// rest as they come. edit may change a message (by event) before it is sent. It returns the
// caller's audio as sent, at 8 kHz.
func replay(t *testing.T, c *client, lines [][]byte, burst int, edit func(event string, m map[string]any)) []float32 {
	t.Helper()
	var in []float32
	sent := 0
	start := time.Now()
	for _, l := range lines {
		m, err := telephony.ParseMessage(l)
		if err != nil {
			t.Fatal(err)
		}
		if m.Event == "media" {
			for _, u := range m.Media.Audio {
				in = append(in, float32(audioout.MuLawToLinear(u))/32768)
			}
			if sent%burst == 0 {
				time.Sleep(time.Until(start.Add(time.Duration(sent) * 20 * time.Millisecond)))
			}
			sent++
		}
		if edit != nil {
			var v map[string]any
			if err := json.Unmarshal(l, &v); err != nil {
				t.Fatal(err)
			}
			edit(m.Event, v)
			c.send(v)
			continue
		}
		c.send(l)
	}
	return in
}

// TestTwilioVoiceConversion replays the recorded call through the dsp voice at +4 semitones:
// the media come back paced in real time (though they were sent in bursts), as long as the
// call, and a major third higher.
func TestTwilioVoiceConversion(t *testing.T) {
	srv, base := startServer(t, telephony.Config{})
	c := dial(t, base+"/v1/telephony/twilio?voice=dsp&pitch_semitones=4", nil)
	in := replay(t, c, loadFixture(t), 10, nil)
	msgs, ce := c.drain(10 * time.Second)
	if ce == nil || ce.Code != websocket.CloseNormalClosure || ce.Text != "stream stopped" {
		t.Errorf("close %v, want 1000 stream stopped", ce)
	}
	out, at := decodeMedia(t, msgs, streamSid)
	inDur := time.Duration(len(in)) * time.Second / 8000
	outDur := time.Duration(len(out)) * time.Second / 8000
	span := at[len(at)-1].Sub(at[0])
	t.Logf("sent %v of audio in bursts of 200 ms; got %d media messages (%v) over %v; most in 100 ms: %d; off schedule by %v",
		inDur, len(at), outDur, span.Round(time.Millisecond), maxInWindow(at, 100*time.Millisecond), scheduleSpread(at))
	// Every input frame comes back, plus the voice's tail (its latency and 100 ms).
	if outDur < inDur || outDur > inDur+400*time.Millisecond {
		t.Errorf("got %v of audio for %v sent", outDur, inDur)
	}
	// Paced: spread over the audio's own duration, never a burst (the input came in bursts
	// of 10 messages; real time is 5 in 100 ms).
	if want := time.Duration(len(at)-1) * 20 * time.Millisecond; math.Abs(float64(span-want)) > 0.1*float64(want) {
		t.Errorf("media spread over %v, want about %v (paced at 20 ms)", span, want)
	}
	if d := scheduleSpread(at); d > 60*time.Millisecond {
		t.Errorf("media arrive up to %v off a steady 20 ms schedule (10th to 90th percentile): not paced", d)
	}
	// The speech itself lasts as long, and is a major third higher.
	if vi, vo := voicedSpan(in, 8000), voicedSpan(out, 8000); math.Abs(float64(vo-vi)) > float64(60*time.Millisecond) {
		t.Errorf("speech lasts %v in the output, %v in the input", vo, vi)
	}
	shift, frames := pitchShift(in, out, 8000)
	t.Logf("median F0 %.1f Hz → %.1f Hz; frame by frame %+.2f semitones over %d voiced frames",
		dsp.MedianF0(in, 8000), dsp.MedianF0(out, 8000), shift, frames)
	if frames < 50 {
		t.Fatalf("only %d frames voiced in both", frames)
	}
	if math.Abs(shift-4) > 0.4 {
		t.Errorf("pitch shift %+.2f semitones, want +4", shift)
	}
	waitIdle(t, srv)
}

// TestTwilioCustomParameters: a real Twilio call cannot carry a query string, so the voice
// and its parameters come from the start message's customParameters.
func TestTwilioCustomParameters(t *testing.T) {
	srv, base := startServer(t, telephony.Config{})
	c := dial(t, base+"/v1/telephony/twilio", nil)
	lines := loadFixture(t)
	in := replay(t, c, lines[:2+75], 1, func(event string, m map[string]any) { // 1.5 s of the call
		if event == "start" {
			m["start"].(map[string]any)["customParameters"] = map[string]any{"voice": "dsp", "pitch_semitones": "-5"}
		}
	})
	c.send(lines[len(lines)-1]) // stop
	msgs, _ := c.drain(10 * time.Second)
	out, _ := decodeMedia(t, msgs, streamSid)
	shift, frames := pitchShift(in, out, 8000)
	t.Logf("%+.2f semitones over %d voiced frames", shift, frames)
	if frames < 20 || math.Abs(shift+5) > 0.5 {
		t.Errorf("pitch shift %+.2f over %d frames, want -5", shift, frames)
	}
	waitIdle(t, srv)
}

// TestTelephonyRaw: the raw protocol (Asterisk's chan_websocket framing) takes binary
// 16 kHz PCM frames and sends the converted voice back as paced binary frames; text frames
// that are not voxpipe's (Asterisk's control events) are ignored.
func TestTelephonyRaw(t *testing.T) {
	srv, base := startServer(t, telephony.Config{})
	d := websocket.Dialer{Subprotocols: []string{"media"}}
	conn, resp, err := d.Dial(base+"/v1/telephony/raw?encoding=slin16&voice=dsp&pitch_semitones=3", nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := resp.Header.Get("Sec-WebSocket-Protocol"); p != "media" {
		t.Errorf("subprotocol %q, want media (chan_websocket asks for it)", p)
	}
	c := &client{t: t, conn: conn, msgs: make(chan outbound, 4096), done: make(chan struct{}), pause: make(chan struct{})}
	go c.read()
	defer func() { conn.Close(); <-c.done }()
	c.send([]byte(`MEDIA_START connection_id:abc channel:WebSocket/abc/0x1 format:slin16 optimal_frame_size:640`))
	c.send([]byte(`{"event":"MEDIA_START","format":"slin16","optimal_frame_size":640}`))
	lines := loadFixture(t)
	var in8 []float32
	for _, l := range lines[2:77] { // 1.5 s
		m, _ := telephony.ParseMessage(l)
		for _, u := range m.Media.Audio {
			in8 = append(in8, float32(audioout.MuLawToLinear(u))/32768)
		}
	}
	in, err := dsp.Resample(in8, 8000, 16000)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := 0; i+320 <= len(in); i += 320 {
		var b bytes.Buffer
		for _, v := range in[i : i+320] {
			binary.Write(&b, binary.LittleEndian, int16(max(-32768, min(32767, math.Round(float64(v)*32767)))))
		}
		time.Sleep(time.Until(start.Add(time.Duration(i/320) * 20 * time.Millisecond)))
		if err := conn.WriteMessage(websocket.BinaryMessage, b.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	var out []float32
	var at []time.Time
	for len(out) < len(in) {
		m, ok := c.next(nil, 3*time.Second)
		if !ok {
			t.Fatal("socket closed")
		}
		if m.kind != websocket.BinaryMessage || len(m.raw) != 640 {
			t.Fatalf("got a %d-byte message of kind %d, want 640-byte binary frames (20 ms)", len(m.raw), m.kind)
		}
		for i := 0; i < len(m.raw); i += 2 {
			out = append(out, float32(int16(binary.LittleEndian.Uint16(m.raw[i:])))/32768)
		}
		at = append(at, m.at)
	}
	shift, frames := pitchShift(in, out, 16000)
	t.Logf("%+.2f semitones over %d voiced frames; most frames in 100 ms: %d", shift, frames, maxInWindow(at, 100*time.Millisecond))
	if frames < 20 || math.Abs(shift-3) > 0.4 {
		t.Errorf("pitch shift %+.2f over %d frames, want +3", shift, frames)
	}
	conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	waitIdle(t, srv)
}
