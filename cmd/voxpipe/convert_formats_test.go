package main

import (
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

// encodeFixture writes the speech fixture encoded as encoding (tts/audioout: FLAC, MP3 via
// libmp3lame, Ogg Opus via libopus) to dir/name.
func encodeFixture(t *testing.T, dir, name, encoding string) string {
	t.Helper()
	in, err := wav.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	b, err := audioout.EncodeClip(audioout.Format{Encoding: encoding, SampleRate: in.SampleRate}, in.SampleRate, in.Mono())
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// convert takes FLAC, MP3 and Ogg Opus input (detected from the content) and writes WAV of
// the decoded input's rate and length.
func TestConvertOtherInputFormats(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, encoding string
	}{
		{"in.flac", audioout.FLAC},
		{"in.mp3", audioout.MP3},
		{"in.opus", audioout.Opus},
		{"mp3-named.wav", audioout.MP3}, // the name does not matter
	} {
		in := encodeFixture(t, dir, c.name, c.encoding)
		out := filepath.Join(dir, c.name+".out.wav")
		stdout, stderr, code := runCmd(t, "convert", in, out, "--voice", "dsp", "--pitch", "4")
		if code != 0 || !strings.Contains(stdout, "converted") {
			t.Errorf("%s: exit %d, %q %q", c.name, code, stdout, stderr)
			continue
		}
		src, err := audiofile.ReadFile(in, audiofile.FileLimits)
		if err != nil {
			t.Fatal(err)
		}
		got, err := wav.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if got.SampleRate != src.SampleRate || got.Channels != 1 || got.Frames() != src.Frames() {
			t.Errorf("%s: wrote %d Hz × %d ch × %d, input decodes to %d Hz × %d", c.name, got.SampleRate, got.Channels, got.Frames(), src.SampleRate, src.Frames())
			continue
		}
		f0in, f0out := dsp.MedianF0(src.Mono(), src.SampleRate), dsp.MedianF0(got.Mono(), got.SampleRate)
		if shift := 12 * math.Log2(f0out/f0in); math.Abs(shift-4) > 0.3 {
			t.Errorf("%s: pitch shift %+.2f semitones, want +4", c.name, shift)
		}
	}
}

func TestConvertInputFormatErrors(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "notes.mp3")
	if err := os.WriteFile(text, []byte("these are notes, not audio"), 0o644); err != nil {
		t.Fatal(err)
	}
	flac := encodeFixture(t, dir, "in.flac", audioout.FLAC)
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"convert", text, filepath.Join(dir, "o.wav")}, audiofile.Accepted},
		{[]string{"convert", flac, filepath.Join(dir, "o.flac")}, "only WAV files are written"},
		{[]string{"convert", flac, filepath.Join(dir, "o.mp3")}, "only WAV files are written"},
	} {
		_, stderr, code := runCmd(t, c.args...)
		if code == 0 || !strings.Contains(stderr, c.msg) {
			t.Errorf("%v: exit %d, %q, want an error saying %q", c.args[1:], code, stderr, c.msg)
		}
	}
}

// --ref takes the other formats too.
func TestConvertMeanVC2WithMP3Reference(t *testing.T) {
	model := tinyVC(t)
	ref := encodeFixture(t, t.TempDir(), "ref.mp3", audioout.MP3)
	_, got := convertFixture(t, "--model", model, "--ref", ref, "--threads", "2")
	if r := rmsOf(got.Mono()); r < 1e-4 {
		t.Errorf("output is silent (RMS %.2g)", r)
	}
}
