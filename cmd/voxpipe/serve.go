package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/models/qwen3"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/server"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/server/metrics"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/telephony"
	"github.com/voxpipe/voxpipe/tts"
	"github.com/voxpipe/voxpipe/voice"
	"github.com/voxpipe/voxpipe/voice/library"
)

// serveOptions are serve's settings (its flags).
type serveOptions struct {
	listen, voice, publicIP, level, debug, voicesDir string
	logFormat                                        string
	accessLog                                        bool
	jitter                                           time.Duration
	udpPort, threads                                 int
	loopback                                         bool
	ttsModel, codec, ttsVoice                        string
	ttsSlots                                         int
	ttsWait                                          time.Duration
	vcModels                                         []string // MeanVC2 model files, one per variant
	vcRef                                            string
	tlsCert, tlsKey                                  string
	backend, vocoderBackend, codecBackend            string // model placement (backend.go)
	kvCache                                          string // MioTTS's KV cache encoding
	tlsSelfSigned                                    bool
	iceURLs                                          []string // --ice-server
	iceUsername, iceCredential                       string
	voiceAliases                                     []string    // --voice-alias NAME=VOICE
	tls                                              *tls.Config // from the three above (tlsConfig)
	apiKeys, adminKeys                               []string
	obsURL, obsInput                                 string
	sessionsPerKey                                   int
	twilioAuthTokens                                 []string // --twilio-auth-token, $VOXPIPE_TWILIO_AUTH_TOKEN
	twilioPublicURL                                  string
	// Connection limits and timeouts (serve_http.go); zero takes the default.
	shutdownGrace, idleTimeout, bodyTimeout, writeTimeout time.Duration
	drainDelay                                            time.Duration // --drain-delay
	connsPerIP                                            int
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
	fs.StringVar(&o.logFormat, "log-format", "text", "log lines as text (key=value) or json (one object a line, for log collectors)")
	fs.BoolVar(&o.accessLog, "access-log", false, "log one line per HTTP request: method, path (no query), status, bytes, duration, remote address")
	fs.StringVar(&o.debug, "debug-listen", "", "serve Go's pprof profiles on this address (e.g. localhost:6060); beyond loopback only with --admin-key, and every request needs it")
	fs.StringVar(&o.voicesDir, "voices", defaultDataDir()+"/voices", "voice library directory (uploaded reference clips)")
	fs.StringVar(&o.ttsModel, "tts-model", "", "MioTTS language model (GGUF) for text to speech")
	fs.StringVar(&o.codec, "codec", "", "MioCodec model (GGUF), with --tts-model")
	fs.StringVar(&o.ttsVoice, "tts-voice", "", "default TTS voice: a reference clip file (.wav, .flac, .ogg, .opus or .mp3), or a voice library id or name")
	fs.IntVar(&o.ttsSlots, "tts-slots", 8, "at most this many concurrent TTS streams per model, fewer when the model's measured capacity says more would not keep real time; more wait in line, then get busy/503")
	fs.DurationVar(&o.ttsWait, "tts-queue", 2*time.Second, "how long a TTS request waits for a free slot")
	fs.Var((*listFlag)(&o.vcModels), "vc-model", "MeanVC2 model `FILE` (GGUF), either variant; repeat the flag or comma-separate to load both: each adds the live voice meanvc2-<variant> (meanvc2-120ms: quality, meanvc2-40ms: low latency) and meanvc2 names the first; a target voice is a reference clip")
	fs.Var((*listFlag)(&o.iceURLs), "ice-server", "a STUN or TURN `URL` (stun:HOST:PORT, turn:HOST:PORT?transport=udp) for the server's and its pages' ICE; repeat or comma-separate")
	fs.StringVar(&o.iceUsername, "ice-username", "", "username for the TURN --ice-server")
	fs.StringVar(&o.iceCredential, "ice-credential", "", "credential for the TURN --ice-server (also $VOXPIPE_ICE_CREDENTIAL)")
	fs.Var((*listFlag)(&o.voiceAliases), "voice-alias", "`NAME=VOICE`: the speech endpoint's voice NAME (e.g. OpenAI's alloy) speaks as the library or server voice VOICE; OpenAI's voice names not given here are the default voice. Repeat or comma-separate")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with this certificate (PEM, full chain) and --tls-key: browsers allow the microphone only on https:// or localhost")
	fs.StringVar(&o.tlsKey, "tls-key", "", "the private key (PEM) of --tls-cert")
	fs.BoolVar(&o.tlsSelfSigned, "tls-self-signed", false, "serve HTTPS with a self-signed certificate for this machine's names and addresses, kept next to the voice library (browsers warn once; compare the printed fingerprint)")
	fs.StringVar(&o.obsURL, "obs", "", "obs-websocket v5 address (ws://localhost:4455): keep --obs-input's audio sync offset at the live voice's measured latency; password from $OBS_WEBSOCKET_PASSWORD")
	fs.StringVar(&o.obsInput, "obs-input", "voxpipe", "the OBS input (source name) whose sync offset --obs sets")
	fs.StringVar(&o.vcRef, "vc-ref", "", "default MeanVC2 target voice (every variant) when a session names none: a clip file (.wav, .flac, .ogg, .opus or .mp3), or a voice library id or name")
	fs.IntVar(&o.threads, "threads", min(runtime.NumCPU(), 4), "engine threads for the models")
	placementFlags(fs, &o)
	apiKeys := fs.String("api-key", "", "comma-separated API keys clients must present (Authorization: Bearer KEY, or ?token=KEY); also $VOXPIPE_API_KEYS. Required when --listen is not a loopback address")
	adminKeys := fs.String("admin-key", "", "comma-separated admin keys: like --api-key, but they see and may end every key's sessions and voices and have no session limit; also $VOXPIPE_ADMIN_KEYS")
	twilioTokens := fs.String("twilio-auth-token", "", "the Twilio account's auth token (comma-separate two while rotating): a stream to /v1/telephony/twilio must then carry a valid X-Twilio-Signature, or is refused (403); better given as $VOXPIPE_TWILIO_AUTH_TOKEN, which a process list does not show")
	fs.StringVar(&o.twilioPublicURL, "twilio-public-url", "", "the base `URL` Twilio connects to (https://voice.example.org), whose stream URL Twilio signs: set it behind a proxy that terminates TLS or changes the host; default: this server's own scheme and the request's Host")
	fs.IntVar(&o.sessionsPerKey, "sessions-per-key", 20, "open sessions (signaling and TTS sockets, streamed speech, WHIP sessions, WHEP viewers) one API key may hold at once; 0: no limit")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", defaultShutdownGrace, "on SIGINT/SIGTERM streams end at once (sockets get close code 1001, streamed speech is cut); other requests get this long to finish, then every connection is closed")
	fs.DurationVar(&o.drainDelay, "drain-delay", 0, "on SIGINT/SIGTERM first answer /readyz with 503 for this long while serving as usual, so a load balancer stops sending new work, then shut down (--shutdown-grace)")
	fs.IntVar(&o.connsPerIP, "conns-per-ip", defaultConnsPerIP, "open connections one client IP may hold; more are closed as they arrive (0: no limit; raise it behind a proxy, whose clients share its IP)")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", defaultIdleTimeout, "close a keep-alive connection idle this long")
	fs.DurationVar(&o.bodyTimeout, "body-timeout", defaultBodyTimeout, "time a client has to send a request body (voice uploads included); a slower one is cut")
	fs.DurationVar(&o.writeTimeout, "write-timeout", 10*time.Second, "a TTS client (speech stream or socket) that reads nothing for this long loses its stream and synthesis slot")
	config := fs.String("config", "", "a YAML or JSON file of settings named like these flags; flags on the command line override it")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if err := applyConfigFlag(fs, *config); err != nil {
		return err
	}
	for _, list := range []string{*apiKeys, os.Getenv("VOXPIPE_API_KEYS")} {
		if list != "" {
			o.apiKeys = append(o.apiKeys, strings.Split(list, ",")...)
		}
	}
	for _, list := range []string{*adminKeys, os.Getenv("VOXPIPE_ADMIN_KEYS")} {
		if list != "" {
			o.adminKeys = append(o.adminKeys, strings.Split(list, ",")...)
		}
	}
	for _, list := range []string{*twilioTokens, os.Getenv("VOXPIPE_TWILIO_AUTH_TOKEN")} {
		if list != "" {
			(*listFlag)(&o.twilioAuthTokens).Set(list) // comma-separated, blanks dropped
		}
	}
	if _, _, err := qwen3.ParseKVCache(o.kvCache); err != nil {
		return fmt.Errorf("--kv-cache: %w", err)
	}
	if o.twilioPublicURL != "" {
		if len(o.twilioAuthTokens) == 0 {
			return errors.New("--twilio-public-url needs --twilio-auth-token (or $VOXPIPE_TWILIO_AUTH_TOKEN)")
		}
		if err := telephony.CheckTwilioPublicURL(o.twilioPublicURL); err != nil {
			return fmt.Errorf("--twilio-public-url %w", err)
		}
	}
	if _, port, err := net.SplitHostPort(o.listen); err != nil || port == "" {
		return fmt.Errorf("--listen %q: expected HOST:PORT, e.g. localhost:8080 (this machine only) or 0.0.0.0:8080 (every address; needs API keys)", o.listen)
	}
	keys, err := auth.NewKeys(o.apiKeys, o.adminKeys...)
	if err != nil {
		return err
	}
	if err := auth.Required(o.listen, keys); err != nil {
		return err
	}
	log, err := newLogger(stderr, o.level, o.logFormat)
	if err != nil {
		return err
	}
	var fingerprint string
	if o.tls, fingerprint, err = tlsConfig(o, filepath.Join(filepath.Dir(filepath.Clean(o.voicesDir)), "tls")); err != nil {
		return err
	}
	a, err := newApp(o, log, stdout)
	if err != nil {
		return err
	}
	serving := false
	defer func() {
		if !serving {
			a.close() // serve closes it (within its grace period) once it runs
		}
	}()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if o.debug != "" {
		dh, err := debugHandler(o.debug, keys)
		if err != nil {
			return err
		}
		dbg := &http.Server{Addr: o.debug, Handler: dh, ReadHeaderTimeout: 10 * time.Second}
		defer dbg.Close()
		go func() {
			if err := dbg.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				log.Warn("debug server ended", "err", err)
			}
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	scheme := "http"
	if o.tls != nil {
		scheme = "https"
		if o.tlsSelfSigned {
			fmt.Fprintf(stdout, "TLS: self-signed certificate, SHA-256 fingerprint %s (the browser warns once; check the fingerprint it shows)\n", fingerprint)
		}
	}
	fmt.Fprintf(stdout, "voxpipe serving on %s://%s (voice %q) — open it in a browser; Ctrl-C stops\n", scheme, ln.Addr(), o.voice)
	serving = true
	return serve(ctx, o, ln, a, log)
}

// app is the server's parts behind one handler.
type app struct {
	handler  http.Handler
	closers  []func()
	once     sync.Once
	draining atomic.Bool // a shutdown has begun: /readyz answers 503
	// ttsBatches reports MioTTS's batched decoding (nil without a TTS model).
	ttsBatches func() metrics.DecodeStats
	// vcBatches reports each loaded MeanVC2 model's batched steps, by voice name.
	vcBatches map[string]func() metrics.VCBatchStats
	// gpus are the model parts on backends with memory of their own (/metrics reports it).
	gpus []gpuPart
}

// modelMetrics exports the loaded models' batching and GPU memory.
func (a *app) modelMetrics(met *metrics.Metrics) {
	if a.ttsBatches != nil {
		met.DecodeBatches("miotts", a.ttsBatches)
	}
	for name, stats := range a.vcBatches {
		met.VCBatches(name, stats)
	}
	for _, g := range a.gpus {
		met.DeviceMemory(g.model, g.part, g.be.Name(), g.sessions, g.mem.MemoryInUse)
	}
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
	lib, warn, err := library.Open(o.voicesDir)
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, func() { lib.Close() }) // its file locks, last
	for _, w := range warn {
		log.Warn("voice library", "problem", w)
	}
	newProcessor, details, err := a.loadMeanVC2(o, lib, voices, stdout)
	if err != nil {
		return nil, err
	}
	def, err := voices.New(o.voice)
	if err != nil {
		return nil, fmt.Errorf("--voice: %w", err)
	}
	stream.CloseProcessor(def) // made only to check the voice
	met := metrics.New()
	var sessions *auth.SessionLimit
	if o.sessionsPerKey > 0 {
		sessions = auth.NewSessionLimit(o.sessionsPerKey)
	}
	synths, err := a.loadTTS(o, lib, stdout)
	if err != nil {
		return nil, err
	}
	aliases := map[string]string{}
	for _, a := range o.voiceAliases {
		name, v, ok := strings.Cut(a, "=")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("--voice-alias %q: want NAME=VOICE (VOICE may be empty for the default voice)", a)
		}
		aliases[strings.TrimSpace(name)] = strings.TrimSpace(v)
	}
	ttsSrv := tts.NewServer(tts.Config{VoiceAliases: aliases, Synthesizers: synths, DefaultSlots: o.ttsSlots, MaxWait: o.ttsWait, Logger: log, WriteTimeout: o.writeTimeout,
		OnSession: met.Session, OnDone: met.TTSDone, OnReject: met.Rejected})
	for _, name := range synths.Names() {
		met.Admission(name, ttsSrv.Admission(name))
	}
	a.modelMetrics(met)
	var ips []string
	if o.publicIP != "" {
		ips = strings.Split(o.publicIP, ",")
	}
	ice, err := iceServers(o.iceURLs, o.iceUsername, o.iceCredential)
	if err != nil {
		return nil, err
	}
	onStats := met.VCStats
	if o.obsURL != "" {
		octx, cancel := context.WithCancel(context.Background())
		a.closers = append(a.closers, cancel)
		obs := newOBSSync(octx, o.obsURL, o.obsInput, log)
		onStats = func(r rtc.SessionReport) { met.VCStats(r); obs.Stats(r) }
	}
	sched := stream.NewScheduler(0)
	a.closers = append(a.closers, sched.Close) // after the rtc server (closers run in reverse)
	met.Scheduler(sched)
	srv, err := rtc.NewServer(rtc.Config{Scheduler: sched,
		Voices: voices, NewProcessor: newProcessor, DefaultVoice: o.voice, Jitter: buffers.JitterConfig{Target: o.jitter},
		Loopback: o.loopback, PublicIPs: ips, UDPPort: o.udpPort, ICEServers: ice, Logger: log,
		OnSession: met.VCSession, OnStats: onStats,
		Synthesizers: synths, TTSAdmission: ttsSrv.Admission, Sessions: sessions,
	})
	if err != nil {
		ttsSrv.Close()
		return nil, err
	}
	a.closers = append(a.closers, func() { srv.Close(); ttsSrv.Close() })
	for _, name := range slices.Sorted(maps.Keys(details)) {
		d := details[name]
		fmt.Fprintf(stdout, "live voice %s: %s, algorithmic latency %.0f ms\n", name, d.Label,
			float64(srv.AlgorithmicLatency(d.Info).Microseconds())/1000)
	}
	keys, err := auth.NewKeys(o.apiKeys, o.adminKeys...)
	if err != nil {
		return nil, err
	}
	// Phone calls (docs/telephony.md): the same voices, scheduler, TTS slots, keys and limits.
	tel := telephony.NewServer(telephony.Config{Scheduler: sched, Voices: voices, NewProcessor: newProcessor, DefaultVoice: o.voice,
		Synthesizers: synths, TTSAdmission: ttsSrv.Admission, Keys: keys, Sessions: sessions, WriteTimeout: o.writeTimeout,
		TwilioAuthTokens: o.twilioAuthTokens, TwilioPublicURL: o.twilioPublicURL,
		Logger: log, OnSession: met.Session})
	a.closers = append(a.closers, tel.Close) // before the scheduler's (closers run in reverse)
	cfg := server.Config{RTC: srv, TTS: ttsSrv, Telephony: tel, Library: lib, Voices: voices, VoiceDetails: details, Synthesizers: synths,
		DefaultVoice: o.voice, Keys: keys, Sessions: sessions, Metrics: met, Scheduler: sched, Draining: a.draining.Load}
	if o.accessLog {
		cfg.AccessLog = log.With("log", "access")
	}
	a.handler = server.New(cfg)
	return a, nil
}

// costSessions is how many MeanVC2 sessions run together when a model's cost is measured at
// load (at WebRTC's 48 kHz): about as many as two cores keep real time, where admission
// decides.
const costSessions = 8

// loadMeanVC2 loads the --vc-model files and registers their live voices: meanvc2-<variant>
// for each (the variant comes from the file's embedded config), and meanvc2 for the first.
// It returns rtc's NewProcessor for them (nil without models) and their listing details.
// All of them take their target voice from the same library and --vc-ref.
func (a *app) loadMeanVC2(o serveOptions, lib *library.Library, voices *stream.Registry, stdout io.Writer) (
	func(owner, voice, ref string) (stream.Processor, error), map[string]server.VoiceDetails, error) {
	if len(o.vcModels) == 0 {
		if o.vcRef != "" {
			return nil, nil, errors.New("--vc-ref needs --vc-model")
		}
		return nil, nil, nil
	}
	byName := map[string]*voice.MeanVC2Voices{}
	files := map[string]string{} // voice name → the file it came from
	details := map[string]server.VoiceDetails{}
	var names []string // in the order given
	for _, path := range o.vcModels {
		fmt.Fprintf(stdout, "loading %s…\n", path)
		m, closeModel, err := voice.LoadMeanVC2(path, a.placement(o.backend, o.vocoderBackend, "vocoder", o.threads, stdout), filepath.Join(o.voicesDir, "embeddings"))
		if err != nil {
			return nil, nil, err
		}
		a.closers = append(a.closers, closeModel)
		variant := m.Config.Runtime.Model
		name := "meanvc2-" + variant
		a.nameGPUParts(name, "vc")
		if prev, ok := files[name]; ok {
			return nil, nil, fmt.Errorf("--vc-model: %s and %s are both the %s MeanVC2 model; give one file per variant (120ms, 40ms)", prev, path, variant)
		}
		files[name] = path
		// How sessions run together, for admission and start cushions before real sessions
		// have taught the scheduler (it also compiles the batch programs now).
		shared, err := voice.MeanVC2Shared(m, costSessions, 48000)
		if err != nil {
			return nil, nil, err
		}
		fmt.Fprintf(stdout, "%s: %d sessions together cost %.3f core-seconds per second of audio each; slowest step %.0f ms\n",
			name, shared.Sessions, shared.Cost, shared.Slowest.Seconds()*1000)
		vc := &voice.MeanVC2Voices{Model: m, Library: lib, DefaultRef: o.vcRef, Shared: shared}
		if a.vcBatches == nil {
			a.vcBatches = map[string]func() metrics.VCBatchStats{}
		}
		a.vcBatches[name] = func() metrics.VCBatchStats {
			st := m.BatchStats()
			return metrics.VCBatchStats{ASRBatches: st.ASRBatches, ASRWindows: st.ASRWindows, StepBatches: st.StepBatches, Steps: st.Steps, Busy: st.Busy}
		}
		byName[name] = vc
		details[name] = server.VoiceDetails{Info: voice.MeanVC2Info(m), NeedsRef: true, Label: meanVC2Label(variant)}
		if len(names) == 0 {
			byName["meanvc2"] = vc
			details["meanvc2"] = server.VoiceDetails{Info: details[name].Info, NeedsRef: true, Label: "MeanVC2 (the " + variant + " model)"}
		}
		names = append(names, name)
	}
	for name, vc := range byName {
		// Listed with the built-in voices (and usable as --voice); a session's ref reaches it
		// through NewProcessor.
		voices.Register(name, func() (stream.Processor, error) { return vc.Processor(auth.Admin, "") })
	}
	if o.vcRef != "" {
		// Embed the default voice now, with every model (each has its own speaker path): a
		// bad clip fails the start, not every session.
		for _, name := range names {
			p, err := byName[name].Processor(auth.Admin, "")
			if err != nil {
				return nil, nil, fmt.Errorf("--vc-ref: %w", err)
			}
			stream.CloseProcessor(p)
		}
	}
	newProcessor := func(owner, voice, ref string) (stream.Processor, error) {
		vc, ok := byName[voice]
		if !ok {
			return nil, nil
		}
		return vc.Processor(owner, ref)
	}
	return newProcessor, details, nil
}

// meanVC2Label names a MeanVC2 variant for people (the page's voice picker).
func meanVC2Label(variant string) string {
	switch variant {
	case "120ms":
		return "MeanVC2 120 ms (quality)"
	case "40ms":
		return "MeanVC2 40 ms (low latency)"
	}
	return "MeanVC2 " + variant
}

// listFlag is a flag that may be repeated, each value a comma-separated list (a config
// file's YAML list arrives comma-joined).
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// loadTTS loads --tts-model with --codec (none: no synthesizers) and registers MioTTS
// speaking in the library's voices, with --tts-voice as its default.
func (a *app) loadTTS(o serveOptions, lib *library.Library, stdout io.Writer) (*stream.Synthesizers, error) {
	synths := &stream.Synthesizers{}
	if o.ttsModel == "" && o.codec == "" {
		return synths, nil
	}
	if o.ttsModel == "" || o.codec == "" {
		return nil, errors.New("--tts-model and --codec go together")
	}
	be, codecBE, closeBE, err := a.placement(o.backend, o.codecBackend, "codec", o.threads, stdout).Open()
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, closeBE)
	fmt.Fprintf(stdout, "loading %s and %s…\n", o.ttsModel, o.codec)
	mt, err := miotts.Load(o.ttsModel, o.codec, be, miotts.Options{VoiceCacheDir: filepath.Join(o.voicesDir, "embeddings"), CodecBackend: codecBE, KVCache: o.kvCache})
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, mt.Close)
	a.nameGPUParts("miotts", "tts")
	fmt.Fprintf(stdout, "warming MioTTS up (compiling its programs, measuring its speed)…\n")
	warm, err := mt.Warm(context.Background())
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "MioTTS warm: %d tokens in %.2f s (first audio after %.0f ms)\n", warm.Tokens, (warm.Decode + warm.Prefill).Seconds(), warm.FirstAudio.Seconds()*1000)
	a.ttsBatches = func() metrics.DecodeStats {
		st, cs := mt.LM.BatchStats(), mt.Codec.BatchStats()
		return metrics.DecodeStats{Rounds: st.Rounds, Steps: st.Rows, Capacity: st.Capacity, CodecRuns: cs.Runs, CodecWindows: cs.Windows}
	}
	files := map[string]string{}
	if o.ttsVoice != "" {
		mt.DefaultVoice = o.ttsVoice
		if audiofile.HasAudioExt(o.ttsVoice) {
			files[o.ttsVoice] = o.ttsVoice
		}
	}
	// The adapter resolves voices per request owner; the default with the server's rights.
	synths.Register(voice.MioTTS(mt, voice.Voices(lib, files)))
	return synths, nil
}
