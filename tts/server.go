package tts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// Config sets up a Server. Zero fields take the defaults.
type Config struct {
	Synthesizers *stream.Synthesizers
	// Admission bounds concurrent synthesis per model name; a model without an entry gets
	// one with DefaultSlots slots and a MaxWait queue.
	Admission    map[string]*stream.Admission
	DefaultSlots int           // default 4
	MaxWait      time.Duration // default 2 s
	MaxText      int           // code points per context (all its speak pieces); default 10000
	MaxMessage   int64         // bytes per WebSocket message; default 64 KiB
	MaxContexts  int           // open contexts per socket; default 16
	// WriteTimeout bounds each write to a client (a speech chunk, a socket message): a
	// client that reads nothing for this long loses its stream and its synthesis slot.
	// Default 10 s.
	WriteTimeout time.Duration
	CheckOrigin  func(r *http.Request) bool
	Logger       *slog.Logger
	// Hooks for metrics, all optional: a stream (socket or HTTP request) opening or closing,
	// a finished context or request, a request refused.
	OnSession func(mode string, started bool)
	OnDone    func(model string, ttfa, audio time.Duration, rtf float64)
	OnReject  func(model, reason string)
	// VoiceAliases map voice names of the speech endpoint to voices (a library voice, or ""
	// for the default): OpenAI's voice names (alloy, nova, …) are the default voice unless
	// mapped here.
	VoiceAliases map[string]string
}

// Server serves the TTS WebSocket (ServeHTTP) and the OpenAI speech endpoint (Speech).
type Server struct {
	cfg      Config
	upgrader websocket.Upgrader
	mu       sync.Mutex
	adm      map[string]*stream.Admission
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	nextID   atomic.Uint64
	active   atomic.Int64
}

// NewServer makes a server; Close ends its streams.
func NewServer(cfg Config) *Server {
	if cfg.Synthesizers == nil {
		cfg.Synthesizers = &stream.Synthesizers{}
	}
	if cfg.DefaultSlots <= 0 {
		cfg.DefaultSlots = 4
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 2 * time.Second
	}
	if cfg.MaxText <= 0 {
		cfg.MaxText = 10000
	}
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = 64 << 10
	}
	if cfg.MaxContexts <= 0 {
		cfg.MaxContexts = 16
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, adm: map[string]*stream.Admission{}}
	for k, v := range cfg.Admission {
		s.adm[k] = v
	}
	s.upgrader = websocket.Upgrader{ReadBufferSize: 8 << 10, WriteBufferSize: 32 << 10, CheckOrigin: cfg.CheckOrigin}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Close cancels every stream and waits for them: sockets get a close frame with code 1001
// (going away, its write bounded by a second) and are closed; speech responses still
// streaming are cut at once, even mid-write to a client that does not read (the client sees
// a truncated body, not a clean end); requests waiting for a slot get 503.
func (s *Server) Close() {
	s.cancel()
	s.wg.Wait()
}

// Active is the number of open TTS sockets and HTTP streams.
func (s *Server) Active() int { return int(s.active.Load()) }

// Admission returns the model's admission control (made on first use).
func (s *Server) Admission(model string) *stream.Admission { return s.admission(model) }

func (s *Server) admission(model string) *stream.Admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.adm[model]
	if !ok {
		a = s.cfg.Synthesizers.AdmissionFor(model, s.cfg.DefaultSlots, s.cfg.MaxWait)
		s.adm[model] = a
	}
	return a
}

// AdmissionStats reports each model's load.
func (s *Server) AdmissionStats() map[string]stream.AdmissionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]stream.AdmissionStats{}
	for k, a := range s.adm {
		out[k] = a.Stats()
	}
	return out
}

// synthesize runs one piece of text through syn under the model's admission control,
// encoding its audio with enc and handing each encoded chunk to send. It returns the
// samples produced (at the synthesizer's rate) and the first chunk's time.
func (s *Server) synthesize(ctx context.Context, syn stream.Synthesizer, req stream.SynthRequest, enc *audioout.Encoder,
	send func([]byte) error, produced func(samples []float32)) (samples int, err error) {
	name := syn.Info().Name
	var buf []byte
	job := stream.TTSJob{Synth: syn, Admission: s.admission(name), Request: req, Log: s.cfg.Logger,
		Out: func(c stream.SynthChunk) error {
			if produced != nil {
				produced(c.Samples)
			}
			var err error
			if buf, err = enc.Encode(buf[:0], c.Samples); err != nil {
				return err
			}
			if len(buf) == 0 {
				return nil
			}
			return send(buf)
		}}
	if s.cfg.OnReject != nil {
		job.OnBusy = func() { s.cfg.OnReject(name, "busy") }
	}
	res := job.Run(ctx)
	return res.Samples, res.Err
}

// ServeHTTP upgrades to the TTS WebSocket and serves it until the client leaves.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.ctx.Err() != nil {
		http.Error(w, "server is shutting down", http.StatusServiceUnavailable)
		return
	}
	conn, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	s.active.Add(1)
	defer s.active.Add(-1)
	s.session("tts_ws")()
	id := fmt.Sprintf("t%06d", s.nextID.Add(1))
	log := s.cfg.Logger.With("session", id, "remote", r.RemoteAddr)
	log.Info("tts socket opened")
	newSocket(s, conn, log, auth.PrincipalOf(r.Context())).run()
	log.Info("tts socket closed")
}

// session reports a stream opening and returns the call that reports it closing.
func (s *Server) session(mode string) func() {
	if s.cfg.OnSession == nil {
		return func() {}
	}
	s.cfg.OnSession(mode, true)
	return func() { s.cfg.OnSession(mode, false) }
}

func (s *Server) done(model string, ttfa, audio, busy time.Duration) {
	if s.cfg.OnDone != nil && audio > 0 {
		s.cfg.OnDone(model, ttfa, audio, busy.Seconds()/audio.Seconds())
	}
}

// textLen counts code points; limits are in characters, not bytes.
func textLen(s string) int { return utf8.RuneCountInString(s) }

// splitReady returns the text up to its last sentence end (what can be spoken now while
// more text may follow) and the rest.
func splitReady(text string) (ready, rest string) {
	i := strings.LastIndexAny(text, ".!?。！？\n")
	if i < 0 {
		return "", text
	}
	_, n := utf8.DecodeRuneInString(text[i:])
	return text[:i+n], text[i+n:]
}

var errClosed = errors.New("socket closed")

func itoa(n int) string { return fmt.Sprint(n) }
