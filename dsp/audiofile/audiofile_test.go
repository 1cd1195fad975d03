package audiofile_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// The fixtures (testdata/README.md): speech_16k.wav is the reference; the others were made
// from it with sox. MP3, Ogg Opus and more FLAC are encoded at test time with tts/audioout
// (libmp3lame, libopus, our FLAC writer).
const (
	refWAV     = "testdata/speech_16k.wav"
	speech48k  = "../../testdata/speech_en_48k.wav"
	refFrames  = 22400 // 1.4 s at 16 kHz
	lossyCorr  = 0.9
	exactCorr  = 0.99
	searchLags = 2500
)

func readRef(t testing.TB, path string) *wav.Audio {
	t.Helper()
	a, err := wav.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// encode encodes mono x at rate with tts/audioout.
func encode(t testing.TB, encoding string, x []float32, rate int) []byte {
	t.Helper()
	out, err := audioout.EncodeClip(audioout.Format{Encoding: encoding, SampleRate: rate}, rate, x)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func channel(a *audiofile.Audio, c int) []float32 {
	out := make([]float32, a.Frames())
	for i := range out {
		out[i] = a.Data[i*a.Channels+c]
	}
	return out
}

// corrAt is the normalized correlation of ref[i] and got[i+lag] where both exist.
func corrAt(ref, got []float32, lag int) float64 {
	var sxy, sxx, syy float64
	for i := range ref {
		j := i + lag
		if j < 0 || j >= len(got) {
			continue
		}
		x, y := float64(ref[i]), float64(got[j])
		sxy += x * y
		sxx += x * x
		syy += y * y
	}
	if sxx == 0 || syy == 0 {
		return 0
	}
	return sxy / math.Sqrt(sxx*syy)
}

// align finds the lag (got behind ref) that best correlates them, from a loud stretch of
// ref, and returns it with the correlation over the whole overlap at that lag.
func align(ref, got []float32, maxLag int) (int, float64) {
	// The loudest 4096-sample window of ref.
	const win = 4096
	best, at := -1.0, 0
	for s := 0; s+win <= len(ref); s += win / 4 {
		var e float64
		for _, v := range ref[s : s+win] {
			e += float64(v) * float64(v)
		}
		if e > best {
			best, at = e, s
		}
	}
	seg := ref[at:min(at+win, len(ref))]
	bestLag, bestC := 0, -2.0
	for lag := -maxLag; lag <= maxLag; lag++ {
		var sxy, syy float64
		for i, x := range seg {
			j := at + i + lag
			if j < 0 || j >= len(got) {
				continue
			}
			sxy += float64(x) * float64(got[j])
			syy += float64(got[j]) * float64(got[j])
		}
		if syy == 0 {
			continue
		}
		if c := sxy / math.Sqrt(syy); c > bestC {
			bestC, bestLag = c, lag
		}
	}
	return bestLag, corrAt(ref, got, bestLag)
}

func decode(t *testing.T, data []byte) *audiofile.Audio {
	t.Helper()
	a, err := audiofile.Decode(data, audiofile.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Truncated {
		t.Errorf("%s: truncated", a.Format)
	}
	return a
}

func TestLosslessFixtures(t *testing.T) {
	ref := readRef(t, refWAV)
	a := decode(t, fixture(t, "speech_16k.wav"))
	if a.Format != audiofile.WAV || a.SampleRate != 16000 || a.Channels != 1 || a.Frames() != refFrames {
		t.Fatalf("wav: %s %d Hz %d ch %d frames", a.Format, a.SampleRate, a.Channels, a.Frames())
	}
	// sox: 24-bit stereo, left the reference, right −0.5 × it.
	f := decode(t, fixture(t, "speech_16k_stereo24.flac"))
	if f.Format != audiofile.FLAC || f.SampleRate != 16000 || f.Channels != 2 || f.Frames() != refFrames {
		t.Fatalf("flac: %s %d Hz %d ch %d frames", f.Format, f.SampleRate, f.Channels, f.Frames())
	}
	l, r := channel(f, 0), channel(f, 1)
	var maxErr float64
	for i, v := range ref.Data {
		maxErr = max(maxErr, math.Abs(float64(l[i]-v)), math.Abs(float64(r[i]+v/2)))
	}
	if maxErr > 1.0/(1<<15) {
		t.Errorf("flac differs from the reference by up to %g", maxErr)
	}
	if c := corrAt(ref.Data, f.Mono(), 0); c < exactCorr {
		t.Errorf("flac mono mix: correlation %.4f", c)
	}
}

func TestVorbisFixtures(t *testing.T) {
	ref := readRef(t, refWAV)
	a := decode(t, fixture(t, "speech_16k.ogg"))
	if a.Format != audiofile.Vorbis || a.SampleRate != 16000 || a.Channels != 1 || a.Frames() != refFrames {
		t.Fatalf("ogg: %s %d Hz %d ch %d frames, want %d", a.Format, a.SampleRate, a.Channels, a.Frames(), refFrames)
	}
	lag, c := align(ref.Data, a.Data, searchLags)
	t.Logf("vorbis 16 kHz: lag %d, correlation %.4f", lag, c)
	if lag != 0 || c < lossyCorr {
		t.Errorf("vorbis: lag %d, correlation %.4f", lag, c)
	}

	s := decode(t, fixture(t, "speech_44k_stereo.ogg"))
	if s.Format != audiofile.Vorbis || s.SampleRate != 44100 || s.Channels != 2 || s.Frames() != 61740 {
		t.Fatalf("stereo ogg: %s %d Hz %d ch %d frames", s.Format, s.SampleRate, s.Channels, s.Frames())
	}
	up, err := dsp.Resample(ref.Data, 16000, 44100)
	if err != nil {
		t.Fatal(err)
	}
	l, r := channel(s, 0), channel(s, 1)
	lag, c = align(up, l, searchLags)
	t.Logf("vorbis 44.1 kHz stereo: lag %d, correlation %.4f", lag, c)
	if c < lossyCorr {
		t.Errorf("stereo vorbis left: correlation %.4f", c)
	}
	// Right is half the left (sox remix 1v0.5).
	var el, er float64
	for i := range l {
		el += float64(l[i]) * float64(l[i])
		er += float64(r[i]) * float64(r[i])
	}
	if ratio := math.Sqrt(er / el); math.Abs(ratio-0.5) > 0.05 || corrAt(l, r, 0) < lossyCorr {
		t.Errorf("stereo vorbis right/left level %.3f, correlation %.3f", ratio, corrAt(l, r, 0))
	}
}

func TestFLACFromOurEncoder(t *testing.T) {
	ref := readRef(t, refWAV)
	a := decode(t, encode(t, audioout.FLAC, ref.Data, 16000))
	if a.Format != audiofile.FLAC || a.SampleRate != 16000 || a.Channels != 1 || a.Frames() != refFrames {
		t.Fatalf("%s %d Hz %d ch %d frames", a.Format, a.SampleRate, a.Channels, a.Frames())
	}
	if c := corrAt(ref.Data, a.Data, 0); c < exactCorr {
		t.Errorf("correlation %.5f", c)
	}
	for i, v := range ref.Data {
		if d := math.Abs(float64(a.Data[i] - v)); d > 1.0/16384 {
			t.Fatalf("sample %d: %g, want %g", i, a.Data[i], v)
		}
	}
}

// lameInfoFrame makes a Xing/Info frame with a LAME extension, shaped like the frame after
// it (same MPEG version, rate, bitrate, mode), as LAME writes first when it can seek back.
func lameInfoFrame(t *testing.T, next []byte, spf, delay, padding int) []byte {
	t.Helper()
	h := append([]byte(nil), next[:4]...)
	h[2] &^= 0x02 // no padding slot
	version1 := h[1]>>3&3 == 3
	bitrates := map[bool][]int{true: {0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320}, false: {0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160}}
	rates := map[bool][]int{true: {44100, 48000, 32000}, false: {22050, 24000, 16000}}
	br, rate := bitrates[version1][h[2]>>4]*1000, rates[version1][h[2]>>2&3]
	size, side := 72*br/rate, 9
	if version1 {
		size, side = 144*br/rate, 17
	}
	if h[3]>>6 != 3 {
		t.Fatal("the test makes mono Info frames")
	}
	f := make([]byte, size)
	copy(f, h)
	at := 4 + side
	if h[1]&1 == 0 {
		at += 2
	}
	copy(f[at:], "Info")
	binary.BigEndian.PutUint32(f[at+4:], 0x0F) // frames, bytes, TOC, quality
	p := at + 8 + 4 + 4 + 100 + 4
	copy(f[p:], "LAME3.100")
	v := delay<<12 | padding
	f[p+21], f[p+22], f[p+23] = byte(v>>16), byte(v>>8), byte(v)
	_ = spf
	return f
}

func TestMP3(t *testing.T) {
	for _, c := range []struct {
		name string
		path string
		rate int
		spf  int
	}{
		{"MPEG-2 16 kHz", refWAV, 16000, 576},
		{"MPEG-1 48 kHz", speech48k, 48000, 1152},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := readRef(t, c.path)
			x := ref.Mono()
			mp3 := encode(t, audioout.MP3, x, c.rate)
			a := decode(t, mp3)
			if a.Format != audiofile.MP3 || a.SampleRate != c.rate || a.Channels != 1 {
				t.Fatalf("%s %d Hz %d ch", a.Format, a.SampleRate, a.Channels)
			}
			lag, corr := align(x, a.Data, searchLags)
			t.Logf("no Info frame: %d frames for %d, lag %d, correlation %.4f", a.Frames(), len(x), lag, corr)
			if corr < lossyCorr {
				t.Errorf("correlation %.4f after alignment", corr)
			}
			// Without gapless info the decoder's and encoder's delay stay (lag) and the
			// stream is whole frames long.
			if a.Frames() < len(x) || a.Frames() > len(x)+lag+c.spf {
				t.Errorf("%d frames for %d input samples and a lag of %d", a.Frames(), len(x), lag)
			}

			// The same stream behind a LAME Info frame: delay and padding are trimmed.
			encDelay := lag - 529
			padding := a.Frames() - len(x) - lag + 529
			tagged := append(lameInfoFrame(t, mp3, c.spf, encDelay, padding), mp3...)
			g := decode(t, tagged)
			glag, gcorr := align(x, g.Data, searchLags)
			t.Logf("LAME Info frame (delay %d, padding %d): %d frames, lag %d, correlation %.4f", encDelay, padding, g.Frames(), glag, gcorr)
			if g.Frames() != len(x) || glag != 0 || gcorr < lossyCorr {
				t.Errorf("gapless: %d frames for %d, lag %d, correlation %.4f", g.Frames(), len(x), glag, gcorr)
			}

			// An ID3v2 tag (larger than the detection window, as with cover art) first.
			id3 := append([]byte("ID3\x04\x00\x00"), syncsafe(200<<10)...)
			id3 = append(id3, make([]byte, 200<<10)...)
			d := decode(t, append(id3, mp3...))
			if d.Format != audiofile.MP3 || d.Frames() != a.Frames() {
				t.Errorf("behind an ID3 tag: %s, %d frames, want %d", d.Format, d.Frames(), a.Frames())
			}
		})
	}
}

func syncsafe(n int) []byte {
	return []byte{byte(n >> 21 & 0x7f), byte(n >> 14 & 0x7f), byte(n >> 7 & 0x7f), byte(n & 0x7f)}
}

func TestOggOpus(t *testing.T) {
	ref := readRef(t, speech48k)
	x := ref.Mono()
	a := decode(t, encode(t, audioout.Opus, x, 48000))
	if a.Format != audiofile.Opus || a.SampleRate != 48000 || a.Channels != 1 {
		t.Fatalf("%s %d Hz %d ch", a.Format, a.SampleRate, a.Channels)
	}
	lag, c := align(x, a.Data, searchLags)
	t.Logf("opus: %d frames for %d, lag %d, correlation %.4f", a.Frames(), len(x), lag, c)
	if c < lossyCorr || lag < -10 || lag > 10 {
		t.Errorf("lag %d, correlation %.4f", lag, c)
	}
	if d := a.Frames() - len(x); d < 0 || d >= 960 {
		t.Errorf("%d frames for %d input samples: want the input padded to a whole 20 ms frame", a.Frames(), len(x))
	}

	// From 16 kHz: libopusfile decodes at 48 kHz.
	ref16 := readRef(t, refWAV)
	b := decode(t, encode(t, audioout.Opus, ref16.Data, 16000))
	if b.SampleRate != 48000 || math.Abs(b.Duration().Seconds()-1.4) > 0.02 {
		t.Errorf("opus from 16 kHz: %d Hz, %v", b.SampleRate, b.Duration())
	}
}

func TestFLACBehindID3(t *testing.T) {
	id3 := append([]byte("ID3\x03\x00\x00"), syncsafe(100)...)
	id3 = append(id3, make([]byte, 100)...)
	a := decode(t, append(id3, fixture(t, "speech_16k_stereo24.flac")...))
	if a.Format != audiofile.FLAC || a.Frames() != refFrames {
		t.Errorf("%s, %d frames", a.Format, a.Frames())
	}
}

func TestUnknownAndUnsupported(t *testing.T) {
	ogg := fixture(t, "speech_16k.ogg")
	oggFLAC := append([]byte(nil), ogg...)
	copy(oggFLAC[28:], "\x7fFLAC\x01\x00") // the BOS packet of another codec (CRC not rechecked by detection)
	for _, c := range []struct {
		name string
		data []byte
		want error
		msg  string
	}{
		{"empty", nil, audiofile.ErrUnknownFormat, audiofile.Accepted},
		{"text", []byte("hello, this is not audio"), audiofile.ErrUnknownFormat, audiofile.Accepted},
		{"AIFF", []byte("FORM\x00\x00\x00\x10AIFFCOMM"), audiofile.ErrUnknownFormat, audiofile.Accepted},
		{"RIFF AVI", []byte("RIFF\x10\x00\x00\x00AVI LIST"), audiofile.ErrUnknownFormat, audiofile.Accepted},
		{"broken WAV", []byte("RIFF\x10\x00\x00\x00WAVEjunk"), audiofile.ErrCorrupt, "wav:"},
		{"layer II", []byte{0xFF, 0xFD, 0x90, 0xC4, 0, 0, 0, 0}, audiofile.ErrUnsupported, "layer II"},
		{"Ogg FLAC", oggFLAC, audiofile.ErrUnsupported, "FLAC"},
		{"ID3 then junk", append(append([]byte("ID3\x03\x00\x00"), syncsafe(4)...), "abcdxxxxxxxxxxxx"...), audiofile.ErrUnknownFormat, "ID3"},
		{"ID3 cut off", append([]byte("ID3\x03\x00\x00"), syncsafe(1000)...), audiofile.ErrCorrupt, "ID3"},
		{"fLaC only", []byte("fLaC"), audiofile.ErrCorrupt, "FLAC"},
		{"OggS only", []byte("OggS\x00"), audiofile.ErrCorrupt, "Ogg"},
	} {
		_, err := audiofile.Decode(c.data, audiofile.Limits{})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %v mentioning %q", c.name, err, c.want, c.msg)
		}
	}
}

func TestLimits(t *testing.T) {
	ref := readRef(t, refWAV)
	files := map[string][]byte{
		"wav":    fixture(t, "speech_16k.wav"),
		"flac":   fixture(t, "speech_16k_stereo24.flac"),
		"vorbis": fixture(t, "speech_16k.ogg"),
		"mp3":    encode(t, audioout.MP3, ref.Data, 16000),
		"opus":   encode(t, audioout.Opus, ref.Data, 16000),
	}
	for name, data := range files {
		if _, err := audiofile.Decode(data, audiofile.Limits{MaxSeconds: 1.4}); err != nil && name != "mp3" && name != "opus" {
			t.Errorf("%s: exactly 1.4 s refused by a 1.4 s limit: %v", name, err)
		}
		if _, err := audiofile.Decode(data, audiofile.Limits{MaxSeconds: 0.5}); !errors.Is(err, audiofile.ErrTooLong) || !strings.Contains(err.Error(), "0.5 s limit") {
			t.Errorf("%s: 0.5 s limit: %v", name, err)
		}
		if _, err := audiofile.Decode(data, audiofile.Limits{MaxSamples: 8000}); !errors.Is(err, audiofile.ErrTooLarge) {
			t.Errorf("%s: 8000-sample limit: %v", name, err)
		}
		if _, err := audiofile.Decode(data, audiofile.Limits{MaxBytes: int64(len(data) - 1)}); !errors.Is(err, audiofile.ErrTooLarge) {
			t.Errorf("%s: byte limit (in memory): %v", name, err)
		}
		// A stream of unknown length is cut at the limit, whatever the format.
		if _, err := audiofile.Read(io.MultiReader(bytes.NewReader(data)), audiofile.Limits{MaxBytes: int64(len(data) / 2)}); !errors.Is(err, audiofile.ErrTooLarge) {
			t.Errorf("%s: byte limit (stream): %v", name, err)
		}
		if a, err := audiofile.Read(io.MultiReader(bytes.NewReader(data)), audiofile.Limits{MaxBytes: int64(len(data))}); err != nil || a.Frames() == 0 {
			t.Errorf("%s: stream of exactly the byte limit: %v", name, err)
		}
	}
	path := filepath.Join(t.TempDir(), "x.flac")
	if err := os.WriteFile(path, files["flac"], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := audiofile.ReadFile(path, audiofile.Limits{MaxBytes: 1000}); !errors.Is(err, audiofile.ErrTooLarge) || !strings.Contains(err.Error(), path) {
		t.Errorf("ReadFile over the byte limit: %v", err)
	}
	if a, err := audiofile.ReadFile(path, audiofile.FileLimits); err != nil || a.Format != audiofile.FLAC {
		t.Errorf("ReadFile: %v", err)
	}
	if _, err := audiofile.ReadFile(filepath.Join(t.TempDir(), "missing.mp3"), audiofile.FileLimits); err == nil || !os.IsNotExist(errors.Unwrap(err)) && !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
}

// A file cut short decodes to the audio before the cut (marked truncated where the
// decoder can tell) or fails cleanly; it never panics.
func TestTruncatedFiles(t *testing.T) {
	ref := readRef(t, refWAV)
	files := map[string][]byte{
		"wav":    fixture(t, "speech_16k.wav"),
		"flac":   fixture(t, "speech_16k_stereo24.flac"),
		"vorbis": fixture(t, "speech_16k.ogg"),
		"mp3":    encode(t, audioout.MP3, ref.Data, 16000),
		"opus":   encode(t, audioout.Opus, ref.Data, 16000),
	}
	for name, data := range files {
		for _, frac := range []float64{0.1, 0.5, 0.9} {
			cut := data[:int(float64(len(data))*frac)]
			a, err := audiofile.Decode(cut, audiofile.Limits{})
			if err != nil {
				t.Logf("%s cut at %.0f%%: %v", name, frac*100, err)
				continue
			}
			full := float64(refFrames) / 16000
			if got := a.Duration().Seconds(); got >= full {
				t.Errorf("%s cut at %.0f%%: %.2f s, the whole file is %.2f s", name, frac*100, got, full)
			}
			if (name == "wav" || name == "flac" || name == "vorbis") && !a.Truncated {
				t.Errorf("%s cut at %.0f%%: not marked truncated", name, frac*100)
			}
		}
	}
}

func TestHasAudioExt(t *testing.T) {
	for p, want := range map[string]bool{"a.wav": true, "/x/B.FLAC": true, "c.ogg": true, "d.opus": true, "e.mp3": true,
		"f.oga": true, "voice-name": false, "v_0123456789abcdef": false, "g.txt": false, "h.wav.json": false} {
		if audiofile.HasAudioExt(p) != want {
			t.Errorf("HasAudioExt(%q) = %v", p, !want)
		}
	}
}

// FuzzDecode feeds arbitrary bytes to the detector and every decoder: no panic, no
// unbounded work, and either a sentinel error or audio within the limits.
func FuzzDecode(f *testing.F) {
	ref := readRef(f, refWAV)
	short := ref.Data[:4000]
	// Small seeds keep each run (and the minimizing of new inputs) quick: the Ogg files
	// cut after their headers and a little audio.
	f.Add(fixture(f, "speech_16k.ogg")[:5000])
	f.Add(fixture(f, "speech_44k_stereo.ogg")[:6000])
	f.Add(fixture(f, "speech_16k_stereo24.flac")[:6000])
	f.Add(fixture(f, "speech_16k.wav")[:2000])
	f.Add(encode(f, audioout.MP3, short, 16000))
	f.Add(encode(f, audioout.MP3, short, 44100))
	f.Add(encode(f, audioout.FLAC, short, 16000))
	f.Add(encode(f, audioout.Opus, short, 16000))
	f.Add(append(append([]byte("ID3\x04\x00\x00"), syncsafe(3)...), "abc\xff\xf3\x44\xc4"...))
	lim := audiofile.Limits{MaxBytes: 1 << 20, MaxSeconds: 10, MaxSamples: 1 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := audiofile.Decode(data, lim)
		if err != nil {
			for _, e := range []error{audiofile.ErrUnknownFormat, audiofile.ErrUnsupported, audiofile.ErrCorrupt, audiofile.ErrTooLarge, audiofile.ErrTooLong} {
				if errors.Is(err, e) {
					return
				}
			}
			t.Fatalf("error of no kind: %v", err)
		}
		if a.Channels < 1 || a.SampleRate < 1 || len(a.Data)%a.Channels != 0 {
			t.Fatalf("invalid audio: %s %d Hz %d ch %d samples", a.Format, a.SampleRate, a.Channels, len(a.Data))
		}
		if len(a.Data) > lim.MaxSamples || a.Duration().Seconds() > lim.MaxSeconds {
			t.Fatalf("over the limits: %d samples, %v", len(a.Data), a.Duration())
		}
		_ = a.Mono()
	})
}
