package main

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/obsws/obstest"
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
	s.Stats(rtc.StatsMessage{Latency: rtc.LatencyStats{Server: 44.2, Jitter: 20}})
	wait(64)
	s.Stats(rtc.StatsMessage{Latency: rtc.LatencyStats{Server: 50, Jitter: 20}}) // +6 ms: kept
	time.Sleep(100 * time.Millisecond)
	if got, _ := obs.Offset("voxpipe"); got != 64 {
		t.Errorf("small change sent: %v", got)
	}
	s.Stats(rtc.StatsMessage{Latency: rtc.LatencyStats{Server: 230, Jitter: 40}})
	wait(270)
}
