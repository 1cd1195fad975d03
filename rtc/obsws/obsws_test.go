package obsws

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// fakeOBS speaks the server side of obs-websocket v5 as documented (OBS itself cannot run
// here): Hello with an authentication challenge, Identify checked against the password,
// and SetInputAudioSyncOffset requests recorded.
type fakeOBS struct {
	password string
	mu       sync.Mutex
	offsets  map[string]float64
}

func (f *fakeOBS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	up := websocket.Upgrader{Subprotocols: []string{"obswebsocket.json"}}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer conn.Close()
	if conn.Subprotocol() != "obswebsocket.json" {
		return
	}
	salt, challenge := "c2FsdA==", "Y2hhbGxlbmdl"
	conn.WriteJSON(map[string]any{"op": 0, "d": map[string]any{"obsWebSocketVersion": "5.5.0", "rpcVersion": 1,
		"authentication": map[string]string{"salt": salt, "challenge": challenge}}})
	var id struct {
		Op int `json:"op"`
		D  struct {
			Auth string `json:"authentication"`
		} `json:"d"`
	}
	if conn.ReadJSON(&id) != nil || id.Op != 1 {
		return
	}
	h1 := sha256.Sum256([]byte(f.password + salt))
	h2 := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(h1[:]) + challenge))
	if id.D.Auth != base64.StdEncoding.EncodeToString(h2[:]) {
		conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(4009, "Authentication failed."))
		return
	}
	conn.WriteJSON(map[string]any{"op": 2, "d": map[string]any{"negotiatedRpcVersion": 1}})
	for {
		var req struct {
			Op int `json:"op"`
			D  struct {
				Type string `json:"requestType"`
				ID   string `json:"requestId"`
				Data struct {
					Input  string  `json:"inputName"`
					Offset float64 `json:"inputAudioSyncOffset"`
				} `json:"requestData"`
			} `json:"d"`
		}
		if conn.ReadJSON(&req) != nil {
			return
		}
		ok, code, comment := true, 100, ""
		switch {
		case req.D.Type != "SetInputAudioSyncOffset":
			ok, code, comment = false, 204, "unknown request type"
		case req.D.Data.Input != "Voice":
			ok, code, comment = false, 600, "No source was found by the name of `"+req.D.Data.Input+"`."
		default:
			f.mu.Lock()
			f.offsets[req.D.Data.Input] = req.D.Data.Offset
			f.mu.Unlock()
		}
		// An event in between, as OBS sends them: the client must skip it.
		conn.WriteJSON(map[string]any{"op": 5, "d": map[string]any{"eventType": "InputAudioSyncOffsetChanged"}})
		conn.WriteJSON(map[string]any{"op": 7, "d": map[string]any{"requestType": req.D.Type, "requestId": req.D.ID,
			"requestStatus": map[string]any{"result": ok, "code": code, "comment": comment}}})
	}
}

func TestSetAudioSyncOffset(t *testing.T) {
	obs := &fakeOBS{password: "hunter2-long-password", offsets: map[string]float64{}}
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
	c, err := Dial(ctx, url, obs.password)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetAudioSyncOffset(ctx, "Voice", 187*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	obs.mu.Lock()
	got := obs.offsets["Voice"]
	obs.mu.Unlock()
	if got != 187 {
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
