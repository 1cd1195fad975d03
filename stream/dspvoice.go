package stream

import (
	"fmt"

	"github.com/voxpipe/voxpipe/dsp"
)

// DSPVoiceRate is the rate the embedded DSP voice runs at: wide enough for a natural voice,
// half the cost of 48 kHz.
const DSPVoiceRate = 24000

// Parameter ranges of the DSP voice.
const (
	MaxPitchSemitones = 12
	MaxFormantShift   = 6
)

// DSPVoice is the embedded voice: pitch shift in semitones with formant preservation and a
// separate formant shift. It takes any block size, so it runs in 2.5 ms chunks: a short chunk
// keeps the audio waiting for a full chunk, and so the latency, small.
type DSPVoice struct {
	v     *dsp.Voice
	zeros []float32
}

// NewDSPVoice returns the DSP voice with pitch and formant at 0.
func NewDSPVoice() (*DSPVoice, error) {
	v, err := dsp.NewVoice(DSPVoiceRate)
	if err != nil {
		return nil, err
	}
	return &DSPVoice{v: v, zeros: make([]float32, v.Latency())}, nil
}

// Info implements Processor.
func (d *DSPVoice) Info() ProcessorInfo {
	return ProcessorInfo{SampleRate: DSPVoiceRate, ChunkSize: DSPVoiceRate / 400, Latency: d.v.Latency()}
}

// Process implements Processor.
func (d *DSPVoice) Process(out, in []float32) ([]float32, error) { return d.v.Process(out, in), nil }

// Flush implements Processor: it pushes the held-back audio out with silence.
func (d *DSPVoice) Flush(out []float32) ([]float32, error) { return d.v.Process(out, d.zeros), nil }

// Reset implements Processor.
func (d *DSPVoice) Reset() { d.v.Reset() }

// SetParams implements Tunable: pitch_semitones (−12…12) and formant_shift (−6…6 semitones).
func (d *DSPVoice) SetParams(p map[string]float64) error {
	pitch, formant := d.v.Params()
	for k, x := range p {
		switch k {
		case "pitch_semitones":
			if x < -MaxPitchSemitones || x > MaxPitchSemitones || x != x {
				return fmt.Errorf("pitch_semitones %g is outside −%d…%d", x, MaxPitchSemitones, MaxPitchSemitones)
			}
			pitch = x
		case "formant_shift":
			if x < -MaxFormantShift || x > MaxFormantShift || x != x {
				return fmt.Errorf("formant_shift %g is outside −%d…%d", x, MaxFormantShift, MaxFormantShift)
			}
			formant = x
		default:
			return fmt.Errorf("unknown parameter %q (the dsp voice takes pitch_semitones and formant_shift)", k)
		}
	}
	d.v.SetParams(pitch, formant)
	return nil
}
