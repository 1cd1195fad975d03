package dsp

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"testing"
)

// Helpers shared by voice_test.go and pitch_test.go.

// vtFormant is one resonance of the synthetic vocal tract.
type vtFormant struct{ freq, bw float64 }

// vtDefaultFormants is a neutral vowel-like tract.
var vtDefaultFormants = []vtFormant{{600, 90}, {1300, 110}, {2500, 160}}

// vtVoiced synthesises a voiced signal: a pulse train at f0 Hz with a slow
// vibrato of vib semitones (peak) at 5 Hz, shaped by a glottal low-pass and a
// cascade of two-pole resonators, normalised to peak 0.5.
func vtVoiced(sr int, f0, dur, vib float64, formants []vtFormant) []float32 {
	n := int(dur * float64(sr))
	exc := make([]float64, n+2)
	phase := 0.9
	for i := 0; i < n; i++ {
		t := float64(i) / float64(sr)
		f := f0 * math.Exp2(vib*math.Sin(2*math.Pi*5*t)/12)
		phase += f / float64(sr)
		if phase >= 1 {
			phase--
			// The pulse falls phase*sr/f samples before sample i+1.
			frac := 1 - phase*float64(sr)/f
			if frac < 0 {
				frac = 0
			}
			exc[i] += 1 - frac
			exc[i+1] += frac
		}
	}
	y := vtFilter(exc[:n], float64(sr), formants)
	vtNormalise(y, 0.5)
	return vtY32(y)
}

// vtFilter applies a glottal-like low-pass (two one-pole stages at 300 Hz)
// and the resonators.
func vtFilter(x []float64, sr float64, formants []vtFormant) []float64 {
	y := append([]float64(nil), x...)
	a := math.Exp(-2 * math.Pi * 300 / sr)
	for stage := 0; stage < 2; stage++ {
		var s float64
		for i := range y {
			s = (1-a)*y[i] + a*s
			y[i] = s
		}
	}
	for _, fm := range formants {
		r := math.Exp(-math.Pi * fm.bw / sr)
		c := 2 * r * math.Cos(2*math.Pi*fm.freq/sr)
		g := 1 - c + r*r // unit gain at DC
		var y1, y2 float64
		for i := range y {
			v := g*y[i] + c*y1 - r*r*y2
			y2, y1 = y1, v
			y[i] = v
		}
	}
	return y
}

func vtNormalise(y []float64, peak float64) {
	var m float64
	for _, v := range y {
		m = math.Max(m, math.Abs(v))
	}
	if m > 0 {
		for i := range y {
			y[i] *= peak / m
		}
	}
}

func vtY32(y []float64) []float32 {
	out := make([]float32, len(y))
	for i, v := range y {
		out[i] = float32(v)
	}
	return out
}

// vtSine is a sine at f Hz, amplitude amp.
func vtSine(sr int, f, dur, amp float64) []float32 {
	n := int(dur * float64(sr))
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(amp * math.Sin(2*math.Pi*f*float64(i)/float64(sr)))
	}
	return out
}

// vtReadWAV parses a PCM 16-bit WAV file (first channel) into float32.
func vtReadWAV(t testing.TB, path string) ([]float32, int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	x, sr, err := vtParseWAV(b)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return x, sr
}

func vtParseWAV(b []byte) ([]float32, int, error) {
	if len(b) < 12 || string(b[0:4]) != "RIFF" || string(b[8:12]) != "WAVE" {
		return nil, 0, fmt.Errorf("not a RIFF/WAVE file")
	}
	var sr, channels, bits int
	var data []byte
	for off := 12; off+8 <= len(b); {
		id := string(b[off : off+4])
		size := int(binary.LittleEndian.Uint32(b[off+4:]))
		body := b[off+8:]
		if size > len(body) {
			size = len(body)
		}
		body = body[:size]
		switch id {
		case "fmt ":
			if size < 16 {
				return nil, 0, fmt.Errorf("short fmt chunk")
			}
			if f := binary.LittleEndian.Uint16(body[0:]); f != 1 {
				return nil, 0, fmt.Errorf("format %d, want PCM", f)
			}
			channels = int(binary.LittleEndian.Uint16(body[2:]))
			sr = int(binary.LittleEndian.Uint32(body[4:]))
			bits = int(binary.LittleEndian.Uint16(body[14:]))
		case "data":
			data = body
		}
		off += 8 + size + size&1
	}
	if sr == 0 || data == nil || bits != 16 || channels < 1 {
		return nil, 0, fmt.Errorf("need 16-bit PCM with fmt and data chunks (bits=%d)", bits)
	}
	frame := 2 * channels
	x := make([]float32, len(data)/frame)
	for i := range x {
		x[i] = float32(int16(binary.LittleEndian.Uint16(data[i*frame:]))) / 32768
	}
	return x, sr, nil
}

// vtProcess runs a fresh Voice at sr with the given params over x in one call.
func vtProcess(t testing.TB, sr int, pitch, formant float64, x []float32) ([]float32, *Voice) {
	t.Helper()
	v, err := NewVoice(sr)
	if err != nil {
		t.Fatal(err)
	}
	v.SetParams(pitch, formant)
	return v.Process(nil, x), v
}

func vtSemitones(ratio float64) float64 { return 12 * math.Log2(ratio) }

// vtLPC fits an order-p all-pole model to the long-term autocorrelation of
// x (decimated to about 8 kHz, pre-emphasised, Hann-windowed 32 ms frames)
// and returns the predictor polynomial and its sample rate.
func vtLPC(x []float32, sr int, order int) ([]float64, float64) {
	d := pitchDecimFactor(sr)
	y := pitchDecimate(x, d, pitchLowpass(d))
	fs := float64(sr) / float64(d)
	pe := make([]float64, len(y))
	for i := 1; i < len(y); i++ {
		pe[i] = float64(y[i]) - 0.9*float64(y[i-1])
	}
	fl := int(0.032 * fs)
	r := make([]float64, order+1)
	w := make([]float64, fl)
	for i := range w {
		w[i] = 0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(fl-1))
	}
	fr := make([]float64, fl)
	for s := 0; s+fl <= len(pe); s += fl / 2 {
		for i := range fr {
			fr[i] = pe[s+i] * w[i]
		}
		for k := 0; k <= order; k++ {
			var acc float64
			for i := k; i < fl; i++ {
				acc += fr[i] * fr[i-k]
			}
			r[k] += acc
		}
	}
	r[0] *= 1 + 1e-6
	// Levinson-Durbin recursion.
	a := make([]float64, order+1)
	a[0] = 1
	e := r[0]
	tmp := make([]float64, order+1)
	for i := 1; i <= order; i++ {
		acc := r[i]
		for j := 1; j < i; j++ {
			acc += a[j] * r[i-j]
		}
		k := -acc / e
		copy(tmp, a)
		for j := 1; j < i; j++ {
			a[j] = tmp[j] + k*tmp[i-j]
		}
		a[i] = k
		e *= 1 - k*k
	}
	return a, fs
}

// vtEnvDB evaluates the all-pole envelope 1/|A| in dB at f Hz.
func vtEnvDB(a []float64, fs, f float64) float64 {
	wv := 2 * math.Pi * f / fs
	var re, im float64
	for k, ak := range a {
		re += ak * math.Cos(wv*float64(k))
		im -= ak * math.Sin(wv*float64(k))
	}
	return -10 * math.Log10(re*re+im*im)
}

// vtEnvelopeShift returns, in cents, the frequency scaling k that best maps the
// spectral envelope of ref onto that of x: it minimises the mean squared
// difference (after removing the mean level difference) between
// env_x(f) and env_ref(f/k) over 300–3000 Hz.
func vtEnvelopeShift(ref, x []float32, sr int) float64 {
	const order = 10
	aRef, fs := vtLPC(ref, sr, order)
	aX, _ := vtLPC(x, sr, order)
	var fx []float64
	var ex []float64
	for f := 300.0; f <= 3000; f *= math.Exp2(1.0 / 48) {
		fx = append(fx, f)
		ex = append(ex, vtEnvDB(aX, fs, f))
	}
	best, bestErr := 0.0, math.Inf(1)
	diff := make([]float64, len(fx))
	for c := -900.0; c <= 900; c += 5 {
		k := math.Exp2(c / 1200)
		var mean float64
		for i, f := range fx {
			diff[i] = ex[i] - vtEnvDB(aRef, fs, f/k)
			mean += diff[i]
		}
		mean /= float64(len(fx))
		var e float64
		for _, d := range diff {
			e += (d - mean) * (d - mean)
		}
		if e < bestErr {
			best, bestErr = c, e
		}
	}
	return best
}

// vtRMS is the RMS of x.
func vtRMS(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	if len(x) == 0 {
		return 0
	}
	return math.Sqrt(s / float64(len(x)))
}
