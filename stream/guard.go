package stream

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
)

// Limits on the synthesis options a client may set. The TTS WebSocket, the speech endpoint
// and text-to-speech WebRTC sessions all check requests against this one table
// (CheckSynthOptions); docs/api.md lists it.
const (
	// MaxTokensLimit caps max_tokens: speech tokens per text piece (MioTTS makes 25 a
	// second, so about 2.7 minutes). 0 takes the model's default.
	MaxTokensLimit = 4096
	// MinTemperature and MaxTemperature bound temperature; 0 takes the model's default.
	MinTemperature = 0.01
	MaxTemperature = 2.0
)

// ErrBadOption is wrapped by CheckSynthOptions' errors: the client's mistake.
var ErrBadOption = errors.New("bad option")

// CheckSynthOptions validates a request's client-set options against the documented ranges.
func CheckSynthOptions(temperature float64, maxTokens int) error {
	if maxTokens < 0 || maxTokens > MaxTokensLimit {
		return fmt.Errorf("%w: max_tokens %d: use 0 (the model's default) to %d", ErrBadOption, maxTokens, MaxTokensLimit)
	}
	if temperature != 0 && !(temperature >= MinTemperature && temperature <= MaxTemperature) {
		return fmt.Errorf("%w: temperature %g: use 0 (the model's default) or %g to %g", ErrBadOption, temperature, MinTemperature, MaxTemperature)
	}
	return nil
}

// ErrPanic is wrapped by the error Guard returns for a panic.
var ErrPanic = errors.New("internal error")

// Guard runs fn, which does work for one client request, and turns a panic in it into that
// request's error: a bug hit by one request must not take the process, and every other
// session, down with it. The panic is logged once with its stack.
func Guard(log *slog.Logger, what string, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if log == nil {
				log = slog.Default()
			}
			log.Error("panic recovered: the request failed, the server goes on", "in", what, "panic", fmt.Sprint(r),
				"stack", string(debug.Stack()))
			err = fmt.Errorf("%w: %s failed", ErrPanic, what)
		}
	}()
	return fn()
}

// Opaque logs an unexpected error with a fresh reference and returns what a client may see
// of it: the reference, and no server detail (paths, file or library names).
func Opaque(log *slog.Logger, what string, err error) string {
	var b [6]byte
	rand.Read(b[:])
	ref := hex.EncodeToString(b[:])
	if log == nil {
		log = slog.Default()
	}
	log.Warn(what+" failed", "ref", ref, "err", err)
	return fmt.Sprintf("%s failed (server error; the server log has the details under ref %s)", what, ref)
}
