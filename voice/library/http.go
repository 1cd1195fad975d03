package library

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/server/auth"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// The HTTP handlers: POST /v1/voices (multipart: name, file — the file's name and content
// type are not looked at, its content is: see Add) is Upload, GET
// /v1/voices/{id} is Show and DELETE /v1/voices/{id} is Remove (server/ routes them; listing
// is left to it, which merges the library with the built-in voices). Each request acts for
// its principal (auth.PrincipalOf): it owns what it uploads, and sees and deletes only what
// it can see.

// Show answers one voice.
func (l *Library) Show(w http.ResponseWriter, r *http.Request) {
	v, err := l.Get(auth.PrincipalOf(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusNotFound, "not_found", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// Remove deletes one voice.
func (l *Library) Remove(w http.ResponseWriter, r *http.Request) {
	if err := l.Delete(auth.PrincipalOf(r.Context()), r.PathValue("id")); err != nil {
		if errors.Is(err, ErrNotFound) {
			writeError(w, http.StatusNotFound, "not_found", err.Error())
		} else {
			l.internal(w, "delete", err)
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// internal answers a server-side failure. The details (OS errors naming the library's
// paths) go to the log only.
func (l *Library) internal(w http.ResponseWriter, op string, err error) {
	l.log().Error("voice library: "+op+" failed", "err", err)
	writeError(w, http.StatusInternalServerError, "internal", "voice library: "+op+" failed on the server")
}

// Upload adds a voice from a multipart form (fields name and file).
func (l *Library) Upload(w http.ResponseWriter, r *http.Request) {
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
		writeError(w, http.StatusBadRequest, "bad_request", "missing the file field (an audio clip: "+audiofile.Accepted+")")
		return
	}
	v, err := l.Add(auth.PrincipalOf(r.Context()), name, clip)
	var ce *ClipError
	switch {
	case errors.As(err, &ce):
		writeError(w, http.StatusBadRequest, "bad_clip", ce.Msg)
	case errors.Is(err, ErrNameTaken):
		writeError(w, http.StatusConflict, "name_taken", err.Error())
	case errors.Is(err, ErrFull):
		writeError(w, http.StatusConflict, "library_full", err.Error())
	case err != nil:
		l.internal(w, "upload", err)
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
