package meanvc2

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/internal/embcache"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

func goldenRef(t *testing.T) (*Model, []float32, []float32) {
	t.Helper()
	r := paritytest.Open(t, Family)
	m, err := Load(r.ModelPath(), cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	ref, _, err := r.Cases.Get("input.ref_wav")
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := r.Cases.Get("spk.embedding")
	if err != nil {
		t.Fatal(err)
	}
	return m, ref, want
}

// The speaker path from the reference waveform gives the reference's embedding, and a clip
// at another rate is resampled to about the same one.
func TestSpeakerEmbedding(t *testing.T) {
	m, ref, want := goldenRef(t)
	got, err := m.SpeakerEmbedding(ref, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if e := rel(got, want); e > 1e-4 {
		t.Errorf("embedding rel error %.2e", e)
	}
	ref24, err := dsp.Resample(ref, 16000, 24000)
	if err != nil {
		t.Fatal(err)
	}
	got24, err := m.SpeakerEmbedding(ref24, 24000)
	if err != nil {
		t.Fatal(err)
	}
	// Only the band above the resampler's passband (0.9 of 8 kHz) is lost.
	e := rel(got24, want)
	t.Logf("from 24 kHz: rel error %.2e", e)
	if e > 1e-2 {
		t.Errorf("embedding from a 24 kHz copy differs by %.2e", e)
	}
	voice, err := m.VoiceFromClip(ref, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if len(voice.K) != m.Config.GTMSlots*m.Config.GTMHidden {
		t.Errorf("voice memory of %d values", len(voice.K))
	}
}

func TestBadReferences(t *testing.T) {
	m, ref, _ := goldenRef(t)
	nan := slices.Clone(ref)
	nan[100] = float32(math.NaN())
	inf := slices.Clone(ref)
	inf[7] = float32(math.Inf(-1))
	quiet := slices.Clone(ref)
	for i := range quiet {
		quiet[i] *= 1e-5
	}
	for _, tc := range []struct {
		name string
		clip []float32
		rate int
		want string
	}{
		{"empty", nil, 16000, "empty"},
		{"rate", ref, 0, "sample rate"},
		{"nan", nan, 16000, "not audio"},
		{"inf", inf, 16000, "not audio"},
		{"short", ref[:12000], 16000, "at least 1.0 s"},
		{"short at 48 kHz", make([]float32, 40000), 48000, "at least 1.0 s"},
		{"zeros", make([]float32, 32000), 16000, "silent"},
		{"quiet", quiet, 16000, "silent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.SpeakerEmbedding(tc.clip, tc.rate)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrBadReference) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want ErrBadReference mentioning %q", err, tc.want)
			}
			t.Log(err)
		})
	}
}

// With an embedding cache the clip is embedded once and found again by content, also by a
// newly loaded model; the key names the model's speaker weights.
func TestEmbeddingCache(t *testing.T) {
	m, ref, want := goldenRef(t)
	dir := t.TempDir()
	c, err := embcache.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.Embeddings = c
	got, err := m.SpeakerEmbedding(ref, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if e := rel(got, want); e > 1e-4 {
		t.Errorf("rel error %.2e", e)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.emb"))
	if len(files) != 1 {
		t.Fatalf("%d cache files, want 1", len(files))
	}

	// A second model with a fresh cache over the same directory reads the stored value:
	// overwrite it to tell.
	m2, err := Load(paritytest.Open(t, Family).ModelPath(), cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if m2.ID != m.ID || !strings.HasPrefix(m.ID, "meanvc2:") {
		t.Errorf("model ids %q and %q", m.ID, m2.ID)
	}
	fake := make([]float32, len(want))
	for i := range fake {
		fake[i] = float32(i)
	}
	other, _ := embcache.New(t.TempDir())
	if _, err := other.Get(embcache.Key(m.ID, ref, 16000), func() ([]float32, error) { return fake, nil }); err != nil {
		t.Fatal(err)
	}
	m2.Embeddings = other
	got2, err := m2.SpeakerEmbedding(ref, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got2, fake) {
		t.Error("the cached embedding was not used")
	}
	m2.Embeddings, _ = embcache.New(dir)
	got3, err := m2.SpeakerEmbedding(ref, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got3, got) {
		t.Error("the embedding stored on disk was not found again")
	}
	// A bad clip is refused before the cache is consulted.
	if _, err := m.SpeakerEmbedding(ref[:100], 16000); !errors.Is(err, ErrBadReference) {
		t.Errorf("short clip through the cache: %v", err)
	}
	if _, err := os.Stat(files[0]); err != nil {
		t.Error(err)
	}
}
