package rtc_test

import (
	"net"
	"strings"
	"testing"

	"github.com/pion/turn/v5"
	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

// startTURN runs a TURN server on loopback with one user and returns its turn: URL.
func startTURN(t *testing.T, user, pass string) string {
	t.Helper()
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	key := turn.GenerateAuthKey(user, "voxpipe.test", pass)
	s, err := turn.NewServer(turn.ServerConfig{
		Realm: "voxpipe.test",
		AuthHandler: func(ra *turn.RequestAttributes) (string, []byte, bool) {
			return ra.Username, key, ra.Username == user
		},
		PacketConnConfigs: []turn.PacketConnConfig{{PacketConn: conn,
			RelayAddressGenerator: &turn.RelayAddressGeneratorStatic{RelayAddress: net.ParseIP("127.0.0.1"), Address: "127.0.0.1"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return "turn:" + conn.LocalAddr().String() + "?transport=udp"
}

// serverCandidates runs a short session and returns the server's answer and the
// candidates it trickled.
func serverCandidates(t *testing.T, url string) string {
	t.Helper()
	c, _ := roundTrip(t, url, rtcclient.Options{}, speech(t)[:4800])
	var all []string
	for _, m := range c.Messages() {
		switch m.Type {
		case "answer":
			all = append(all, m.SDP)
		case "candidate":
			if m.Candidate != nil {
				all = append(all, m.Candidate.Candidate)
			}
		}
	}
	if len(all) == 0 {
		t.Fatal("no answer")
	}
	return strings.Join(all, "\n")
}

// The server gathers its candidates through the configured TURN server (a relay candidate
// in its answer) when the credentials are right, and has none when they are wrong.
func TestICEServersGiveARelayCandidate(t *testing.T) {
	turnURL := startTURN(t, "alice", "secret")
	for _, tc := range []struct {
		pass  string
		relay bool
	}{{"secret", true}, {"wrong", false}} {
		_, url := startServerWith(t, rtc.Config{ICEServers: []webrtc.ICEServer{{URLs: []string{turnURL}, Username: "alice", Credential: tc.pass}}})
		sdp := serverCandidates(t, url)
		if got := strings.Contains(sdp, "typ relay"); got != tc.relay {
			t.Errorf("credential %q: relay candidate %v, want %v\n%s", tc.pass, got, tc.relay, sdp)
		}
	}
}
