package main

import (
	"fmt"
	"os"

	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"
)

// iceServers turns --ice-server URLs (stun:, stuns:, turn:, turns:) into the WebRTC
// configuration the server and its pages use. --ice-username and --ice-credential (or
// $VOXPIPE_ICE_CREDENTIAL) go with the TURN servers, which need them.
func iceServers(urls []string, username, credential string) ([]webrtc.ICEServer, error) {
	if len(urls) == 0 && (username != "" || credential != "") {
		return nil, fmt.Errorf("--ice-username and --ice-credential go with a TURN --ice-server")
	}
	if credential == "" {
		credential = os.Getenv("VOXPIPE_ICE_CREDENTIAL")
	}
	var out []webrtc.ICEServer
	for _, raw := range urls {
		u, err := ice.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("--ice-server %q: %w (want stun:HOST[:PORT] or turn:HOST[:PORT][?transport=udp|tcp])", raw, err)
		}
		s := webrtc.ICEServer{URLs: []string{raw}}
		if u.Scheme == ice.SchemeTypeTURN || u.Scheme == ice.SchemeTypeTURNS {
			if username == "" || credential == "" {
				return nil, fmt.Errorf("--ice-server %q: a TURN server needs --ice-username and --ice-credential (or $VOXPIPE_ICE_CREDENTIAL)", raw)
			}
			s.Username, s.Credential = username, credential
		}
		out = append(out, s)
	}
	return out, nil
}
