// Package voice is the voice catalog: it turns a voice name and a reference clip into a
// stream.Processor (MeanVC2) or serves a stream.Synthesizer (MioTTS), looking voices up in
// the library (voice/library) for the principal asking. models/ and stream/ never import each
// other (models speak in plain types), so the adapters between them live here.
package voice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice/library"
)

// MioTTS makes a MioTTS model a stream.Synthesizer named "miotts" whose voices, the default
// (t.DefaultVoice) included, come from voices (nil: no voices at all). The adapter resolves
// each request's voice itself, for the principal asking, and hands the model the clip:
// t.Voices is not used, so no lookup through this adapter ignores the owner.
func MioTTS(t *miotts.TTS, voices *VoiceSet) stream.Synthesizer { return miottsSynth{t, voices} }

type miottsSynth struct {
	t      *miotts.TTS
	voices *VoiceSet
}

// Fits: the language model's measured capacity (batched decode rounds within real time).
func (m miottsSynth) Fits(active int) bool { return m.t.LM.Fits(active) }

func (m miottsSynth) Info() stream.SynthInfo {
	return stream.SynthInfo{Name: "miotts", SampleRate: m.t.SampleRate()}
}

func (m miottsSynth) Synthesize(ctx context.Context, req stream.SynthRequest, out func(stream.SynthChunk) error) error {
	r := miotts.Request{Text: req.Text, Gen: miotts.GenOptions{Seed: req.Seed, MaxNew: req.MaxTokens}}
	// Check the text first, as the model would: a request with nothing to say should say
	// so, not fail on its voice.
	if !miotts.Speakable(miotts.Normalize(req.Text)) {
		return fmt.Errorf("%w: %w", stream.ErrNothingToSay, miotts.ErrNothingToSay)
	}
	clip, rate, err := m.voices.forRequest(req.Owner, req.Voice, m.t.DefaultVoice)
	if err != nil {
		return m.classify(err)
	}
	r.Clip, r.Rate = clip, rate
	if req.Temperature > 0 {
		sc := m.t.LM.Defaults
		sc.Temperature = req.Temperature
		r.Gen.Sampler = &sc
	}
	srate := time.Duration(m.t.SampleRate())
	start := time.Now()
	var done int
	_, err = m.t.Synthesize(ctx, r, func(c miotts.Chunk) error {
		ch := stream.SynthChunk{Samples: c.Samples, Offset: time.Duration(done) * time.Second / srate,
			Elapsed: time.Since(start), Final: c.Final}
		done += len(c.Samples)
		return out(ch)
	})
	return m.classify(err)
}

func (miottsSynth) classify(err error) error {
	switch {
	case errors.Is(err, miotts.ErrNoVoice), errors.Is(err, library.ErrNotFound):
		return fmt.Errorf("%w: %w", stream.ErrUnknownVoice, err)
	case errors.Is(err, miotts.ErrNothingToSay):
		return fmt.Errorf("%w: %w", stream.ErrNothingToSay, err)
	}
	return err
}

// VoiceSet is where TTS voices come from: clip files the operator configured (name → path;
// the server's own voices, usable by everyone) and the voice library, where each principal
// sees only its own voices (auth.CanSee).
type VoiceSet struct {
	lib   *library.Library
	files map[string]string
}

// Voices makes a VoiceSet; lib may be nil.
func Voices(lib *library.Library, files map[string]string) *VoiceSet {
	return &VoiceSet{lib: lib, files: files}
}

// Clip resolves name for principal: operator files first, then principal's library voices
// by id or name. A voice principal cannot see is library.ErrNotFound, like a missing one.
func (s *VoiceSet) Clip(principal, name string) ([]float32, int, error) {
	if s != nil {
		if path, ok := s.files[name]; ok {
			a, err := audiofile.ReadFile(path, audiofile.FileLimits)
			if err != nil {
				return nil, 0, fmt.Errorf("voice %q: %w", name, err)
			}
			return a.Mono(), a.SampleRate, nil
		}
		if s.lib != nil {
			clip, rate, err := s.lib.Clip(principal, name)
			if err == nil || !errors.Is(err, library.ErrNotFound) {
				return clip, rate, err
			}
		}
	}
	return nil, 0, fmt.Errorf("%w: %q is not in the voice library", library.ErrNotFound, name)
}

// forRequest resolves a request's voice. No voice is the model's default, used with the
// server's privileges: the operator chose it for everyone. A named voice must be visible to
// owner (an empty owner sees no library voice, so a caller that forgets to set it gets
// less, not more); naming the default explicitly also works when owner has no voice of
// that name.
func (s *VoiceSet) forRequest(owner, voice, def string) ([]float32, int, error) {
	if voice == "" {
		if def == "" {
			return nil, 0, miotts.ErrNoVoice
		}
		return s.Clip(auth.Admin, def)
	}
	clip, rate, err := s.Clip(owner, voice)
	if errors.Is(err, library.ErrNotFound) && voice == def {
		return s.Clip(auth.Admin, def)
	}
	return clip, rate, err
}
