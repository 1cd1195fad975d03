package dsp

import (
	"math"
	"math/rand"
	"path/filepath"
	"testing"
)

// TestF0Synthetic: on clean synthetic voices EstimateF0 is accurate to well
// under 0.1 semitone, frame by frame, from 55 Hz to 700 Hz and 16–48 kHz.
func TestF0Synthetic(t *testing.T) {
	for _, sr := range []int{16000, 24000, 44100, 48000} {
		for _, f0 := range []float64{55, 82, 110, 150, 220, 330, 440, 700} {
			x := vtVoiced(sr, f0, 0.6, 0, vtDefaultFormants)
			f := EstimateF0(x, sr, 0.01)
			if want := int(math.Ceil(float64(len(x)) / (0.01 * float64(sr)))); len(f) != want {
				t.Fatalf("sr=%d: %d frames, want %d", sr, len(f), want)
			}
			var worst float64
			voiced := 0
			// Frames whose window lies inside the signal.
			for i := 5; i < len(f)-5; i++ {
				if f[i] == 0 {
					continue
				}
				voiced++
				worst = math.Max(worst, math.Abs(vtSemitones(f[i]/f0)))
			}
			if voiced < len(f)-12 {
				t.Errorf("sr=%d f0=%g: only %d of %d inner frames voiced", sr, f0, voiced, len(f)-10)
			}
			if worst > 0.1 {
				t.Errorf("sr=%d f0=%g: worst frame error %.3f st, want ≤ 0.1", sr, f0, worst)
			}
			med := MedianF0(x, sr)
			if e := math.Abs(vtSemitones(med / f0)); e > 0.03 {
				t.Errorf("sr=%d f0=%g: MedianF0 %.3f Hz (%.3f st off)", sr, f0, med, e)
			}
		}
	}
}

// TestF0Sine: a pure tone is measured exactly.
func TestF0Sine(t *testing.T) {
	for _, f0 := range []float64{65.4, 98, 261.6, 523.3} {
		x := vtSine(24000, f0, 0.5, 0.3)
		if got := MedianF0(x, 24000); math.Abs(vtSemitones(got/f0)) > 0.02 {
			t.Errorf("sine %g Hz: MedianF0 %.3f", f0, got)
		}
	}
}

// TestF0Vibrato: frames follow a vibrato (±1 semitone at 5 Hz).
func TestF0Vibrato(t *testing.T) {
	const sr, f0 = 24000, 180.0
	x := vtVoiced(sr, f0, 1, 1, vtDefaultFormants)
	f := EstimateF0(x, sr, 0.005)
	var worst float64
	for i := 8; i < len(f)-8; i++ {
		tt := float64(i) * 0.005
		// The synthesiser's phase runs at the instantaneous F0.
		want := f0 * math.Exp2(math.Sin(2*math.Pi*5*tt)/12)
		if f[i] == 0 {
			t.Fatalf("frame %d unvoiced", i)
		}
		worst = math.Max(worst, math.Abs(vtSemitones(f[i]/want)))
	}
	// A 30 ms window averages over a slope of up to ~1 st per 32 ms.
	if worst > 0.15 {
		t.Errorf("vibrato tracking worst error %.3f st", worst)
	}
}

// TestF0Unvoiced: silence and noise are unvoiced.
func TestF0Unvoiced(t *testing.T) {
	const sr = 24000
	if got := MedianF0(make([]float32, sr), sr); got != 0 {
		t.Errorf("silence: MedianF0 %g, want 0", got)
	}
	for _, f := range EstimateF0(make([]float32, sr), sr, 0.01) {
		if f != 0 {
			t.Fatalf("silence: voiced frame %g", f)
		}
	}
	rng := rand.New(rand.NewSource(3))
	noise := make([]float32, sr)
	for i := range noise {
		noise[i] = 0.2 * float32(rng.NormFloat64())
	}
	f := EstimateF0(noise, sr, 0.01)
	voiced := 0
	for _, v := range f {
		if v != 0 {
			voiced++
		}
	}
	if voiced > len(f)/20 {
		t.Errorf("white noise: %d of %d frames voiced", voiced, len(f))
	}
	if EstimateF0(nil, sr, 0.01) != nil || EstimateF0(noise, 0, 0.01) != nil || EstimateF0(noise, sr, 0) != nil {
		t.Error("degenerate input: want nil")
	}
}

// TestF0Timing: frame i describes the signal around i*hop.
func TestF0Timing(t *testing.T) {
	const sr = 24000
	a := vtVoiced(sr, 120, 0.5, 0, vtDefaultFormants)
	b := vtVoiced(sr, 240, 0.5, 0, vtDefaultFormants)
	x := append(a, b...)
	f := EstimateF0(x, sr, 0.02)
	for i, v := range f {
		tt := float64(i) * 0.02
		var want float64
		switch {
		case tt > 0.05 && tt < 0.45:
			want = 120
		case tt > 0.55 && tt < 0.95:
			want = 240
		default:
			continue
		}
		if math.Abs(vtSemitones(v/want)) > 0.1 {
			t.Errorf("frame %d (%.2f s): %.2f Hz, want %g", i, tt, v, want)
		}
	}
}

// TestF0Speech: the espeak-ng fixture has a plausible male F0 and voicing.
func TestF0Speech(t *testing.T) {
	x, sr := vtReadWAV(t, filepath.Join("..", "testdata", "speech_en_48k.wav"))
	f := EstimateF0(x, sr, 0.01)
	voiced := 0
	for _, v := range f {
		if v != 0 {
			voiced++
		}
	}
	med := MedianF0(x, sr)
	t.Logf("speech: %d frames, %d voiced, median F0 %.2f Hz", len(f), voiced, med)
	if med < 70 || med > 140 {
		t.Errorf("median F0 %.1f Hz, want a male voice (70–140)", med)
	}
	if frac := float64(voiced) / float64(len(f)); frac < 0.3 || frac > 0.85 {
		t.Errorf("voiced fraction %.2f", frac)
	}
	// Consistent across sample rates (decimated by averaging pairs).
	x24 := make([]float32, len(x)/2)
	for i := range x24 {
		x24[i] = 0.5 * (x[2*i] + x[2*i+1])
	}
	if m24 := MedianF0(x24, 24000); math.Abs(vtSemitones(m24/med)) > 0.05 {
		t.Errorf("median at 24 kHz %.2f vs %.2f at 48 kHz", m24, med)
	}
}
