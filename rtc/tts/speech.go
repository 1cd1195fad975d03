package tts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/voxpipe/voxpipe/rtc/audioout"
	"github.com/voxpipe/voxpipe/rtc/auth"
	"github.com/voxpipe/voxpipe/stream"
)

// SpeechRequest is the OpenAI audio.speech request body.
type SpeechRequest struct {
	Model          string   `json:"model"`
	Input          string   `json:"input"`
	Voice          string   `json:"voice"`
	ResponseFormat string   `json:"response_format"` // wav (default: mp3 is not offered), pcm, opus, mulaw
	Speed          *float64 `json:"speed"`
	// Extensions: output rate for pcm/wav/mulaw and sampling settings.
	SampleRate int      `json:"sample_rate"`
	Options    *Options `json:"options"`
}

type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func writeAPIError(w http.ResponseWriter, status int, code, msg string) {
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, "invalid_request_error", code
	if status >= 500 {
		e.Error.Type = "server_error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(e)
}

// Speech serves POST /v1/audio/speech: the audio is streamed with chunked transfer while it
// is synthesised. The status line goes out with the first audio, so errors found before
// then (bad request, busy, unknown voice) are proper HTTP errors.
func (s *Server) Speech(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeAPIError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxMessage)
	var req SpeechRequest
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(&req); err != nil {
		writeAPIError(w, http.StatusBadRequest, CodeBadJSON, "request body is not valid JSON: "+err.Error())
		return
	}
	if req.Input == "" || !hasWords(req.Input) {
		writeAPIError(w, http.StatusBadRequest, CodeBadMessage, "input is empty")
		return
	}
	if n := textLen(req.Input); n > s.cfg.MaxText {
		writeAPIError(w, http.StatusBadRequest, CodeTextTooLong, fmt.Sprintf("input has %d characters; the limit is %d", n, s.cfg.MaxText))
		return
	}
	f := audioout.Format{SampleRate: req.SampleRate}
	switch req.ResponseFormat {
	case "", "wav":
		f.Encoding = audioout.WAV
	case "pcm":
		f.Encoding = audioout.PCM // OpenAI's pcm: 24 kHz 16-bit little-endian mono by default
	case "opus":
		f.Encoding = audioout.Opus
	case "mulaw", "ulaw":
		f.Encoding = audioout.MuLaw
	default:
		writeAPIError(w, http.StatusBadRequest, CodeBadFormat, fmt.Sprintf("response_format %q: use wav, pcm, opus or mulaw", req.ResponseFormat))
		return
	}
	if err := f.Validate(); err != nil {
		writeAPIError(w, http.StatusBadRequest, CodeBadFormat, err.Error())
		return
	}
	if o := req.Options; o != nil {
		if err := stream.CheckSynthOptions(o.Temperature, o.MaxTokens); err != nil {
			writeAPIError(w, http.StatusBadRequest, CodeBadMessage, "options: "+err.Error())
			return
		}
	}
	if sp := req.Speed; sp != nil && !(*sp >= 0.25 && *sp <= 4) {
		writeAPIError(w, http.StatusBadRequest, CodeBadMessage, fmt.Sprintf("speed %g: use 0.25 to 4", *sp))
		return
	}
	syn, err := s.cfg.Synthesizers.Get(req.Model)
	if err != nil {
		writeAPIError(w, http.StatusNotFound, CodeUnknownModel, err.Error())
		return
	}
	enc, err := audioout.NewEncoder(f, syn.Info().SampleRate)
	if err != nil {
		writeAPIError(w, http.StatusBadRequest, CodeBadFormat, err.Error())
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	s.active.Add(1)
	defer s.active.Add(-1)
	defer s.session("tts_http")()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)() // server shutdown ends the stream too
	sr := stream.SynthRequest{Text: req.Input, Voice: req.Voice, Owner: auth.PrincipalOf(r.Context())}
	if o := req.Options; o != nil {
		sr.Seed, sr.Temperature, sr.MaxTokens = o.Seed, o.Temperature, o.MaxTokens
	}
	rc := http.NewResponseController(w)
	started := false
	start := time.Now()
	send := func(b []byte) error {
		if !started {
			started = true
			w.Header().Set("Content-Type", f.ContentType())
			if req.Speed != nil && *req.Speed != 1 {
				w.Header().Set("X-Voxpipe-Note", "speed is ignored: MioTTS has no speed control")
			}
			w.Header().Set("X-Voxpipe-TTFA-Ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
			w.WriteHeader(http.StatusOK)
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	var ttfa time.Duration
	first := send
	send = func(b []byte) error {
		if ttfa == 0 {
			ttfa = time.Since(start)
		}
		return first(b)
	}
	n, err := s.synthesize(ctx, syn, sr, enc, send)
	if err == nil {
		audio := time.Duration(n) * time.Second / time.Duration(syn.Info().SampleRate)
		s.done(syn.Info().Name, ttfa, audio, time.Since(start))
	}
	if err == nil {
		var tail []byte
		if tail, err = enc.Flush(nil); err == nil && len(tail) > 0 {
			err = send(tail)
		}
	}
	if err == nil || started {
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("speech stream failed after the first audio", "err", err)
		}
		return // once audio has gone out, the only way to signal an error is to cut the stream
	}
	var busy *stream.BusyError
	switch {
	case errors.As(err, &busy):
		w.Header().Set("Retry-After", strconv.Itoa(int(busy.RetryAfter.Seconds())))
		writeAPIError(w, http.StatusServiceUnavailable, CodeBusy, err.Error())
	case errors.Is(err, stream.ErrUnknownVoice):
		writeAPIError(w, http.StatusBadRequest, CodeUnknownVoice, err.Error())
	case errors.Is(err, stream.ErrNothingToSay):
		writeAPIError(w, http.StatusBadRequest, CodeBadMessage, err.Error())
	case ctx.Err() != nil:
	default:
		writeAPIError(w, http.StatusInternalServerError, CodeSynthesis, stream.Opaque(s.cfg.Logger, "synthesis", err))
	}
}
