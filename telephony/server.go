// Package telephony puts voxpipe into phone calls: a WebSocket endpoint that speaks the Twilio
// Media Streams protocol (GET /v1/telephony/twilio: JSON messages, base64 8 kHz μ-law) and a
// raw one (GET /v1/telephony/raw: binary frames of μ-law or 16-bit PCM, for Asterisk's
// chan_websocket and the like). A call either converts the caller's voice (mode vc: a
// stream.Live session on the server's scheduler, like a WebRTC session) or speaks text into
// the call (mode tts: a stream.TTSJob per utterance). Either way the audio going back is
// paced in real time, 20 ms a message. docs/telephony.md describes the protocol.
package telephony

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
)

// Protocols: the last element of the endpoint's path.
const (
	ProtoTwilio = "twilio"
	ProtoRaw    = "raw"
)

// Config sets up a Server. Zero fields take the defaults.
type Config struct {
	// Scheduler runs voice-conversion calls (default: one the server makes and closes).
	Scheduler *stream.Scheduler
	// Voices are the live voices (default stream.NewRegistry()); NewProcessor, if set, is
	// asked first for a voice with the call's owner and reference clip, as rtc.Config's.
	Voices       *stream.Registry
	NewProcessor func(owner, voice, ref string) (stream.Processor, error)
	DefaultVoice string        // default "dsp"
	MaxQueue     time.Duration // the stale-audio bound of a call's output queue (stream.Config)
	// Synthesizers serve calls in tts mode; TTSAdmission, if set, bounds their concurrent
	// synthesis per model (shared with the other TTS paths).
	Synthesizers *stream.Synthesizers
	TTSAdmission func(model string) *stream.Admission
	// Keys are the server's API keys (nil: none, every call is admin). A call presents its
	// key as the other endpoints take it (Authorization: Bearer, ?token=) or, since Twilio
	// can set neither, as the token custom parameter of its start message.
	Keys *auth.Keys
	// Sessions bounds the calls each key holds (with every other session of the key).
	Sessions *auth.SessionLimit
	// TwilioAuthTokens, if any is set, are the Twilio account's auth tokens (several while
	// one is rotated): a request to the Twilio endpoint must then carry an X-Twilio-Signature
	// made with one of them, or it is refused with 403 bad_signature before the upgrade. The
	// API key is still required as without them: the signature proves the request comes
	// from the Twilio account, the key names the call's owner. The raw endpoint is not
	// affected.
	TwilioAuthTokens []string
	// TwilioPublicURL is the base URL Twilio connects to (https://voice.example.org, or
	// wss://; a path prefix a proxy strips may follow), which Twilio signs: needed behind a
	// proxy that terminates TLS or changes the host. Empty: the request's own (wss:// when
	// the server has TLS, else ws://, and its Host). CheckTwilioPublicURL checks one; an
	// invalid one refuses every Twilio request.
	TwilioPublicURL string
	// MaxMessage bounds an inbound message (default 64 KiB; larger ones close with 1009).
	MaxMessage int64
	// StartTimeout bounds the wait for the start message (default 10 s); ReadTimeout ends a
	// call from which nothing (no message, no pong) came for that long (default 30 s);
	// WriteTimeout bounds every write (default 10 s); PingInterval is how often the server
	// pings (default 5 s). A client that has answered a ping and then answers none for
	// ReadTimeout has stopped reading: its call ends.
	StartTimeout time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	PingInterval time.Duration
	// JitterTarget is the inbound audio a vc call collects before it starts playing (and
	// again after running dry) (default 60 ms); MaxBuffered bounds the inbound audio
	// waiting to be played (default 1 s; older audio is dropped).
	JitterTarget time.Duration
	MaxBuffered  time.Duration
	Logger       *slog.Logger
	// OnSession, if set, is told about every call that starts and ends, with its mode
	// ("telephony_vc", "telephony_tts"), for metrics.
	OnSession func(mode string, started bool)
}

// Server serves the telephony WebSockets.
type Server struct {
	cfg      Config
	twilio   *twilioVerifier // nil: signatures are not checked
	sched    *stream.Scheduler
	ownSched bool
	upgrader websocket.Upgrader

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	active atomic.Int64
}

// NewServer makes a server; Close ends its calls.
func NewServer(cfg Config) *Server {
	if cfg.Voices == nil {
		cfg.Voices = stream.NewRegistry()
	}
	if cfg.DefaultVoice == "" {
		cfg.DefaultVoice = "dsp"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.StartTimeout, 10*time.Second)
	def(&cfg.ReadTimeout, 30*time.Second)
	def(&cfg.WriteTimeout, 10*time.Second)
	def(&cfg.PingInterval, 5*time.Second)
	def(&cfg.JitterTarget, 60*time.Millisecond)
	def(&cfg.MaxBuffered, time.Second)
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = 64 << 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, sched: cfg.Scheduler, twilio: newTwilioVerifier(cfg.TwilioAuthTokens, cfg.TwilioPublicURL)}
	if s.twilio != nil && s.twilio.bad != nil {
		cfg.Logger.Error("telephony: invalid Twilio public URL: every Twilio call is refused", "err", s.twilio.bad)
	}
	if s.sched == nil {
		s.sched = stream.NewScheduler(0)
		s.ownSched = true
	}
	// "media" is the subprotocol Asterisk's chan_websocket asks for; Twilio asks for none.
	s.upgrader = websocket.Upgrader{ReadBufferSize: 4 << 10, WriteBufferSize: 4 << 10, Subprotocols: []string{"media"}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Active is the number of calls now open (upgraded sockets, authenticated or not yet).
func (s *Server) Active() int { return int(s.active.Load()) }

// Close ends every call (close code 1001) and waits for them.
func (s *Server) Close() {
	s.cancel()
	s.wg.Wait()
	if s.ownSched {
		s.sched.Close()
	}
}

// ServeHTTP upgrades GET /v1/telephony/twilio or /v1/telephony/raw and runs the call.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	proto := path.Base(r.URL.Path)
	if proto != ProtoTwilio && proto != ProtoRaw {
		auth.WriteError(w, http.StatusNotFound, "not_found", "no telephony protocol "+proto+": use twilio or raw")
		return
	}
	if s.ctx.Err() != nil {
		auth.WriteError(w, http.StatusServiceUnavailable, "shutting_down", "server is shutting down")
		return
	}
	if proto == ProtoTwilio && s.twilio != nil {
		// Twilio's signature, before anything else: a request that does not verify gets no
		// further (docs/telephony.md#twilios-signature).
		if s.twilio.bad != nil {
			auth.WriteError(w, http.StatusInternalServerError, CodeInternal, "the server's Twilio public URL is invalid")
			return
		}
		if signed, err := s.twilio.verify(r); err != nil {
			s.cfg.Logger.Info("telephony: Twilio signature refused", "err", err, "signed_url", trunc(signed, 200), "remote", r.RemoteAddr)
			auth.WriteError(w, http.StatusForbidden, CodeBadSignature, err.Error())
			return
		}
	}
	var cfg callConfig
	q := queryParams(r.URL.Query())
	if err := cfg.apply(q); err != nil {
		auth.WriteError(w, http.StatusBadRequest, CodeBadParams, err.Error())
		return
	}
	// The key: as everywhere (header or ?token=), checked here since the route is open to
	// requests without one (a Twilio call brings it in its start message).
	owner, known := auth.Admin, true
	if s.cfg.Keys.Enabled() {
		owner, known = "", false
		if key := auth.KeyOf(r); key != "" {
			p, ok := s.cfg.Keys.Lookup(key)
			if !ok {
				auth.WriteError(w, http.StatusUnauthorized, CodeUnauthorized, "invalid API key")
				return
			}
			owner, known = p, true
		} else if proto == ProtoRaw {
			w.Header().Set("WWW-Authenticate", `Bearer realm="voxpipe"`)
			auth.WriteError(w, http.StatusUnauthorized, CodeUnauthorized, "missing API key: send Authorization: Bearer KEY (or ?token=KEY)")
			return
		}
	}
	if proto == ProtoRaw {
		// No start message will come: the query is the whole configuration.
		if err := cfg.check(true); err != nil {
			auth.WriteError(w, http.StatusBadRequest, CodeBadParams, err.Error())
			return
		}
	}
	release := func() {}
	if known {
		rel, ok := s.cfg.Sessions.Acquire(owner)
		if !ok {
			s.cfg.Sessions.Refuse(w)
			return
		}
		release = rel
	}
	conn, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		release()
		return // the upgrader answered with an HTTP error
	}
	s.wg.Add(1)
	defer s.wg.Done()
	s.active.Add(1)
	defer s.active.Add(-1)
	id := newID()
	log := s.cfg.Logger.With("call", id, "protocol", proto, "remote", r.RemoteAddr)
	c := newCall(s, conn, log, proto, cfg)
	c.owner, c.release = owner, release
	if !known {
		c.release = nil // taken once the start message names the key
	}
	c.run()
}

// newID is a call id for the logs.
func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return "c" + hex.EncodeToString(b[:])
}

// modeLabel is the metrics label of a mode.
func modeLabel(mode string) string { return fmt.Sprintf("telephony_%s", mode) }
