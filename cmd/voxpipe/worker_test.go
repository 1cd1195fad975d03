package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/worker/lktest"
)

// The worker command against a real livekit-server: it refuses to start without
// credentials, stops with a clear error on a wrong secret, and otherwise registers and
// serves its API until cancelled.
func TestWorkerCommand(t *testing.T) {
	t.Setenv("LIVEKIT_URL", "")
	t.Setenv("LIVEKIT_API_KEY", "")
	t.Setenv("LIVEKIT_API_SECRET", "")
	t.Setenv("VOXPIPE_API_KEYS", "")
	err := workerCommand(context.Background(), []string{"--listen", ""}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "URL, API key and secret") {
		t.Fatalf("without credentials: %v", err)
	}

	lk := lktest.Start(t)
	voices := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = workerCommand(ctx, []string{"--livekit-url", lk.URL, "--api-key", lk.Key, "--api-secret", "not-the-secret-of-this-key-000000000000",
		"--listen", "", "--voices", voices}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "check the API key and secret") {
		t.Fatalf("with a wrong secret: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	t.Setenv("LIVEKIT_API_SECRET", lk.Secret) // the secret from the environment
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		done <- workerCommand(ctx, []string{"--livekit-url", lk.URL, "--api-key", lk.Key, "--agent-name", "cmd-test",
			"--listen", addr, "--voices", voices, "--log-level", "warn"}, &out, io.Discard)
	}()
	base := "http://" + addr
	lktest.Eventually(t, "the worker to register", 20*time.Second, func() bool {
		var h struct{ Registered bool }
		return getJSON(base+"/healthz", &h) == nil && h.Registered
	})
	resp, err := http.Post(base+"/v1/rooms", "application/json", strings.NewReader(`{"room":"cmd-room","params":{"pitch_semitones":3}}`))
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("join: %v %v", resp, err)
	}
	resp.Body.Close()
	var rooms struct {
		Rooms []struct{ Name, Mode string }
	}
	if err := getJSON(base+"/v1/rooms", &rooms); err != nil || len(rooms.Rooms) != 1 || rooms.Rooms[0].Name != "cmd-room" || rooms.Rooms[0].Mode != "vc" {
		t.Fatalf("rooms: %+v %v", rooms, err)
	}
	var capa struct {
		Rooms     int
		Accepting bool
	}
	if err := getJSON(base+"/v1/capacity", &capa); err != nil || capa.Rooms != 1 || !capa.Accepting {
		t.Fatalf("capacity: %+v %v", capa, err)
	}
	if resp, err := http.Get(base + "/metrics"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("metrics: %v %v", resp, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("worker ended with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the worker did not stop within 15 s of its context ending")
	}
	if !strings.Contains(out.String(), "voxpipe worker for LiveKit at "+lk.URL+", agent name cmd-test") {
		t.Errorf("start-up line missing: %q", out.String())
	}
}
