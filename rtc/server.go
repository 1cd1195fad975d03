package rtc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/pion/interceptor"
	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
)

// Config sets up a Server. Zero fields take the defaults.
type Config struct {
	Voices       *stream.Registry // default: stream.NewRegistry()
	DefaultVoice string           // default "dsp"
	// NewProcessor, if set, is asked first for every voice a session selects, with the
	// session's owner (auth.PrincipalOf: a reference clip must be one of its voices) and
	// reference clip (a voice library id or name, "" when none was given): voices
	// whose target is a clip (MeanVC2) are made here. It returns (nil, nil) for a voice it
	// does not make, which then comes from Voices. Errors wrapping stream.ErrUnknownVoice
	// reach the client as unknown_voice, those wrapping stream.ErrBadParams as bad_params, others as
	// internal. A processor with a Close method is closed once the session no longer uses it.
	NewProcessor func(owner, voice, ref string) (stream.Processor, error)
	Jitter       buffers.JitterConfig
	Encoder      EncoderConfig
	MaxMessage   int64         // bytes; default 256 KiB
	MaxQueue     time.Duration // stale-audio bound of a session's output queue
	// ICE: include loopback candidates (for same-host clients and tests); public IPs to
	// advertise when behind 1:1 NAT; a single UDP port for all sessions (0: one per session).
	Loopback  bool
	PublicIPs []string
	UDPPort   int
	// ICEServers are STUN and TURN servers for the server's own candidates (a TURN relay
	// when it sits behind a NAT that 1:1 advertising cannot cross); the pages get the same
	// list (ICEConfig) for theirs.
	ICEServers []webrtc.ICEServer
	Logger     *slog.Logger
	// OnSession, if set, is told about every session that starts and ends (for metrics).
	OnSession func(id string, started bool)
	// OnStats, if set, gets every live session's once-a-second report (for metrics and the
	// OBS sync), from the stream's own counters.
	OnStats func(SessionReport)
	// Synthesizers serve sessions in text-to-speech mode ({"type":"session","mode":"tts"});
	// TTSAdmission, if set, bounds their concurrent synthesis per model (shared with the TTS
	// WebSocket so that both count against the same slots).
	Synthesizers *stream.Synthesizers
	TTSAdmission func(model string) *stream.Admission
	// Scheduler runs the live sessions' processing (default: one the server makes, with a
	// worker per CPU, closed with the server).
	Scheduler *stream.Scheduler
	// Sessions, if set, bounds the WHIP sessions and WHEP viewers each principal holds (the
	// signaling socket is counted by its HTTP middleware, as the request lasts the session).
	Sessions *auth.SessionLimit
}

// Server answers WebSocket signaling at /v1/rtc and runs one peer per socket.
type Server struct {
	cfg      Config
	api      *webrtc.API
	upgrader websocket.Upgrader
	udpMux   interface{ Close() error }
	sched    *stream.Scheduler
	ownSched bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	active atomic.Int64

	mu         sync.Mutex
	peers      map[string]*peer            // live sessions by id (WHEP looks them up)
	viewers    map[string]viewer           // WHEP viewers by id
	channels   map[channelKey]channelEntry // each named channel's live session (channels.go)
	channelSeq uint64
}

// NewServer builds the WebRTC API (Opus only, default interceptors) and the server.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Voices == nil {
		cfg.Voices = stream.NewRegistry()
	}
	if cfg.DefaultVoice == "" {
		cfg.DefaultVoice = "dsp"
	}
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = 256 << 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	me := &webrtc.MediaEngine{}
	if err := me.RegisterCodec(webrtc.RTPCodecParameters{RTPCodecCapability: opusCapability, PayloadType: 111}, webrtc.RTPCodecTypeAudio); err != nil {
		return nil, fmt.Errorf("rtc: register opus: %w", err)
	}
	ir := &interceptor.Registry{}
	if err := webrtc.RegisterDefaultInterceptors(me, ir); err != nil {
		return nil, fmt.Errorf("rtc: interceptors: %w", err)
	}
	se := webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(cfg.Loopback)
	se.SetICETimeouts(5*time.Second, 10*time.Second, 2*time.Second)
	if len(cfg.PublicIPs) > 0 {
		se.SetNAT1To1IPs(cfg.PublicIPs, webrtc.ICECandidateTypeHost)
	}
	s := &Server{cfg: cfg, peers: map[string]*peer{}, viewers: map[string]viewer{}, channels: map[channelKey]channelEntry{}, sched: cfg.Scheduler}
	if cfg.UDPPort > 0 {
		conn, err := net.ListenUDP("udp", &net.UDPAddr{Port: cfg.UDPPort})
		if err != nil {
			return nil, fmt.Errorf("rtc: UDP port %d: %w", cfg.UDPPort, err)
		}
		mux := webrtc.NewICEUDPMux(nil, conn)
		se.SetICEUDPMux(mux)
		s.udpMux = mux
	}
	s.api = webrtc.NewAPI(webrtc.WithMediaEngine(me), webrtc.WithInterceptorRegistry(ir), webrtc.WithSettingEngine(se))
	s.upgrader = websocket.Upgrader{ReadBufferSize: 16 << 10, WriteBufferSize: 16 << 10}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.sched == nil {
		s.sched = stream.NewScheduler(0)
		s.ownSched = true
	}
	return s, nil
}

var opusCapability = webrtc.RTPCodecCapability{
	MimeType: webrtc.MimeTypeOpus, ClockRate: opusRate, Channels: 2,
	SDPFmtpLine: "minptime=10;useinbandfec=1",
}

// ServeHTTP upgrades the request to a WebSocket and runs the session until it ends.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.ctx.Err() != nil {
		http.Error(w, "server is shutting down", http.StatusServiceUnavailable)
		return
	}
	conn, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader already answered with an HTTP error
	}
	s.wg.Add(1)
	defer s.wg.Done()
	id := newID("s")
	s.active.Add(1)
	defer s.active.Add(-1)
	if s.cfg.OnSession != nil {
		s.cfg.OnSession(id, true)
		defer s.cfg.OnSession(id, false)
	}
	log := s.cfg.Logger.With("session", id, "remote", r.RemoteAddr)
	started := time.Now()
	log.Info("session started")
	p := newPeer(s, id, conn, log)
	p.owner = auth.PrincipalOf(r.Context())
	s.addPeer(p)
	p.run(s.ctx)
	s.removePeer(p)
	log.Info("session ended", p.summary(started)...)
}

// SessionReport is a live session's once-a-second report for the server's observers: the
// stream's cumulative counters and what the network side adds to them.
type SessionReport struct {
	ID           string
	Stream       stream.Stats  // the session's counters and its last measured latency
	Shed         int           // frames the jitter buffer shed, in all
	JitterTarget time.Duration // the jitter buffer's current target delay
	// Algorithmic is the delay the session's processing path adds by design (its voice's
	// latency, chunking and resampler look-ahead; not the jitter target): what a client can
	// expect before a latency has been measured.
	Algorithmic time.Duration
}

// AlgorithmicLatency is the algorithmic latency a session whose voice has info reports in
// its "ready" message: the processing path's designed delay (stream.AlgorithmicLatency at
// the Opus rate) plus the jitter buffer's initial target. Listings (GET /v1/voices) use it
// so that a voice's advertised latency is the one its sessions report.
func (s *Server) AlgorithmicLatency(info stream.ProcessorInfo) time.Duration {
	return stream.AlgorithmicLatency(opusRate, info) + s.cfg.Jitter.WithDefaults().Target
}

// newID makes an unguessable id (128 random bits): a session id is what WHEP viewers and
// WHIP DELETEs name, so it must not be found by counting.
func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Active is the number of sessions now running.
func (s *Server) Active() int { return int(s.active.Load()) }

// Close ends every session and waits for them.
func (s *Server) Close() error {
	s.cancel()
	s.wg.Wait()
	if s.ownSched {
		s.sched.Close()
	}
	if s.udpMux != nil {
		return s.udpMux.Close()
	}
	return nil
}

// ICEConfig is what browsers need of the server's ICE setup: GET /v1/rtc/config.
func (s *Server) ICEConfig() map[string]any {
	type server struct {
		URLs       []string `json:"urls"`
		Username   string   `json:"username,omitempty"`
		Credential string   `json:"credential,omitempty"`
	}
	list := []server{}
	for _, is := range s.cfg.ICEServers {
		c, _ := is.Credential.(string)
		list = append(list, server{URLs: is.URLs, Username: is.Username, Credential: c})
	}
	return map[string]any{"ice_servers": list}
}
