package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/internal/golden"
)

// served is a real serve() on a loopback port, stopped by cancel.
type served struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// startServe runs serve (the command's HTTP server, timeouts, limits and shutdown) with o.
func startServe(t *testing.T, o serveOptions) *served {
	t.Helper()
	o = testDefaults(t, o)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := newApp(o, log, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- serve(ctx, o, ln, a, log) }()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// ttsOptions loads the tiny golden TTS with the speech fixture as its default voice.
func ttsOptions(t *testing.T) serveOptions {
	return serveOptions{ttsModel: golden.Path(t, "miotts", "model.gguf"), codec: golden.Path(t, "miocodec", "model.gguf"),
		ttsVoice: filepath.Join("..", "..", "testdata", "speech_en_48k.wav")}
}

// rawGet sends a keep-alive GET on c and reads its response.
func rawGet(t *testing.T, c net.Conn, br *bufio.Reader, path string) *http.Response {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// closedWithin reads c until it ends and returns what it read and how long that took; a
// read that times out (the server held the connection) fails the test.
func closedWithin(t *testing.T, c net.Conn, r io.Reader, limit time.Duration) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(limit))
	b, err := io.ReadAll(r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v (read %q)", limit, b)
	}
	return string(b), time.Since(start)
}

// TestServeClosesIdleConnections: a keep-alive connection that sends nothing after its
// response is closed by the server after the idle timeout.
func TestServeClosesIdleConnections(t *testing.T) {
	s := startServe(t, serveOptions{idleTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if resp := rawGet(t, c, br, "/healthz"); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("healthz: %d close=%v", resp.StatusCode, resp.Close)
	}
	_, took := closedWithin(t, c, br, 3*time.Second)
	t.Logf("idle connection closed after %v (idle timeout 300ms)", took.Round(time.Millisecond))
}

// TestServeCutsSlowRequestBody: a client that trickles a request body is cut off after the
// body timeout, not held for as long as it keeps sending.
func TestServeCutsSlowRequestBody(t *testing.T) {
	s := startServe(t, serveOptions{bodyTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"input":"` + strings.Repeat("a", 200) + `"}`
	fmt.Fprintf(c, "POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	stop := make(chan struct{})
	defer close(stop)
	go func() { // 20 bytes a second: the whole body would take 10 s
		for i := range len(body) {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := c.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	got, took := closedWithin(t, c, c, 3*time.Second)
	status, _, _ := strings.Cut(got, "\r\n")
	t.Logf("slow body cut after %v (body timeout 300ms): %q", took.Round(time.Millisecond), status)
}

// TestServeLimitsConnectionsPerIP: connections from one address over --conns-per-ip are
// closed as they arrive, the open ones keep working, and a closed one frees its place.
func TestServeLimitsConnectionsPerIP(t *testing.T) {
	s := startServe(t, serveOptions{connsPerIP: 3})
	type conn struct {
		c  net.Conn
		br *bufio.Reader
	}
	var open []conn
	for range 3 {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if resp := rawGet(t, c, br, "/healthz"); resp.StatusCode != 200 {
			t.Fatalf("connection %d: %d", len(open), resp.StatusCode)
		}
		open = append(open, conn{c, br})
	}
	extra, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	fmt.Fprintf(extra, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	closedWithin(t, extra, extra, 2*time.Second)
	if resp := rawGet(t, open[0].c, open[0].br, "/healthz"); resp.StatusCode != 200 {
		t.Fatalf("open connection after the refusal: %d", resp.StatusCode)
	}
	open[1].c.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get("http://" + s.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection after one closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stalledSpeech posts a long speech request from a client with a tiny receive buffer, reads
// the response header (audio has started) and then reads nothing more.
func stalledSpeech(t *testing.T, addr string) (net.Conn, *http.Response) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := `{"input":"` + strings.Repeat("Talk on and on. ", 20) + `","response_format":"pcm","sample_rate":48000,"options":{"max_tokens":4000,"seed":3}}`
	fmt.Fprintf(c, "POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 512), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Time{})
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("speech: %d %s", resp.StatusCode, b)
	}
	return c, resp
}

// truncated reads the rest of a stalled speech response: it must end in an error (the
// server cut the chunked body), never in a clean end.
func truncated(t *testing.T, c net.Conn, resp *http.Response) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, resp.Body)
	switch {
	case err == nil:
		t.Errorf("speech stream ended cleanly after %d more bytes; a cut stream must read as an error", n)
	case errors.Is(err, io.ErrUnexpectedEOF):
		t.Logf("stalled client read %d more bytes, then %v", n, err)
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("speech stream still open: %v", err)
		} else {
			t.Logf("stalled client read %d more bytes, then %v", n, err)
		}
	}
}

func postSpeech(addr, body string) (*http.Response, []byte, error) {
	resp, err := http.Post("http://"+addr+"/v1/audio/speech", "application/json", strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// TestServeSpeechWriteTimeoutFreesSlot: with one synthesis slot, a speech client that stops
// reading loses its stream (cut, not ended cleanly) and the slot within the write timeout,
// so a request queued behind it is served.
func TestServeSpeechWriteTimeoutFreesSlot(t *testing.T) {
	o := ttsOptions(t)
	// The stalled stream first fills the kernel's socket buffers (megabytes on loopback: about
	// 2 s of synthesis here, far more under -race), so the queued request may wait long; it
	// would wait forever if the stalled stream kept its slot.
	o.ttsSlots, o.ttsWait, o.writeTimeout = 1, 2*time.Minute, 500*time.Millisecond
	s := startServe(t, o)
	c, stalled := stalledSpeech(t, s.addr)
	start := time.Now()
	resp, b, err := postSpeech(s.addr, `{"input":"Hello there.","response_format":"pcm","options":{"max_tokens":20}}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || len(b) == 0 {
		t.Fatalf("queued request: %d %s", resp.StatusCode, b)
	}
	t.Logf("queued request served %v after the stalled one started (write timeout 500ms)", time.Since(start).Round(time.Millisecond))
	truncated(t, c, stalled)
}

// TestServeShutdown: on shutdown with a speech client that does not read, a TTS socket in
// mid-utterance, a live-voice signaling socket and a speech request waiting for a slot,
// serve returns within the grace period plus 2 s; both sockets get close code 1001, the
// speech client reads an error, not a clean end of its audio, and the waiting request gets
// 503 with Retry-After.
func TestServeShutdown(t *testing.T) {
	o := ttsOptions(t)
	const grace = time.Second
	o.shutdownGrace, o.ttsSlots, o.ttsWait = grace, 2, time.Minute
	s := startServe(t, o)

	c, stalled := stalledSpeech(t, s.addr)

	// closeCode reads a socket until it ends and reports its close code (-1: no close frame).
	closeCode := func(ws *websocket.Conn) <-chan int {
		ch := make(chan int, 1)
		go func() {
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					var ce *websocket.CloseError
					if errors.As(err, &ce) {
						ch <- ce.Code
					} else {
						ch <- -1
					}
					return
				}
			}
		}()
		return ch
	}
	tws, _, err := websocket.DefaultDialer.Dial("ws://"+s.addr+"/v1/tts/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tws.Close()
	tws.WriteJSON(map[string]any{"type": "speak", "context_id": "a", "text": strings.Repeat("Keep talking please. ", 10),
		"options": map[string]any{"max_tokens": 4000, "seed": 4}})
	var first map[string]any
	if err := tws.ReadJSON(&first); err != nil || first["type"] != "audio" {
		t.Fatalf("tts socket: %v %v", first, err)
	}
	ttsClosed := closeCode(tws)

	rws, _, err := websocket.DefaultDialer.Dial("ws://"+s.addr+"/v1/rtc", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rws.Close()
	rws.WriteJSON(map[string]any{"type": "ping"})
	var pong map[string]any
	if err := rws.ReadJSON(&pong); err != nil || pong["type"] != "pong" {
		t.Fatalf("rtc socket: %v %v", pong, err)
	}
	rtcClosed := closeCode(rws)

	// Both slots are taken: a third request waits in line.
	type result struct {
		resp *http.Response
		body []byte
		err  error
	}
	queued := make(chan result, 1)
	go func() {
		resp, b, err := postSpeech(s.addr, `{"input":"Hello there.","options":{"max_tokens":20}}`)
		queued <- result{resp, b, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(metricsText(t, s.addr), `voxpipe_admission_queued{model="miotts"} 1`); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the third request never queued")
		}
	}

	start := time.Now()
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(grace + 2*time.Second):
		t.Fatalf("shutdown took over %v", grace+2*time.Second)
	}
	t.Logf("shutdown took %v (grace %v)", time.Since(start).Round(time.Millisecond), grace)
	for name, ch := range map[string]<-chan int{"tts": ttsClosed, "rtc": rtcClosed} {
		select {
		case code := <-ch:
			if code != websocket.CloseGoingAway {
				t.Errorf("%s socket: close code %d, want 1001", name, code)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("%s socket still open", name)
		}
	}
	truncated(t, c, stalled)
	q := <-queued
	if q.err != nil || q.resp.StatusCode != http.StatusServiceUnavailable || q.resp.Header.Get("Retry-After") == "" {
		t.Errorf("queued request: %v %v %s", q.err, q.resp, q.body)
	}
}

func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
