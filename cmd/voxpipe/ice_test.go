package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// --ice-server reaches the pages through GET /v1/rtc/config (TURN with its credentials), and
// what cannot work is refused at start with the flag's name.
func TestServeICEServers(t *testing.T) {
	base := testApp(t, serveOptions{iceURLs: []string{"stun:stun.example.org:3478", "turn:turn.example.org:3478?transport=udp"},
		iceUsername: "alice", iceCredential: "secret"})
	resp, err := http.Get(base + "/v1/rtc/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		ICE []struct {
			URLs       []string `json:"urls"`
			Username   string   `json:"username"`
			Credential string   `json:"credential"`
		} `json:"ice_servers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || len(got.ICE) != 2 {
		t.Fatalf("/v1/rtc/config: %+v %v", got, err)
	}
	if got.ICE[0].URLs[0] != "stun:stun.example.org:3478" || got.ICE[0].Username != "" ||
		got.ICE[1].Username != "alice" || got.ICE[1].Credential != "secret" {
		t.Errorf("/v1/rtc/config: %+v", got.ICE)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ice-server", "http://example.org"}, "--ice-server"},
		{[]string{"--ice-server", "turn:turn.example.org"}, "needs --ice-username and --ice-credential"},
		{[]string{"--ice-username", "bob"}, "go with a TURN --ice-server"},
	} {
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--voices", t.TempDir()}, tc.args...)
		if _, stderr, code := runCmd(t, args...); code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %q", tc.args, code, stderr)
		}
	}
}
