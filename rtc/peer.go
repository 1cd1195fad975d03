package rtc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/pion/webrtc/v4"
	"golang.org/x/time/rate"

	"github.com/voxpipe/voxpipe/stream"
)

// peer is one signaling socket, its peer connection and its media loop.
type peer struct {
	srv   *Server
	id    string
	owner string // the principal that made the session (auth.PrincipalOf)
	conn  *websocket.Conn
	log   *slog.Logger

	// channel is the name the session is live under (channels.go), "" for none; srv.mu
	// guards it.
	channel string

	writeMu sync.Mutex // serialises socket writes (signaling goroutine, Pion callbacks, media loop)

	// mu guards the voice state the signaling goroutine changes and stats read; it is never
	// held across model work, and the media loop does not take it.
	mu          sync.Mutex
	sess        *stream.Live // processing runs on the server's scheduler, off the media clock
	voiceName   string
	voice       stream.Processor // the selected voice, kept while passthrough stands in for it
	passthrough bool
	ref         string                  // the session's reference clip (voices that take one)
	owned       []stream.Processor      // processors made for this session and not yet closed
	tts         atomic.Pointer[Speaker] // text-to-speech mode: the media loop plays its audio

	events     atomic.Pointer[webrtc.DataChannel] // a data channel the client opened, for events
	answerSDP  string                             // the answer sent (WHIP returns it over HTTP)
	negotiated chan struct{}                      // closed once the outgoing track exists (WHEP waits for it)

	pipe *Pipe // the media path: jitter buffer, 20 ms clock, codecs

	pc     *webrtc.PeerConnection
	track  *webrtc.TrackLocalStaticSample
	cancel context.CancelFunc
	goMu   sync.Mutex     // guards closed against spawn
	closed bool           // shutdown has begun: start no more goroutines
	wg     sync.WaitGroup // goroutines this peer started
	media  sync.Once
}

func newPeer(s *Server, id string, conn *websocket.Conn, log *slog.Logger) *peer {
	p := &peer{srv: s, id: id, conn: conn, log: log, negotiated: make(chan struct{})}
	p.pipe = NewPipe(PipeConfig{ID: id, Jitter: s.cfg.Jitter, Encoder: s.cfg.Encoder, Log: log,
		OnStats: p.onStats, Source: p.ttsAudio})
	return p
}

// onStats completes the pipe's once-a-second report with the voice and sends it.
func (p *peer) onStats(st StatsMessage, report SessionReport) {
	p.mu.Lock()
	st.Voice, st.Passthrough = p.voiceName, p.passthrough
	p.mu.Unlock()
	if p.srv.cfg.OnStats != nil {
		p.srv.cfg.OnStats(report)
	}
	p.send(st)
}

// ttsAudio plays text-to-speech audio in place of the session's output once the peer is in
// tts mode.
func (p *peer) ttsAudio(out []float32) bool {
	t := p.tts.Load()
	if t == nil {
		return false
	}
	t.Pull(out)
	return true
}

// start makes the session with the server's default voice. On failure it returns the error
// code for the client too: busy when the default voice has no room (the client may retry).
func (p *peer) start() (code string, err error) {
	proc, code, err := p.newVoice(p.srv.cfg.DefaultVoice, "", false)
	if err == nil {
		p.sess, err = p.srv.sched.NewLive(stream.Config{IORate: opusRate, MaxQueue: p.srv.cfg.MaxQueue}, p.srv.cfg.DefaultVoice, proc, p.log)
	}
	if err != nil {
		if code == "" {
			code = CodeInternal
		}
		if errors.Is(err, stream.ErrBusy) {
			code = CodeBusy
		}
		return code, fmt.Errorf("default voice: %w", err)
	}
	p.voiceName, p.voice = p.srv.cfg.DefaultVoice, proc
	return "", nil
}

// run serves the socket until it closes or ctx ends, then tears everything down.
func (p *peer) run(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(ctx)
	defer p.shutdown()
	if code, err := p.start(); err != nil {
		p.sendError(code, err.Error(), true)
		return
	}

	p.conn.SetReadLimit(p.srv.cfg.MaxMessage)
	// A client may change its voice many times a second, but not flood the server with work.
	limiter := rate.NewLimiter(50, 100)
	go func() { // unblock the reader when the server or the peer ends the session
		<-ctx.Done()
		p.conn.SetReadDeadline(time.Now())
	}()
	for {
		kind, data, err := p.conn.ReadMessage()
		if err != nil {
			if errors.Is(err, websocket.ErrReadLimit) {
				p.closeSocket(websocket.CloseMessageTooBig, fmt.Sprintf("message over %d bytes", p.srv.cfg.MaxMessage))
			}
			return
		}
		if !limiter.Allow() {
			p.sendError(CodeRateLimited, "too many messages: at most 50 a second", false)
			continue
		}
		if kind != websocket.TextMessage {
			p.sendError(CodeBadMessage, "binary messages are not part of the protocol; send JSON text", false)
			continue
		}
		m, code, err := decodeMessage(data)
		if err != nil {
			p.sendError(code, err.Error(), false)
			continue
		}
		var fatal bool
		if err := stream.Guard(p.log, m.Type+" message", func() error { fatal = p.handle(ctx, m); return nil }); err != nil {
			p.sendError(CodeInternal, err.Error(), true)
			return
		}
		if fatal {
			return
		}
	}
}

// handle acts on one client message; it returns true when the session must end.
func (p *peer) handle(ctx context.Context, m Message) bool {
	switch m.Type {
	case "offer":
		if p.pc != nil {
			p.sendError(CodeDuplicateOffer, "this socket already negotiated; open a new one to renegotiate", false)
			return false
		}
		if code, err := checkOffer(m.SDP); err != nil {
			p.sendError(code, err.Error(), false)
			return false
		}
		if err := p.answer(ctx, m.SDP); err != nil {
			p.sendError(CodeInternal, fmt.Sprintf("negotiation failed: %v", err), true)
			return true
		}
		p.sendReady()
	case "candidate":
		if m.Candidate == nil || m.Candidate.Candidate == "" {
			return false // end of candidates
		}
		if p.pc == nil {
			p.sendError(CodeBadCandidate, "candidate before offer: send the offer first", false)
			return false
		}
		if err := p.pc.AddICECandidate(*m.Candidate); err != nil {
			p.sendError(CodeBadCandidate, fmt.Sprintf("cannot add candidate: %v", err), false)
		}
	case "session":
		if m.Channel != "" {
			// Checked first: a message with a bad name changes nothing.
			if err := checkChannel(m.Channel); err != nil {
				p.sendError(CodeBadChannel, err.Error(), false)
				return false
			}
		}
		var code string
		var err error
		if m.Mode == "tts" {
			code, err = p.startTTS(ctx, m)
		} else {
			code, err = p.configure(m)
		}
		if err != nil {
			p.sendError(code, err.Error(), false)
			return false
		}
		if m.Channel != "" {
			p.srv.setChannel(p, m.Channel)
		}
		if p.pc != nil {
			p.sendReady()
		}
	case "speak":
		t := p.tts.Load()
		if t == nil {
			p.sendError(CodeBadMessage, `speak needs a text-to-speech session: send {"type":"session","mode":"tts"} first`, false)
			return false
		}
		if code, err := t.Speak(ctx, m); err != nil {
			p.sendError(code, err.Error(), false)
		}
	case "cancel":
		if t := p.tts.Load(); t != nil {
			t.CancelAll()
		}
	case "ping":
		p.send(Message{Type: "pong"})
	default:
		p.sendError(CodeBadMessage, fmt.Sprintf("unknown message type %q", m.Type), false)
	}
	return false
}

// configure applies a session message: voice, reference clip, params and passthrough.
func (p *peer) configure(m Message) (string, error) {
	if m.Mode != "" && m.Mode != "vc" {
		return CodeBadMessage, fmt.Errorf("mode %q: use \"vc\" or \"tts\"", m.Mode)
	}
	if p.tts.Load() != nil {
		return CodeBadMessage, fmt.Errorf("this session is in text-to-speech mode; open another socket for voice conversion")
	}
	// Only this goroutine changes voice, voiceName and ref, so they are read without the
	// lock; a new voice is made outside it (embedding a reference clip can take a while)
	// so the media loop keeps running meanwhile.
	voice, name, ref := p.voice, p.voiceName, p.ref
	var fresh stream.Processor
	if (m.Voice != "" && m.Voice != name) || (m.Ref != "" && m.Ref != ref) {
		if m.Voice != "" {
			name = m.Voice
		}
		if m.Ref != "" {
			ref = m.Ref
		}
		v, code, err := p.newVoice(name, ref, m.Ref != "")
		if err != nil {
			return code, err
		}
		voice, fresh = v, v
	}
	code, err := p.tune(m, voice, name, fresh == nil)
	if err == nil {
		p.mu.Lock()
		code, err = p.apply(m, voice, name)
		p.mu.Unlock()
	}
	if err != nil {
		if fresh != nil { // never installed: only this session held it
			p.owned = slices.DeleteFunc(p.owned, func(q stream.Processor) bool { return q == fresh })
			stream.CloseProcessor(fresh)
		}
		return code, err
	}
	p.ref = ref
	return "", nil
}

// tune sets a session message's params on voice. A voice the scheduler may be running
// (installed) is tuned between its steps; a fresh one is not in use yet.
func (p *peer) tune(m Message, voice stream.Processor, name string, installed bool) (string, error) {
	if len(m.Params) == 0 {
		return "", nil
	}
	t, ok := voice.(stream.Tunable)
	if !ok {
		return CodeBadParams, fmt.Errorf("voice %q takes no parameters", name)
	}
	set := func() error { return t.SetParams(m.Params) }
	var err error
	if installed {
		err = p.sess.Tune(set)
	} else {
		err = set()
	}
	if err != nil {
		return CodeBadParams, err
	}
	return "", nil
}

// apply sets passthrough and queues the swap of voice in; p.mu is held. The swap happens on
// the scheduler before the session's next chunk, so this returns at once.
func (p *peer) apply(m Message, voice stream.Processor, name string) (string, error) {
	passthrough := p.passthrough
	if m.Passthrough != nil {
		passthrough = *m.Passthrough
	}
	if voice == p.voice && passthrough == p.passthrough {
		return "", nil
	}
	next, nextName := voice, name
	if passthrough {
		i := voice.Info()
		next, nextName = stream.NewDelay(i.SampleRate, i.ChunkSize, i.Latency), "passthrough"
	}
	p.sess.Swap(nextName, next)
	p.voice, p.voiceName, p.passthrough = voice, name, passthrough
	// The scheduler may still run what the session reports in use (the processor being
	// replaced, a crossfade), and the selected voice is kept while passthrough stands in;
	// everything older is done with. (What retires later is closed at the next change or
	// at the end of the session.)
	p.release(append(p.sess.InUse(), next, voice)...)
	return "", nil
}

// newVoice makes a processor for a voice and reference clip: from NewProcessor if it makes
// that voice, otherwise from the registry (which takes no reference clip; explicitRef says the
// client named one for it). It returns the protocol error code with any error.
func (p *peer) newVoice(voice, ref string, explicitRef bool) (stream.Processor, string, error) {
	// A client's mistake is explained; anything else is the server's, and its detail
	// (paths, file names) stays in the log.
	fail := func(err error) (stream.Processor, string, error) {
		code, msg := stream.ClientError(p.log, "voice "+voice, err, CodeInternal)
		return nil, code, errors.New(msg)
	}
	if f := p.srv.cfg.NewProcessor; f != nil {
		proc, err := f(p.owner, voice, ref)
		if err != nil {
			return fail(err)
		}
		if proc != nil && !p.srv.sched.Admit(voice, p.sess, proc) {
			// A model voice runs on the scheduler's workers: admit it only if they keep up with
			// it (the session's current voice makes room for it).
			stream.CloseProcessor(proc)
			return nil, CodeBusy, stream.NoRoom(voice)
		}
		if proc != nil {
			p.owned = append(p.owned, proc)
			return proc, "", nil
		}
	}
	if explicitRef {
		return nil, CodeBadParams, fmt.Errorf("voice %q takes no reference clip (ref)", voice)
	}
	proc, err := p.srv.cfg.Voices.New(voice)
	if err != nil {
		return fail(err)
	}
	p.owned = append(p.owned, proc)
	return proc, "", nil
}

// release closes the processors this session made, except those in keep, that have a Close
// method (a model stream holds engine memory until it is closed); p.mu is held.
func (p *peer) release(keep ...stream.Processor) {
	kept := p.owned[:0]
	for _, proc := range p.owned {
		if slices.Contains(keep, proc) {
			kept = append(kept, proc)
			continue
		}
		stream.CloseProcessor(proc)
	}
	clear(p.owned[len(kept):])
	p.owned = kept
}

// answer negotiates the peer connection for an offer and sends the answer.
func (p *peer) answer(ctx context.Context, offer string) error {
	pc, err := p.srv.api.NewPeerConnection(webrtc.Configuration{ICEServers: p.srv.cfg.ICEServers})
	if err != nil {
		return err
	}
	p.pc = pc
	pc.OnICECandidate(func(c *webrtc.ICECandidate) {
		if c == nil {
			return
		}
		init := c.ToJSON()
		p.send(Message{Type: "candidate", Candidate: &init})
	})
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		p.log.Debug("peer connection", "state", st.String())
		if st == webrtc.PeerConnectionStateFailed || st == webrtc.PeerConnectionStateClosed {
			p.cancel()
		}
	})
	pc.OnDataChannel(func(dc *webrtc.DataChannel) {
		dc.OnOpen(func() { p.events.Store(dc) })
	})
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		if tr.Kind() != webrtc.RTPCodecTypeAudio {
			return
		}
		p.media.Do(func() { p.spawn(func() { p.pipe.Feed(tr) }) })
	})
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: offer}); err != nil {
		return fmt.Errorf("set offer: %w", err)
	}
	p.track, err = webrtc.NewTrackLocalStaticSample(opusCapability, "audio", "voxpipe-"+p.id)
	if err != nil {
		return err
	}
	sender, err := pc.AddTrack(p.track)
	if err != nil {
		return fmt.Errorf("add track: %w", err)
	}
	close(p.negotiated)
	p.spawn(func() { // drain RTCP so the interceptors see receiver reports
		buf := make([]byte, 1500)
		for {
			if _, _, err := sender.Read(buf); err != nil {
				return
			}
		}
	})
	p.spawn(func() {
		if err := p.pipe.Run(ctx, p.sess, p.track); err != nil {
			p.sendError(CodeInternal, err.Error(), true)
			p.cancel()
		}
	})
	ans, err := pc.CreateAnswer(nil)
	if err != nil {
		return fmt.Errorf("create answer: %w", err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(ans); err != nil {
		return fmt.Errorf("set answer: %w", err)
	}
	if p.conn == nil {
		// WHIP: no trickling, the answer carries every candidate.
		select {
		case <-gathered:
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.answerSDP = pc.LocalDescription().SDP
	p.send(Message{Type: "answer", SDP: p.answerSDP})
	return nil
}

func (p *peer) sendReady() {
	p.mu.Lock()
	info, voice := p.voice.Info(), p.voiceName // the selected voice: its swap may still be queued
	p.mu.Unlock()
	p.srv.mu.Lock()
	channel := p.channel
	p.srv.mu.Unlock()
	alg := p.srv.AlgorithmicLatency(info)
	p.send(Message{Type: "ready", SessionID: p.id, Voice: voice, Channel: channel, SampleRate: info.SampleRate,
		AlgorithmicLatency: float64(alg.Microseconds()) / 1000})
}

func (p *peer) sendError(code, msg string, fatal bool) {
	p.log.Info("client error", "code", code, "message", msg)
	p.send(Message{Type: "error", Code: code, Message: msg, Fatal: fatal})
}

// send writes one JSON message; failures mean the socket is going away, which the reader sees.
func (p *peer) send(v any) {
	if p.conn == nil {
		return // a WHIP session has no signaling socket
	}
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	p.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = p.conn.WriteJSON(v)
}

// closeSocket sends a close frame. It does not take writeMu: gorilla lets WriteControl run
// alongside another writer, and a send stuck on a client that does not read must not hold
// the close (bounded by its own one-second deadline) up.
func (p *peer) closeSocket(code int, reason string) {
	if p.conn == nil {
		return
	}
	_ = p.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
}

// spawn runs fn on a goroutine that shutdown waits for; after shutdown began it does nothing
// (Pion callbacks can still fire while the connection closes).
func (p *peer) spawn(fn func()) {
	p.goMu.Lock()
	defer p.goMu.Unlock()
	if p.closed {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// A panic (in a voice, a codec) ends this session with an error, not the process.
		if err := stream.Guard(p.log, "session", func() error { fn(); return nil }); err != nil {
			p.sendError(CodeInternal, err.Error(), true)
			p.cancel()
		}
	}()
}

// shutdown stops every goroutine of the peer and releases the connection.
func (p *peer) shutdown() {
	p.goMu.Lock()
	p.closed = true
	p.goMu.Unlock()
	p.cancel()
	if p.pc != nil {
		if err := p.pc.Close(); err != nil {
			p.log.Debug("peer connection close", "err", err)
		}
	}
	p.wg.Wait()
	if p.sess != nil {
		p.sess.Close() // waits for a step that runs; then no processor is in use
	}
	p.mu.Lock()
	p.release()
	p.mu.Unlock()
	if p.srv.ctx.Err() != nil {
		// The server is shutting down: 1001 tells the client to come back later, where 1000
		// would say the session is over.
		p.closeSocket(websocket.CloseGoingAway, "server shutting down")
	} else {
		p.closeSocket(websocket.CloseNormalClosure, "session ended")
	}
	if p.conn != nil {
		p.conn.Close()
	}
}
