package miocodec

import (
	"testing"

	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

func TestRefPadding(t *testing.T) {
	for _, c := range []struct{ l, pad, frames int }{
		{110250, 111, 125}, // the golden clip: 40000 samples at 16 kHz
		{882, 110, 1},      // 320 samples at 16 kHz: one frame
		{883, 0, 2},
		{44100, 111, 50},
	} {
		pad, frames := refPadding(c.l, 44100, refDefaultGeometry)
		// Check the defining property rather than trusting hand numbers: the padded clip
		// resampled to 16 kHz reaches 320·T + 80 samples, and one pad less would not.
		need := 320*frames + 80
		out := func(p int) int { return (160*(c.l+2*p) + 440) / 441 }
		if frames != (c.l*16000+44100*320-1)/(44100*320) {
			t.Errorf("l=%d: frames %d", c.l, frames)
		}
		if out(pad)+1 < need || (pad > 0 && float64(pad-1) >= (float64(need)*44100/16000-float64(c.l))/2) {
			t.Errorf("l=%d: pad %d gives %d samples, need %d", c.l, pad, out(pad), need)
		}
		if c.l == 110250 && (pad != c.pad || frames != c.frames) {
			t.Errorf("golden clip: pad %d frames %d, want %d %d", pad, frames, c.pad, c.frames)
		}
	}
}

// The preparation alone against the golden 16 kHz WavLM input.
func TestRefPrepareGolden(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	raw, _, err := r.F32("global.ref_wave_raw")
	if err != nil {
		t.Fatal(err)
	}
	p, err := PrepareRef(raw, 44100)
	if err != nil {
		t.Fatal(err)
	}
	pad, _ := r.I32("global.pad_each_side")
	if p.PadEachSide != int(pad[0]) {
		t.Errorf("pad %d, want %d", p.PadEachSide, pad[0])
	}
	if p.Frames != 125 {
		t.Errorf("frames %d, want 125", p.Frames)
	}
	st := r.Check("global.wavlm_input_16k", p.Wave16k, globalTol)
	if !st.OK() {
		t.Error(st)
	}
	t.Log(st)
}

// Clips longer than 20 s keep their first 20 s; the peak is taken over the whole clip.
func TestRefTrim(t *testing.T) {
	long := make([]float32, 25*44100)
	for i := range long {
		long[i] = 0.1
	}
	long[len(long)-1] = 0.5 // beyond 20 s: sets the peak only
	p, err := PrepareRef(long, 44100)
	if err != nil {
		t.Fatal(err)
	}
	wantFrames := (20*44100*16000 + 44100*320 - 1) / (44100 * 320)
	if p.Frames != wantFrames {
		t.Errorf("frames %d, want %d (20 s)", p.Frames, wantFrames)
	}
	mid := p.Wave16k[len(p.Wave16k)/2]
	if d := mid - 0.2; d > 1e-3 || d < -1e-3 {
		t.Errorf("middle sample %v, want 0.1/0.5 = 0.2", mid)
	}
}
