package tts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// SpeechRequest is the OpenAI audio.speech request body.
type SpeechRequest struct {
	Model          string   `json:"model"`
	Input          string   `json:"input"`
	Voice          string   `json:"voice"`
	ResponseFormat string   `json:"response_format"` // mp3 (default), flac, wav, pcm, opus, mulaw
	Speed          *float64 `json:"speed"`
	Instructions   string   `json:"instructions"`  // accepted and ignored: MioTTS takes no style prompt
	StreamFormat   string   `json:"stream_format"` // audio (default): the bytes; sse: Server-Sent Events
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
	if req.Input == "" || !stream.HasWords(req.Input) {
		writeAPIError(w, http.StatusBadRequest, CodeBadMessage, "input is empty")
		return
	}
	if n := textLen(req.Input); n > s.cfg.MaxText {
		writeAPIError(w, http.StatusBadRequest, CodeTextTooLong, fmt.Sprintf("input has %d characters; the limit is %d", n, s.cfg.MaxText))
		return
	}
	f := audioout.Format{SampleRate: req.SampleRate}
	switch req.ResponseFormat {
	case "", "mp3":
		f.Encoding = audioout.MP3 // OpenAI's default
	case "wav":
		f.Encoding = audioout.WAV
	case "pcm":
		f.Encoding = audioout.PCM // OpenAI's pcm: 24 kHz 16-bit little-endian mono by default
	case "opus":
		f.Encoding = audioout.Opus
	case "mulaw", "ulaw":
		f.Encoding = audioout.MuLaw
	case "flac":
		f.Encoding = audioout.FLAC
	case "aac":
		writeAPIError(w, http.StatusBadRequest, CodeBadFormat, `response_format "aac" is not offered: use mp3, flac, wav, opus, pcm or mulaw`)
		return
	default:
		writeAPIError(w, http.StatusBadRequest, CodeBadFormat, fmt.Sprintf("response_format %q: use mp3, flac, wav, opus, pcm or mulaw", req.ResponseFormat))
		return
	}
	sse := false
	switch req.StreamFormat {
	case "", "audio":
	case "sse":
		sse = true
	default:
		writeAPIError(w, http.StatusBadRequest, CodeBadMessage, fmt.Sprintf("stream_format %q: use audio or sse", req.StreamFormat))
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
	syn, err := s.synthesizerFor(req.Model)
	if err != nil {
		writeAPIError(w, http.StatusNotFound, CodeUnknownModel, err.Error())
		return
	}
	enc, err := audioout.NewEncoder(f, syn.Info().SampleRate)
	if err != nil {
		writeAPIError(w, http.StatusBadRequest, CodeBadFormat, err.Error())
		return
	}
	defer enc.Close()
	s.wg.Add(1)
	defer s.wg.Done()
	s.active.Add(1)
	defer s.active.Add(-1)
	defer s.session("tts_http")()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)() // server shutdown ends the stream too
	sr := stream.SynthRequest{Text: req.Input, Voice: s.voiceFor(req.Voice), Owner: auth.PrincipalOf(r.Context())}
	if o := req.Options; o != nil {
		sr.Seed, sr.Temperature, sr.MaxTokens = o.Seed, o.Temperature, o.MaxTokens
	}
	rc := http.NewResponseController(w)
	// A write blocked on a client that does not read only ends at its deadline: when the
	// stream ends (shutdown, client gone) move the deadline to now so the handler, its slot
	// and the server's wait for it are released at once. The controller may not be used once
	// the handler has returned, hence the lock and flag.
	var dlMu sync.Mutex
	handlerDone := false
	stopDeadline := context.AfterFunc(ctx, func() {
		dlMu.Lock()
		defer dlMu.Unlock()
		if !handlerDone {
			rc.SetWriteDeadline(time.Now())
		}
	})
	settle := func() { // no deadline moves after this
		stopDeadline()
		dlMu.Lock()
		handlerDone = true
		dlMu.Unlock()
	}
	defer settle()
	started := false
	start := time.Now()
	send := func(b []byte) error {
		if !started {
			started = true
			w.Header().Set("Content-Type", f.ContentType())
			if sse {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header().Set("Cache-Control", "no-cache")
			}
			if req.Speed != nil && *req.Speed != 1 {
				w.Header().Add("X-Voxpipe-Note", "speed is ignored: MioTTS has no speed control")
			}
			if req.Instructions != "" {
				w.Header().Add("X-Voxpipe-Note", "instructions are ignored: MioTTS takes no style instructions")
			}
			w.Header().Set("X-Voxpipe-TTFA-Ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
			w.WriteHeader(http.StatusOK)
		}
		// Each chunk gets WriteTimeout: a client that stops reading loses the stream (and its
		// slot) then, instead of holding both for as long as it likes.
		if err := rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err() // the stream ended while the deadline was set: do not undo its move to now
		}
		if sse {
			b = sseDelta(b)
		}
		_, err := w.Write(b)
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			cancel() // stop the synthesis even if the synthesizer does not check send's error
		}
		return err
	}
	var ttfa time.Duration
	first := send
	send = func(b []byte) error {
		if ttfa == 0 {
			ttfa = time.Since(start)
		}
		return first(b)
	}
	n, err := s.synthesize(ctx, syn, sr, enc, send, nil)
	if err == nil {
		audio := time.Duration(n) * time.Second / time.Duration(syn.Info().SampleRate)
		s.done(syn.Info().Name, ttfa, audio, time.Since(start))
	}
	if err == nil {
		var tail []byte
		if tail, err = enc.Flush(nil); err == nil && len(tail) > 0 {
			err = send(tail)
		}
		if err == nil && sse && started {
			if _, err = w.Write(sseDone()); err == nil {
				err = rc.Flush()
			}
		}
	}
	if started && (err != nil || ctx.Err() != nil) {
		if s.ctx.Err() == nil {
			s.cfg.Logger.Info("speech stream cut after the first audio", "err", err, "remote", r.RemoteAddr)
		}
		// The status line went out with the first audio, so the only way left to say the
		// audio is incomplete is to cut the stream: net/http closes the connection without
		// the chunked terminator, and the client reads an unexpected EOF, never a clean end.
		// The deferred cleanups above (slot, counters, wait group) run while this unwinds.
		panic(http.ErrAbortHandler)
	}
	if err == nil || started {
		return
	}
	// An error response follows: it needs a deadline of its own, not the one a shutdown
	// moved to now.
	settle()
	rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	var busy *stream.BusyError
	switch code, client := stream.Classify(err, CodeSynthesis); {
	case errors.As(err, &busy):
		w.Header().Set("Retry-After", strconv.Itoa(int(busy.RetryAfter.Seconds())))
		writeAPIError(w, http.StatusServiceUnavailable, code, err.Error())
	case client:
		writeAPIError(w, http.StatusBadRequest, code, err.Error())
	case s.ctx.Err() != nil:
		w.Header().Set("Retry-After", "5")
		writeAPIError(w, http.StatusServiceUnavailable, CodeBusy, "server is shutting down")
	case ctx.Err() != nil:
	default:
		writeAPIError(w, http.StatusInternalServerError, code, stream.Opaque(s.cfg.Logger, "synthesis", err))
	}
}
