package miotts

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/models/miocodec"
)

func loadGoldenTTS(t *testing.T) (*TTS, []float32, int) {
	t.Helper()
	lm := golden.Path(t, "miotts", "model.gguf")
	codec := golden.Path(t, "miocodec", "model.gguf")
	be, err := engine.NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	tts, err := Load(lm, codec, be, Options{VoiceCacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tts.Close)
	ref, err := wav.ReadFile(filepath.Join("..", "..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	return tts, ref.Mono(), ref.SampleRate
}

// TestStreamedEqualsOffline: the audio streamed while tokens are generated is the codec's
// windowed decode of those tokens, the same whatever the chunking, and starts early.
func TestStreamedEqualsOffline(t *testing.T) {
	tts, clip, rate := loadGoldenTTS(t)
	req := Request{Text: "Hello there, streaming world.", Clip: clip, Rate: rate, Gen: GenOptions{Seed: 3, MaxNew: 60}}
	var streamed []float32
	chunks := 0
	st, err := tts.Synthesize(context.Background(), req, func(c Chunk) error {
		streamed = append(streamed, c.Samples...)
		chunks++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	spt := tts.Codec.Config.SamplesPerToken()
	if st.Tokens == 0 || len(streamed) != st.Tokens*spt || st.Samples != len(streamed) {
		t.Fatalf("%d tokens, %d samples streamed (stats %+v)", st.Tokens, len(streamed), st)
	}
	if st.Tokens > 2*DefaultRamp[0] && chunks < 2 {
		t.Errorf("%d tokens came out in %d chunk(s): not streamed", st.Tokens, chunks)
	}
	// The same tokens through the codec stream all at once, and offline.
	codes, emb, once := streamAtOnce(t, tts, req, DefaultRamp)
	if !slices.Equal(once, streamed) {
		t.Error("token-by-token stream differs from the all-at-once stream")
	}
	offline, err := tts.Codec.Decode(codes, emb)
	if err != nil {
		t.Fatal(err)
	}
	var maxd, peak, se, so float64
	for i := range offline {
		d := float64(streamed[i] - offline[i])
		maxd = max(maxd, math.Abs(d))
		peak = max(peak, math.Abs(float64(offline[i])))
		se += d * d
		so += float64(offline[i]) * float64(offline[i])
	}
	t.Logf("%d tokens → %d samples in %d chunks; first audio %v; streamed vs offline: max rel %.3g, rms rel %.3g (random weights: windowed GroupNorm statistics differ, see the miocodec manifest §6)",
		st.Tokens, len(streamed), chunks, st.FirstAudio, maxd/peak, math.Sqrt(se/so))
}

// streamAtOnce generates req's tokens again and decodes them through a codec stream with
// ramp in one push: the tokens, the speaker embedding and the audio.
func streamAtOnce(t *testing.T, tts *TTS, req Request, ramp []int) ([]int32, []float32, []float32) {
	t.Helper()
	var codes []int32
	if _, err := tts.LM.Generate(context.Background(), Normalize(req.Text), req.Gen, func(c int32) error {
		codes = append(codes, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	emb, err := tts.Embed(req.Clip, req.Rate)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := tts.Codec.NewStream(emb, miocodec.StreamOptions{Ramp: ramp})
	if err != nil {
		t.Fatal(err)
	}
	a, err := cs.Push(codes)
	if err != nil {
		t.Fatal(err)
	}
	audio := slices.Clone(a)
	b, err := cs.Flush()
	if err != nil {
		t.Fatal(err)
	}
	return codes, emb, append(audio, b...)
}

func TestSynthesizeInputs(t *testing.T) {
	tts, clip, rate := loadGoldenTTS(t)
	ctx := context.Background()
	discard := func(Chunk) error { return nil }
	if _, err := tts.Synthesize(ctx, Request{Text: "", Clip: clip, Rate: rate}, discard); !errors.Is(err, ErrNothingToSay) {
		t.Errorf("empty text: %v", err)
	}
	if _, err := tts.Synthesize(ctx, Request{Text: "?!… ---", Clip: clip, Rate: rate}, discard); !errors.Is(err, ErrNothingToSay) {
		t.Errorf("punctuation only: %v", err)
	}
	if _, err := tts.Synthesize(ctx, Request{Text: "Hello."}, discard); !errors.Is(err, ErrNoVoice) {
		t.Errorf("no voice: %v", err)
	}
	silent := make([]float32, 3*rate)
	if _, err := tts.Synthesize(ctx, Request{Text: "Hello.", Clip: silent, Rate: rate}, discard); err == nil || !strings.Contains(err.Error(), "silent") {
		t.Errorf("silent clip: %v", err)
	}
	// A reference longer than 20 s is trimmed to its first 20 s (as the reference does):
	// the embedding is that of the first 20 s (up to the resampler's edge at the cut).
	long25 := make([]float32, 0, 25*rate)
	for len(long25) < 20*rate {
		long25 = append(long25, clip...)
	}
	long25 = long25[:20*rate]
	for i := range 5 * rate { // then 5 s of a quiet hum that would change the voice if kept
		long25 = append(long25, float32(0.05*math.Sin(2*math.Pi*90*float64(i)/float64(rate))))
	}
	e25, err := tts.Embed(long25, rate)
	if err != nil {
		t.Fatalf("25 s reference: %v", err)
	}
	e20, err := tts.Embed(long25[:20*rate], rate)
	var dot, n25, n20 float64
	for i := range e25 {
		dot += float64(e25[i]) * float64(e20[i])
		n25 += float64(e25[i]) * float64(e25[i])
		n20 += float64(e20[i]) * float64(e20[i])
	}
	if cos := dot / math.Sqrt(n25*n20); err != nil || cos < 0.999 {
		t.Errorf("25 s reference vs its first 20 s: cosine %.5f (%v)", cos, err)
	}
	// Mixed Japanese/English and a 10 000-character text: split into pieces, each spoken.
	st, err := tts.Synthesize(ctx, Request{Text: "日本語 and English mixed テキストです。", Clip: clip, Rate: rate, Gen: GenOptions{MaxNew: 10}}, discard)
	if err != nil || st.Pieces != 1 {
		t.Errorf("mixed text: %+v %v", st, err)
	}
	long := strings.Repeat("A fairly ordinary sentence. ", 358)[:10000]
	st, err = tts.Synthesize(ctx, Request{Text: long, Clip: clip, Rate: rate, Gen: GenOptions{MaxNew: 2}}, discard)
	if err != nil || st.Pieces < 56 || st.Samples == 0 {
		t.Errorf("10 000 characters: %+v %v", st, err)
	}
	// Cancel mid-utterance stops compute and output at once.
	cctx, cancel := context.WithCancel(ctx)
	n := 0
	_, err = tts.Synthesize(cctx, Request{Text: "Talk for a long time please.", Clip: clip, Rate: rate, Gen: GenOptions{MaxNew: 400}}, func(c Chunk) error {
		n++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || n != 1 {
		t.Errorf("cancel: %d chunks after cancel, err %v", n, err)
	}
	// A missing codec file is a clear load error.
	be, _ := engine.NewCPU(1)
	defer be.Close()
	if _, err := Load(golden.Path(t, "miotts", "model.gguf"), filepath.Join(t.TempDir(), "nope.gguf"), be, Options{}); err == nil || !strings.Contains(err.Error(), "codec") {
		t.Errorf("missing codec: %v", err)
	}
}

// Warm speaks its sentence through the ramp into a steady codec window and leaves the model
// with its token gap alone measured, so that admission can judge a second stream.
func TestWarm(t *testing.T) {
	tts, _, _ := loadGoldenTTS(t)
	if gap := tts.LM.PredictGap(1); gap != 0 {
		t.Fatalf("a fresh model has a measured gap %v", gap)
	}
	st, err := tts.Warm(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o := tts.Stream
	o.Ramp = tts.Ramp
	_, need := o.Window(len(o.Ramp) + 1)
	t.Logf("warm-up: %+v; through the first steady window needs %d tokens", st, need)
	if st.Tokens == 0 || st.Samples == 0 || st.FirstAudio <= 0 {
		t.Errorf("the warm-up spoke nothing: %+v", st)
	}
	if st.Tokens > need {
		t.Errorf("the warm-up generated %d tokens, more than the %d it needs", st.Tokens, need)
	}
	if gap := tts.LM.PredictGap(1); gap <= 0 {
		t.Error("no token gap measured by the warm-up")
	}
	if runs := tts.Codec.BatchStats().Runs; runs == 0 {
		t.Error("the codec ran no window")
	}
}
