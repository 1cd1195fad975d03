package miocodec

import (
	"errors"
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/dsp"
)

// Reference preparation constants (MANIFEST §3.16, MioTTS server limits).
const (
	// RefCodecRate is the rate the reference is normalised, trimmed and padded at.
	RefCodecRate = 44100
	// RefSSLRate is WavLM's input rate.
	RefSSLRate = 16000
	// RefMaxSeconds is how much of the reference is kept (its first 20 s).
	RefMaxSeconds = 20
	// RefMinPeak is the smallest peak accepted: quieter clips are silence (peak
	// normalisation would only amplify noise).
	RefMinPeak = 1e-4
	// refPeakEps is the reference's guard in x / (max|x| + eps).
	refPeakEps = 1e-8
	// refMinFrames is the fewest SSL frames the global encoder is given (its std pooling
	// needs more than one).
	refMinFrames = 2
)

// RefPrepared is a reference clip made ready for WavLM.
type RefPrepared struct {
	// Wave16k is the peak-normalised, trimmed, symmetrically padded clip at 16 kHz.
	Wave16k []float32
	// PadEachSide is the zeros added on each side at 44.1 kHz before resampling.
	PadEachSide int
	// Frames is the number of WavLM frames the padded clip gives (⌈L·16000/44100/hop⌉).
	Frames int
}

// refGeometry is the SSL hop and receptive field (samples at 16 kHz): 320 and 400 for the
// real conv stack.
type refGeometry struct{ hop, receptive int }

var refDefaultGeometry = refGeometry{hop: 320, receptive: 400}

// refPadding is MioCodec's _calculate_waveform_padding for l samples at rate sr: the frames
// T = ⌈l·16000/sr/hop⌉ and the zeros on each side, ⌈((hop·T + rf − hop)·sr/16000 − l)/2⌉,
// in exact integer arithmetic.
func refPadding(l, sr int, geo refGeometry) (pad, frames int) {
	num := int64(l) * RefSSLRate
	den := int64(sr) * int64(geo.hop)
	frames = int((num + den - 1) / den)
	need := (int64(geo.hop)*int64(frames) + int64(geo.receptive-geo.hop)) * int64(sr) // ×16000
	diff := need - int64(l)*RefSSLRate                                                // 2·pad·16000, rounded up
	pad = int(refCeilDiv(diff, 2*RefSSLRate))
	return max(pad, 0), frames
}

func refCeilDiv(a, b int64) int64 {
	if a >= 0 {
		return (a + b - 1) / b
	}
	return -((-a) / b)
}

// PrepareRef turns a mono clip at any rate into WavLM's input: resample to 44.1 kHz (the HQ
// resampler), peak-normalise, keep the first 20 s, pad symmetrically so the conv stack gives
// ⌈L16/320⌉ frames, and resample to 16 kHz exactly like torchaudio.
func PrepareRef(wave []float32, rate int) (*RefPrepared, error) {
	return refPrepare(wave, rate, refDefaultGeometry)
}

func refPrepare(wave []float32, rate int, geo refGeometry) (*RefPrepared, error) {
	if len(wave) == 0 {
		return nil, errors.New("miocodec: reference clip is empty")
	}
	if rate <= 0 {
		return nil, fmt.Errorf("miocodec: reference sample rate %d", rate)
	}
	for i, x := range wave {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("miocodec: reference sample %d is %v", i, x)
		}
	}
	x := wave
	if rate != RefCodecRate {
		var err error
		if x, err = dsp.Resample(x, rate, RefCodecRate); err != nil {
			return nil, fmt.Errorf("miocodec: reference %d → %d Hz: %w", rate, RefCodecRate, err)
		}
	}
	var peak float32
	for _, v := range x {
		peak = max(peak, float32(math.Abs(float64(v))))
	}
	if peak < RefMinPeak {
		return nil, fmt.Errorf("miocodec: reference clip is silent (peak %.3g < %g)", peak, RefMinPeak)
	}
	x = x[:min(len(x), RefMaxSeconds*RefCodecRate)]
	pad, frames := refPadding(len(x), RefCodecRate, geo)
	if frames < refMinFrames {
		return nil, fmt.Errorf("miocodec: reference clip of %d samples at %d Hz is too short (%.1f ms; at least %d SSL frames needed)",
			len(wave), rate, 1000*float64(len(wave))/float64(rate), refMinFrames)
	}
	// float32 like the reference: x / (max|x| + 1e-8) with both operands float32.
	den := peak + float32(refPeakEps)
	padded := make([]float32, len(x)+2*pad)
	for i, v := range x {
		padded[pad+i] = v / den
	}
	w16, err := dsp.ResampleTorchaudio(padded, RefCodecRate, RefSSLRate)
	if err != nil {
		return nil, fmt.Errorf("miocodec: reference %d → %d Hz: %w", RefCodecRate, RefSSLRate, err)
	}
	return &RefPrepared{Wave16k: w16, PadEachSide: pad, Frames: frames}, nil
}
