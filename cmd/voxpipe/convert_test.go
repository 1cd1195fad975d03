package main

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice"
)

// meanVC2Variants are the golden folders of the two published MeanVC2 models and the
// variant each file's config names.
var meanVC2Variants = []struct{ folder, variant string }{{"meanvc2", "120ms"}, {"meanvc2_40ms", "40ms"}}

// convert runs either variant: the output has the input's rate and length and is not silent;
// a --voice naming the other variant is refused.
func TestConvertMeanVC2Variants(t *testing.T) {
	for _, v := range meanVC2Variants {
		t.Run(v.variant, func(t *testing.T) {
			model := golden.Path(t, v.folder, "model.gguf")
			out := filepath.Join(t.TempDir(), "out.wav")
			_, stderr, code := runCmd(t, "convert", fixture, out, "--model", model, "--ref", fixture, "--threads", "2", "--voice", "meanvc2-"+v.variant)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			in, err := wav.ReadFile(fixture)
			if err != nil {
				t.Fatal(err)
			}
			got, err := wav.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if got.SampleRate != in.SampleRate || len(got.Mono()) != len(in.Mono()) {
				t.Fatalf("output %d Hz × %d samples, input %d Hz × %d", got.SampleRate, len(got.Mono()), in.SampleRate, len(in.Mono()))
			}
			if r := rmsOf(got.Mono()); r < 1e-4 {
				t.Errorf("output is silent (RMS %.2g)", r)
			}
			other := "meanvc2-40ms"
			if v.variant == "40ms" {
				other = "meanvc2-120ms"
			}
			_, stderr, code = runCmd(t, "convert", fixture, out, "--model", model, "--ref", fixture, "--threads", "2", "--voice", other)
			if code == 0 || !strings.Contains(stderr, "the "+v.variant+" MeanVC2 model") {
				t.Errorf("--voice %s with the %s model: exit %d, %q", other, v.variant, code, stderr)
			}
		})
	}
}

// convert's processor is the reference path: whole chunks through Stream.Process, the
// output the stream's own, delayed by the priming it reports — every sample, the first
// chunk's included (the live path gives some of those up).
func TestConvertIsTheReferencePath(t *testing.T) {
	for _, v := range meanVC2Variants {
		t.Run(v.variant, func(t *testing.T) {
			m, closeModel, err := voice.LoadMeanVC2(golden.Path(t, v.folder, "model.gguf"), 2, "")
			if err != nil {
				t.Fatal(err)
			}
			defer closeModel()
			if got := m.Config.Runtime.Model; got != v.variant {
				t.Fatalf("%s holds the %q model, want %q", v.folder, got, v.variant)
			}
			a, err := wav.ReadFile(fixture)
			if err != nil {
				t.Fatal(err)
			}
			src, err := dsp.Resample(a.Mono(), a.SampleRate, 16000)
			if err != nil {
				t.Fatal(err)
			}
			p, err := voice.MeanVC2ReferenceFromClip(m, a.Mono(), a.SampleRate)
			if err != nil {
				t.Fatal(err)
			}
			defer stream.CloseProcessor(p)
			target, err := m.VoiceFromClip(a.Mono(), a.SampleRate)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := m.NewStream(target)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			info, prime := p.Info(), m.OutputSlack()
			chunk := raw.ChunkSize()
			if info.SampleRate != 16000 || info.ChunkSize != chunk || info.Latency != m.Latency()+prime {
				t.Fatalf("info %+v; want 16 kHz, whole chunks of %d, latency %d+%d", info, chunk, m.Latency(), prime)
			}
			src = src[:len(src)/chunk*chunk]
			var got, want []float32
			for i := 0; i < len(src); i += chunk {
				before := len(got)
				if got, err = p.Process(got, src[i:i+chunk]); err != nil {
					t.Fatal(err)
				}
				if len(got)-before != chunk {
					t.Fatalf("chunk %d: %d samples out, want %d", i/chunk, len(got)-before, chunk)
				}
				if want, err = raw.Process(want, src[i:i+chunk]); err != nil {
					t.Fatal(err)
				}
			}
			if got, err = p.Flush(got); err != nil {
				t.Fatal(err)
			}
			if want, err = raw.Flush(want); err != nil {
				t.Fatal(err)
			}
			if len(got) != prime+len(want) || slices.ContainsFunc(got[:prime], func(x float32) bool { return x != 0 }) {
				t.Fatalf("%d samples out, want %d of silent priming and the stream's %d", len(got), prime, len(want))
			}
			if !slices.Equal(got[prime:], want) {
				t.Error("convert's output is not the stream's whole-chunk output")
			}
			if rmsOf(want) < 1e-4 {
				t.Error("the stream's output is silent")
			}
		})
	}
}

// bridge runs either variant on the live path, and names the voice it ran.
func TestBridgeMeanVC2Variants(t *testing.T) {
	for _, v := range meanVC2Variants {
		t.Run(v.variant, func(t *testing.T) {
			model := golden.Path(t, v.folder, "model.gguf")
			ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
			defer cancel()
			name := "meanvc2-" + v.variant
			rep, err := bridge(ctx, bridgeOptions{backend: "null", voice: name, vc: vcOptions{model: model, ref: fixture, threads: 2},
				rate: 48000, period: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("bridge %s: %d chunks, algorithmic latency %v", name, rep.stats.Chunks, rep.algorithm)
			if rep.stats.Voice != name || rep.stats.Chunks == 0 {
				t.Errorf("bridge did not run %s: %+v", name, rep.stats)
			}
			// The live path: 20 ms pieces (a chunk of 320 samples at 16 kHz: 50 per second).
			if sec := float64(rep.frames) / float64(rep.rate); float64(rep.stats.Chunks) < 20*sec {
				t.Errorf("%d chunks in %.2f s: not the live path's 20 ms pieces", rep.stats.Chunks, sec)
			}
		})
	}
}
