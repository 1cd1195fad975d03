package miotts

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/embcache"
	"github.com/voxpipe/voxpipe/models/miocodec"
)

// ErrNothingToSay is returned for text with no letters or digits.
var ErrNothingToSay = errors.New("miotts: the text has nothing to say (no letters or digits)")

// ErrNoVoice is returned when a request names no voice and no default is configured.
var ErrNoVoice = errors.New("miotts: no voice: give a reference clip or configure a default voice")

// VoiceSource finds a voice's reference clip by name (a voice library id, a preset or a
// file the operator configured). It returns an error wrapping stream.ErrUnknownVoice-like
// sentinels as it sees fit; TTS passes it through.
type VoiceSource func(name string) (clip []float32, rate int, err error)

// TTS is MioTTS with the MioCodec decoder and speaker encoder: text in, 44.1 kHz audio out,
// streamed while the language model generates. Safe for concurrent use.
type TTS struct {
	LM      *LM
	Codec   *miocodec.Decoder
	Speaker *miocodec.SpeakerEncoder
	Voices  VoiceSource // resolves SynthRequest voices; nil: only DefaultVoice clips
	// DefaultVoice is used when a request names none ("" means requests must name one).
	DefaultVoice string
	Embeddings   *embcache.Cache
	Stream       miocodec.StreamOptions
	// Ramp are the cores of the first codec windows (see miocodec.StreamOptions.Ramp):
	// audio starts after 2·Ramp[0] tokens, and each next window is decoded before the audio
	// already out has played. nil: DefaultRamp; empty: no ramp.
	Ramp    []int
	codecID string
	pieces  atomic.Int32 // pieces speaking now (their codec streams decode together)
	// codec is the codec's wall time per decoded token, measured on every window: the
	// playout schedules (ramp choice, admission) count a window's decode before its audio.
	codec codecCost
}

// DefaultRamp starts audio after 8 tokens (4 + 4 of right context: ~0.1 s of decoding on the
// real 0.6B model) and grows the windows 4, 6, 10, 16, then 24: each window needs only a few
// more tokens than the audio already out lasts, so at up to ~20 ms a token (2× real time) the
// stream never runs dry after its first audio. A piece whose tokens will come slower (a
// slower machine, streams sharing the model) grows its windows more slowly from the same
// first one, or starts later in the ramp (rampFor). Early cores see less future than later
// ones.
var DefaultRamp = []int{4, 6, 10, 16}

// Options configure Load.
type Options struct {
	VoiceCacheDir string // "" keeps speaker embeddings in memory only
	Stream        miocodec.StreamOptions
	Ramp          []int // see TTS.Ramp; nil: DefaultRamp
	// CodecBackend runs MioCodec (decoder and speaker encoder) apart from the language
	// model, e.g. on the CPU beside an LM on a GPU; nil shares the LM's backend.
	CodecBackend engine.Backend
	// KVCache is the language model's cache encoding (qwen3.KVCacheUsage; "": auto).
	KVCache string
}

// Load opens the MioTTS LM and the MioCodec file.
func Load(lmPath, codecPath string, backend engine.Backend, opt Options) (*TTS, error) {
	lm, err := LoadLM(lmPath, backend)
	if err != nil {
		return nil, err
	}
	if err := lm.Model.SetKVCacheName(opt.KVCache); err != nil {
		lm.Close()
		return nil, fmt.Errorf("miotts: %w", err)
	}
	t := &TTS{LM: lm, Stream: opt.Stream, Ramp: opt.Ramp}
	if t.Ramp == nil {
		t.Ramp = DefaultRamp
	}
	fail := func(err error) (*TTS, error) {
		t.Close()
		return nil, err
	}
	cf, err := gguf.OpenModel(codecPath)
	if err != nil {
		return fail(fmt.Errorf("miotts: codec: %w", err))
	}
	defer cf.Close()
	if fam, err := cf.File.KV.String("audiocpp.model_spec.family"); err == nil && fam != "miocodec" {
		return fail(fmt.Errorf("miotts: codec %s is a %q model, not MioCodec", codecPath, fam))
	}
	codecBE := backend
	if opt.CodecBackend != nil {
		codecBE = opt.CodecBackend
	}
	if t.Codec, err = miocodec.LoadDecoder(cf, codecBE); err != nil {
		return fail(err)
	}
	if t.Speaker, err = miocodec.NewSpeakerEncoder(cf, t.Codec.Config.GlobalSSLLayers, codecBE); err != nil {
		return fail(err)
	}
	if t.Embeddings, err = embcache.New(opt.VoiceCacheDir); err != nil {
		return fail(err)
	}
	name, _ := cf.File.KV.String("general.name")
	t.codecID = fmt.Sprintf("miocodec:%s:%d", name, cf.Len())
	return t, nil
}

// warmText is what Warm speaks: long enough for the ramp's windows and a steady one.
const warmText = "This sentence warms the model up before the first caller arrives, so that nobody waits for it."

// Warm speaks a sentence alone in a made-up voice and throws the audio away: the programs a
// first request needs (the speaker encoder, the prompt's prefill, the decode steps, the
// ramp's codec windows and a steady one) are compiled now rather than while it plays, and
// the language model's token gap alone is measured, which admission needs before a second
// stream may join (LM.Fits). It returns the synthesis's stats.
func (t *TTS) Warm(ctx context.Context) (Stats, error) {
	const rate = 16000
	clip := make([]float32, 2*rate) // a hum with a vibrato: a voice the encoder accepts
	for i := range clip {
		x := float64(i) / rate
		clip[i] = float32(0.2 * math.Sin(2*math.Pi*(150*x+3*math.Sin(2*math.Pi*5*x))))
	}
	emb, err := t.Speaker.Embedding(clip, rate)
	if err != nil {
		return Stats{}, fmt.Errorf("miotts: warm-up: %w", err)
	}
	o := t.Stream
	o.Ramp = t.Ramp
	_, need := o.Window(len(o.Ramp) + 1) // through the first steady window
	st, err := t.Synthesize(ctx, Request{Text: warmText, Embedding: emb, Gen: GenOptions{MaxNew: need}}, func(Chunk) error { return nil })
	if err != nil {
		return st, fmt.Errorf("miotts: warm-up: %w", err)
	}
	return st, nil
}

// Close frees everything.
func (t *TTS) Close() {
	if t.Speaker != nil {
		t.Speaker.Close()
	}
	if t.Codec != nil {
		t.Codec.Close()
	}
	if t.LM != nil {
		t.LM.Close()
	}
}

// SampleRate is the output rate (44.1 kHz for the published codec).
func (t *TTS) SampleRate() int { return t.Codec.Config.SampleRate }

// Embed computes (or finds in the cache) the speaker embedding of a reference clip.
func (t *TTS) Embed(clip []float32, rate int) ([]float32, error) {
	return t.Embeddings.Get(embcache.Key(t.codecID, clip, rate), func() ([]float32, error) {
		return t.Speaker.Embedding(clip, rate)
	})
}

// Request is one synthesis.
type Request struct {
	Text  string
	Voice string    // resolved through Voices; "" is DefaultVoice
	Clip  []float32 // a reference clip given directly (overrides Voice)
	Rate  int       // Clip's sample rate
	// Embedding is a speaker embedding from Embed (overrides Clip and Voice).
	Embedding []float32
	Gen       GenOptions
}

// Chunk is audio ready to play.
type Chunk struct {
	Samples []float32 // at SampleRate; the receiver may keep it
	Final   bool
}

// Stats describe one synthesis.
type Stats struct {
	Pieces       int
	Tokens       int
	Samples      int
	FirstAudio   time.Duration // request → first samples handed to out
	Embed        time.Duration
	Prefill      time.Duration
	Decode       time.Duration // LM decode steps
	Codec        time.Duration // codec windows
	CodecSamples int
	// RampSkipped counts the ramp's first windows the pieces left out because the model was
	// shared and those windows would have come late (rampFor).
	RampSkipped int
}

// Synthesize speaks req.Text, calling out with audio as soon as each codec window is
// decoded. Long text is split at sentence boundaries and spoken piece by piece; ctx ending
// or out failing stops compute within one LM step or codec window.
func (t *TTS) Synthesize(ctx context.Context, req Request, out func(Chunk) error) (Stats, error) {
	var st Stats
	start := time.Now()
	text := Normalize(req.Text)
	if !Speakable(text) {
		return st, ErrNothingToSay
	}
	pieces := SplitText(text, MaxChunkRunes)
	emb, err := t.voice(req)
	if err != nil {
		return st, err
	}
	st.Embed = time.Since(start)
	emit := func(samples []float32, final bool) error {
		if len(samples) == 0 && !final {
			return nil
		}
		if st.FirstAudio == 0 && len(samples) > 0 {
			st.FirstAudio = time.Since(start)
		}
		st.Samples += len(samples)
		return out(Chunk{Samples: samples, Final: final})
	}
	for i, piece := range pieces {
		if !Speakable(piece) {
			continue
		}
		st.Pieces++
		if err := t.speakPiece(ctx, piece, emb, req.Gen, &st, func(s []float32, last bool) error {
			return emit(s, last && i == len(pieces)-1)
		}); err != nil {
			return st, err
		}
	}
	return st, nil
}

func (t *TTS) voice(req Request) ([]float32, error) {
	if req.Embedding != nil {
		return req.Embedding, nil
	}
	if req.Clip != nil {
		return t.Embed(req.Clip, req.Rate)
	}
	name := req.Voice
	if name == "" {
		name = t.DefaultVoice
	}
	if name == "" {
		return nil, ErrNoVoice
	}
	if t.Voices == nil {
		return nil, fmt.Errorf("miotts: voice %q: no voice library is configured", name)
	}
	clip, rate, err := t.Voices(name)
	if err != nil {
		return nil, err
	}
	return t.Embed(clip, rate)
}

// codecAhead is how many speech tokens a piece's codec may be behind its language model
// before the model waits for it.
const codecAhead = 64

// speakPiece generates one piece's tokens and decodes them to audio as they come. The codec
// runs on a goroutine of its own, so a window it decodes does not hold up the stream's next
// decode step (a stream late to a batched round waits for the next one).
func (t *TTS) speakPiece(ctx context.Context, text string, emb []float32, gen GenOptions, st *Stats, out func([]float32, bool) error) error {
	// The ramp's early audio needs tokens faster than real time: with other streams sharing
	// the model, or waiting to (rampPlan), a piece grows its ramp's windows more slowly or
	// starts later in it (or after a whole window: rampFor) so that it does not fall behind
	// its own playout.
	n := t.pieces.Add(1)
	defer t.pieces.Add(-1)
	so := t.Stream
	gap, delay := t.LM.rampPlan(int(n))
	var skipped int
	so.Ramp, skipped = rampFor(t.Ramp, so, gap, delay, &t.codec)
	cs, err := t.Codec.NewStream(emb, so)
	if err != nil {
		return err
	}
	st.RampSkipped += skipped
	play := newPlayout(cs.Options(), &t.codec)
	defer t.LM.steps.play(play)()
	// The codec batches the windows of the pieces speaking at once: compile the batch size
	// this many reach before their windows need it (once per size).
	if err := cs.Warm(int(n)); err != nil {
		return err
	}
	// decode runs a Push or the Flush: its time goes to the stats and to the codec's measured
	// cost per decoded token.
	decode := func(run func() ([]float32, error)) ([]float32, error) {
		t0, d0 := time.Now(), cs.DecodedTokens()
		audio, err := run()
		took := time.Since(t0)
		st.Codec += took
		t.codec.add(took, cs.DecodedTokens()-d0)
		return audio, err
	}
	codes := make(chan int32, codecAhead)
	var codecErr error // the codec goroutine's; read after it ends, or through failed
	var failed atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		var one [1]int32
		for c := range codes {
			if failed.Load() || ctx.Err() != nil {
				continue // drain: the piece is over
			}
			one[0] = c
			err := recovered("codec", func() error {
				audio, err := decode(func() ([]float32, error) { return cs.Push(one[:]) })
				if len(audio) > 0 {
					play.first.CompareAndSwap(0, time.Now().UnixNano())
				}
				st.CodecSamples += len(audio)
				if err == nil {
					err = out(audio, false)
				}
				return err
			})
			if err != nil {
				codecErr = err
				failed.Store(true)
			}
		}
	})
	gs, err := t.LM.Generate(ctx, text, gen, func(code int32) error {
		if failed.Load() {
			return errCodecStopped
		}
		play.generated.Add(1)
		select {
		case codes <- code:
			return nil
		case <-ctx.Done(): // the codec is codecAhead tokens behind and the request ended
			return fmt.Errorf("%w: %w", ErrCanceled, ctx.Err())
		}
	})
	close(codes)
	wg.Wait()
	st.Tokens += gs.Tokens
	st.Prefill += gs.Prefill
	st.Decode += gs.Decode
	if failed.Load() {
		return codecErr
	}
	if err != nil {
		return err
	}
	audio, err := decode(cs.Flush)
	st.CodecSamples += len(audio)
	if err != nil {
		return err
	}
	return out(audio, true)
}

// errCodecStopped stops generation once the codec goroutine has failed (its own error is
// the one returned).
var errCodecStopped = errors.New("miotts: codec stopped")
