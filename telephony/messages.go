package telephony

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/voxpipe/voxpipe/stream"
)

// Error codes: the prefix of a close reason, and the code of an error event (a voxpipe
// extension, sent only for speak and cancel). Shared codes come from stream.
const (
	CodeBadJSON      = "bad_json"
	CodeBadMessage   = stream.CodeBadMessage
	CodeBadMedia     = "bad_media"
	CodeBadParams    = stream.CodeBadParams
	CodeUnknownVoice = stream.CodeUnknownVoice
	CodeUnknownModel = "unknown_model"
	CodeTextTooLong  = "text_too_long"
	CodeRateLimited  = "rate_limited"
	CodeUnauthorized = "unauthorized"
	CodeTooMany      = "too_many_sessions"
	CodeBusy         = stream.CodeBusy
	CodeSynthesis    = stream.CodeSynthesis
	CodeInternal     = stream.CodeInternal
	CodeTimeout      = "timeout"
)

// Limits of the message parser.
const (
	// MaxPayload is the most audio one media message may carry, in bytes of μ-law (one
	// second at 8 kHz; Twilio sends 20 ms, 160 bytes).
	MaxPayload = 8000
	// MaxSpeakText is the longest text a speak message (or a greeting) may carry, in
	// characters: the limit of every other TTS path.
	MaxSpeakText = 10000
	// maxParams bounds the custom parameters of a start message, maxName the length of a
	// mark name, a stream or call sid and a parameter's name.
	maxParams = 64
	maxName   = 256
)

// Message is one inbound message of the Twilio Media Streams protocol (connected, start,
// media, mark, dtmf, stop) or of voxpipe's extensions on the same socket (speak, cancel).
// Event selects the fields that are set. Other events parse with Known false.
type Message struct {
	Event     string
	Known     bool
	StreamSid string
	// Sequence is the message's sequenceNumber (0 when absent).
	Sequence int64

	Start *Start
	Media *Media
	Mark  string // mark: the name of the mark (Twilio's echo of a mark we sent, once played)
	DTMF  string // dtmf: the digit

	// speak (voxpipe extension): the text, sampling seed and speech-token cap, and the
	// name of the mark sent once its audio has been played ("" for one by count).
	Text      string
	Seed      uint64
	MaxTokens int
	MarkName  string
}

// Start is a start message's stream metadata.
type Start struct {
	StreamSid  string
	AccountSid string
	CallSid    string
	Tracks     []string
	// Encoding, SampleRate and Channels are the mediaFormat (audio/x-mulaw, 8000, 1 when
	// the message has none).
	Encoding   string
	SampleRate int
	Channels   int
	// Params are the customParameters (Twilio's <Parameter> values): voice, mode, the
	// voice's parameters, the API key as token, a greeting as text.
	Params map[string]string
}

// Media is one media message's audio.
type Media struct {
	Track     string // inbound (or outbound, with both_tracks); "" counts as inbound
	Chunk     int64
	Timestamp int64  // milliseconds from the start of the stream
	Audio     []byte // the decoded payload: 8 kHz μ-law
}

// ErrBadMessage is wrapped by ParseMessage's errors; Code says which kind.
var ErrBadMessage = errors.New("bad message")

// ParseError is a message that cannot be used: Code is bad_json, bad_message, bad_media or
// text_too_long.
type ParseError struct {
	Code string
	Msg  string
}

func (e *ParseError) Error() string { return e.Msg }
func (e *ParseError) Unwrap() error { return ErrBadMessage }

func parseErr(code, format string, args ...any) error {
	return &ParseError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// The wire forms. Twilio sends its counters as strings ("sequenceNumber":"2"); flexInt
// takes a string or a number. Unknown fields are ignored, as Twilio may add some.
type wireMessage struct {
	Event          string          `json:"event"`
	SequenceNumber flexInt         `json:"sequenceNumber"`
	StreamSid      string          `json:"streamSid"`
	Start          *wireStart      `json:"start"`
	Media          *wireMedia      `json:"media"`
	Mark           *wireMark       `json:"mark"`
	DTMF           *wireDTMF       `json:"dtmf"`
	Text           *string         `json:"text"`
	Seed           json.RawMessage `json:"seed"`
	MaxTokens      json.RawMessage `json:"max_tokens"`
	MarkName       string          `json:"mark_name"`
}

type wireStart struct {
	StreamSid   string   `json:"streamSid"`
	AccountSid  string   `json:"accountSid"`
	CallSid     string   `json:"callSid"`
	Tracks      []string `json:"tracks"`
	MediaFormat *struct {
		Encoding   string  `json:"encoding"`
		SampleRate flexInt `json:"sampleRate"`
		Channels   flexInt `json:"channels"`
	} `json:"mediaFormat"`
	CustomParameters map[string]json.RawMessage `json:"customParameters"`
}

type wireMedia struct {
	Track     string  `json:"track"`
	Chunk     flexInt `json:"chunk"`
	Timestamp flexInt `json:"timestamp"`
	Payload   *string `json:"payload"`
}

type wireMark struct {
	Name string `json:"name"`
}

type wireDTMF struct {
	Digit string `json:"digit"`
}

// flexInt is an integer sent as a JSON number or a decimal string.
type flexInt int64

func (f *flexInt) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	s := b
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		s = []byte(str)
	}
	v, err := strconv.ParseInt(string(s), 10, 64)
	if err != nil {
		return fmt.Errorf("%q is not an integer", s)
	}
	*f = flexInt(v)
	return nil
}

// ParseMessage parses and validates one inbound text message. Media payloads are decoded
// (base64) and bounded here, so nothing past the edge sees unchecked input.
func ParseMessage(data []byte) (Message, error) {
	var w wireMessage
	if err := json.Unmarshal(data, &w); err != nil {
		return Message{}, parseErr(CodeBadJSON, "not a JSON message: %v", err)
	}
	m := Message{Event: w.Event, StreamSid: w.StreamSid, Sequence: int64(w.SequenceNumber)}
	if m.Event == "" {
		return m, parseErr(CodeBadMessage, "message has no event")
	}
	if len(m.Event) > 64 || !utf8.ValidString(m.Event) {
		return Message{}, parseErr(CodeBadMessage, "event name is not valid")
	}
	if len(m.StreamSid) > maxName {
		return m, parseErr(CodeBadMessage, "streamSid over %d bytes", maxName)
	}
	m.Known = true
	switch m.Event {
	case "connected", "stop", "cancel":
	case "start":
		s, err := parseStart(w.Start)
		if err != nil {
			return m, err
		}
		if s.StreamSid == "" {
			s.StreamSid = m.StreamSid
		}
		m.Start = s
	case "media":
		md, err := parseMedia(w.Media)
		if err != nil {
			return m, err
		}
		m.Media = md
	case "mark":
		if w.Mark == nil || w.Mark.Name == "" || len(w.Mark.Name) > maxName {
			return m, parseErr(CodeBadMessage, "mark needs a name of 1–%d bytes", maxName)
		}
		m.Mark = w.Mark.Name
	case "dtmf":
		if w.DTMF != nil && len(w.DTMF.Digit) <= 8 {
			m.DTMF = w.DTMF.Digit
		}
	case "speak":
		if err := parseSpeak(&m, w); err != nil {
			return m, err
		}
	default:
		m.Known = false // Twilio may add events: they are ignored, not refused
	}
	return m, nil
}

func parseStart(w *wireStart) (*Start, error) {
	if w == nil {
		return nil, parseErr(CodeBadMessage, "start message without a start object")
	}
	for _, s := range []string{w.StreamSid, w.AccountSid, w.CallSid} {
		if len(s) > maxName {
			return nil, parseErr(CodeBadMessage, "start: a sid over %d bytes", maxName)
		}
	}
	if len(w.Tracks) > 4 {
		return nil, parseErr(CodeBadMessage, "start: more than 4 tracks")
	}
	s := &Start{StreamSid: w.StreamSid, AccountSid: w.AccountSid, CallSid: w.CallSid, Tracks: w.Tracks,
		Encoding: "audio/x-mulaw", SampleRate: 8000, Channels: 1}
	if f := w.MediaFormat; f != nil {
		s.Encoding, s.SampleRate, s.Channels = f.Encoding, int(f.SampleRate), int(f.Channels)
		if s.Channels == 0 {
			s.Channels = 1
		}
	}
	if s.Encoding != "audio/x-mulaw" || s.SampleRate != 8000 || s.Channels != 1 {
		return nil, parseErr(CodeBadMedia, "start: media format %q %d Hz %d channels: only audio/x-mulaw, 8000 Hz, mono is supported",
			trunc(s.Encoding, 40), s.SampleRate, s.Channels)
	}
	if len(w.CustomParameters) > maxParams {
		return nil, parseErr(CodeBadParams, "start: more than %d custom parameters", maxParams)
	}
	s.Params = make(map[string]string, len(w.CustomParameters))
	for k, raw := range w.CustomParameters {
		if k == "" || len(k) > maxName {
			return nil, parseErr(CodeBadParams, "start: a custom parameter name must have 1–%d bytes", maxName)
		}
		v, err := paramValue(raw)
		if err != nil {
			return nil, parseErr(CodeBadParams, "start: custom parameter %q: %v", trunc(k, 40), err)
		}
		s.Params[k] = v
	}
	return s, nil
}

// paramValue reads a custom parameter: Twilio sends strings; numbers and booleans from
// other clients are taken as their text.
func paramValue(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", errors.New("no value")
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case '{', '[':
		return "", errors.New("want a string or a number")
	case 'n':
		return "", nil
	}
	return string(raw), nil
}

func parseMedia(w *wireMedia) (*Media, error) {
	if w == nil || w.Payload == nil {
		return nil, parseErr(CodeBadMedia, "media message without a media payload")
	}
	if len(w.Track) > 32 {
		return nil, parseErr(CodeBadMedia, "media track name over 32 bytes")
	}
	p := *w.Payload
	// Checked before decoding: a huge payload costs nothing but the read.
	if base64.StdEncoding.DecodedLen(len(p)) > MaxPayload+2 {
		return nil, parseErr(CodeBadMedia, "media payload over %d bytes (Twilio sends 160 a message)", MaxPayload)
	}
	audio, err := base64.StdEncoding.DecodeString(p)
	if err != nil {
		return nil, parseErr(CodeBadMedia, "media payload is not base64: %v", err)
	}
	if len(audio) > MaxPayload {
		return nil, parseErr(CodeBadMedia, "media payload over %d bytes", MaxPayload)
	}
	return &Media{Track: w.Track, Chunk: int64(w.Chunk), Timestamp: int64(w.Timestamp), Audio: audio}, nil
}

func parseSpeak(m *Message, w wireMessage) error {
	if w.Text == nil || !stream.HasWords(*w.Text) {
		return parseErr(CodeBadMessage, "speak needs a non-empty text")
	}
	if n := utf8.RuneCountInString(*w.Text); n > MaxSpeakText {
		return parseErr(CodeTextTooLong, "text has %d characters; the limit is %d", n, MaxSpeakText)
	}
	m.Text = *w.Text
	if len(w.MarkName) > maxName {
		return parseErr(CodeBadMessage, "mark_name over %d bytes", maxName)
	}
	m.MarkName = w.MarkName
	if len(w.Seed) > 0 && string(w.Seed) != "null" {
		if err := json.Unmarshal(w.Seed, &m.Seed); err != nil {
			return parseErr(CodeBadMessage, "seed: want an unsigned 64-bit integer")
		}
	}
	if len(w.MaxTokens) > 0 && string(w.MaxTokens) != "null" {
		var k int64
		if err := json.Unmarshal(w.MaxTokens, &k); err != nil || k < 0 || k > stream.MaxTokensLimit {
			return parseErr(CodeBadMessage, "max_tokens: use 0 (the model's default) to %d", stream.MaxTokensLimit)
		}
		m.MaxTokens = int(k)
	}
	return nil
}

// trunc cuts s to at most n bytes on a character boundary.
func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
