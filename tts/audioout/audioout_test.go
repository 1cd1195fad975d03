package audioout

import (
	"bytes"
	"encoding/binary"
	"io"
	"log"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hajimehoshi/go-mp3"
	"github.com/mewkiz/flac"
	"gopkg.in/hraban/opus.v2"
)

func sine(rate int, hz, amp float64, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(amp * math.Sin(2*math.Pi*hz*float64(i)/float64(rate)))
	}
	return x
}

// encodeInPieces feeds src in uneven pieces, as a synthesizer would.
func encodeInPieces(t *testing.T, f Format, src []float32, srcRate int) []byte {
	t.Helper()
	e, err := NewEncoder(f, srcRate)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for i, n := 0, 0; i < len(src); i += n {
		n = min(len(src)-i, 1000+i%777)
		if out, err = e.Encode(out, src[i:i+n]); err != nil {
			t.Fatal(err)
		}
	}
	if out, err = e.Flush(out); err != nil {
		t.Fatal(err)
	}
	return out
}

// tone measures the frequency (zero crossings) and RMS of the middle half of x.
func tone(x []float64, rate int) (hz, rms float64) {
	x = x[len(x)/4 : 3*len(x)/4]
	cross := 0
	for i := 1; i < len(x); i++ {
		if (x[i-1] < 0) != (x[i] < 0) {
			cross++
		}
		rms += x[i] * x[i]
	}
	return float64(cross) / 2 / (float64(len(x)) / float64(rate)), math.Sqrt(rms / float64(len(x)))
}

func TestPCMAndMuLaw(t *testing.T) {
	src := sine(44100, 440, 0.5, 44100)
	for _, rate := range []int{8000, 16000, 24000, 48000} {
		pcm := encodeInPieces(t, Format{Encoding: PCM, SampleRate: rate}, src, 44100)
		if want := rate; math.Abs(float64(len(pcm)/2-want)) > float64(want)/100 {
			t.Errorf("pcm %d Hz: %d samples for 1 s", rate, len(pcm)/2)
		}
		x := make([]float64, len(pcm)/2)
		for i := range x {
			x[i] = float64(int16(binary.LittleEndian.Uint16(pcm[2*i:]))) / 32768
		}
		if hz, rms := tone(x, rate); math.Abs(hz-440) > 2 || math.Abs(rms-0.5/math.Sqrt2) > 0.01 {
			t.Errorf("pcm %d Hz: tone %.1f Hz rms %.3f", rate, hz, rms)
		}
	}
	mu := encodeInPieces(t, Format{Encoding: MuLaw}, src, 44100)
	x := make([]float64, len(mu))
	for i, b := range mu {
		x[i] = float64(MuLawToLinear(b)) / 32768
	}
	if hz, rms := tone(x, 8000); math.Abs(hz-440) > 2 || math.Abs(rms-0.5/math.Sqrt2) > 0.01 {
		t.Errorf("mulaw: tone %.1f Hz rms %.3f", hz, rms)
	}
	// G.711 reference points: silence, the largest codes, and sox's decoder agreeing.
	if linearToMuLaw(0) != 0xFF || linearToMuLaw(32767) != 0x80 || linearToMuLaw(-32768) != 0x00 {
		t.Errorf("mulaw codes: 0→%#x max→%#x min→%#x", linearToMuLaw(0), linearToMuLaw(32767), linearToMuLaw(-32768))
	}
	for v := -32768; v < 32768; v += 7 {
		got := int(MuLawToLinear(linearToMuLaw(int16(v))))
		if d := math.Abs(float64(got - v)); d > math.Max(8, math.Abs(float64(v))/16) {
			t.Fatalf("mulaw round trip %d → %d", v, got)
		}
	}
	if sox, err := exec.LookPath("sox"); err == nil {
		dir := t.TempDir()
		raw, wav := filepath.Join(dir, "a.ul"), filepath.Join(dir, "a.wav")
		os.WriteFile(raw, mu, 0o644)
		if out, err := exec.Command(sox, "-t", "ul", "-r", "8000", "-c", "1", raw, "-b", "16", "-e", "signed-integer", wav).CombinedOutput(); err != nil {
			t.Fatalf("sox: %v %s", err, out)
		}
		data, _ := os.ReadFile(wav)
		data = data[44:]
		for i := 0; i < min(len(mu), len(data)/2); i++ {
			if s := int16(binary.LittleEndian.Uint16(data[2*i:])); s != MuLawToLinear(mu[i]) {
				t.Fatalf("sample %d: sox decodes %d, we %d", i, s, MuLawToLinear(mu[i]))
			}
		}
	}
}

func TestWAVHeader(t *testing.T) {
	w := encodeInPieces(t, Format{Encoding: WAV, SampleRate: 16000}, sine(16000, 300, 0.3, 1600), 16000)
	if string(w[:4]) != "RIFF" || string(w[8:16]) != "WAVEfmt " || binary.LittleEndian.Uint32(w[24:]) != 16000 || len(w) != 44+3200 {
		t.Errorf("wav header %q, %d bytes", w[:44], len(w))
	}
}

func TestOggOpusDecodes(t *testing.T) {
	src := sine(44100, 440, 0.5, 44100)
	for _, rate := range []int{48000, 16000} {
		ogg := encodeInPieces(t, Format{Encoding: Opus, SampleRate: rate}, src, 44100)
		s, err := opus.NewStream(bytes.NewReader(ogg))
		if err != nil {
			t.Fatalf("%d Hz: opusfile refuses the stream: %v", rate, err)
		}
		var x []float64
		buf := make([]float32, 5760)
		for {
			n, err := s.ReadFloat32(buf)
			if err == io.EOF || n == 0 {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range buf[:n] {
				x = append(x, float64(v))
			}
		}
		s.Close()
		// opusfile decodes at 48 kHz and honours pre-skip and the final granule position.
		if math.Abs(float64(len(x)-48000)) > 960 {
			t.Errorf("%d Hz: decoded %d samples at 48 kHz for 1 s", rate, len(x))
		}
		if hz, rms := tone(x, 48000); math.Abs(hz-440) > 3 || math.Abs(rms-0.5/math.Sqrt2) > 0.05 {
			t.Errorf("%d Hz: tone %.1f Hz rms %.3f", rate, hz, rms)
		}
	}
	// A corrupted byte breaks the page CRC: the decoder must notice.
	ogg := encodeInPieces(t, Format{Encoding: Opus}, src, 44100)
	ogg[len(ogg)/2] ^= 0x55
	if s, err := opus.NewStream(bytes.NewReader(ogg)); err == nil {
		n, total := 0, 0
		buf := make([]float32, 5760)
		for {
			if n, err = s.ReadFloat32(buf); err != nil || n == 0 {
				break
			}
			total += n
		}
		if total >= 48000-960 {
			t.Errorf("corrupt page not detected (%d samples decoded)", total)
		}
	}
}

func TestFormatValidate(t *testing.T) {
	for _, f := range []Format{{Encoding: "aac"}, {Encoding: PCM, SampleRate: 11025}, {Encoding: Opus, SampleRate: 44100}} {
		if err := f.Validate(); err == nil {
			t.Errorf("%+v accepted", f)
		}
	}
	f := Format{}
	if err := f.Validate(); err != nil || f.Encoding != PCM || f.SampleRate != 24000 {
		t.Errorf("defaults: %+v %v", f, err)
	}
}

// MP3: a 440 Hz tone fed in uneven pieces decodes (with an independent decoder) to the same
// tone at the same level, as long as the input within the codec's padding, and every rate a
// client may ask for is accepted.
func TestMP3(t *testing.T) {
	const srcRate = 44100
	src := sine(srcRate, 440, 0.5, srcRate) // 1 s
	f := Format{Encoding: MP3}
	if err := f.Validate(); err != nil || f.SampleRate != 24000 {
		t.Fatalf("default MP3 format %+v: %v", f, err)
	}
	out := encodeInPieces(t, f, src, srcRate)
	if f.ContentType() != "audio/mpeg" || len(out) < 4 || out[0] != 0xFF || out[1]&0xE0 != 0xE0 {
		t.Fatalf("not an MP3 frame stream: % x", out[:min(len(out), 4)])
	}
	dec, err := mp3.NewDecoder(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if dec.SampleRate() != 24000 {
		t.Fatalf("decoded rate %d", dec.SampleRate())
	}
	pcm, err := io.ReadAll(dec) // 16-bit stereo little-endian
	if err != nil {
		t.Fatal(err)
	}
	n := len(pcm) / 4
	got := make([]float64, n)
	for i := range got {
		got[i] = float64(int16(binary.LittleEndian.Uint16(pcm[4*i:]))) / 32768
	}
	if n < 24000 || n > 24000+4*1152 {
		t.Errorf("%d samples decoded for 1 s at 24 kHz", n)
	}
	// Level and pitch over the middle: RMS of 0.5·sin is 0.354; zero crossings give 440 Hz.
	mid := got[n/4 : 3*n/4]
	var ss float64
	cross := 0
	for i, v := range mid {
		ss += v * v
		if i > 0 && (mid[i-1] < 0) != (v < 0) {
			cross++
		}
	}
	rms := math.Sqrt(ss / float64(len(mid)))
	hz := float64(cross) / 2 / (float64(len(mid)) / 24000)
	if math.Abs(rms-0.354) > 0.03 || math.Abs(hz-440) > 5 {
		t.Errorf("decoded tone: RMS %.3f (want 0.354), %.1f Hz (want 440)", rms, hz)
	}
	for _, rate := range mp3Rates {
		if _, err := NewEncoder(Format{Encoding: MP3, SampleRate: rate}, srcRate); err != nil {
			t.Errorf("%d Hz: %v", rate, err)
		}
	}
	if err := (&Format{Encoding: MP3, SampleRate: 12345}).Validate(); err == nil {
		t.Error("12345 Hz accepted")
	}
}

// FLAC is lossless: an independent decoder gives back exactly the 16-bit samples, across
// whole 4096-sample frames and the short last one, at every rate a client may ask for; the
// predictor and Rice coding make speech-like audio smaller than PCM.
func TestFLAC(t *testing.T) {
	log.SetOutput(io.Discard) // the decoder logs about rates its own tests lack
	defer log.SetOutput(os.Stderr)
	for _, rate := range []int{8000, 24000, 48000} {
		src := sine(rate, 220, 0.3, rate*3/2+123) // 1.5 s: frames of 4096 and a short one
		for i := range src {
			src[i] += float32(0.3 * math.Sin(float64(i)*0.37)) // and something less regular
		}
		f := Format{Encoding: FLAC, SampleRate: rate}
		out := encodeInPieces(t, f, src, rate)
		if f.ContentType() != "audio/flac" || string(out[:4]) != "fLaC" {
			t.Fatalf("not a FLAC stream: %q", out[:min(len(out), 4)])
		}
		stream, err := flac.New(bytes.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		if int(stream.Info.SampleRate) != rate || stream.Info.NChannels != 1 || stream.Info.BitsPerSample != 16 {
			t.Fatalf("STREAMINFO %+v", stream.Info)
		}
		var got []int32
		for {
			fr, err := stream.ParseNext()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%d Hz: frame after %d samples: %v", rate, len(got), err)
			}
			got = append(got, fr.Subframes[0].Samples...)
		}
		if len(got) != len(src) {
			t.Fatalf("%d Hz: %d samples decoded, %d encoded", rate, len(got), len(src))
		}
		for i, v := range src {
			if got[i] != int32(toInt16(v)) {
				t.Fatalf("%d Hz: sample %d decoded as %d, was %d", rate, i, got[i], toInt16(v))
			}
		}
		if len(out) >= 2*len(src) {
			t.Errorf("%d Hz: %d bytes for %d samples: no smaller than PCM", rate, len(out), len(src))
		}
	}
}
