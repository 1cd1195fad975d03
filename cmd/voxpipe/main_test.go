package main

import (
	"bytes"
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/vulkan"
)

const fixture = "../../testdata/speech_en_48k.wav"

func runCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}

// convertFixture runs convert on the speech fixture with args, checks that it succeeded and
// printed its summary, and returns the input and the output, which must have the input's
// rate and length.
func convertFixture(t *testing.T, args ...string) (in, got *wav.Audio) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.wav")
	stdout, stderr, code := runCmd(t, append([]string{"convert", fixture, out}, args...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "converted") {
		t.Errorf("no summary line: %q", stdout)
	}
	in, err := wav.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	if got, err = wav.ReadFile(out); err != nil {
		t.Fatal(err)
	}
	if got.SampleRate != in.SampleRate || len(got.Mono()) != len(in.Mono()) {
		t.Fatalf("output %d Hz × %d samples, input %d Hz × %d", got.SampleRate, len(got.Mono()), in.SampleRate, len(in.Mono()))
	}
	return in, got
}

func TestConvertShiftsPitchAndKeepsLength(t *testing.T) {
	in, got := convertFixture(t, "--voice", "dsp", "--pitch", "4")
	f0in, f0out := dsp.MedianF0(in.Mono(), in.SampleRate), dsp.MedianF0(got.Mono(), got.SampleRate)
	shift := 12 * math.Log2(f0out/f0in)
	t.Logf("F0 %.1f → %.1f Hz (%+.2f st)", f0in, f0out, shift)
	if math.Abs(shift-4) > 0.3 {
		t.Errorf("shift %+.2f semitones, want +4 ± 0.3", shift)
	}
}

func TestConvertAnyRateAndChannels(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.wav"), filepath.Join(dir, "out.wav")
	// 1.5 s of a stereo 44.1 kHz tone, identical channels.
	const rate = 44100
	n := rate * 3 / 2
	st := make([]float32, 2*n)
	for i := 0; i < n; i++ {
		v := float32(0.3 * math.Sin(2*math.Pi*200*float64(i)/rate))
		st[2*i], st[2*i+1] = v, v
	}
	if err := wav.WriteFile(in, st, rate, 2); err != nil {
		t.Fatal(err)
	}
	// Pitch 0: the output must be the input, aligned (latency removed), up to resampling.
	if _, stderr, code := runCmd(t, "convert", in, out, "--quiet"); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got, err := wav.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got.SampleRate != rate || got.Channels != 1 || len(got.Data) != n {
		t.Fatalf("got %d Hz, %d ch, %d samples; want %d Hz mono %d", got.SampleRate, got.Channels, len(got.Data), rate, n)
	}
	var maxErr float64
	for i := rate / 10; i < n-rate/10; i++ {
		maxErr = max(maxErr, math.Abs(float64(got.Data[i]-st[2*i])))
	}
	if maxErr > 0.01 {
		t.Errorf("passthrough conversion differs from the input by up to %.4f: not aligned", maxErr)
	}
}

func TestConvertErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.wav")
	if err := os.WriteFile(bad, []byte("RIFF....WAVEjunk"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"convert", "missing.wav", filepath.Join(dir, "o.wav")},
		{"convert", bad, filepath.Join(dir, "o.wav")},
		{"convert", fixture},
		{"convert", fixture, filepath.Join(dir, "o.wav"), "--voice", "nope"},
		{"convert", fixture, filepath.Join(dir, "o.wav"), "--pitch", "40"},
	} {
		_, stderr, code := runCmd(t, args...)
		if code == 0 || !strings.Contains(stderr, "voxpipe convert:") {
			t.Errorf("%v: exit %d, stderr %q: want a clear error", args, code, stderr)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	if _, stderr, code := runCmd(t, "frobnicate"); code != 2 || !strings.Contains(stderr, "unknown command") {
		t.Fatalf("exit %d, %q", code, stderr)
	}
	if stdout, _, code := runCmd(t, "help"); code != 0 || !strings.Contains(stdout, "bridge") {
		t.Fatalf("help: exit %d, %q", code, stdout)
	}
}

// devices --gpu lists the Vulkan devices (lavapipe in CI), or says why there are none.
func TestDevicesGPU(t *testing.T) {
	stdout, stderr, code := runCmd(t, "devices", "--gpu")
	if _, err := vulkan.Devices(); err != nil {
		if os.Getenv("VOXPIPE_REQUIRE_VULKAN") != "" {
			t.Fatalf("Vulkan is required here but: %v", err)
		}
		if code == 0 || !strings.Contains(stderr, "no Vulkan here") {
			t.Fatalf("devices --gpu without Vulkan: exit %d, %q", code, stderr)
		}
		return
	}
	if code != 0 || !strings.Contains(stdout, "Vulkan devices:") || !strings.Contains(stdout, "  0: ") || !strings.Contains(stdout, "subgroup") {
		t.Fatalf("devices --gpu: exit %d, %q %q", code, stdout, stderr)
	}
}

func TestDevicesAndBridgeOnTheNullBackend(t *testing.T) {
	stdout, stderr, code := runCmd(t, "devices", "--backend", "null")
	if code != 0 || !strings.Contains(stdout, "Inputs:") || !strings.Contains(stdout, "Outputs:") {
		t.Fatalf("devices: exit %d, %q %q", code, stdout, stderr)
	}
	var readout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	rep, err := bridge(ctx, bridgeOptions{backend: "null", voice: "dsp", pitch: 4, rate: 44100, period: 10 * time.Millisecond, readout: &readout})
	if err != nil {
		t.Fatal(err)
	}
	secs := float64(rep.frames) / float64(rep.rate)
	t.Logf("bridge ran %.2f s at %d Hz; readout %q", secs, rep.rate, lastLine(readout.String()))
	if rep.rate != 44100 || secs < 0.5 {
		t.Fatalf("bridge processed %.2f s at %d Hz", secs, rep.rate)
	}
	if !strings.Contains(readout.String(), "latency") || !strings.Contains(readout.String(), "load") {
		t.Fatalf("no live readout: %q", readout.String())
	}
	if _, err := bridge(context.Background(), bridgeOptions{backend: "null", in: "no such device"}); err == nil {
		t.Fatal("unknown device accepted")
	}
}

func lastLine(s string) string {
	parts := strings.Split(s, "\r")
	return parts[len(parts)-1]
}

func TestBenchLoopbackReportsFigures(t *testing.T) {
	srv, err := rtc.NewServer(rtc.Config{Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/rtc", srv)
	hs := httptest.NewServer(mux)
	defer hs.Close()
	defer srv.Close()
	res, err := benchLoopback(loopbackOptions{voice: "dsp", pitch: 4, sessions: 2, seconds: 3, server: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.ClicksFound < res.ClicksSent*8/10 {
		t.Errorf("found %d of %d clicks", res.ClicksFound, res.ClicksSent)
	}
	if res.LatencyP50 < 20 || res.LatencyP50 > 1000 || res.LatencyP95 < res.LatencyP50 { // sanity, not a speed goal
		t.Errorf("implausible latency p50 %.1f ms p95 %.1f ms", res.LatencyP50, res.LatencyP95)
	}
	if res.Chunks == 0 {
		t.Error("no chunk counts from the server's stats")
	}
	// Staggered: the second session dials 1.5 s after the first began to send; both run
	// and are measured.
	res, err = benchLoopback(loopbackOptions{voice: "dsp", pitch: 4, sessions: 2, seconds: 3, stagger: 1500 * time.Millisecond, server: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sessions != 2 || res.Refused != 0 || res.ClicksFound < res.ClicksSent*8/10 || res.SteadyFrames != 2*50 {
		t.Errorf("staggered: %d sessions, %d refused, %d of %d clicks, %d steady frames (want 100)", res.Sessions, res.Refused, res.ClicksFound, res.ClicksSent, res.SteadyFrames)
	}
	// A voice the server does not run fails the bench instead of measuring the default.
	if _, err := benchLoopback(loopbackOptions{voice: "meanvc2", sessions: 1, seconds: 1, server: hs.URL}); err == nil ||
		!strings.Contains(err.Error(), "refused") {
		t.Errorf("bench of a voice the server lacks: %v", err)
	}
}

func TestTTSCommand(t *testing.T) {
	lm := golden.Path(t, "miotts", "model.gguf")
	codec := golden.Path(t, "miocodec", "model.gguf")
	ref := filepath.Join("..", "..", "testdata", "speech_en_48k.wav")
	out := filepath.Join(t.TempDir(), "out.wav")
	args := []string{"tts", "--model", lm, "--codec", codec, "--voice", ref, "--max-tokens", "30", "--voice-cache", ""}
	if stdout, stderr, code := runCmd(t, append(args, "Hello there.", "-o", out)...); code != 0 || !strings.Contains(stdout, "wrote") {
		t.Fatalf("tts: exit %d\n%s\n%s", code, stdout, stderr)
	}
	a, err := wav.ReadFile(out)
	if err != nil || a.SampleRate != 44100 || a.Frames() == 0 || a.Frames()%1764 != 0 {
		t.Fatalf("output: %v %+v", err, a)
	}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"tts", "--model", lm, "--voice", ref, "hi", "-o", out}, "--codec"},
		{[]string{"tts", "--model", lm, "--codec", codec, "hi", "-o", out}, "--voice"},
		{[]string{"tts", "--model", lm, "--codec", codec, "--voice", ref, "-o", out}, "no text"},
		{[]string{"tts", "--model", lm, "--codec", codec, "--voice", ref, "?!", "-o", out}, "nothing to say"},
		{[]string{"tts", "--model", lm, "--codec", lm, "--voice", ref, "hi", "-o", out, "--voice-cache", ""}, "not MioCodec"},
		{[]string{"tts", "--model", lm, "--codec", codec, "--voice", ref, "hi", "-o", out, "--kv-cache", "f64"}, "--kv-cache"},
	} {
		if _, stderr, code := runCmd(t, c.args...); code == 0 || !strings.Contains(stderr, c.msg) {
			t.Errorf("%v: exit %d, %q (want %q)", c.args, code, stderr, c.msg)
		}
	}
}

// TestRunsWithoutVulkan: with no Vulkan driver at all (CI machines have lavapipe, so the
// loader is pointed at none), --backend auto runs the model on the CPU and says why in one
// line, and --backend vulkan is a clear error.
func TestRunsWithoutVulkan(t *testing.T) {
	golden.Path(t, "miotts", "model.gguf")
	voxpipe := func(args ...string) (string, error) {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), actAsVoxpipe+"=1", "VK_ICD_FILENAMES=/nonexistent", "VK_DRIVER_FILES=/nonexistent")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := voxpipe("golden", "--family", "miotts", "--backend", "auto")
	if err != nil || !strings.Contains(out, "running on the CPU: no Vulkan") || !strings.Contains(out, " 0 failed") {
		t.Errorf("--backend auto without Vulkan: %v\n%s", err, out)
	}
	if strings.Count(out, "Vulkan") != 1 {
		t.Errorf("the fallback takes more than one line:\n%s", out)
	}
	if out, err = voxpipe("golden", "--family", "miotts", "--backend", "vulkan"); err == nil || !strings.Contains(out, "Vulkan") {
		t.Errorf("--backend vulkan without Vulkan: %v\n%s", err, out)
	}
}

// TestEveryCommandHelp: every command and benchmark prints its flags and exits 0 for -h. A
// flag defined twice panics when its command starts (bridge's audio system and the model's
// --backend did, for every bridge run), which tests calling the command's function directly
// never see.
func TestEveryCommandHelp(t *testing.T) {
	args := [][]string{}
	for _, c := range commands {
		if c.name != "bench" {
			args = append(args, []string{c.name, "-h"})
		}
	}
	for name := range benches {
		args = append(args, []string{"bench", name, "-h"})
	}
	for _, a := range args {
		t.Run(strings.Join(a[:len(a)-1], " "), func(t *testing.T) {
			_, stderr, code := runCmd(t, a...)
			if code != 0 || !strings.Contains(stderr, "Usage: voxpipe "+a[0]) {
				t.Errorf("exit %d: %q", code, stderr)
			}
		})
	}
}

// First contact: version, help COMMAND, and clear errors for a bare port and for output
// files voxpipe would not write in the format their name says.
func TestFirstContact(t *testing.T) {
	stdout, _, code := runCmd(t, "version")
	if code != 0 || !strings.Contains(stdout, "voxpipe ") || !strings.Contains(stdout, runtime.Version()) {
		t.Errorf("version: exit %d %q", code, stdout)
	}
	if again, _, _ := runCmd(t, "--version"); again != stdout {
		t.Errorf("--version %q differs from version %q", again, stdout)
	}
	if _, stderr, code := runCmd(t, "help", "convert"); code != 0 || !strings.Contains(stderr, "Usage: voxpipe convert") || !strings.Contains(stderr, "-voice") {
		t.Errorf("help convert: exit %d %q", code, stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--listen", "8080"}, "expected HOST:PORT"},
		{[]string{"serve", "--kv-cache", "f8"}, "--kv-cache: qwen3: KV cache \"f8\""},
		{[]string{"worker", "--kv-cache", "q8"}, "--kv-cache: qwen3: KV cache \"q8\""},
		{[]string{"tts", "--model", "m.gguf", "--codec", "c.gguf", "--voice", "r.wav", "-o", "out.mp3", "hello"}, "only WAV files are written"},
		{[]string{"convert", "in.wav", "out.mp3"}, "only WAV files are written"},
	} {
		if _, stderr, code := runCmd(t, tc.args...); code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %q", tc.args, code, stderr)
		}
	}
}
