package stream

import (
	"errors"
	"log/slog"
)

// ErrBadParams is wrapped by errors that are the client's fault in what it asked of a voice:
// an unknown or out-of-range parameter, an unusable reference clip.
var ErrBadParams = errors.New("bad parameters")

// Mark returns err unchanged in its message, but matching kind with errors.Is too: how a
// lower layer's error is classified for the protocols (see Classify) without rewording it.
func Mark(err, kind error) error { return marked{err, kind} }

type marked struct {
	error
	kind error
}

func (e marked) Unwrap() []error { return []error{e.error, e.kind} }

// Protocol error codes shared by every protocol (signaling, the TTS WebSocket, the speech
// endpoint), so one error reaches every client under one name.
const (
	CodeUnknownVoice = "unknown_voice"
	CodeBadParams    = "bad_params"
	CodeBadMessage   = "bad_message"
	CodeBusy         = "busy"
	CodeSynthesis    = "synthesis_failed"
	CodeInternal     = "internal"
)

// Classify is the one table from errors to protocol codes. clientFault says the message may
// be shown as it is (it describes the client's request); otherwise the error is the
// server's, and only an opaque reference (Opaque) should reach the client. fallback is the
// code of a server fault (synthesis_failed for text to speech, internal elsewhere).
func Classify(err error, fallback string) (code string, clientFault bool) {
	var busy *BusyError
	switch {
	case err == nil:
		return "", true
	case errors.As(err, &busy), errors.Is(err, ErrBusy):
		return CodeBusy, true
	case errors.Is(err, ErrUnknownVoice):
		return CodeUnknownVoice, true
	case errors.Is(err, ErrBadParams):
		return CodeBadParams, true
	case errors.Is(err, ErrNothingToSay), errors.Is(err, ErrBadOption):
		return CodeBadMessage, true
	}
	return fallback, false
}

// ClientError is what a client is told about err: its code, and a message that is err's own
// when the client caused it, or an opaque log reference when the server did (the detail is
// logged under that reference).
func ClientError(log *slog.Logger, what string, err error, fallback string) (code, msg string) {
	code, client := Classify(err, fallback)
	if client {
		return code, err.Error()
	}
	return code, Opaque(log, what, err)
}
