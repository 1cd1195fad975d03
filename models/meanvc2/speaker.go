package meanvc2

import (
	"errors"
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/internal/embcache"
)

// Reference-clip limits. WavLM needs 400 samples for one frame, but a speaker embedding from
// a fraction of a second is mostly noise: the statistics pooling wants a few dozen frames
// (1 s = 49 WavLM frames). Clips are embedded whole; callers trim long uploads.
const (
	MinReferenceSeconds = 1.0
	// SilencePeak is the largest |sample| below which a clip counts as silent.
	SilencePeak = 1e-4
)

// ErrBadReference is wrapped by every error about an unusable reference clip (as opposed to a
// failure of the model).
var ErrBadReference = errors.New("bad reference clip")

// SpeakerEmbedding embeds a reference clip (mono samples at rate Hz): resampled to 16 kHz if
// needed, WavLM-Large hidden states, ECAPA head. With Model.Embeddings set, a clip already
// embedded (same samples, rate and speaker weights) is not recomputed.
func (m *Model) SpeakerEmbedding(clip []float32, rate int) ([]float32, error) {
	if err := CheckReference(clip, rate); err != nil {
		return nil, err
	}
	compute := func() ([]float32, error) { return m.embed(clip, rate) }
	if m.Embeddings == nil {
		return compute()
	}
	emb, err := m.Embeddings.Get(embcache.Key(m.ID, clip, rate), compute)
	if err != nil {
		return nil, err
	}
	if len(emb) != m.Config.SpkDim {
		return nil, fmt.Errorf("meanvc2: speaker embedding: cached embedding of %d values, want %d", len(emb), m.Config.SpkDim)
	}
	return append([]float32(nil), emb...), nil
}

// VoiceFromClip is SpeakerEmbedding followed by Timbre: the target voice of a clip.
func (m *Model) VoiceFromClip(clip []float32, rate int) (Timbre, error) {
	spk, err := m.SpeakerEmbedding(clip, rate)
	if err != nil {
		return Timbre{}, err
	}
	return m.Timbre(spk)
}

// CheckReference reports why a clip cannot serve as a reference voice: no samples, a rate
// that is not positive, NaN or Inf samples, shorter than MinReferenceSeconds, or silent.
func CheckReference(clip []float32, rate int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("meanvc2: %w: %s", ErrBadReference, fmt.Sprintf(format, args...))
	}
	if rate <= 0 {
		return bad("sample rate %d Hz", rate)
	}
	if len(clip) == 0 {
		return bad("it is empty")
	}
	var peak float64
	for i, v := range clip {
		a := math.Abs(float64(v))
		if math.IsNaN(a) || math.IsInf(a, 0) {
			return bad("sample %d is %v: not audio", i, v)
		}
		peak = max(peak, a)
	}
	if sec := float64(len(clip)) / float64(rate); sec < MinReferenceSeconds {
		return bad("%.2f s long; at least %.1f s of speech is needed", sec, MinReferenceSeconds)
	}
	if peak < SilencePeak {
		return bad("it is silent (peak %.1e)", peak)
	}
	return nil
}

// embed runs the speaker path on a checked clip.
func (m *Model) embed(clip []float32, rate int) ([]float32, error) {
	wave := clip
	if sr := m.Config.Runtime.SampleRate; rate != sr {
		var err error
		if wave, err = dsp.Resample(clip, rate, sr); err != nil {
			return nil, fmt.Errorf("meanvc2: speaker embedding: resample %d → %d Hz: %w", rate, sr, err)
		}
	}
	// On the streams' backend the speaker path holds it and streams wait (a long clip on
	// the real model takes seconds); LoadWith gives it a backend of its own.
	m.speakerExec.Lock()
	defer m.speakerExec.Unlock()
	hidden, T, err := m.WavLM.Hidden(wave, m.layers)
	if err != nil {
		return nil, fmt.Errorf("meanvc2: speaker embedding: %w", err)
	}
	emb, err := m.ECAPA.EmbedLayers(hidden, T)
	if err != nil {
		return nil, fmt.Errorf("meanvc2: speaker embedding: %w", err)
	}
	for _, v := range emb {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, errors.New("meanvc2: speaker embedding is not finite")
		}
	}
	return emb, nil
}
