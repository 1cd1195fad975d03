// Package tts serves text-to-speech over the network: a WebSocket protocol with several
// concurrent contexts per socket (speak in pieces, flush, cancel), and the OpenAI-compatible
// POST /v1/audio/speech endpoint streaming audio as it is synthesised. docs/protocol.md and
// docs/api.md describe both.
package tts

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// Error codes sent in error messages.
const (
	CodeBadJSON      = "bad_json"
	CodeBadMessage   = stream.CodeBadMessage
	CodeBadFormat    = "bad_format"
	CodeUnknownModel = "unknown_model"
	CodeUnknownVoice = stream.CodeUnknownVoice
	CodeTextTooLong  = "text_too_long"
	CodeTooMany      = "too_many_contexts"
	CodeBusy         = stream.CodeBusy
	CodeSynthesis    = stream.CodeSynthesis
	CodeRateLimited  = "rate_limited"
)

// ClientMessage is a message from the client; Type selects the fields used.
type ClientMessage struct {
	Type      string           `json:"type"` // speak, flush, cancel
	ContextID string           `json:"context_id"`
	Text      string           `json:"text,omitempty"`
	Voice     string           `json:"voice,omitempty"`
	Model     string           `json:"model,omitempty"`
	Continue  bool             `json:"continue,omitempty"`
	Format    *audioout.Format `json:"format,omitempty"`
	Options   *Options         `json:"options,omitempty"`
	// AddTimestamps asks for a timestamps message after each piece of text is spoken.
	AddTimestamps bool `json:"add_timestamps,omitempty"`
	// Binary sends the context's audio as binary WebSocket frames (see binaryAudio)
	// instead of base64 inside JSON.
	Binary bool `json:"binary,omitempty"`
}

// Options tune synthesis per context.
type Options struct {
	Seed        uint64  `json:"seed,omitempty"`
	Temperature float64 `json:"temperature,omitempty"`
	MaxTokens   int     `json:"max_tokens,omitempty"`
}

// ServerMessage is a message to the client.
type ServerMessage struct {
	Type      string   `json:"type"` // audio, timestamps, flush_done, done, error
	ContextID string   `json:"context_id,omitempty"`
	Seq       int      `json:"seq,omitempty"`
	Data      []byte   `json:"data,omitempty"` // base64 in JSON
	Metrics   *Metrics `json:"metrics,omitempty"`
	// WordTimestamps come with type timestamps.
	WordTimestamps *WordTimestamps `json:"word_timestamps,omitempty"`
	Canceled       bool            `json:"canceled,omitempty"`
	Code           string          `json:"code,omitempty"`
	Message        string          `json:"message,omitempty"`
	// RetryAfterMs comes with code busy.
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
}

// Metrics summarise a finished context.
type Metrics struct {
	TTFAMs  float64 `json:"ttfa_ms"`  // first speak message → first audio sent
	AudioMs float64 `json:"audio_ms"` // audio produced
	RTF     float64 `json:"rtf"`      // synthesis time / audio time
}

var errBadMessage = errors.New("bad message")

// decodeClientMessage parses and validates one client message.
func decodeClientMessage(data []byte) (ClientMessage, string, error) {
	var m ClientMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return m, CodeBadJSON, fmt.Errorf("not a JSON message: %v", err)
	}
	switch m.Type {
	case "speak", "flush", "cancel":
	case "":
		return m, CodeBadMessage, fmt.Errorf("%w: missing type", errBadMessage)
	default:
		return m, CodeBadMessage, fmt.Errorf("%w: unknown type %q (use speak, flush or cancel)", errBadMessage, m.Type)
	}
	if m.ContextID == "" || len(m.ContextID) > 128 {
		return m, CodeBadMessage, fmt.Errorf("%w: context_id must be 1–128 characters", errBadMessage)
	}
	if m.Format != nil {
		if err := m.Format.Validate(); err != nil {
			return m, CodeBadFormat, err
		}
	}
	if o := m.Options; o != nil {
		if err := stream.CheckSynthOptions(o.Temperature, o.MaxTokens); err != nil {
			return m, CodeBadMessage, fmt.Errorf("options: %w", err)
		}
	}
	return m, "", nil
}

// binaryAudio lays out an audio message as a binary frame: the context id's length in one
// byte, the id, the sequence number as a big-endian uint32, then the audio bytes. (A
// context id is at most 128 bytes.)
func binaryAudio(m ServerMessage) []byte {
	b := make([]byte, 0, 1+len(m.ContextID)+4+len(m.Data))
	b = append(b, byte(len(m.ContextID)))
	b = append(b, m.ContextID...)
	b = binary.BigEndian.AppendUint32(b, uint32(m.Seq))
	return append(b, m.Data...)
}
