// Package rtc is voxpipe's network edge for live audio: Pion WebRTC peers with WebSocket
// signaling (docs/protocol.md), Opus in and out, a jitter buffer and a 20 ms paced sender.
package rtc

import (
	"encoding/json"
	"fmt"

	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/stream"
)

// Error codes of the signaling protocol.
const (
	CodeBadJSON          = "bad_json"
	CodeBadMessage       = stream.CodeBadMessage
	CodeBadSDP           = "bad_sdp"
	CodeNoAudio          = "no_audio"
	CodeUnsupportedCodec = "unsupported_codec"
	CodeBadCandidate     = "bad_candidate"
	CodeUnknownVoice     = stream.CodeUnknownVoice
	CodeBadParams        = stream.CodeBadParams
	CodeDuplicateOffer   = "duplicate_offer"
	CodeRateLimited      = "rate_limited"
	CodeBusy             = stream.CodeBusy
	CodeTextTooLong      = "text_too_long"
	CodeSynthesis        = stream.CodeSynthesis
	CodeInternal         = stream.CodeInternal
)

// Message is any signaling message; Type selects which fields are used.
type Message struct {
	Type string `json:"type"`

	// offer, answer
	SDP string `json:"sdp,omitempty"`
	// candidate
	Candidate *webrtc.ICECandidateInit `json:"candidate,omitempty"`

	// session
	Mode        string             `json:"mode,omitempty"`
	Voice       string             `json:"voice,omitempty"`
	Ref         string             `json:"ref,omitempty"` // reference clip of a voice that takes one
	Params      map[string]float64 `json:"params,omitempty"`
	Passthrough *bool              `json:"passthrough,omitempty"`
	Channel     string             `json:"channel,omitempty"` // session, ready: the channel the session is live on

	// speak, cancel, and the speaking/done events of text-to-speech sessions
	Text      string      `json:"text,omitempty"`
	ContextID string      `json:"context_id,omitempty"`
	Model     string      `json:"model,omitempty"`
	MaxTokens int         `json:"max_tokens,omitempty"` // speech tokens per sentence group at most
	Seed      uint64      `json:"seed,omitempty"`
	Metrics   *TTSMetrics `json:"metrics,omitempty"`
	Canceled  bool        `json:"canceled,omitempty"`

	// ready
	SessionID          string  `json:"session_id,omitempty"`
	SampleRate         int     `json:"sample_rate,omitempty"`
	AlgorithmicLatency float64 `json:"algorithmic_latency_ms,omitempty"`

	// error
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	Fatal   bool   `json:"fatal,omitempty"`
}

// TTSMetrics summarise one spoken text of a text-to-speech session.
type TTSMetrics struct {
	TTFAMs  float64 `json:"ttfa_ms"`  // speak message → first audio ready to send
	AudioMs float64 `json:"audio_ms"` // audio produced
	RTF     float64 `json:"rtf"`      // synthesis time / audio time
}

// StatsMessage is the once-a-second report of a session.
type StatsMessage struct {
	Type          string       `json:"type"`
	SessionID     string       `json:"session_id"`
	Voice         string       `json:"voice"`
	Passthrough   bool         `json:"passthrough"`
	Timings       StageTimings `json:"timings_ms"`
	Queue         QueueStats   `json:"queue"`
	Chunks        int          `json:"chunks"`
	LateChunks    int          `json:"late_chunks"`
	DroppedChunks int          `json:"dropped_chunks"`
	DroppedMs     float64      `json:"dropped_ms"`
	Packets       PacketStats  `json:"packets"`
	Latency       LatencyStats `json:"latency_ms"`
	Load          float64      `json:"load"`
}

// StageTimings are mean per-frame times in ms over the last report interval.
type StageTimings struct {
	Jitter   float64 `json:"jitter"`
	Decode   float64 `json:"decode"`
	Resample float64 `json:"resample"`
	Process  float64 `json:"process"`
	Encode   float64 `json:"encode"`
}

// QueueStats describe the processed audio waiting to be sent.
type QueueStats struct {
	DepthMs float64 `json:"depth_ms"`
	AgeMs   float64 `json:"age_ms"`
	// OutputBufferMs is the adaptive output cushion the session holds now (beyond what each
	// 20 ms frame takes): it grows when a slow model step makes a frame run short and is
	// trimmed back when no frame needed it for a while. TrimmedMs is the output dropped, in
	// all, to shrink it.
	OutputBufferMs float64 `json:"output_buffer_ms"`
	TrimmedMs      float64 `json:"trimmed_ms"`
	// StretchedMs is the output played twice, in all, to grow the cushion when the session's
	// model steps were expected to slow (sessions joined): a repeat crossfaded in, instead of
	// the gaps the slow steps would otherwise leave.
	StretchedMs float64 `json:"stretched_ms"`
	// Underflows counts the 20 ms frames, since output began, that the output queue could
	// not fill when they were due: audio that came late to the listener.
	Underflows int `json:"underflows"`
}

// PacketStats count what arrived on the wire.
type PacketStats struct {
	Received     int `json:"received"`
	Lost         int `json:"lost"`
	Late         int `json:"late"`
	FECRecovered int `json:"fec_recovered"`
	PLCFrames    int `json:"plc_frames"`
	Underflows   int `json:"underflows"`
	Shed         int `json:"shed"`
}

// LatencyStats are the session's measured and designed latencies in ms.
type LatencyStats struct {
	Server      float64 `json:"server"`
	Algorithmic float64 `json:"algorithmic"`
	Jitter      float64 `json:"jitter_target"`
}

// decodeMessage parses one client message, returning a protocol error code on failure.
func decodeMessage(data []byte) (Message, string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return Message{}, CodeBadJSON, fmt.Errorf("message is not a JSON object: %v", err)
	}
	var typ string
	if err := json.Unmarshal(raw["type"], &typ); err != nil || typ == "" {
		return Message{}, CodeBadJSON, fmt.Errorf(`message has no string "type"`)
	}
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		return Message{}, CodeBadMessage, fmt.Errorf("%s message: %v", typ, err)
	}
	return m, "", nil
}
