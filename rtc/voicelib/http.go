package voicelib

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// Register adds the library's routes to mux: POST /v1/voices (multipart: name, file),
// GET /v1/voices/{id}, DELETE /v1/voices/{id}. Listing is left to the caller, which merges
// the library with the built-in voices (see List).
func (l *Library) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/voices", l.upload)
	mux.HandleFunc("GET /v1/voices/{id}", func(w http.ResponseWriter, r *http.Request) {
		v, err := l.Get(r.PathValue("id"))
		if err != nil {
			writeError(w, http.StatusNotFound, "not_found", err.Error())
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
	mux.HandleFunc("DELETE /v1/voices/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := l.Delete(r.PathValue("id")); err != nil {
			if errors.Is(err, ErrNotFound) {
				writeError(w, http.StatusNotFound, "not_found", err.Error())
			} else {
				writeError(w, http.StatusInternalServerError, "internal", err.Error())
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func (l *Library) upload(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, l.MaxBytes+64<<10)
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "expected multipart/form-data with fields name and file: "+err.Error())
		return
	}
	var name string
	var clip []byte
	var haveFile bool
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			l.badBody(w, err)
			return
		}
		switch p.FormName() {
		case "name":
			b, err := io.ReadAll(io.LimitReader(p, 1024))
			if err != nil {
				l.badBody(w, err)
				return
			}
			name = string(b)
		case "file":
			if clip, err = io.ReadAll(io.LimitReader(p, l.MaxBytes+1)); err != nil {
				l.badBody(w, err)
				return
			}
			haveFile = true
		}
		p.Close()
	}
	if !haveFile {
		writeError(w, http.StatusBadRequest, "bad_request", "missing the file field (a WAV clip)")
		return
	}
	v, err := l.Add(name, clip)
	var ce *ClipError
	switch {
	case errors.As(err, &ce):
		writeError(w, http.StatusBadRequest, "bad_clip", ce.Msg)
	case err != nil:
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
	default:
		writeJSON(w, http.StatusCreated, v)
	}
}

func (l *Library) badBody(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", "upload is over the size limit")
		return
	}
	writeError(w, http.StatusBadRequest, "bad_request", "malformed multipart body: "+err.Error())
}
