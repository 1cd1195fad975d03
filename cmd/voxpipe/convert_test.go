package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/internal/golden"
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
			_, got := convertFixture(t, "--model", model, "--ref", fixture, "--threads", "2", "--voice", "meanvc2-"+v.variant)
			if r := rmsOf(got.Mono()); r < 1e-4 {
				t.Errorf("output is silent (RMS %.2g)", r)
			}
			other := "meanvc2-40ms"
			if v.variant == "40ms" {
				other = "meanvc2-120ms"
			}
			out := filepath.Join(t.TempDir(), "out.wav")
			_, stderr, code := runCmd(t, "convert", fixture, out, "--model", model, "--ref", fixture, "--threads", "2", "--voice", other)
			if code == 0 || !strings.Contains(stderr, "the "+v.variant+" MeanVC2 model") {
				t.Errorf("--voice %s with the %s model: exit %d, %q", other, v.variant, code, stderr)
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
