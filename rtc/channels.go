package rtc

import (
	"fmt"
	"regexp"

	"github.com/voxpipe/voxpipe/server/auth"
)

// Channels give a live session a stable name that outlives it: a streamer's OBS page asks
// for channel "studio" and gets whatever session is live on it now, so restarting the voice
// changer does not change the OBS URL. A channel belongs to the key that named it (two keys
// may both have a "studio"); it maps to the latest session that named it, and is forgotten
// when that session ends, so the map never holds more entries than there are live sessions.

// CodeBadChannel answers a channel name that is not allowed.
const CodeBadChannel = "bad_channel"

const maxChannelLen = 64

var (
	channelName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	// Session ids and channel names share WHEP's path, so a name may not look like an id.
	sessionID = regexp.MustCompile(`^[sw][0-9a-f]{32}$`)
)

// checkChannel says why name cannot be a channel name, or nil.
func checkChannel(name string) error {
	switch {
	case len(name) > maxChannelLen:
		return fmt.Errorf("channel name is %d characters: at most %d", len(name), maxChannelLen)
	case !channelName.MatchString(name):
		return fmt.Errorf("channel name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	case sessionID.MatchString(name):
		return fmt.Errorf("channel name %q looks like a session id: choose another", name)
	}
	return nil
}

// channelKey scopes a channel name to the key that uses it.
type channelKey struct{ owner, name string }

// channelEntry is a channel's live session; seq orders claims (an admin key picks the latest).
type channelEntry struct {
	p   *peer
	seq uint64
}

// setChannel moves p to channel name ("" leaves it on none): its old channel is forgotten
// unless another session took it since, and the new one points at p once p is live (a WHIP
// session is registered only after it negotiated; addPeer maps it then). Naming the same
// channel again changes nothing: a session replaced on its channel does not take it back
// by sending its settings again.
func (s *Server) setChannel(p *peer, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == p.channel {
		return
	}
	s.unmapChannel(p)
	p.channel = name
	if _, live := s.peers[p.id]; live {
		s.mapChannel(p)
	}
}

// mapChannel points p's channel at p, replacing the session it pointed at; s.mu is held.
func (s *Server) mapChannel(p *peer) {
	if p.channel == "" {
		return
	}
	s.channelSeq++
	s.channels[channelKey{p.owner, p.channel}] = channelEntry{p: p, seq: s.channelSeq}
}

// unmapChannel forgets p's channel if it still points at p; s.mu is held.
func (s *Server) unmapChannel(p *peer) {
	k := channelKey{p.owner, p.channel}
	if e, ok := s.channels[k]; ok && e.p == p {
		delete(s.channels, k)
	}
}

// channelPeer is the live session on channel name that principal may see: its own, or for
// an admin key its own first, then the latest of any key's; s.mu is held.
func (s *Server) channelPeer(principal, name string) (*peer, bool) {
	if e, ok := s.channels[channelKey{principal, name}]; ok {
		return e.p, true
	}
	if principal != auth.Admin {
		return nil, false
	}
	var best channelEntry
	for k, e := range s.channels {
		if k.name == name && e.seq > best.seq {
			best = e
		}
	}
	return best.p, best.p != nil
}

// lookupSession finds what WHEP's path names, a session id or a channel name, among the
// sessions principal may see; s.mu is held.
func (s *Server) lookupSession(principal, idOrChannel string) (*peer, bool) {
	if p, ok := s.peers[idOrChannel]; ok {
		return p, auth.CanSee(p.owner, principal)
	}
	if checkChannel(idOrChannel) != nil {
		return nil, false
	}
	return s.channelPeer(principal, idOrChannel)
}
