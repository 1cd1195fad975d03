package worker

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
)

// maxBody bounds a request body of the worker's API.
const maxBody = 64 << 10

// Handler is the worker's HTTP API (docs/livekit.md): health and capacity for the operator
// and load balancers, and joining, leaving and speaking in rooms on request. keys guard
// every route but /healthz (nil: none; the caller keeps such a listener on loopback).
func (w *Worker) Handler(keys *auth.Keys) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		id, agentErr := w.workerID, w.agentErr
		w.mu.Unlock()
		out := map[string]any{"status": "ok", "registered": id != "", "worker_id": id}
		if agentErr != nil {
			out["agent_error"] = agentErr.Error()
		}
		writeJSON(rw, http.StatusOK, out)
	})
	mux.HandleFunc("GET /v1/capacity", func(rw http.ResponseWriter, r *http.Request) {
		writeJSON(rw, http.StatusOK, w.Capacity())
	})
	mux.HandleFunc("GET /v1/rooms", func(rw http.ResponseWriter, r *http.Request) {
		rooms := []Info{}
		for _, room := range w.Rooms() {
			rooms = append(rooms, room.info())
		}
		slices.SortFunc(rooms, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
		writeJSON(rw, http.StatusOK, map[string]any{"rooms": rooms})
	})
	mux.HandleFunc("POST /v1/rooms", func(rw http.ResponseWriter, r *http.Request) {
		var req struct {
			Room string `json:"room"`
			Options
		}
		if !decode(rw, r, &req) {
			return
		}
		room, err := w.Join(req.Room, req.Options)
		if err != nil {
			fail(w, rw, "join", err)
			return
		}
		writeJSON(rw, http.StatusCreated, room.info())
	})
	mux.HandleFunc("DELETE /v1/rooms/{room}", func(rw http.ResponseWriter, r *http.Request) {
		if !w.Leave(r.PathValue("room")) {
			auth.WriteError(rw, http.StatusNotFound, "not_found", "the worker is not in that room")
			return
		}
		rw.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/rooms/{room}/speak", func(rw http.ResponseWriter, r *http.Request) {
		var m rtc.Message
		if !decode(rw, r, &m) {
			return
		}
		room := w.ttsRoom(r.PathValue("room"))
		if room == nil {
			auth.WriteError(rw, http.StatusNotFound, "not_found", "the worker has no tts agent in that room")
			return
		}
		if code, err := room.Speak(m); err != nil {
			status := http.StatusBadRequest
			if code == rtc.CodeRateLimited {
				status = http.StatusTooManyRequests
			}
			auth.WriteError(rw, status, code, err.Error())
			return
		}
		rw.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("POST /v1/rooms/{room}/cancel", func(rw http.ResponseWriter, r *http.Request) {
		room := w.ttsRoom(r.PathValue("room"))
		if room == nil {
			auth.WriteError(rw, http.StatusNotFound, "not_found", "the worker has no tts agent in that room")
			return
		}
		room.Cancel()
		rw.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		auth.WriteError(rw, http.StatusNotFound, "not_found", "no endpoint "+r.Method+" "+r.URL.Path+" (docs/livekit.md lists them)")
	})
	if !keys.Enabled() {
		return auth.GuardLocal(mux)
	}
	return keys.Middleware(mux, func(path string) bool { return path == "/healthz" })
}

// ttsRoom is the worker's tts agent in the named room, if it has one.
func (w *Worker) ttsRoom(name string) *Room {
	for _, r := range w.Rooms() {
		if r.name == name && r.opts.Mode == ModeTTS {
			return r
		}
	}
	return nil
}

func decode(rw http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(rw, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		auth.WriteError(rw, http.StatusBadRequest, stream.CodeBadMessage, "want a JSON object: "+err.Error())
		return false
	}
	return true
}

// fail answers an error with the status its class calls for.
func fail(w *Worker, rw http.ResponseWriter, what string, err error) {
	code, msg := stream.ClientError(w.cfg.Logger, what, err, stream.CodeInternal)
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, stream.ErrBusy):
		status = http.StatusServiceUnavailable
	case code == stream.CodeBadParams, code == stream.CodeUnknownVoice, code == stream.CodeBadMessage:
		status = http.StatusBadRequest
	default:
		status = http.StatusBadGateway // LiveKit refused or could not be reached
		msg = err.Error()
	}
	auth.WriteError(rw, status, code, msg)
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	json.NewEncoder(rw).Encode(v)
}
