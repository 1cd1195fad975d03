package library

import (
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// encodeClip encodes mono x at rate with tts/audioout (libmp3lame, libopus, our FLAC).
func encodeClip(t *testing.T, encoding string, x []float32, rate int) []byte {
	t.Helper()
	out, err := audioout.EncodeClip(audioout.Format{Encoding: encoding, SampleRate: rate}, rate, x)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Uploads of FLAC, MP3, Ogg Opus and Ogg Vorbis clips are stored as mono 16-bit WAV, like
// WAV uploads, so everything that reads the library stays WAV-only.
func TestUploadOtherFormats(t *testing.T) {
	dir := t.TempDir()
	l, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, l)
	src, err := wav.Read(strings.NewReader(string(speechWAV(t))))
	if err != nil {
		t.Fatal(err)
	}
	x := src.Mono()
	vorbis, err := os.ReadFile(filepath.Join("..", "..", "dsp", "audiofile", "testdata", "speech_44k_stereo.ogg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		file  []byte
		rate  int
		exact bool // lossless: the stored clip is the source
	}{
		{"flac", encodeClip(t, audioout.FLAC, x, 48000), 48000, true},
		{"mp3", encodeClip(t, audioout.MP3, x, 48000), 48000, false},
		{"opus", encodeClip(t, audioout.Opus, x, 48000), 48000, false},
		{"vorbis", vorbis, 44100, false},
	} {
		code, v := upload(t, srv.URL, c.name, c.file)
		if code != http.StatusCreated {
			t.Errorf("%s: %d %v", c.name, code, v)
			continue
		}
		id := v["id"].(string)
		if int(v["sample_rate"].(float64)) != c.rate {
			t.Errorf("%s: sample_rate %v, want %d", c.name, v["sample_rate"], c.rate)
		}
		stored, err := wav.ReadFile(filepath.Join(dir, id+".wav"))
		if err != nil || stored.Channels != 1 || stored.BitsPerSample != 16 || stored.SampleRate != c.rate {
			t.Errorf("%s: stored clip: %v %+v", c.name, err, stored)
			continue
		}
		clip, rate, err := l.Clip(auth.Admin, c.name)
		if err != nil || rate != c.rate || len(clip) != stored.Frames() {
			t.Errorf("%s: Clip: %d samples at %d Hz, %v", c.name, len(clip), rate, err)
		}
		if c.exact {
			for i, s := range x {
				if math.Abs(float64(clip[i]-s)) > 1.0/16384 {
					t.Fatalf("%s: sample %d stored as %g, was %g", c.name, i, clip[i], s)
				}
			}
		}
		if secs := v["seconds"].(float64); math.Abs(secs-float64(len(x))/48000) > 0.1 && c.name != "vorbis" {
			t.Errorf("%s: %.2f s, source %.2f s", c.name, secs, float64(len(x))/48000)
		}
	}
	if n := len(l.List(auth.Admin)); n != 4 {
		t.Errorf("%d voices stored, want 4", n)
	}
}

func TestBadUploadsOtherFormats(t *testing.T) {
	l, _, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, l)
	tone := func(seconds float64) []float32 {
		x := make([]float32, int(seconds*16000))
		for i := range x {
			x[i] = float32(0.5 * math.Sin(float64(i)*0.1))
		}
		return x
	}
	flac := encodeClip(t, audioout.FLAC, tone(2), 16000)
	for _, c := range []struct {
		what string
		file []byte
		want int
		msg  string
	}{
		// 40 s of FLAC is small (a tone compresses well), but over the 30 s limit: decoding
		// stops there.
		{"long FLAC", encodeClip(t, audioout.FLAC, tone(40), 16000), 400, "limit"},
		{"long MP3", encodeClip(t, audioout.MP3, tone(40), 16000), 400, "limit"},
		{"cut-off FLAC header", flac[:30], 400, "cannot be read"},
		{"unknown format", []byte("OggS\x00\x02not really ogg at all........................"), 400, "Ogg"},
		{"AIFF", []byte("FORM\x00\x00\x00\x10AIFFCOMM"), 400, "not a WAV, FLAC"},
	} {
		code, out := upload(t, srv.URL, "x", c.file)
		if code != c.want || !strings.Contains(errMsg(out), c.msg) {
			t.Errorf("%s: %d %v, want %d mentioning %q", c.what, code, out, c.want, c.msg)
		}
	}
	if n := len(l.List(auth.Admin)); n != 0 {
		t.Errorf("bad uploads stored %d voices", n)
	}
}
