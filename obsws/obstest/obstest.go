// Package obstest is an obs-websocket v5 server for tests (OBS Studio cannot run in them):
// it speaks the documented handshake with a password challenge and records the
// SetInputAudioSyncOffset requests it gets.
package obstest

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"sync"

	"github.com/gorilla/websocket"
)

// Server speaks the server side of obs-websocket v5 as documented (OBS itself cannot run
// here): Hello with an authentication challenge, Identify checked against the password,
// and SetInputAudioSyncOffset requests recorded.
type Server struct {
	Password string
	Input    string // the one input that exists
	mu       sync.Mutex
	offsets  map[string]float64
}

func (f *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
	h1 := sha256.Sum256([]byte(f.Password + salt))
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
		case req.D.Data.Input != f.Input:
			ok, code, comment = false, 600, "No source was found by the name of `"+req.D.Data.Input+"`."
		default:
			f.mu.Lock()
			if f.offsets == nil {
				f.offsets = map[string]float64{}
			}
			f.offsets[req.D.Data.Input] = req.D.Data.Offset
			f.mu.Unlock()
		}
		// An event in between, as OBS sends them: the client must skip it.
		conn.WriteJSON(map[string]any{"op": 5, "d": map[string]any{"eventType": "InputAudioSyncOffsetChanged"}})
		conn.WriteJSON(map[string]any{"op": 7, "d": map[string]any{"requestType": req.D.Type, "requestId": req.D.ID,
			"requestStatus": map[string]any{"result": ok, "code": code, "comment": comment}}})
	}
}

// Offset is the sync offset in ms last set on input, and whether one was set.
func (f *Server) Offset(input string) (float64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.offsets[input]
	return v, ok
}
