package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with --debug-listen
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/adapt"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/metrics"
	"github.com/voxpipe/voxpipe/rtc/tts"
	"github.com/voxpipe/voxpipe/rtc/voicelib"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/web"
)

// serveOptions are serve's settings (its flags).
type serveOptions struct {
	listen, voice, publicIP, level, debug, voicesDir string
	jitter                                           time.Duration
	udpPort, threads                                 int
	loopback                                         bool
	ttsModel, codec, ttsVoice                        string
	ttsSlots                                         int
	ttsWait                                          time.Duration
}

func runServe(args []string, stdout, stderr io.Writer) error {
	var o serveOptions
	fs := newFlags("serve", "serve [flags]", stderr)
	fs.StringVar(&o.listen, "listen", "localhost:8080", "HTTP address (HOST:PORT)")
	fs.StringVar(&o.voice, "voice", "dsp", "default voice for new live sessions")
	fs.DurationVar(&o.jitter, "jitter-target", 40*time.Millisecond, "initial jitter buffer target (adapts to measured jitter)")
	fs.IntVar(&o.udpPort, "udp-port", 0, "serve all WebRTC media on this one UDP port (0: a port per session)")
	fs.StringVar(&o.publicIP, "public-ip", "", "comma-separated IPs to advertise in ICE candidates (server behind 1:1 NAT)")
	fs.BoolVar(&o.loopback, "loopback", true, "offer loopback ICE candidates (clients on the same host)")
	fs.StringVar(&o.level, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.debug, "debug-listen", "", "serve Go's pprof profiles on this address (e.g. localhost:6060)")
	fs.StringVar(&o.voicesDir, "voices", defaultDataDir()+"/voices", "voice library directory (uploaded reference clips)")
	fs.StringVar(&o.ttsModel, "tts-model", "", "MioTTS language model (GGUF) for text to speech")
	fs.StringVar(&o.codec, "codec", "", "MioCodec model (GGUF), with --tts-model")
	fs.StringVar(&o.ttsVoice, "tts-voice", "", "default TTS voice: a WAV reference clip, or a voice library id or name")
	fs.IntVar(&o.ttsSlots, "tts-slots", 2, "concurrent TTS streams per model; more wait in line, then get busy/503")
	fs.DurationVar(&o.ttsWait, "tts-queue", 2*time.Second, "how long a TTS request waits for a free slot")
	fs.IntVar(&o.threads, "threads", min(runtime.NumCPU(), 4), "engine threads for the models")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, o.level)
	if err != nil {
		return err
	}
	a, err := newApp(o, log, stdout)
	if err != nil {
		return err
	}
	defer a.close()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if o.debug != "" {
		go func() { log.Warn("debug server ended", "err", http.ListenAndServe(o.debug, http.DefaultServeMux)) }()
	}
	hs := &http.Server{Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fmt.Fprintf(stdout, "voxpipe serving on http://%s (voice %q) — open it in a browser; Ctrl-C stops\n", ln.Addr(), o.voice)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.close() // ends live sessions and TTS streams (hijacked sockets are not closed by Shutdown)
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// app is the server's parts behind one handler.
type app struct {
	handler http.Handler
	closers []func()
	once    sync.Once
}

func (a *app) close() {
	a.once.Do(func() {
		for i := len(a.closers) - 1; i >= 0; i-- {
			a.closers[i]()
		}
	})
}

// newApp loads the models and builds every endpoint.
func newApp(o serveOptions, log *slog.Logger, stdout io.Writer) (_ *app, err error) {
	a := &app{}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	voices := stream.NewRegistry()
	if _, err := voices.New(o.voice); err != nil {
		return nil, err
	}
	lib, warn, err := voicelib.Open(o.voicesDir)
	if err != nil {
		return nil, err
	}
	for _, w := range warn {
		log.Warn("voice library", "problem", w)
	}
	met := metrics.New()
	synths := &stream.Synthesizers{}
	if o.ttsModel != "" || o.codec != "" {
		if o.ttsModel == "" || o.codec == "" {
			return nil, errors.New("--tts-model and --codec go together")
		}
		be, err := engine.NewCPU(o.threads)
		if err != nil {
			return nil, err
		}
		a.closers = append(a.closers, be.Close)
		fmt.Fprintf(stdout, "loading %s and %s…\n", o.ttsModel, o.codec)
		mt, err := miotts.Load(o.ttsModel, o.codec, be, miotts.Options{VoiceCacheDir: filepath.Join(o.voicesDir, "embeddings")})
		if err != nil {
			return nil, err
		}
		a.closers = append(a.closers, mt.Close)
		files := map[string]string{}
		if o.ttsVoice != "" {
			mt.DefaultVoice = o.ttsVoice
			if strings.HasSuffix(strings.ToLower(o.ttsVoice), ".wav") {
				files[o.ttsVoice] = o.ttsVoice
			}
		}
		mt.Voices = adapt.Voices(lib, files)
		synths.Register(adapt.MioTTS(mt))
	}
	ttsSrv := tts.NewServer(tts.Config{Synthesizers: synths, DefaultSlots: o.ttsSlots, MaxWait: o.ttsWait, Logger: log,
		OnSession: met.Session, OnDone: met.TTSDone, OnReject: met.Rejected})
	for _, name := range synths.Names() {
		met.Admission(name, ttsSrv.Admission(name))
	}
	var ips []string
	if o.publicIP != "" {
		ips = strings.Split(o.publicIP, ",")
	}
	srv, err := rtc.NewServer(rtc.Config{
		Voices: voices, DefaultVoice: o.voice, Jitter: buffers.JitterConfig{Target: o.jitter},
		Loopback: o.loopback, PublicIPs: ips, UDPPort: o.udpPort, Logger: log,
		OnSession: met.VCSession, OnStats: met.VCStats,
	})
	if err != nil {
		ttsSrv.Close()
		return nil, err
	}
	a.closers = append(a.closers, func() { srv.Close(); ttsSrv.Close() })
	mux := http.NewServeMux()
	mux.Handle("/v1/rtc", srv)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"status": "ok", "sessions": srv.Active(), "tts_streams": ttsSrv.Active()})
	})
	mux.HandleFunc("GET /v1/voices", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"voices": lib.List(), "processors": voices.Names(), "default": o.voice,
			"tts_models": synths.Names()})
	})
	lib.Register(mux)
	mux.Handle("/v1/tts/ws", ttsSrv)
	mux.HandleFunc("/v1/audio/speech", ttsSrv.Speech)
	mux.Handle("GET /metrics", met.Handler())
	mux.Handle("/", web.Handler())
	a.handler = mux
	return a, nil
}
