package miocodec

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

func globalTestSetup(t *testing.T) (*parity.Run, *gguf.Model, engine.Backend) {
	t.Helper()
	r := paritytest.Open(t, "miocodec")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	be, err := engine.NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	return r, m, be
}

func TestGlobalGolden(t *testing.T) {
	r, m, be := globalTestSetup(t)
	GoldenGlobal(r, m, be)
	var st []parity.Stage
	for _, s := range r.Stages() {
		if strings.HasPrefix(s.Name, "global.") {
			st = append(st, s)
		}
	}
	if len(st) != 10 {
		t.Errorf("%d global stages, want 10", len(st))
	}
	paritytest.Require(t, st)
	// Every global.* case was read.
	for _, n := range r.Names("global.") {
		found := n == "global.ref_wave_raw"
		for _, s := range st {
			found = found || s.Name == n
		}
		if !found {
			t.Errorf("case %s not checked", n)
		}
	}
}

// The public API gives the golden embedding, concurrently and repeatedly.
func TestGlobalEmbeddingAPI(t *testing.T) {
	r, m, be := globalTestSetup(t)
	enc, err := NewSpeakerEncoder(m, []int{1, 2}, be)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	raw, _, _ := r.F32("global.ref_wave_raw")
	want, _, _ := r.F32("global.embedding")
	var wg sync.WaitGroup
	got := make([][]float32, 3)
	errs := make([]error, 3)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = enc.Embedding(raw, 44100)
		}()
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if len(got[i]) != 128 {
			t.Fatalf("embedding of %d values", len(got[i]))
		}
		if s := parity.Compare("embedding", got[i], want, globalTol); !s.OK() {
			t.Error(s)
		}
		if !slices.Equal(got[i], got[0]) {
			t.Error("concurrent calls differ")
		}
	}
}

// A reference at another rate goes through the HQ resampler to 44.1 kHz first: the 48 kHz
// version of the golden clip gives nearly the same embedding.
func TestGlobalOtherRate(t *testing.T) {
	r, m, be := globalTestSetup(t)
	enc, err := NewSpeakerEncoder(m, []int{1, 2}, be)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	raw, _, _ := r.F32("global.ref_wave_raw")
	want, _, _ := r.F32("global.embedding")
	up := make([]float32, len(raw)*48000/44100)
	for i := range up { // linear interpolation is enough for a smoke test of the path
		x := float64(i) * 44100 / 48000
		j := int(x)
		f := float32(x - float64(j))
		up[i] = raw[j]*(1-f) + raw[min(j+1, len(raw)-1)]*f
	}
	got, err := enc.Embedding(up, 48000)
	if err != nil {
		t.Fatal(err)
	}
	var dot, na, nb float64
	for i := range got {
		dot += float64(got[i]) * float64(want[i])
		na += float64(got[i]) * float64(got[i])
		nb += float64(want[i]) * float64(want[i])
	}
	if cos := dot / math.Sqrt(na*nb); cos < 0.98 {
		t.Errorf("48 kHz embedding cosine %.4f to the 44.1 kHz one", cos)
	}
}

func TestGlobalBadInput(t *testing.T) {
	_, m, be := globalTestSetup(t)
	enc, err := NewSpeakerEncoder(m, []int{1, 2}, be)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	noise := make([]float32, 44100)
	for i := range noise {
		noise[i] = float32(math.Sin(float64(i) * 0.05))
	}
	nan := slices.Clone(noise)
	nan[100] = float32(math.NaN())
	inf := slices.Clone(noise)
	inf[7] = float32(math.Inf(-1))
	for _, c := range []struct {
		name string
		wave []float32
		rate int
		want string
	}{
		{"empty", nil, 44100, "empty"},
		{"silent", make([]float32, 44100), 44100, "silent"},
		{"quiet", slices.Repeat([]float32{5e-5}, 44100), 44100, "silent"},
		{"short", noise[:800], 44100, "too short"},
		{"nan", nan, 44100, "NaN"},
		{"inf", inf, 44100, "Inf"},
		{"rate", noise, 0, "rate"},
	} {
		_, err := enc.Embedding(c.wave, c.rate)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	// Just long enough for two frames.
	if _, err := enc.Embedding(noise[:900], 44100); err != nil {
		t.Errorf("900 samples: %v", err)
	}
	if _, err := NewSpeakerEncoder(m, []int{3}, be); err == nil {
		t.Error("layer 3 of a 2-layer WavLM accepted")
	}
	if _, err := NewSpeakerEncoder(m, nil, be); err == nil {
		t.Error("no layers accepted")
	}
}

// Timing of a 10 s reference on the tiny model (first call compiles; the second is cached).
func TestGlobalTiming10s(t *testing.T) {
	_, m, be := globalTestSetup(t)
	enc, err := NewSpeakerEncoder(m, []int{1, 2}, be)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	wave := make([]float32, 10*44100)
	for i := range wave {
		x := float64(i) / 44100
		wave[i] = float32(0.3*math.Sin(2*math.Pi*180*x) + 0.1*math.Sin(2*math.Pi*1234*x*(1+0.1*math.Sin(x))))
	}
	for _, pass := range []string{"first", "cached"} {
		t0 := time.Now()
		if _, err := enc.Embedding(wave, 44100); err != nil {
			t.Fatal(err)
		}
		t.Logf("10 s reference, %s call: %v", pass, time.Since(t0))
	}
}
