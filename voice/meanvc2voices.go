package voice

import (
	"errors"
	"fmt"

	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/embcache"
	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice/library"
)

// LoadMeanVC2 loads a MeanVC2 model where pl places it (its vocoder where pl.Part says),
// with a second backend of the model's kind for the speaker path (embedding a new voice does
// not stall live streams), caching embeddings in cacheDir ("" for memory only). The
// returned function frees it all.
func LoadMeanVC2(path string, pl engine.Placement, cacheDir string) (*meanvc2.Model, func(), error) {
	be, voc, closeBE, err := pl.Open()
	if err != nil {
		return nil, nil, err
	}
	spk, err := pl.OpenSpeaker()
	if err != nil {
		closeBE()
		return nil, nil, err
	}
	m, err := meanvc2.LoadOn(path, meanvc2.Backends{Main: be, Vocoder: voc, Speaker: spk})
	if err != nil {
		closeBE()
		spk.Close()
		return nil, nil, err
	}
	if m.Embeddings, err = embcache.New(cacheDir); err != nil {
		m.Close()
		closeBE()
		spk.Close()
		return nil, nil, err
	}
	return m, func() { m.Close(); closeBE(); spk.Close() }, nil
}

// maxRefSeconds is how much of a reference clip is embedded: a few seconds of speech already
// give the voice, and the speaker path's time grows with the clip.
const maxRefSeconds = 20

// MeanVC2FromClip makes a live MeanVC2 processor (MeanVC2Processor) into the voice of a
// reference clip (its first maxRefSeconds).
func MeanVC2FromClip(m *meanvc2.Model, clip []float32, rate int) (stream.Processor, error) {
	return fromClip(m, clip, rate, MeanVC2Processor)
}

// MeanVC2ReferenceFromClip is MeanVC2FromClip on the reference path (MeanVC2Reference), for
// offline conversion.
func MeanVC2ReferenceFromClip(m *meanvc2.Model, clip []float32, rate int) (stream.Processor, error) {
	return fromClip(m, clip, rate, MeanVC2Reference)
}

func fromClip(m *meanvc2.Model, clip []float32, rate int, make func(*meanvc2.Model, meanvc2.Timbre) (stream.Processor, error)) (stream.Processor, error) {
	if n := maxRefSeconds * rate; rate > 0 && len(clip) > n {
		clip = clip[:n]
	}
	target, err := m.VoiceFromClip(clip, rate)
	if err != nil {
		return nil, err
	}
	return make(m, target)
}

// MeanVC2Voices makes MeanVC2 processors whose target voice is a reference clip: a voice
// library entry, or the operator's default (a path to an audio file of a format
// dsp/audiofile reads, or a library entry). Embeddings are cached by clip content
// (Model.Embeddings), so a voice is embedded once.
type MeanVC2Voices struct {
	Model      *meanvc2.Model
	Library    *library.Library
	DefaultRef string
	// Shared is how the model's sessions run together (MeanVC2Shared), given to its
	// processors (ProcessorInfo.Shared).
	Shared stream.Shared
}

// Processor makes a MeanVC2 processor for ref ("" for the default), which must be one of
// owner's voices. Errors say what the client did wrong: an unknown ref wraps
// stream.ErrUnknownVoice, an unusable clip or no ref at all stream.ErrBadParams. The
// operator's default is named "the default voice" in errors, never by its path.
func (v *MeanVC2Voices) Processor(owner, ref string) (stream.Processor, error) {
	var clip []float32
	var rate int
	var err error
	name := fmt.Sprintf("ref %q", ref)
	switch {
	case ref == "" && v.DefaultRef == "":
		return nil, stream.Mark(errors.New(`voice meanvc2 needs a target voice: send "ref" (a voice library id or name; upload a clip with POST /v1/voices), or start the server with --vc-ref`), stream.ErrBadParams)
	case ref == "" && audiofile.HasAudioExt(v.DefaultRef):
		// Only the operator's default may be a file path; a client's ref is always looked
		// up in the library, so no session can name a file on the server.
		name = "the default voice"
		var a *audiofile.Audio
		if a, err = audiofile.ReadFile(v.DefaultRef, audiofile.FileLimits); err == nil {
			clip, rate = a.Mono(), a.SampleRate
		}
	default:
		// A client's ref must be one of owner's voices; the operator's default is used with
		// admin rights, also when a client names it and has no voice of that name.
		principal := owner
		if ref == "" {
			ref, principal, name = v.DefaultRef, auth.Admin, "the default voice"
		}
		clip, rate, err = v.Library.Clip(principal, ref)
		if errors.Is(err, library.ErrNotFound) && principal != auth.Admin && ref == v.DefaultRef {
			clip, rate, err = v.Library.Clip(auth.Admin, ref)
		}
		if errors.Is(err, library.ErrNotFound) {
			return nil, stream.Mark(fmt.Errorf("%s: %w (upload it with POST /v1/voices)", name, err), stream.ErrUnknownVoice)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p, err := MeanVC2FromClip(v.Model, clip, rate)
	switch {
	case errors.Is(err, meanvc2.ErrBadReference):
		return nil, stream.Mark(fmt.Errorf("%s: %w", name, err), stream.ErrBadParams)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if mp, ok := p.(*meanvc2Proc); ok {
		mp.info.Shared = v.Shared
	}
	return p, nil
}
