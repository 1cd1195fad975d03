package server

import (
	"encoding/json"
	"math"
	"net/http"
	"slices"

	"github.com/voxpipe/voxpipe/stream"
)

// Capacity is GET /v1/capacity's answer: this server's load, for a load balancer choosing
// where new work goes. It has counts and measured fractions only — no session ids, voices
// or owners — and needs no key, like /healthz.
type Capacity struct {
	// Status is "ok", "full" (see Full) or "draining" (a shutdown has begun); Accepting is
	// Status == "ok", which is when GET /readyz answers 200.
	Status    string `json:"status"`
	Accepting bool   `json:"accepting"`
	// Full names what is saturated: "scheduler" (new sessions with a model voice are refused
	// as busy) and "tts" (every TTS model's slots are in use: a new request waits in line).
	Full []string `json:"full,omitempty"`
	// Load is the larger of the scheduler's load and the busiest TTS model's share of slots
	// in use, capped at 1: 0 idle, 1 saturated.
	Load       float64 `json:"load"`
	Sessions   int     `json:"sessions"`        // live voice sessions (WebRTC)
	TTSStreams int     `json:"tts_streams"`     // TTS sockets and speech responses open
	Calls      *int    `json:"calls,omitempty"` // phone calls open, where served
	// The TTS models' slots summed, and per model.
	TTSSlots  int                    `json:"tts_slots"`
	TTSActive int                    `json:"tts_active"`
	TTSQueued int                    `json:"tts_queued"`
	TTS       map[string]TTSCapacity `json:"tts"`
	Scheduler *SchedulerCapacity     `json:"scheduler,omitempty"`
	// LateChunks is voxpipe_late_chunks_total: live-voice chunks whose compute took longer
	// than their audio since the start (absent without metrics).
	LateChunks *int64 `json:"late_chunks_total,omitempty"`
}

// TTSCapacity is one TTS model's admission (stream.AdmissionStats).
type TTSCapacity struct {
	Slots    int   `json:"slots"`
	Active   int   `json:"active"`
	Queued   int   `json:"queued"`
	Rejected int64 `json:"rejected_total"`
}

// SchedulerCapacity is what the scheduler of the live sessions' model steps measures
// (stream.SchedulerStats).
type SchedulerCapacity struct {
	Workers  int `json:"workers"`
	Cores    int `json:"cores"`    // what load is a fraction of
	Sessions int `json:"sessions"` // live sessions it runs (WebRTC and phone calls)
	Queued   int `json:"queued"`   // sessions whose step waits for a worker
	// Load is the step time over the last second as a fraction of the cores' time; from
	// SaturatedLoad on, sessions with a model voice are refused (Saturated).
	Load          float64 `json:"load"`
	ExpectedLoad  float64 `json:"expected_load"` // if every open session spoke (their voices' learned costs)
	SaturatedLoad float64 `json:"saturated_load"`
	Saturated     bool    `json:"saturated"`
}

// capacity gathers c's load now.
func (c Config) capacity() Capacity {
	out := Capacity{Status: "ok", TTS: map[string]TTSCapacity{}}
	if c.RTC != nil {
		out.Sessions = c.RTC.Active()
	}
	if c.Telephony != nil {
		n := c.Telephony.Active()
		out.Calls = &n
	}
	if c.Metrics != nil {
		n := c.Metrics.LateChunks()
		out.LateChunks = &n
	}
	if c.Scheduler != nil {
		st := c.Scheduler.Stats()
		out.Scheduler = &SchedulerCapacity{Workers: st.Workers, Cores: st.Cores, Sessions: st.Sessions, Queued: st.Queued,
			Load: round3(st.Load), ExpectedLoad: round3(st.ExpectedLoad), SaturatedLoad: stream.SaturatedLoad, Saturated: st.Load >= stream.SaturatedLoad}
		out.Load = st.Load
		if out.Scheduler.Saturated {
			out.Full = append(out.Full, "scheduler")
		}
	}
	if c.TTS != nil {
		out.TTSStreams = c.TTS.Active()
		names := c.Synthesizers.Names()
		allFull := len(names) > 0
		for _, name := range names {
			st := c.TTS.Admission(name).Stats()
			out.TTS[name] = TTSCapacity{Slots: st.Slots, Active: st.Active, Queued: st.Queued, Rejected: st.Rejected}
			out.TTSSlots += st.Slots
			out.TTSActive += st.Active
			out.TTSQueued += st.Queued
			if st.Slots > 0 {
				out.Load = max(out.Load, float64(st.Active)/float64(st.Slots))
			}
			if st.Active < st.Slots {
				allFull = false
			}
		}
		if allFull {
			out.Full = append(out.Full, "tts")
		}
	}
	out.Load = round3(min(out.Load, 1))
	switch {
	case c.Draining != nil && c.Draining():
		out.Status = "draining"
	case len(out.Full) > 0:
		out.Status = "full"
	}
	out.Accepting = out.Status == "ok"
	return out
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// serveCapacity answers GET /v1/capacity.
func (c Config) serveCapacity(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, c.capacity())
}

// serveReady answers GET /readyz: 200 while the server takes new work, 503 while it drains
// for a shutdown or is full. ?ignore_load=1 leaves fullness out (503 only while draining),
// for deployments that would rather keep a saturated server in rotation.
func (c Config) serveReady(w http.ResponseWriter, r *http.Request) {
	cp := c.capacity()
	ready := cp.Accepting || cp.Status == "full" && r.URL.Query().Get("ignore_load") == "1"
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	body := map[string]any{"status": cp.Status, "ready": ready}
	if len(cp.Full) > 0 {
		body["full"] = slices.Clone(cp.Full)
	}
	json.NewEncoder(w).Encode(body)
}
