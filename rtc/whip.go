package rtc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
)

// WHIP (RFC 9725) ingest and WHEP egress: OBS (30+) or ffmpeg sends its audio to
// POST /v1/whip and gets it converted; any live session's output — a WHIP session's or a
// browser session's — can be pulled with POST /v1/whep/{session}, e.g. into OBS as a WHEP
// source. Both take an application/sdp offer and answer 201 with the SDP answer (all
// candidates included, no trickling) and a Location to DELETE when done.

// maxViewers bounds the WHEP viewers of one session.
const maxViewers = 8

func (s *Server) addPeer(p *peer) {
	s.mu.Lock()
	s.peers[p.id] = p
	s.mapChannel(p)
	s.mu.Unlock()
}

// removePeer forgets a session and hangs up its viewers.
func (s *Server) removePeer(p *peer) {
	s.mu.Lock()
	delete(s.peers, p.id)
	s.unmapChannel(p) // the channel is idle until a new session names it
	var gone []viewer
	for id, v := range s.viewers {
		if v.session == p.id && v.pc != nil { // one still negotiating sees the session gone
			gone = append(gone, v)
			delete(s.viewers, id)
		}
	}
	s.mu.Unlock()
	for _, v := range gone {
		v.hangUp()
	}
}

// viewer is a WHEP viewer; pc is nil while it is still negotiating (its place is taken).
type viewer struct {
	session string
	owner   string
	pc      *webrtc.PeerConnection
	release func() // gives the viewer's session back to its key's limit
}

func (v viewer) hangUp() {
	if v.pc != nil {
		v.pc.Close()
	}
	if v.release != nil {
		v.release()
	}
}

// readOffer reads an application/sdp body and checks it offers Opus audio.
func (s *Server) readOffer(w http.ResponseWriter, r *http.Request) (string, bool) {
	if s.ctx.Err() != nil {
		http.Error(w, "server is shutting down", http.StatusServiceUnavailable)
		return "", false
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/sdp") {
		http.Error(w, "the body must be an SDP offer with Content-Type: application/sdp", http.StatusUnsupportedMediaType)
		return "", false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxMessage))
	if err != nil {
		http.Error(w, "offer too large or unreadable: "+err.Error(), http.StatusRequestEntityTooLarge)
		return "", false
	}
	if code, err := checkOffer(string(body)); err != nil {
		http.Error(w, code+": "+err.Error(), http.StatusBadRequest)
		return "", false
	}
	return string(body), true
}

func writeAnswer(w http.ResponseWriter, location, sdp string) {
	w.Header().Set("Content-Type", "application/sdp")
	w.Header().Set("Location", location)
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, sdp)
}

// WHIP (POST /v1/whip) starts a session from an offer. The voice and its settings come from the query:
// ?voice=dsp&pitch_semitones=4 (any other numeric parameter is a voice parameter), &ref=ID
// for voices that take a reference clip.
func (s *Server) WHIP(w http.ResponseWriter, r *http.Request) {
	offer, ok := s.readOffer(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	m := Message{Type: "session", Voice: q.Get("voice"), Ref: q.Get("ref"), Channel: q.Get("channel")}
	if m.Channel != "" {
		if err := checkChannel(m.Channel); err != nil {
			http.Error(w, CodeBadChannel+": "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	for k, vs := range q {
		if k == "voice" || k == "ref" || k == "token" || k == "channel" {
			continue
		}
		v, err := strconv.ParseFloat(vs[0], 64)
		if err != nil {
			http.Error(w, fmt.Sprintf("%s: parameter %q is not a number", CodeBadParams, k), http.StatusBadRequest)
			return
		}
		if m.Params == nil {
			m.Params = map[string]float64{}
		}
		m.Params[k] = v
	}
	owner := auth.PrincipalOf(r.Context())
	release, ok := s.cfg.Sessions.Acquire(owner) // the session outlives this request
	if !ok {
		s.cfg.Sessions.Refuse(w)
		return
	}
	id := newID("w")
	log := s.cfg.Logger.With("session", id, "remote", r.RemoteAddr, "via", "whip")
	p := newPeer(s, id, nil, log)
	p.owner = owner
	ctx, cancel := context.WithCancel(s.ctx)
	p.cancel = cancel
	fail := func(status int, msg string) {
		cancel()
		p.shutdown()
		release()
		http.Error(w, msg, status)
	}
	if code, err := p.start(); err != nil {
		if code == CodeBusy { // no room for the default voice now: the client may retry
			w.Header().Set("Retry-After", "1")
			fail(http.StatusServiceUnavailable, code+": "+err.Error())
			return
		}
		fail(http.StatusInternalServerError, stream.Opaque(log, "session", err))
		return
	}
	if code, err := p.configure(m); err != nil {
		fail(http.StatusBadRequest, code+": "+err.Error())
		return
	}
	if err := p.answer(ctx, offer); err != nil {
		fail(http.StatusBadRequest, "negotiation failed: "+err.Error())
		return
	}
	s.setChannel(p, m.Channel) // not live yet: addPeer maps the channel
	s.addPeer(p)
	s.active.Add(1)
	if s.cfg.OnSession != nil {
		s.cfg.OnSession(id, true)
	}
	s.wg.Add(1)
	started := time.Now()
	go func() { // the session lives until DELETE, the peer connection failing, or shutdown
		defer s.wg.Done()
		<-ctx.Done()
		s.removePeer(p)
		p.shutdown()
		release()
		s.active.Add(-1)
		if s.cfg.OnSession != nil {
			s.cfg.OnSession(id, false)
		}
		log.Info("whip session ended", p.summary(started)...)
	}()
	log.Info("whip session started", "voice", p.voiceName)
	writeAnswer(w, "/v1/whip/"+id, p.answerSDP)
}

// WHIPDelete (DELETE /v1/whip/{id}) ends a WHIP session.
func (s *Server) WHIPDelete(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	p, ok := s.peers[r.PathValue("id")]
	s.mu.Unlock()
	// Another key's session is answered like a missing one: ids are not to be probed.
	if !ok || p.conn != nil || !auth.CanSee(p.owner, auth.PrincipalOf(r.Context())) {
		http.Error(w, "no such WHIP session", http.StatusNotFound)
		return
	}
	s.removePeer(p) // gone at once for WHEP and a repeated DELETE; the teardown follows
	p.cancel()
	w.WriteHeader(http.StatusOK)
}

// WHEP (POST /v1/whep/{session}) lets a viewer receive a live session's output track: one the viewer's key made
// (an admin key may view any). {session} is a session id or a channel name (the channel's
// live session now); the Location names the session either way.
func (s *Server) WHEP(w http.ResponseWriter, r *http.Request) {
	offer, ok := s.readOffer(w, r)
	if !ok {
		return
	}
	asked := r.PathValue("session")
	owner := auth.PrincipalOf(r.Context())
	vid := newID("v")
	// The viewer's place is taken under the lock that counts them, before negotiating, so
	// concurrent requests cannot pass the cap together; a failure gives it back.
	s.mu.Lock()
	p, ok := s.lookupSession(owner, asked)
	session, n := "", 0
	if ok {
		session = p.id
		for _, v := range s.viewers {
			if v.session == session {
				n++
			}
		}
		if n < maxViewers {
			s.viewers[vid] = viewer{session: session, owner: owner}
		}
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "no live session or channel "+asked, http.StatusNotFound)
		return
	}
	if n >= maxViewers {
		http.Error(w, fmt.Sprintf("session %s already has %d viewers", session, maxViewers), http.StatusServiceUnavailable)
		return
	}
	release, ok := s.cfg.Sessions.Acquire(owner)
	if !ok {
		s.dropViewer(vid)
		s.cfg.Sessions.Refuse(w)
		return
	}
	select {
	case <-p.negotiated:
	case <-time.After(5 * time.Second):
		s.dropViewer(vid)
		release()
		http.Error(w, "session "+session+" has not negotiated its media yet", http.StatusConflict)
		return
	}
	pc, err := s.api.NewPeerConnection(webrtc.Configuration{ICEServers: s.cfg.ICEServers})
	if err != nil {
		s.dropViewer(vid)
		release()
		http.Error(w, "cannot make a peer connection", http.StatusInternalServerError)
		return
	}
	answer, err := func() (string, error) {
		sender, err := pc.AddTrack(p.track) // the session's one output track, shared by its viewers
		if err != nil {
			return "", err
		}
		go func() { // drain RTCP for the interceptors; ends when pc closes
			buf := make([]byte, 1500)
			for {
				if _, _, err := sender.Read(buf); err != nil {
					return
				}
			}
		}()
		if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: offer}); err != nil {
			return "", err
		}
		ans, err := pc.CreateAnswer(nil)
		if err != nil {
			return "", err
		}
		gathered := webrtc.GatheringCompletePromise(pc)
		if err := pc.SetLocalDescription(ans); err != nil {
			return "", err
		}
		select {
		case <-gathered:
		case <-time.After(5 * time.Second):
		}
		return pc.LocalDescription().SDP, nil
	}()
	if err != nil {
		s.dropViewer(vid)
		release()
		pc.Close()
		http.Error(w, "negotiation failed: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	_, live := s.peers[session]
	_, kept := s.viewers[vid]
	if live && kept {
		s.viewers[vid] = viewer{session: session, owner: owner, pc: pc, release: release}
	}
	s.mu.Unlock()
	if !live || !kept {
		s.dropViewer(vid)
		release()
		pc.Close()
		http.Error(w, "session "+session+" ended", http.StatusNotFound)
		return
	}
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		if st == webrtc.PeerConnectionStateFailed || st == webrtc.PeerConnectionStateClosed {
			s.dropViewer(vid)
		}
	})
	writeAnswer(w, "/v1/whep/"+session+"/"+vid, answer)
}

// dropViewer forgets a viewer, hangs it up and gives its session back to its key.
func (s *Server) dropViewer(vid string) {
	s.mu.Lock()
	v, ok := s.viewers[vid]
	delete(s.viewers, vid)
	s.mu.Unlock()
	if ok {
		v.hangUp()
	}
}

// WHEPDelete (DELETE /v1/whep/{session}/{viewer}) hangs up a viewer.
func (s *Server) WHEPDelete(w http.ResponseWriter, r *http.Request) {
	vid := r.PathValue("viewer")
	s.mu.Lock()
	v, ok := s.viewers[vid]
	if ok && v.session == r.PathValue("session") && v.pc != nil && auth.CanSee(v.owner, auth.PrincipalOf(r.Context())) {
		delete(s.viewers, vid)
	} else {
		ok = false
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "no such WHEP viewer", http.StatusNotFound)
		return
	}
	v.hangUp()
	w.WriteHeader(http.StatusOK)
}
