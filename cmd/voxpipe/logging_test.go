package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// lockedBuffer collects log output written from many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// jsonLines parses every log line as a JSON object.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		out = append(out, m)
	}
	return out
}

func TestJSONLogsAndAccessLog(t *testing.T) {
	if _, err := newLogger(&lockedBuffer{}, "info", "xml"); err == nil || !strings.Contains(err.Error(), "text or json") {
		t.Errorf("--log-format xml: %v", err)
	}
	var buf lockedBuffer
	log, err := newLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	o := testDefaults(t, serveOptions{accessLog: true})
	a, err := newApp(o, log, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, o, ln, a, log) }()
	base := "http://" + ln.Addr().String()

	for _, path := range []string{"/healthz?token=hush", "/v1/nothing-here"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+ln.Addr().String()+"/v1/rtc", nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.Close()
	// The socket's line comes when its session has ended.
	for end := time.Now().Add(5 * time.Second); !strings.Contains(buf.String(), `"path":"/v1/rtc"`) && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done

	out := buf.String()
	if strings.Contains(out, "hush") {
		t.Error("the access log shows a query string (tokens travel there)")
	}
	want := map[string]float64{"/healthz": 200, "/v1/nothing-here": 404, "/v1/rtc": 101}
	summary := false
	for _, m := range jsonLines(t, out) {
		if m["msg"] == "session ended" {
			summary = true
			for _, k := range []string{"duration", "voice", "audio", "late_chunks", "underflows", "latency", "packets", "lost", "fec", "plc"} {
				if _, ok := m[k]; !ok {
					t.Errorf("session summary without %s: %v", k, m)
				}
			}
		}
		if m["log"] != "access" {
			continue
		}
		path, _ := m["path"].(string)
		if status, ok := want[path]; ok {
			if m["status"] != status || m["method"] != "GET" || m["duration"] == nil || m["remote"] == nil {
				t.Errorf("access line for %s: %v", path, m)
			}
			delete(want, path)
		}
	}
	if !summary {
		t.Error("no session ended line")
	}
	if len(want) > 0 {
		t.Errorf("no access line for %v in:\n%s", want, out)
	}
}
