package obsws

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/obsws/obstest"
)

func TestSetAudioSyncOffset(t *testing.T) {
	obs := &obstest.Server{Password: "hunter2-long-password", Input: "Voice"}
	srv := httptest.NewServer(obs)
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if _, err := Dial(ctx, url, "wrong"); err == nil || !strings.Contains(err.Error(), "wrong password") {
		t.Errorf("wrong password: %v", err)
	}
	if _, err := Dial(ctx, url, ""); err == nil || !strings.Contains(err.Error(), "needs a password") {
		t.Errorf("no password: %v", err)
	}
	c, err := Dial(ctx, url, obs.Password)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetAudioSyncOffset(ctx, "Voice", 187*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got, _ := obs.Offset("Voice"); got != 187 {
		t.Errorf("offset %v ms, want 187", got)
	}
	if err := c.SetAudioSyncOffset(ctx, "Mic", time.Second); err == nil || !strings.Contains(err.Error(), "No source") {
		t.Errorf("unknown input: %v", err)
	}
	if err := c.SetAudioSyncOffset(ctx, "Voice", 30*time.Second); err == nil {
		t.Error("offset beyond OBS's range accepted")
	}
	if _, err := c.Request(ctx, "GetVersion", nil); err == nil {
		t.Error("failed request without an error")
	}
	c.Close()
	if err := c.SetAudioSyncOffset(ctx, "Voice", time.Second); err == nil {
		t.Error("request after Close without an error")
	}
}
