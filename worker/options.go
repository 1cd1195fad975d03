package worker

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/voxpipe/voxpipe/rtc"
)

// Modes of a room.
const (
	ModeVC  = "vc"  // every participant's microphone (or one participant's) is converted and published
	ModeTTS = "tts" // the worker speaks text sent to it into the room
)

// Options say what the worker does in a room. They come from a dispatch's metadata (a JSON
// object; empty metadata takes the worker's defaults) or from the body of POST /v1/rooms.
type Options struct {
	Mode   string             `json:"mode,omitempty"`   // vc (default) or tts
	Voice  string             `json:"voice,omitempty"`  // vc: a live voice (dsp, meanvc2…); tts: a library voice
	Ref    string             `json:"ref,omitempty"`    // vc: the target voice of a voice that takes one
	Params map[string]float64 `json:"params,omitempty"` // vc: the voice's parameters (pitch_semitones…)
	// Participant, in vc mode, converts only this identity's microphone ("" every
	// participant's but other agents').
	Participant string `json:"participant,omitempty"`
	Model       string `json:"model,omitempty"` // tts: the model ("" when one is loaded)
	Text        string `json:"text,omitempty"`  // tts: a greeting spoken once the worker has joined
}

// maxMetadata bounds the options' JSON (LiveKit allows metadata far larger).
const maxMetadata = 64 << 10

// ParseOptions reads options from a dispatch's metadata; empty metadata is the defaults.
func ParseOptions(metadata string) (Options, error) {
	var o Options
	if strings.TrimSpace(metadata) == "" {
		return o, o.check()
	}
	if len(metadata) > maxMetadata {
		return o, fmt.Errorf("metadata is %d bytes; the limit is %d", len(metadata), maxMetadata)
	}
	dec := json.NewDecoder(strings.NewReader(metadata))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return o, fmt.Errorf("metadata: want a JSON object of voxpipe options (mode, voice, ref, params, participant, model, text): %v", err)
	}
	return o, o.check()
}

// check validates the options and fills the mode's default.
func (o *Options) check() error {
	if o.Mode == "" {
		o.Mode = ModeVC
	}
	switch o.Mode {
	case ModeVC:
		if o.Model != "" || o.Text != "" {
			return fmt.Errorf("model and text are for mode tts")
		}
	case ModeTTS:
		if len(o.Params) > 0 || o.Ref != "" || o.Participant != "" {
			return fmt.Errorf("params, ref and participant are for mode vc")
		}
	default:
		return fmt.Errorf("mode %q: use vc or tts", trunc(o.Mode))
	}
	if len(o.Params) > 16 {
		return fmt.Errorf("more than 16 params")
	}
	for k, x := range o.Params {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("param %q is not a finite number", trunc(k))
		}
	}
	if n := utf8.RuneCountInString(o.Text); n > rtc.MaxSpeakText {
		return fmt.Errorf("text has %d characters; the limit is %d", n, rtc.MaxSpeakText)
	}
	for _, s := range []string{o.Voice, o.Ref, o.Participant, o.Model} {
		if len(s) > 256 || !utf8.ValidString(s) {
			return fmt.Errorf("a name (voice, ref, participant, model) is over 256 bytes or not UTF-8")
		}
	}
	return nil
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// liveVoice is the live voice the options convert with (def when they name none; "" in tts
// mode, which converts nothing).
func (o Options) liveVoice(def string) string {
	switch {
	case o.Mode == ModeTTS:
		return ""
	case o.Voice != "":
		return o.Voice
	}
	return def
}
