package tts

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/voxpipe/voxpipe/stream"
)

// OpenAI's model and voice names, which clients such as Open WebUI send by default.
var (
	openAIModels = []string{"tts-1", "tts-1-hd", "gpt-4o-mini-tts"}
	openAIVoices = []string{"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse"}
)

// synthesizerFor finds the model a speech request names: a loaded model by its name, or an
// OpenAI model name (tts-1, tts-1-hd, gpt-4o-mini-tts), which stands for the first loaded one.
func (s *Server) synthesizerFor(model string) (stream.Synthesizer, error) {
	syn, err := s.cfg.Synthesizers.Get(model)
	if err == nil || !slices.Contains(openAIModels, model) {
		return syn, err
	}
	names := s.cfg.Synthesizers.Names()
	if len(names) == 0 {
		return nil, err
	}
	return s.cfg.Synthesizers.Get(names[0])
}

// voiceFor maps a requested voice: a configured alias (VoiceAliases) first, then an OpenAI
// voice name to the default voice; anything else is a voice of the library or the server.
func (s *Server) voiceFor(voice string) string {
	if v, ok := s.cfg.VoiceAliases[voice]; ok {
		return v
	}
	if slices.Contains(openAIVoices, strings.ToLower(voice)) {
		return ""
	}
	return voice
}

// Models serves GET /v1/models (OpenAI's list): the loaded models and the OpenAI names that
// stand for the first of them.
func (s *Server) Models(w http.ResponseWriter, r *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	data := []model{}
	names := s.cfg.Synthesizers.Names()
	for _, n := range names {
		data = append(data, model{ID: n, Object: "model", OwnedBy: "voxpipe"})
	}
	if len(names) > 0 {
		for _, n := range openAIModels {
			data = append(data, model{ID: n, Object: "model", OwnedBy: "voxpipe (" + names[0] + ")"})
		}
	}
	if id := r.PathValue("id"); id != "" {
		for _, m := range data {
			if m.ID == id {
				writeJSON(w, m)
				return
			}
		}
		writeAPIError(w, http.StatusNotFound, CodeUnknownModel, fmt.Sprintf("model %q is not loaded (GET /v1/models lists them)", id))
		return
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// sseEvent is one Server-Sent Event of stream_format "sse", as OpenAI sends them.
func sseEvent(v any) []byte {
	b, _ := json.Marshal(v)
	return append(append([]byte("data: "), b...), '\n', '\n')
}

// sseDelta wraps a chunk of encoded audio as a speech.audio.delta event.
func sseDelta(audio []byte) []byte {
	return sseEvent(map[string]string{"type": "speech.audio.delta", "audio": base64.StdEncoding.EncodeToString(audio)})
}

// sseDone is the last event: usage is reported as OpenAI's schema has it, with no token
// counts (the server does not bill).
func sseDone() []byte {
	return sseEvent(map[string]any{"type": "speech.audio.done", "usage": map[string]int{"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}})
}
