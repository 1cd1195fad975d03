// Package adapt joins model packages to the stream interfaces: models/ and stream/ never
// import each other (models speak in plain types), so the adapters live here, shared by the
// command and the tests of the network layer.
package adapt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/rtc/voicelib"
	"github.com/voxpipe/voxpipe/stream"
)

// MioTTS makes a MioTTS model a stream.Synthesizer named "miotts".
func MioTTS(t *miotts.TTS) stream.Synthesizer { return miottsSynth{t} }

type miottsSynth struct {
	t *miotts.TTS
}

func (m miottsSynth) Info() stream.SynthInfo {
	return stream.SynthInfo{Name: "miotts", SampleRate: m.t.SampleRate()}
}

func (m miottsSynth) Synthesize(ctx context.Context, req stream.SynthRequest, out func(stream.SynthChunk) error) error {
	r := miotts.Request{Text: req.Text, Voice: req.Voice, Gen: miotts.GenOptions{Seed: req.Seed, MaxNew: req.MaxTokens}}
	if req.Temperature > 0 {
		sc := m.t.LM.Defaults
		sc.Temperature = req.Temperature
		r.Gen.Sampler = &sc
	}
	rate := time.Duration(m.t.SampleRate())
	start := time.Now()
	var done int
	_, err := m.t.Synthesize(ctx, r, func(c miotts.Chunk) error {
		ch := stream.SynthChunk{Samples: c.Samples, Offset: time.Duration(done) * time.Second / rate,
			Elapsed: time.Since(start), Final: c.Final}
		done += len(c.Samples)
		return out(ch)
	})
	switch {
	case errors.Is(err, miotts.ErrNoVoice), errors.Is(err, voicelib.ErrNotFound):
		return fmt.Errorf("%w: %w", stream.ErrUnknownVoice, err)
	case errors.Is(err, miotts.ErrNothingToSay):
		return fmt.Errorf("%w: %w", stream.ErrNothingToSay, err)
	}
	return err
}

// Voices resolves TTS voice names: operator-configured clip files (name → path) first,
// then voice library ids and names.
func Voices(lib *voicelib.Library, files map[string]string) miotts.VoiceSource {
	return func(name string) ([]float32, int, error) {
		if path, ok := files[name]; ok {
			a, err := wav.ReadFile(path)
			if err != nil {
				return nil, 0, fmt.Errorf("voice %q: %w", name, err)
			}
			return a.Mono(), a.SampleRate, nil
		}
		if lib != nil {
			clip, rate, err := lib.Clip(name)
			if err == nil || !errors.Is(err, voicelib.ErrNotFound) {
				return clip, rate, err
			}
		}
		return nil, 0, fmt.Errorf("%w: %q is not in the voice library", voicelib.ErrNotFound, name)
	}
}
