// Package server is voxpipe's one HTTP handler: every route is registered here, behind the
// API keys (server/auth), the per-key session limit and, on a server without keys, the
// local-only guard; /healthz, /readyz, /v1/capacity and /metrics (server/metrics) are
// served from here too.
package server

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/server/metrics"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/telephony"
	"github.com/voxpipe/voxpipe/tts"
	"github.com/voxpipe/voxpipe/voice/library"
	"github.com/voxpipe/voxpipe/web"
)

// Config names the parts the handler serves. Keys may be the zero value (no keys: a
// loopback server); Sessions may be nil (no per-key limit); Metrics may be nil.
type Config struct {
	RTC          *rtc.Server
	TTS          *tts.Server
	Telephony    *telephony.Server // phone calls (docs/telephony.md); nil: not served
	Library      *library.Library
	Voices       *stream.Registry        // the built-in and model voices, for the listing
	VoiceDetails map[string]VoiceDetails // voices not made just to be listed (a model voice needs a target); others are, once
	Synthesizers *stream.Synthesizers
	DefaultVoice string
	Keys         *auth.Keys
	Sessions     *auth.SessionLimit
	Metrics      *metrics.Metrics
	// Scheduler runs the live sessions' model steps: /v1/capacity reports its load and
	// /readyz its saturation. nil: not reported.
	Scheduler *stream.Scheduler
	// Draining, when it reports true, turns /readyz to 503 "draining" (serve sets it as a
	// shutdown begins, so a load balancer stops sending new work). nil: never.
	Draining func() bool
	// AccessLog, when set, gets one line per request (serve --access-log).
	AccessLog *slog.Logger
}

// New builds the handler.
func New(c Config) http.Handler {
	mux := http.NewServeMux()
	live := newCatalog(c.RTC, c.Voices, c.VoiceDetails)
	// Live voice over WebRTC (docs/protocol.md).
	mux.Handle("/v1/rtc", c.RTC)
	mux.HandleFunc("GET /v1/rtc/config", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, c.RTC.ICEConfig()) })
	mux.HandleFunc("POST /v1/whip", c.RTC.WHIP)
	mux.HandleFunc("DELETE /v1/whip/{id}", c.RTC.WHIPDelete)
	mux.HandleFunc("POST /v1/whep/{session}", c.RTC.WHEP)
	mux.HandleFunc("DELETE /v1/whep/{session}/{viewer}", c.RTC.WHEPDelete)
	// Text to speech.
	mux.Handle("/v1/tts/ws", c.TTS)
	mux.HandleFunc("/v1/audio/speech", c.TTS.Speech)
	mux.HandleFunc("GET /v1/models", c.TTS.Models)
	mux.HandleFunc("GET /v1/models/{id}", c.TTS.Models)
	// Phone calls: it checks keys itself (Twilio brings its key in the start message).
	if c.Telephony != nil {
		mux.Handle("GET /v1/telephony/{protocol}", c.Telephony)
	}
	// Anything else under /v1/ answers in JSON too, as API clients expect.
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		auth.WriteError(w, http.StatusNotFound, "not_found", "no endpoint "+r.Method+" "+r.URL.Path+" (docs/api.md lists them)")
	})
	// Voices: the catalog and the library (docs/api.md).
	mux.HandleFunc("GET /v1/voices", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"voices": c.Library.List(auth.PrincipalOf(r.Context())), "processors": c.Voices.Names(),
			"live_voices": live.list(), "default": c.DefaultVoice, "tts_models": c.Synthesizers.Names()})
	})
	mux.HandleFunc("POST /v1/voices", c.Library.Upload)
	mux.HandleFunc("GET /v1/voices/{id}", c.Library.Show)
	mux.HandleFunc("DELETE /v1/voices/{id}", c.Library.Remove)
	// Operations.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"status": "ok", "sessions": c.RTC.Active(), "tts_streams": c.TTS.Active()})
	})
	// For load balancers (docs/api.md#operations): readiness and load, counts only.
	mux.HandleFunc("GET /readyz", c.serveReady)
	mux.HandleFunc("GET /v1/capacity", c.serveCapacity)
	if c.Metrics != nil {
		mux.Handle("GET /metrics", c.Metrics.Handler())
	}
	// The pages.
	mux.Handle("/", web.Handler())

	// Sessions are counted on the long-lived requests here; WHIP sessions and WHEP viewers
	// outlive their request and are counted by rtc with the same limit.
	long := func(path string) bool {
		return path == "/v1/rtc" || path == "/v1/tts/ws" || path == "/v1/audio/speech"
	}
	h := c.Sessions.Middleware(mux, long)
	if !c.Keys.Enabled() {
		h = auth.GuardLocal(h) // loopback only: refuse DNS-rebound hosts and cross-site posts
	}
	// With keys, everything but the pages, the health and readiness checks and the capacity
	// report needs one (telephony checks its own); WHIP and WHEP answer browsers' preflights
	// first.
	h = whipCORS(c.Keys.Middleware(h, func(path string) bool {
		return path == "/healthz" || path == "/readyz" || path == "/v1/capacity" ||
			!strings.HasPrefix(path, "/v1/") && path != "/metrics" ||
			c.Telephony != nil && strings.HasPrefix(path, "/v1/telephony/")
	}))
	if c.AccessLog != nil {
		h = accessLog(h, c.AccessLog)
	}
	return h
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
