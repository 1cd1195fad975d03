package rtc_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

// TestWHEPByChannel: WHIP's ?channel= and the signaling session's "channel" name a channel
// that WHEP plays by name; another key gets 404 for it; a new session on the channel
// replaces the old one; the channel is idle (404) once its session ends, even while the
// replaced session lives; bad names are refused with bad_channel.
func TestWHEPByChannel(t *testing.T) {
	base := keyedServer(t, rtc.Config{}, 0)
	api := pionAPI(t)

	for _, bad := range []string{"has%20space", strings.Repeat("x", 65), "s" + strings.Repeat("ab", 16)} {
		body, code := postSDP(t, newSender(t, api), base+"/v1/whip?channel="+bad, keyA)
		if code != http.StatusBadRequest || !strings.Contains(body, rtc.CodeBadChannel) {
			t.Errorf("WHIP ?channel=%s: %d %q", bad, code, body)
		}
	}

	loc, code := postSDP(t, newSender(t, api), base+"/v1/whip?channel=studio", keyA)
	if code != http.StatusCreated {
		t.Fatalf("WHIP: %d %s", code, loc)
	}
	whipID := strings.TrimPrefix(loc, "/v1/whip/")
	playing := func(key string) (string, int) { // the session WHEP on channel studio plays
		t.Helper()
		vloc, code := postSDP(t, newViewer(t, api), base+"/v1/whep/studio", key)
		if code != http.StatusCreated {
			return "", code
		}
		return strings.Split(strings.TrimPrefix(vloc, "/v1/whep/"), "/")[0], code
	}
	if id, code := playing(keyA); code != http.StatusCreated || id != whipID {
		t.Errorf("WHEP by channel: %d, session %q, want %q", code, id, whipID)
	}
	if _, code := playing(keyB); code != http.StatusNotFound {
		t.Errorf("another key's channel: %d, want 404", code)
	}

	// The voice changer page starts on the same channel: it takes the channel over.
	c, err := rtcclient.Dial(context.Background(), rtcclient.Options{URL: rtcclient.WSURL(base) + "?token=" + keyA})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Send(map[string]any{"type": "session", "channel": "bad name"})
	if _, ok := c.WaitMessage("error", rtc.CodeBadChannel, 5*time.Second); !ok {
		t.Errorf("a bad channel name got no bad_channel error: %+v", c.Messages())
	}
	c.Send(rtc.Message{Type: "session", Channel: "studio"})
	var ready rtc.Message
	for end := time.Now().Add(5 * time.Second); ready.Channel == "" && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, m := range c.Messages() {
			if m.Type == "ready" && m.Channel != "" {
				ready = m
			}
		}
	}
	if ready.Channel != "studio" {
		t.Fatalf("ready after naming the channel: %+v", ready)
	}
	if id, code := playing(keyA); code != http.StatusCreated || id != ready.SessionID {
		t.Errorf("after replacement: %d, session %q, want %q", code, id, ready.SessionID)
	}

	c.Close() // Stop: the channel is idle, though the WHIP session still lives
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if _, code = playing(keyA); code == http.StatusNotFound {
			break
		}
	}
	if code != http.StatusNotFound {
		t.Errorf("WHEP on a channel whose session ended: %d, want 404", code)
	}
	if _, code := postSDP(t, newViewer(t, api), base+"/v1/whep/"+whipID, keyA); code != http.StatusCreated {
		t.Errorf("the replaced WHIP session by id: %d", code)
	}
}
