package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/models/qwen3"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/server/metrics"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice/library"
	"github.com/voxpipe/voxpipe/worker"
)

// runWorker is `voxpipe worker`: voxpipe as a LiveKit agent worker (docs/livekit.md),
// until SIGINT or SIGTERM.
func runWorker(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return workerCommand(ctx, args, stdout, stderr)
}

// workerCommand runs the worker until ctx ends.
func workerCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o serveOptions
	var lkURL, lkKey, lkSecret, agentName, listen, level, logFormat, httpKeys string
	var maxRooms, maxTracks int
	fs := newFlags("worker", "worker --livekit-url URL --api-key KEY --api-secret SECRET [flags]", stderr)
	fs.StringVar(&lkURL, "livekit-url", os.Getenv("LIVEKIT_URL"), "the LiveKit server (ws://, wss://, http:// or https://); also $LIVEKIT_URL")
	fs.StringVar(&lkKey, "api-key", os.Getenv("LIVEKIT_API_KEY"), "the LiveKit API key; also $LIVEKIT_API_KEY")
	fs.StringVar(&lkSecret, "api-secret", "", "the LiveKit API secret; better given as $LIVEKIT_API_SECRET, which a process list does not show")
	fs.StringVar(&agentName, "agent-name", "", "the agent name dispatch rules and explicit dispatches use; empty: LiveKit sends the worker every new room")
	fs.IntVar(&maxRooms, "max-rooms", 64, "rooms at once; the worker declines more, and LiveKit dispatches them to another worker")
	fs.IntVar(&maxTracks, "max-tracks", 32, "microphones converted at once, all rooms together")
	fs.StringVar(&listen, "listen", "localhost:8081", "address of the worker's HTTP API (health, capacity, rooms, speak, metrics); empty: none")
	fs.StringVar(&httpKeys, "http-api-key", "", "comma-separated keys the HTTP API requires (Authorization: Bearer KEY); also $VOXPIPE_API_KEYS. Required when --listen is not a loopback address")
	fs.StringVar(&o.voice, "voice", "dsp", "default live voice for converted microphones")
	fs.StringVar(&o.voicesDir, "voices", defaultDataDir()+"/voices", "voice library directory (reference clips; may be shared with serve)")
	fs.Var((*listFlag)(&o.vcModels), "vc-model", "MeanVC2 model `FILE` (GGUF), either variant; repeat or comma-separate (as serve)")
	fs.StringVar(&o.vcRef, "vc-ref", "", "default MeanVC2 target voice: a clip file, or a voice library id or name")
	fs.StringVar(&o.ttsModel, "tts-model", "", "MioTTS language model (GGUF), for rooms in tts mode")
	fs.StringVar(&o.codec, "codec", "", "MioCodec model (GGUF), with --tts-model")
	fs.StringVar(&o.ttsVoice, "tts-voice", "", "default TTS voice: a clip file, or a voice library id or name")
	fs.IntVar(&o.ttsSlots, "tts-slots", 8, "at most this many concurrent TTS streams per model, fewer when the model's measured capacity says more would not keep real time; more wait in line, then fail busy")
	fs.DurationVar(&o.ttsWait, "tts-queue", 2*time.Second, "how long a text waits for a free TTS slot")
	fs.DurationVar(&o.jitter, "jitter-target", 40*time.Millisecond, "initial jitter buffer target of a converted microphone")
	fs.IntVar(&o.threads, "threads", min(runtime.NumCPU(), 4), "engine threads for the models")
	placementFlags(fs, &o)
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&logFormat, "log-format", "text", "log lines as text (key=value) or json")
	config := fs.String("config", "", "a YAML or JSON file of settings named like these flags; flags on the command line override it")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if err := applyConfigFlag(fs, *config); err != nil {
		return err
	}
	if _, _, err := qwen3.ParseKVCache(o.kvCache); err != nil {
		return fmt.Errorf("--kv-cache: %w", err)
	}
	if lkSecret == "" {
		lkSecret = os.Getenv("LIVEKIT_API_SECRET")
	}
	if lkURL == "" || lkKey == "" || lkSecret == "" {
		return errors.New("worker needs the LiveKit server's URL, API key and secret: --livekit-url, --api-key and $LIVEKIT_API_SECRET (or --api-secret)")
	}
	var keyList []string
	for _, list := range []string{httpKeys, os.Getenv("VOXPIPE_API_KEYS")} {
		if list != "" {
			keyList = append(keyList, strings.Split(list, ",")...)
		}
	}
	keys, err := auth.NewKeys(keyList)
	if err != nil {
		return err
	}
	if listen != "" {
		if err := auth.Required(listen, keys); err != nil {
			return err
		}
	}
	log, err := newLogger(stderr, level, logFormat)
	if err != nil {
		return err
	}

	a := &app{}
	defer a.close()
	lib, warn, err := library.Open(o.voicesDir)
	if err != nil {
		return err
	}
	for _, w := range warn {
		log.Warn("voice library", "problem", w)
	}
	voices := stream.NewRegistry()
	newProcessor, _, err := a.loadMeanVC2(o, lib, voices, stdout)
	if err != nil {
		return err
	}
	def, err := voices.New(o.voice)
	if err != nil {
		return fmt.Errorf("--voice: %w", err)
	}
	stream.CloseProcessor(def)
	synths, err := a.loadTTS(o, lib, stdout)
	if err != nil {
		return err
	}
	sched := stream.NewScheduler(0)
	a.closers = append(a.closers, sched.Close)
	met := metrics.New()
	met.Scheduler(sched)
	a.modelMetrics(met)
	var admMu sync.Mutex
	adm := map[string]*stream.Admission{}
	w, err := worker.New(worker.Config{URL: lkURL, APIKey: lkKey, APISecret: lkSecret, AgentName: agentName, Version: buildVersion,
		Voices: voices, NewProcessor: newProcessor, DefaultVoice: o.voice, Scheduler: sched, Synthesizers: synths,
		TTSAdmission: func(model string) *stream.Admission {
			admMu.Lock()
			defer admMu.Unlock()
			if adm[model] == nil {
				adm[model] = synths.AdmissionFor(model, o.ttsSlots, o.ttsWait)
			}
			return adm[model]
		},
		MaxRooms: maxRooms, MaxTracks: maxTracks, Jitter: buffers.JitterConfig{Target: o.jitter},
		Logger: log, OnStats: met.VCStats})
	if err != nil {
		return err
	}
	a.closers = append(a.closers, w.Close) // before the scheduler's (closers run in reverse)

	if listen != "" {
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", keys.Middleware(met.Handler(), func(string) bool { return false }))
		mux.Handle("/", w.Handler(keys))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: headerTimeout, WriteTimeout: 30 * time.Second, IdleTimeout: defaultIdleTimeout,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go hs.Serve(ln)
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			hs.Shutdown(sctx)
		}()
		fmt.Fprintf(stdout, "worker API on http://%s (health, capacity, rooms)\n", ln.Addr())
	}
	name := agentName
	if name == "" {
		name = "(none: every new room)"
	}
	fmt.Fprintf(stdout, "voxpipe worker for LiveKit at %s, agent name %s, voice %q — Ctrl-C stops\n", lkURL, name, o.voice)
	return w.Run(ctx)
}
