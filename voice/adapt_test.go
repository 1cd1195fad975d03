package voice

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice/library"
)

// A TTS request resolves its voice among the voices its owner can see: another owner's
// library voice, by id or by name, is an unknown voice, exactly like one that does not
// exist; the owner, the admin, the operator's files and the default (no voice named) work
// for everyone they should. Runs the tiny golden MioTTS end to end.
func TestMioTTSVoicesAreTheOwners(t *testing.T) {
	lm := golden.Path(t, "miotts", "model.gguf")
	codec := golden.Path(t, "miocodec", "model.gguf")
	be, err := engine.NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	m, err := miotts.Load(lm, codec, be, miotts.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	_, file, _, _ := runtime.Caller(0)
	fixture := filepath.Join(filepath.Dir(file), "..", "testdata", "speech_en_48k.wav")
	a, err := wav.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	var clip bytes.Buffer
	if err := wav.Write(&clip, a.Mono()[:3*a.SampleRate], a.SampleRate, 1); err != nil {
		t.Fatal(err)
	}
	lib, _, err := library.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const ownerA, ownerB = "k_aaaaaaaaaaaaaaaa", "k_bbbbbbbbbbbbbbbb"
	va, err := lib.Add(ownerA, "alice", clip.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	m.DefaultVoice = "ref"
	synth := MioTTS(m, Voices(lib, map[string]string{"ref": fixture}))

	say := func(owner, voice string) error {
		var samples int
		err := synth.Synthesize(context.Background(), stream.SynthRequest{Text: "Hello.", Voice: voice, Owner: owner, MaxTokens: 8},
			func(c stream.SynthChunk) error { samples += len(c.Samples); return nil })
		if err == nil && samples == 0 {
			t.Errorf("owner %q voice %q: no audio", owner, voice)
		}
		return err
	}
	for _, c := range []struct{ owner, voice string }{
		{ownerB, va.ID}, {ownerB, "alice"}, {"", va.ID}, {"", "alice"}, {ownerB, "v_0000000000000000"},
	} {
		if err := say(c.owner, c.voice); !errors.Is(err, stream.ErrUnknownVoice) {
			t.Errorf("owner %q voice %q: %v, want ErrUnknownVoice", c.owner, c.voice, err)
		}
	}
	for _, c := range []struct{ owner, voice string }{
		{ownerA, va.ID}, {ownerA, "alice"}, {auth.Admin, "alice"}, {ownerB, ""}, {ownerB, "ref"}, {"", ""},
	} {
		if err := say(c.owner, c.voice); err != nil {
			t.Errorf("owner %q voice %q: %v", c.owner, c.voice, err)
		}
	}
}

// The operator's default voice may be a library voice (--tts-voice NAME) that no client
// owns: requests without a voice, or naming it, use it with the server's rights, while a
// client's own voice of the same name wins for that client.
func TestVoiceSetDefaultFromTheLibrary(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	a, err := wav.ReadFile(filepath.Join(filepath.Dir(file), "..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	clipOf := func(seconds int) []byte {
		var b bytes.Buffer
		if err := wav.Write(&b, a.Mono()[:seconds*a.SampleRate], a.SampleRate, 1); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	lib, _, err := library.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lib.Add(auth.Admin, "house", clipOf(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := lib.Add("k_cccccccccccccccc", "house", clipOf(3)); err != nil {
		t.Fatal(err)
	}
	s := Voices(lib, nil)
	for _, c := range []struct {
		owner, voice string
		seconds      int
	}{{"k_bbbbbbbbbbbbbbbb", "", 2}, {"k_bbbbbbbbbbbbbbbb", "house", 2}, {"k_cccccccccccccccc", "house", 3}} {
		clip, rate, err := s.forRequest(c.owner, c.voice, "house")
		if err != nil || len(clip) != c.seconds*rate {
			t.Errorf("owner %s voice %q: %d samples at %d, %v; want %d s", c.owner, c.voice, len(clip), rate, err, c.seconds)
		}
	}
	if _, _, err := s.forRequest("k_bbbbbbbbbbbbbbbb", "", ""); !errors.Is(err, miotts.ErrNoVoice) {
		t.Errorf("no voice and no default: %v", err)
	}
}
