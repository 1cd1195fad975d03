package main

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/obsws/obstest"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/stream"
)

// TestOBSSync: session stats set the OBS input's sync offset to the measured latency, and
// small changes are not sent again.
func TestOBSSync(t *testing.T) {
	obs := &obstest.Server{Password: "obs-password-0123", Input: "voxpipe"}
	srv := httptest.NewServer(obs)
	defer srv.Close()
	t.Setenv("OBS_WEBSOCKET_PASSWORD", obs.Password)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newOBSSync(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), "voxpipe", slog.New(slog.NewTextHandler(io.Discard, nil)))
	wait := func(want float64) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if got, ok := obs.Offset("voxpipe"); ok && got == want {
				return
			}
		}
		got, _ := obs.Offset("voxpipe")
		t.Fatalf("offset %v ms, want %v", got, want)
	}
	s.Stats(report(44.2, 20))
	wait(64)
	s.Stats(report(50, 20)) // +6 ms: kept
	time.Sleep(100 * time.Millisecond)
	if got, _ := obs.Offset("voxpipe"); got != 64 {
		t.Errorf("small change sent: %v", got)
	}
	s.Stats(report(230, 40))
	wait(270)
}

// report is a live session's report with a measured latency and a jitter target, in ms.
func report(latency, jitter float64) rtc.SessionReport {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return rtc.SessionReport{Stream: stream.Stats{Latency: ms(latency)}, JitterTarget: ms(jitter)}
}
