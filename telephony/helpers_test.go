package telephony_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/telephony"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var update = flag.Bool("update", false, "rewrite testdata/twilio_call.jsonl from ../testdata/speech_en_48k.wav")

const fixture = "testdata/twilio_call.jsonl"

// Fake sids in Twilio's shapes (MZ, AC, CA and 32 hex digits).
const (
	streamSid  = "MZ18ad3ab5a668481ce02b83e7395059f0"
	accountSid = "AC00000000000000000000000000000000"
	callSid    = "CA00000000000000000000000000000000"
)

// makeFixture is the recorded call: what Twilio sends for 3 s of a caller's speech over
// <Connect><Stream> — connected, start, one media message per 20 ms (160 bytes of 8 kHz
// μ-law, base64), Twilio's echo of a mark, stop. The caller is the espeak-ng sentence in
// ../testdata, resampled to 8 kHz and μ-law encoded.
func makeFixture(t *testing.T) []byte {
	a, err := wav.ReadFile(filepath.Join("..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	ulaw, err := audioout.EncodeClip(audioout.Format{Encoding: audioout.MuLaw, SampleRate: 8000}, a.SampleRate, a.Mono())
	if err != nil {
		t.Fatal(err)
	}
	for len(ulaw)%160 != 0 {
		ulaw = append(ulaw, 0xFF) // μ-law silence
	}
	var b bytes.Buffer
	line := func(v any) {
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	type obj = map[string]any
	seq := 1
	next := func() string { s := fmt.Sprint(seq); seq++; return s }
	line(obj{"event": "connected", "protocol": "Call", "version": "1.0.0"})
	line(obj{"event": "start", "sequenceNumber": next(), "streamSid": streamSid, "start": obj{
		"accountSid": accountSid, "streamSid": streamSid, "callSid": callSid, "tracks": []string{"inbound"},
		"mediaFormat":      obj{"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
		"customParameters": obj{}}})
	for i := 0; i < len(ulaw); i += 160 {
		line(obj{"event": "media", "sequenceNumber": next(), "streamSid": streamSid, "media": obj{
			"track": "inbound", "chunk": fmt.Sprint(i/160 + 1), "timestamp": fmt.Sprint(i / 8),
			"payload": base64.StdEncoding.EncodeToString(ulaw[i : i+160])}})
	}
	line(obj{"event": "mark", "sequenceNumber": next(), "streamSid": streamSid, "mark": obj{"name": "playback-1"}})
	line(obj{"event": "stop", "sequenceNumber": next(), "streamSid": streamSid, "stop": obj{"accountSid": accountSid, "callSid": callSid}})
	return b.Bytes()
}

// loadFixture reads the recorded call, one message a line.
func loadFixture(t *testing.T) [][]byte {
	t.Helper()
	data, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatalf("%v (go test ./telephony -run TestTwilioFixture -update makes it)", err)
	}
	var lines [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, bytes.Clone(sc.Bytes()))
	}
	return lines
}

// TestTwilioFixture checks the recorded call parses, in Twilio's order (and rewrites it with
// -update).
func TestTwilioFixture(t *testing.T) {
	if *update {
		if err := os.WriteFile(fixture, makeFixture(t), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lines := loadFixture(t)
	var events []string
	audio := 0
	for i, l := range lines {
		m, err := telephony.ParseMessage(l)
		if err != nil || !m.Known {
			t.Fatalf("line %d: %v (known %v)", i+1, err, m.Known)
		}
		if m.Event == "media" {
			audio += len(m.Media.Audio)
			if len(m.Media.Audio) != 160 {
				t.Errorf("line %d: %d bytes of audio, want 160", i+1, len(m.Media.Audio))
			}
		}
		if len(events) == 0 || events[len(events)-1] != m.Event {
			events = append(events, m.Event)
		}
	}
	if want := []string{"connected", "start", "media", "mark", "stop"}; !slices.Equal(events, want) {
		t.Errorf("events %v, want %v", events, want)
	}
	if sec := float64(audio) / 8000; sec < 3 || sec > 3.5 {
		t.Errorf("%.2f s of audio, want about 3", sec)
	}
}

// startServer runs a telephony server on loopback until the test ends; it returns the server
// and the WebSocket base URL.
func startServer(t *testing.T, cfg telephony.Config) (*telephony.Server, string) {
	t.Helper()
	srv := telephony.NewServer(cfg)
	mux := http.NewServeMux()
	mux.Handle("GET /v1/telephony/{protocol}", srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
	})
	return srv, "ws" + strings.TrimPrefix(hs.URL, "http")
}

// outbound is one message from the server, as the client received it.
type outbound struct {
	at    time.Time
	kind  int
	raw   []byte
	Event string `json:"event"`
	Sid   string `json:"streamSid"`
	Media *struct {
		Payload string `json:"payload"`
	} `json:"media"`
	Mark *struct {
		Name string `json:"name"`
	} `json:"mark"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// client is a gorilla WebSocket client that records what the server sends, with arrival
// times, until the socket closes; closed then holds the close frame's code and text.
type client struct {
	t      *testing.T
	conn   *websocket.Conn
	msgs   chan outbound
	done   chan struct{}
	closed *websocket.CloseError
	pause  chan struct{} // closed: the reader stops reading (and so answering pings)
	once   sync.Once
}

func dial(t *testing.T, url string, h http.Header) *client {
	t.Helper()
	conn, resp, err := websocket.DefaultDialer.Dial(url, h)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (HTTP %d)", url, err, status)
	}
	c := &client{t: t, conn: conn, msgs: make(chan outbound, 4096), done: make(chan struct{}), pause: make(chan struct{})}
	go c.read()
	t.Cleanup(func() {
		conn.Close()
		c.stopReading()
		<-c.done
	})
	return c
}

func (c *client) read() {
	defer close(c.done)
	defer close(c.msgs)
	for {
		select {
		case <-c.pause:
			return
		default:
		}
		kind, data, err := c.conn.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				c.closed = ce
			}
			return
		}
		o := outbound{at: time.Now(), kind: kind, raw: data}
		if kind == websocket.TextMessage {
			if err := json.Unmarshal(data, &o); err != nil {
				o.Event = "unparsable"
			}
		}
		c.msgs <- o
	}
}

func (c *client) stopReading() { c.once.Do(func() { close(c.pause) }) }

func (c *client) send(v any) {
	c.t.Helper()
	var err error
	if b, ok := v.([]byte); ok {
		err = c.conn.WriteMessage(websocket.TextMessage, b)
	} else {
		err = c.conn.WriteJSON(v)
	}
	if err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// next waits for the next message that keep accepts (nil: any); ok false when the socket
// closed first.
func (c *client) next(keep func(outbound) bool, timeout time.Duration) (outbound, bool) {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				return outbound{}, false
			}
			if keep == nil || keep(m) {
				return m, true
			}
		case <-deadline:
			c.t.Fatalf("no message within %s", timeout)
		}
	}
}

// drain collects every message until the socket closes, and returns them with the close.
func (c *client) drain(timeout time.Duration) ([]outbound, *websocket.CloseError) {
	c.t.Helper()
	var all []outbound
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				<-c.done
				return all, c.closed
			}
			all = append(all, m)
		case <-deadline:
			c.t.Fatalf("the server did not close the socket within %s (%d messages so far)", timeout, len(all))
		}
	}
}

// expectClose waits for the server to close the socket with code and a reason starting
// with prefix.
func (c *client) expectClose(code int, prefix string) {
	c.t.Helper()
	_, ce := c.drain(10 * time.Second)
	if ce == nil {
		c.t.Fatalf("socket ended without a close frame; want %d %q", code, prefix)
	}
	if ce.Code != code || !strings.HasPrefix(ce.Text, prefix) {
		c.t.Errorf("closed with %d %q, want %d %q…", ce.Code, ce.Text, code, prefix)
	}
}

// waitIdle waits until the server has no call open.
func waitIdle(t *testing.T, srv *telephony.Server) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for srv.Active() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls still open", srv.Active())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// decodeMedia concatenates the media messages' audio as 8 kHz floats.
func decodeMedia(t *testing.T, msgs []outbound, sid string) ([]float32, []time.Time) {
	t.Helper()
	var pcm []float32
	var at []time.Time
	for _, m := range msgs {
		if m.Event != "media" {
			continue
		}
		if m.Sid != sid {
			t.Fatalf("media for stream %q, want %q", m.Sid, sid)
		}
		b, err := base64.StdEncoding.DecodeString(m.Media.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != 160 {
			t.Fatalf("a media message of %d bytes, want 160 (20 ms)", len(b))
		}
		for _, u := range b {
			pcm = append(pcm, float32(audioout.MuLawToLinear(u))/32768)
		}
		at = append(at, m.at)
	}
	return pcm, at
}

// pitchShift measures how many semitones out is above in (both at rate): align the energy
// envelopes, estimate F0 every 10 ms, take the median ratio over frames voiced in both.
func pitchShift(in, out []float32, rate int) (float64, int) {
	hop := rate / 100
	env := func(x []float32) []float32 {
		e := make([]float32, len(x)/hop)
		for i := range e {
			e[i] = float32(rms(x[i*hop : (i+1)*hop]))
		}
		return e
	}
	lag := align(env(in), env(out), 100)
	fi := dsp.EstimateF0(in, rate, 0.01)
	fo := dsp.EstimateF0(out, rate, 0.01)
	var shifts []float64
	for i, f := range fi {
		if j := i + lag; f > 0 && j >= 0 && j < len(fo) && fo[j] > 0 {
			shifts = append(shifts, 12*math.Log2(fo[j]/f))
		}
	}
	if len(shifts) == 0 {
		return 0, 0
	}
	slices.Sort(shifts)
	return shifts[len(shifts)/2], len(shifts)
}

// align finds the lag in 0…maxLag of got against ref with the best normalised correlation.
func align(ref, got []float32, maxLag int) int {
	best, bestLag := -1.0, 0
	for lag := 0; lag <= maxLag; lag++ {
		var xy, xx, yy float64
		for i := range ref {
			if i+lag >= len(got) {
				break
			}
			a, b := float64(ref[i]), float64(got[i+lag])
			xy, xx, yy = xy+a*b, xx+a*a, yy+b*b
		}
		if c := xy / math.Sqrt(xx*yy+1e-20); c > best {
			best, bestLag = c, lag
		}
	}
	return bestLag
}

func rms(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s / float64(max(len(x), 1)))
}

// voicedSpan is the time from the first to the last 10 ms frame within 30 dB of the loudest.
func voicedSpan(x []float32, rate int) time.Duration {
	hop := rate / 100
	var e []float64
	loud := 0.0
	for i := 0; i+hop <= len(x); i += hop {
		v := rms(x[i : i+hop])
		e = append(e, v)
		loud = max(loud, v)
	}
	first, last := -1, -1
	for i, v := range e {
		if v > loud*0.0316 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return 0
	}
	return time.Duration(last-first+1) * 10 * time.Millisecond
}

// scheduleSpread is how far arrivals stray from a steady 20 ms schedule: the 10th to 90th
// percentile of arrival − n×20 ms. A paced sender keeps it near 0 (a late message delays
// only itself); a sender of bursts of n messages spreads it over about n×20 ms.
func scheduleSpread(at []time.Time) time.Duration {
	off := make([]time.Duration, len(at))
	for i, a := range at {
		off[i] = a.Sub(at[0]) - time.Duration(i)*20*time.Millisecond
	}
	slices.Sort(off)
	return off[len(off)*9/10] - off[len(off)/10]
}

// maxInWindow is the most arrivals within any window w: a burst shows as many.
func maxInWindow(at []time.Time, w time.Duration) int {
	most := 0
	j := 0
	for i := range at {
		for at[i].Sub(at[j]) > w {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}
