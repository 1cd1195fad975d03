package tts

import (
	"testing"
	"unicode/utf8"
)

// FuzzDecodeClientMessage: any bytes give a message or a coded error, never a panic, and
// an accepted message is one the server can act on.
func FuzzDecodeClientMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"speak","context_id":"a","text":"Hello.","continue":true,"format":{"encoding":"mulaw","sample_rate":8000}}`,
		`{"type":"cancel","context_id":"a"}`, `{"type":"flush","context_id":"x"}`, `{"type":"speak"}`, `[]`, `null`,
		`{"type":"speak","context_id":"a","options":{"temperature":-1}}`, `{"type":"speak","context_id":"a","format":{"encoding":"opus","sample_rate":44100}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, code, err := decodeClientMessage(data)
		if err != nil {
			if code == "" {
				t.Fatalf("error without a code: %v", err)
			}
			return
		}
		if m.ContextID == "" || len(m.ContextID) > 128 || (m.Type != "speak" && m.Type != "flush" && m.Type != "cancel") {
			t.Fatalf("accepted %+v", m)
		}
		if m.Format != nil && m.Format.SampleRate == 0 {
			t.Fatalf("format without defaults: %+v", m.Format)
		}
		_ = utf8.ValidString(m.Text)
	})
}
