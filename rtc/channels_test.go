package rtc

import (
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/server/auth"
)

func TestCheckChannel(t *testing.T) {
	for _, ok := range []string{"studio", "a", "My.Stream_1-2", "0day", strings.Repeat("x", 64)} {
		if err := checkChannel(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	id := "s" + strings.Repeat("0a", 16)
	for _, bad := range []string{"", strings.Repeat("x", 65), "has space", "ümlaut", "a/b", ".", "..", "-x", "_x",
		"x?y", id, "w" + id[1:]} {
		if err := checkChannel(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := checkChannel(strings.Repeat("x", 65)); err == nil || !strings.Contains(err.Error(), "at most 64") {
		t.Errorf("a long name's error does not say the limit: %v", err)
	}
}

// channelServer is a Server with only the maps the channel bookkeeping uses.
func channelServer() *Server {
	return &Server{peers: map[string]*peer{}, viewers: map[string]viewer{}, channels: map[channelKey]channelEntry{}}
}

// on reports which session principal reaches by name ("" for none).
func on(s *Server, principal, name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.lookupSession(principal, name); ok {
		return p.id
	}
	return ""
}

// TestChannelMapping: a channel points at its key's latest session, other keys cannot reach
// it (an admin can), a replaced session ending leaves the channel alone, the channel's own
// session ending makes it idle, renaming frees the old name, and nothing is left behind.
func TestChannelMapping(t *testing.T) {
	s := channelServer()
	live := func(id, owner, channel string) *peer {
		p := &peer{id: id, owner: owner}
		s.addPeer(p)
		s.setChannel(p, channel)
		return p
	}
	a1 := live("s1", "A", "studio")
	if got := on(s, "A", "studio"); got != "s1" {
		t.Fatalf("A's studio: %q", got)
	}
	if got := on(s, "B", "studio"); got != "" {
		t.Errorf("B reaches A's channel: %q", got)
	}
	if got := on(s, "B", "s1"); got != "" {
		t.Errorf("B reaches A's session by id: %q", got)
	}
	b1 := live("s2", "B", "studio") // B's own "studio", beside A's
	if a, b := on(s, "A", "studio"), on(s, "B", "studio"); a != "s1" || b != "s2" {
		t.Errorf("two keys' studio: A %q, B %q", a, b)
	}
	if got := on(s, auth.Admin, "studio"); got != "s2" {
		t.Errorf("admin gets %q, want the latest (s2)", got)
	}

	a2 := live("s3", "A", "studio") // A restarts its voice changer
	if got := on(s, "A", "studio"); got != "s3" {
		t.Errorf("after replacement: %q", got)
	}
	s.setChannel(a1, "studio") // the replaced one sends its settings again: no take-back
	if got := on(s, "A", "studio"); got != "s3" {
		t.Errorf("a replaced session took its channel back: %q", got)
	}
	s.removePeer(a1) // the replaced session ends late: the channel stays on the new one
	if got := on(s, "A", "studio"); got != "s3" {
		t.Errorf("replaced session's end took the channel: %q", got)
	}
	s.removePeer(a2)
	if got := on(s, "A", "studio"); got != "" {
		t.Errorf("channel not idle after its session ended: %q", got)
	}

	a3 := live("s4", "A", "one")
	s.setChannel(a3, "two")
	if one, two := on(s, "A", "one"), on(s, "A", "two"); one != "" || two != "s4" {
		t.Errorf("after a rename: one %q, two %q", one, two)
	}

	// A WHIP session names its channel before it is live: only addPeer maps it.
	w := &peer{id: "w1", owner: "A"}
	s.setChannel(w, "whip")
	if got := on(s, "A", "whip"); got != "" {
		t.Errorf("channel mapped before the session was live: %q", got)
	}
	s.addPeer(w)
	if got := on(s, "A", "whip"); got != "w1" {
		t.Errorf("WHIP channel: %q", got)
	}

	for _, p := range []*peer{b1, a3, w} {
		s.removePeer(p)
	}
	if len(s.channels) != 0 || len(s.peers) != 0 {
		t.Errorf("left behind: %d channels, %d sessions", len(s.channels), len(s.peers))
	}
}
