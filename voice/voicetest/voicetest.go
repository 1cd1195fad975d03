// Package voicetest is test support for the protocol packages: the tiny golden MioTTS as a
// registered synthesizer, loaded once per test binary.
package voicetest

import (
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice"
)

var (
	once   sync.Once
	shared *miotts.TTS
	err    error
)

// Speech is the repository's speech fixture (testdata/speech_en_48k.wav).
func Speech() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "speech_en_48k.wav")
}

// TinyTTS returns synthesizers holding the tiny golden MioTTS and MioCodec, speaking in the
// speech fixture's voice by default (the voice "ref"). The model is loaded once and shared
// by the binary's tests; it skips as the golden data does when that is absent.
func TinyTTS(t testing.TB) *stream.Synthesizers {
	t.Helper()
	lm := golden.Path(t, "miotts", "model.gguf")
	codec := golden.Path(t, "miocodec", "model.gguf")
	once.Do(func() {
		be, e := engine.NewCPU(2)
		if e != nil {
			err = e
			return
		}
		if shared, err = miotts.Load(lm, codec, be, miotts.Options{}); err == nil {
			shared.DefaultVoice = "ref"
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &stream.Synthesizers{}
	s.Register(voice.MioTTS(shared, voice.Voices(nil, map[string]string{"ref": Speech()})))
	return s
}
