// Package miotts is MioTTS text-to-speech: a Qwen3 language model that writes MioCodec
// speech tokens for a ChatML prompt, and the MioCodec decoder that turns them into 44.1 kHz
// audio while the model is still writing.
package miotts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/models/bpe"
	"github.com/voxpipe/voxpipe/models/qwen3"
	"github.com/voxpipe/voxpipe/models/sampler"
)

// SpeechTokens is the number of MioCodec token ids (<|s_0|>..<|s_12799|>).
const SpeechTokens = 12800

// LM is a loaded MioTTS language model with its tokenizer and generation defaults; it is
// shared by all requests (each Generate call has its own KV cache).
type LM struct {
	Model     *qwen3.Model
	Tokenizer *bpe.Tokenizer
	Defaults  sampler.Config // from the embedded generation_config.json
	MaxNew    int            // default cap on generated tokens per piece of text
	speech0   int32          // id of <|s_0|>; the speech ids are contiguous
	eos       int32
	pad       int32 // treated as EOS too
	imStart   int32
	imEnd     int32
	rows      []int32 // candidate vocabulary rows: speech ids, then EOS

	mu   sync.Mutex
	idle []*qwen3.Session // finished sessions kept with their compiled programs

	steps *stepper // the decode steps of concurrent Generate calls, run together
}

// prefillChunk is the most prompt tokens one prefill program takes while other streams
// generate (BenchmarkJoinStall measures the trade-off).
var prefillChunk = 16

// maxIdle bounds the sessions kept for reuse (each holds a KV cache).
const maxIdle = 4

// session returns an idle session with room for n positions, or a new one (its capacity
// rounded up so it can serve later requests too).
func (lm *LM) session(n int) (*qwen3.Session, error) {
	lm.mu.Lock()
	for i, s := range lm.idle {
		if s.MaxTokens() >= n {
			lm.idle = append(lm.idle[:i], lm.idle[i+1:]...)
			lm.mu.Unlock()
			return s, nil
		}
	}
	lm.mu.Unlock()
	c := (n + 255) / 256 * 256
	if mp := lm.Model.Config.MaxPos; mp > 0 {
		c = min(c, mp)
	}
	s, err := lm.Model.NewSession(c)
	if err != nil {
		return nil, err
	}
	if err := s.SetOutputRows(lm.rows); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// release keeps a finished session for reuse, or closes it when enough are kept.
func (lm *LM) release(s *qwen3.Session) {
	s.Reset()
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if len(lm.idle) < maxIdle {
		lm.idle = append(lm.idle, s)
		return
	}
	s.Close()
}

// LoadLM opens a MioTTS GGUF in the audio.cpp packaging (Hugging Face tensor names, embedded
// config.json, generation_config.json and tokenizer files).
func LoadLM(path string, backend engine.Backend) (*LM, error) {
	f, err := gguf.OpenModel(path)
	if err != nil {
		return nil, fmt.Errorf("miotts: %w", err)
	}
	defer f.Close()
	if fam, err := f.File.KV.String("audiocpp.model_spec.family"); err == nil && fam != "miotts" {
		return nil, fmt.Errorf("miotts: %s is a %q model, not a MioTTS language model", path, fam)
	}
	tok, err := bpe.FromModel(f)
	if err != nil {
		return nil, fmt.Errorf("miotts: %s: %w", path, err)
	}
	cfgJSON, ok := f.EmbeddedFile("config.json")
	if !ok {
		return nil, fmt.Errorf("miotts: %s: no embedded config.json", path)
	}
	cfg, err := qwen3.ParseConfig(cfgJSON)
	if err != nil {
		return nil, err
	}
	gen := sampler.Config{Temperature: 0.8, TopK: 50, TopP: 1, RepetitionPenalty: 1}
	maxNew := 700
	if g, ok := f.EmbeddedFile("generation_config.json"); ok {
		if gen, err = sampler.ConfigFromGenerationJSON(g); err != nil {
			return nil, fmt.Errorf("miotts: %s: %w", path, err)
		}
		if n, ok := maxNewTokens(g); ok {
			maxNew = n
		}
	}
	lm := &LM{Tokenizer: tok, Defaults: gen, MaxNew: maxNew, eos: int32(cfg.EOSTokenID), pad: int32(cfg.PadTokenID)}
	if err := lm.resolveIDs(cfg.Vocab); err != nil {
		return nil, fmt.Errorf("miotts: %s: %w", path, err)
	}
	if byteLevelOnly(tok, cfg.Vocab) {
		slog.Warn("this model's tokenizer has no merges, so its prompts cost a token a byte (several times the published tokenizer's): "+
			"a random model made by voxpipe mkmodel before its tokenizer learnt merges; remake it for realistic prefill and TTS load figures", "model", path)
	}
	if lm.Model, err = qwen3.FromSource(cfg, f, backend); err != nil {
		return nil, err
	}
	lm.steps = newStepper(lm.Model)
	return lm, nil
}

// byteLevelOnly reports a tokenizer for a real-size vocabulary that splits English into
// bytes: no merges at all.
func byteLevelOnly(tok *bpe.Tokenizer, vocab int) bool {
	return vocab >= 100000 && len(tok.Encode(" the")) > 1
}

func (lm *LM) resolveIDs(vocab int) error {
	id := func(s string) (int32, error) {
		v, ok := lm.Tokenizer.TokenID(s)
		if !ok {
			return 0, fmt.Errorf("tokenizer has no %s token", s)
		}
		return int32(v), nil
	}
	var err error
	if lm.speech0, err = id("<|s_0|>"); err != nil {
		return err
	}
	last, err := id("<|s_" + strconv.Itoa(SpeechTokens-1) + "|>")
	if err != nil {
		return err
	}
	if last != lm.speech0+SpeechTokens-1 || int(last) >= vocab {
		return fmt.Errorf("speech tokens are not %d contiguous ids inside the vocabulary of %d (<|s_0|>=%d, last=%d)",
			SpeechTokens, vocab, lm.speech0, last)
	}
	if lm.imStart, err = id("<|im_start|>"); err != nil {
		return err
	}
	if lm.imEnd, err = id("<|im_end|>"); err != nil {
		return err
	}
	if lm.eos != lm.imEnd {
		return fmt.Errorf("eos_token_id %d is not <|im_end|> (%d)", lm.eos, lm.imEnd)
	}
	lm.rows = make([]int32, 0, SpeechTokens+1)
	for c := range int32(SpeechTokens) {
		lm.rows = append(lm.rows, lm.speech0+c)
	}
	lm.rows = append(lm.rows, lm.eos)
	return nil
}

func maxNewTokens(genJSON []byte) (int, bool) {
	var g struct {
		MaxNew *int `json:"max_new_tokens"`
	}
	if err := json.Unmarshal(genJSON, &g); err != nil || g.MaxNew == nil || *g.MaxNew <= 0 {
		return 0, false
	}
	return *g.MaxNew, true
}

// Close frees the model weights.
func (lm *LM) Close() {
	lm.mu.Lock()
	for _, s := range lm.idle {
		s.Close()
	}
	lm.idle = nil
	lm.mu.Unlock()
	if lm.Model != nil {
		lm.Model.Close()
	}
}

// Candidates are the vocabulary rows the head computes: <|s_0|>..<|s_12799|>, then EOS.
func (lm *LM) Candidates() []int32 { return lm.rows }

// SpeechID is the vocabulary id of MioCodec token c.
func (lm *LM) SpeechID(c int32) int32 { return lm.speech0 + c }

// PromptText is the ChatML prompt MioTTS was trained with (no system prompt, no BOS).
func PromptText(text string) string {
	return "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n"
}

// Prompt tokenizes the prompt for already normalised text. Only the template's own markers
// become special tokens: the user's text is encoded as plain text (AppendEncodeText), so
// "<|im_end|>" or "<|s_5|>" in it cannot steer the model. For text without such markers the
// ids equal those of encoding PromptText whole.
func (lm *LM) Prompt(text string) []int32 {
	tok := lm.Tokenizer
	ids := make([]int, 0, len(text)/3+8)
	ids = append(ids, int(lm.imStart))
	ids = tok.AppendEncodeText(ids, "user\n"+text) // one piece, as the pre-tokenizer saw it
	ids = append(ids, int(lm.imEnd))
	ids = tok.AppendEncodeText(ids, "\n")
	ids = append(ids, int(lm.imStart))
	ids = tok.AppendEncodeText(ids, "assistant\n")
	out := make([]int32, len(ids))
	for i, v := range ids {
		out[i] = int32(v)
	}
	return out
}

// maxTokensNoContext caps generation for a model whose config gives no context length, so
// the KV cache and history are sized by something other than a caller's number.
const maxTokensNoContext = 8192

// GenOptions are per-request generation settings; zero fields take the model's defaults.
type GenOptions struct {
	Sampler *sampler.Config // nil: the generation_config.json defaults
	Seed    uint64          // 0: a fixed default seed, so output is reproducible
	MaxNew  int             // cap on speech tokens; 0: the model's default
}

// GenStats describe one generation.
type GenStats struct {
	PromptTokens int
	Tokens       int  // speech tokens emitted
	Stopped      bool // ended with EOS (rather than the token cap or a cancel)
	Prefill      time.Duration
	Decode       time.Duration // all decode steps together
}

// ErrCanceled is returned (wrapped with the context's error) when ctx ends a generation.
var ErrCanceled = errors.New("miotts: generation canceled")

// Generate writes MioCodec tokens for one piece of normalised text, calling emit with each
// token (0..12799) as soon as it is chosen. It stops at EOS, at the token cap, when emit
// fails, or when ctx is done (checked before every decode step, so a cancel stops compute
// within one step). Concurrent calls share their decode steps (one batched model step for
// all generating streams); each keeps its own prompt, sampler, seed and cap.
func (lm *LM) Generate(ctx context.Context, text string, opt GenOptions, emit func(code int32) error) (st GenStats, err error) {
	prompt := lm.Prompt(text)
	st.PromptTokens = len(prompt)
	maxNew := opt.MaxNew
	if maxNew <= 0 {
		maxNew = lm.MaxNew
	}
	// Compared as maxNew > mp-len(prompt), never len(prompt)+maxNew: a cap near MaxInt
	// would overflow the sum and pass.
	if mp := lm.Model.Config.MaxPos; mp > 0 && maxNew > mp-len(prompt) {
		if len(prompt) >= mp {
			return st, fmt.Errorf("miotts: prompt of %d tokens does not fit the context of %d", len(prompt), mp)
		}
		maxNew = mp - len(prompt)
	} else if mp <= 0 && maxNew > maxTokensNoContext {
		maxNew = maxTokensNoContext
	}
	cfg := lm.Defaults
	if opt.Sampler != nil {
		cfg = *opt.Sampler
	}
	cfg.Seed = opt.Seed
	if cfg.Seed == 0 {
		cfg.Seed = 0x6d696f747473 // "miotts": fixed, so the same request gives the same audio
	}
	smp := sampler.New(cfg)
	if err := smp.SetCandidates(lm.rows); err != nil {
		return st, err
	}
	sess, err := lm.session(len(prompt) + maxNew)
	if err != nil {
		return st, fmt.Errorf("miotts: %w", err)
	}
	defer lm.release(sess)
	if err := ctx.Err(); err != nil {
		return st, fmt.Errorf("%w: %w", ErrCanceled, err)
	}
	t0 := time.Now()
	// While other streams generate, the prompt goes in chunks: the engine runs one program
	// at a time, and their rounds get a turn between chunks instead of waiting for the whole
	// prompt (a 120-token prompt held them 0.74 s in one program, at most 0.17 s in chunks of
	// 16 — which take this stream twice as long). Alone, it goes in one program.
	chunk, shared := len(prompt), lm.steps.generating() > 0
	if shared {
		chunk = prefillChunk
	}
	var logits []float32
	busy0 := sess.PrefillTime()
	for i := 0; i < len(prompt); i += chunk {
		if logits, err = sess.Prefill(prompt[i:min(i+chunk, len(prompt))]); err != nil {
			return st, fmt.Errorf("miotts: prefill: %w", err)
		}
	}
	st.Prefill = time.Since(t0)
	// What the prefill costs the streams generating meanwhile is the backend time of its
	// chunks, not its wall time: their own rounds ran between the chunks.
	lm.steps.notePrefill(sess.PrefillTime()-busy0, shared)
	history := append(make([]int32, 0, len(prompt)+maxNew), prompt...)
	// From here the stream's steps run batched with the other generating streams'.
	lm.steps.join()
	defer lm.steps.leave()
	req := &stepReq{done: make(chan struct{}, 1)}
	t0 = time.Now()
	defer func() { st.Decode = time.Since(t0) }()
	for st.Tokens < maxNew {
		id := smp.Sample(logits, history)
		if id == lm.eos || id == lm.pad {
			st.Stopped = true
			return st, nil
		}
		st.Tokens++
		if err := emit(id - lm.speech0); err != nil {
			return st, err
		}
		if st.Tokens == maxNew {
			break
		}
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("%w: %w", ErrCanceled, err)
		}
		history = append(history, id)
		if logits, err = lm.steps.step(req, sess, id); err != nil {
			return st, fmt.Errorf("miotts: decode step %d: %w", st.Tokens, err)
		}
	}
	return st, nil
}
