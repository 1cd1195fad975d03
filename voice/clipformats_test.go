package voice

import (
	"errors"
	"github.com/voxpipe/voxpipe/engine"
	"os"
	"path/filepath"
	"testing"

	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts/audioout"
	"github.com/voxpipe/voxpipe/voice/library"
)

// speechAs writes the speech fixture encoded as encoding to dir/name.
func speechAs(t *testing.T, dir, name, encoding string) (string, int) {
	t.Helper()
	in, err := wav.ReadFile(filepath.Join("..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := audioout.EncodeClip(audioout.Format{Encoding: encoding, SampleRate: 48000}, 48000, in.Mono())
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, in.Frames()
}

// The operator's voice files (serve --tts-voice) may be any format audiofile reads.
func TestVoiceFilesOfOtherFormats(t *testing.T) {
	dir := t.TempDir()
	flac, n := speechAs(t, dir, "narrator.flac", audioout.FLAC)
	mp3, _ := speechAs(t, dir, "narrator.mp3", audioout.MP3)
	s := Voices(nil, map[string]string{flac: flac, mp3: mp3})
	for _, p := range []string{flac, mp3} {
		clip, rate, err := s.Clip(auth.Admin, p)
		if err != nil || rate != 48000 || len(clip) < n {
			t.Errorf("%s: %d samples at %d Hz, %v", filepath.Base(p), len(clip), rate, err)
		}
	}
}

// --vc-ref may name a FLAC/Ogg/MP3 file: it is read as a file, not looked up in the library.
func TestMeanVC2DefaultRefOfOtherFormats(t *testing.T) {
	m, done, err := LoadMeanVC2(golden.Path(t, "meanvc2", "model.gguf"), engine.Placement{Backend: "cpu", Threads: 2}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	lib, _, err := library.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ogg, _ := speechAs(t, dir, "target.ogg", audioout.Opus)
	p, err := (&MeanVC2Voices{Model: m, Library: lib, DefaultRef: ogg}).Processor(auth.Admin, "")
	if err != nil {
		t.Fatalf("Ogg Opus default voice: %v", err)
	}
	stream.CloseProcessor(p)
	if !audiofile.HasAudioExt(ogg) {
		t.Fatal("HasAudioExt")
	}
	// A missing file of an audio extension is an error naming the default voice, not a
	// library lookup.
	_, err = (&MeanVC2Voices{Model: m, Library: lib, DefaultRef: filepath.Join(dir, "none.mp3")}).Processor(auth.Admin, "")
	if err == nil || errors.Is(err, library.ErrNotFound) {
		t.Errorf("missing default file: %v", err)
	}
}
