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
	obs, s, wait := startOBSSync(t, "voxpipe")
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

// TestOBSOffsetBeforeAMeasuredLatency: a session's algorithmic latency stands in until its
// latency is measured, then the measurement wins; a report with neither asks for nothing.
func TestOBSOffsetBeforeAMeasuredLatency(t *testing.T) {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	r := report(0, 40)
	if got := obsOffset(r); got != 0 {
		t.Errorf("no latency at all: offset %v, want none", got)
	}
	r.Algorithmic = ms(185) // the 40 ms MeanVC2 model's, say
	if got := obsOffset(r); got != ms(225) {
		t.Errorf("before a measurement: offset %v, want algorithmic 185 ms + jitter 40 ms", got)
	}
	r.Stream.Latency = ms(200)
	if got := obsOffset(r); got != ms(240) {
		t.Errorf("measured: offset %v, want measured 200 ms + jitter 40 ms", got)
	}
}

// TestOBSSyncFromAlgorithmicLatency: the first reports of a session, before its latency is
// measured, already set the offset.
func TestOBSSyncFromAlgorithmicLatency(t *testing.T) {
	_, s, wait := startOBSSync(t, "mic")
	r := report(0, 40)
	r.Algorithmic = 345 * time.Millisecond
	s.Stats(r)
	wait(385) // algorithmic 345 + jitter 40
}

// startOBSSync runs a fake obs-websocket server with input and an obsSync for it until the
// test ends; wait(ms) waits for the input's offset to become ms.
func startOBSSync(t *testing.T, input string) (*obstest.Server, *obsSync, func(float64)) {
	obs := &obstest.Server{Password: "obs-password-0123", Input: input}
	srv := httptest.NewServer(obs)
	t.Cleanup(srv.Close)
	t.Setenv("OBS_WEBSOCKET_PASSWORD", obs.Password)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := newOBSSync(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), input, slog.New(slog.NewTextHandler(io.Discard, nil)))
	wait := func(want float64) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if got, ok := obs.Offset(input); ok && got == want {
				return
			}
		}
		got, _ := obs.Offset(input)
		t.Fatalf("offset %v ms, want %v", got, want)
	}
	return obs, s, wait
}

// report is a live session's report with a measured latency and a jitter target, in ms.
func report(latency, jitter float64) rtc.SessionReport {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return rtc.SessionReport{Stream: stream.Stats{Latency: ms(latency)}, JitterTarget: ms(jitter)}
}
