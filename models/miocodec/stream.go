package miocodec

import (
	"fmt"
	"math"
	"slices"
)

// StatsMode is how a Stream's GroupNorms get their statistics.
type StatsMode int

const (
	// StatsRunning (the default) normalises with group statistics accumulated over every
	// frame decoded so far in the utterance (the cores of earlier windows) plus the new
	// frames of the current window: the offline decode normalises over the whole utterance,
	// which a stream cannot know in advance.
	StatsRunning StatsMode = iota
	// StatsPlain normalises over each window alone (what decoding windows with the
	// reference model does).
	StatsPlain
	// StatsFrozen uses given statistics (StreamOptions.Frozen), e.g. the full utterance's
	// from Decoder.DecodeStats: a test mode that makes windowed decoding exact once the
	// context covers the receptive field.
	StatsFrozen
)

// Stream defaults: cores of 24 tokens (0.96 s) with 16 tokens of context on each side, so
// the first audio comes after 40 tokens and each window decodes 56 tokens for 24 emitted
// (≈2.3× the offline work). The context is a latency/cost versus fidelity setting: on the
// golden (random-weight) model the live stream's deviation from the offline decode shrinks
// with context (TestStreamLive), but the real trade-off can only be judged with trained
// weights (the real decoder's receptive field is ±325 tokens; attention there is local).
const (
	DefaultCore    = 24
	DefaultContext = 16
)

// StreamOptions configure a Stream; zero values take the defaults.
type StreamOptions struct {
	Core         int // tokens emitted per window
	LeftContext  int // tokens decoded before the core (0: DefaultContext; <0: none)
	RightContext int // tokens decoded after the core (0: DefaultContext; <0: none)
	// Crossfade is the length in samples of the raised-cosine blend at each seam, centred
	// on it (0: half a token; <0: none). It is limited by the context on both sides.
	Crossfade int
	// Ramp lists the cores of the first windows, shorter than Core, so that audio starts
	// after Ramp[0] + its right context tokens and each next window is ready before the
	// audio already out has played (e.g. 4, 8, 16, then Core). A ramp window's right context
	// is RampContext, or min(its core, RightContext) when that is 0: early cores see less
	// future, later windows are unaffected.
	Ramp        []int
	RampContext int
	Stats       StatsMode
	Frozen      *GroupStats // StatsFrozen only
}

// Stream decodes one utterance while its tokens arrive, as overlapping windows
// [core − left, core + right) of which the core's samples are emitted. It is used by one
// goroutine; cancelling is just not calling it again (each call decodes whole windows).
type Stream struct {
	d      *Decoder
	global []float32
	o      StreamOptions
	spt    int // samples per token
	half   int // crossfade half-width in samples

	tokens  []int32
	window  int       // index of the next window to decode
	decoded int       // tokens decoded by all windows so far (DecodedTokens)
	tail    []float32 // the previous window's samples [seam − half, seam + half)
	out     []float32 // returned samples (reused)
	wave    []float32 // one window's waveform (reused)
	ramp    []float32 // crossfade weights of the new window
	io      runIO
}

// NewStream starts a stream for one speaker (global embedding).
func (d *Decoder) NewStream(global []float32, o StreamOptions) (*Stream, error) {
	if len(global) != d.CondDim {
		return nil, fmt.Errorf("miocodec: stream: global embedding of %d values, want %d", len(global), d.CondDim)
	}
	o = o.withDefaults()
	o.Ramp = slices.Clone(o.Ramp)
	for _, c := range o.Ramp {
		if c <= 0 {
			return nil, fmt.Errorf("miocodec: stream: ramp core %d is not positive", c)
		}
	}
	s := &Stream{d: d, global: append([]float32(nil), global...), o: o, spt: d.Config.SamplesPerToken()}
	switch {
	case o.Crossfade == 0:
		s.half = s.spt / 4
	case o.Crossfade > 0:
		s.half = o.Crossfade / 2
	}
	// Seams are a core apart and each blend needs its samples on both sides from context.
	s.half = min(s.half, s.spt, o.Core*s.spt/2, o.LeftContext*s.spt, o.RightContext*s.spt)
	for w := range o.Ramp {
		c0, c1 := s.o.core(w)
		s.half = min(s.half, (c1-c0)*s.spt/2, s.o.right(w)*s.spt)
	}
	if o.Stats == StatsFrozen && o.Frozen == nil {
		return nil, fmt.Errorf("miocodec: stream: frozen statistics mode without statistics")
	}
	s.ramp = make([]float32, 2*s.half)
	for i := range s.ramp {
		s.ramp[i] = float32(0.5 - 0.5*math.Cos(math.Pi*(float64(i)+0.5)/float64(2*s.half)))
	}
	nGN := d.NumGroupNorms()
	s.io.acc = make([][]float64, nGN)
	s.io.commit = make([][]float64, nGN)
	for i := range nGN {
		s.io.acc[i] = make([]float64, 2*d.groupsOf(i))
	}
	s.io.frozen = o.Frozen
	return s, nil
}

// withDefaults fills in the zero values (the ramp is still the caller's).
func (o StreamOptions) withDefaults() StreamOptions {
	if o.Core <= 0 {
		o.Core = DefaultCore
	}
	ctx := func(c int) int {
		switch {
		case c == 0:
			return DefaultContext
		case c < 0:
			return 0
		}
		return c
	}
	o.LeftContext, o.RightContext = ctx(o.LeftContext), ctx(o.RightContext)
	return o
}

// Window is window w's place in the utterance: start is its first emitted token (its audio
// begins start token periods after the stream's first audio) and need the number of tokens
// the stream must hold before the window decodes (its core and right context) — what a
// playout schedule is predicted from.
func (o StreamOptions) Window(w int) (start, need int) {
	o = o.withDefaults()
	start, end := o.core(w)
	return start, end + o.right(w)
}

// Span is the tokens [first, need) window w decodes when the stream holds all it needs: its
// left context, core and right context. A window's decode time grows with need − first.
func (o StreamOptions) Span(w int) (first, need int) {
	o = o.withDefaults()
	start, end := o.core(w)
	return max(0, start-o.LeftContext), end + o.right(w)
}

// DecodedTokens is how many tokens the stream's windows have decoded since it was made,
// contexts included (a token in two windows counts twice): with the time its Push and Flush
// calls took, the codec's cost per decoded token.
func (s *Stream) DecodedTokens() int { return s.decoded }

// Options are the stream's settings with the defaults filled in.
func (s *Stream) Options() StreamOptions { return s.o }

// Reset starts a new utterance with the same speaker and settings.
func (s *Stream) Reset() {
	s.tokens = s.tokens[:0]
	s.window = 0
	s.tail = s.tail[:0]
	s.io.committed = 0
	for _, a := range s.io.acc {
		clear(a)
	}
}

// Push adds tokens and decodes every window whose right context has arrived. It returns
// the samples that became final (a slice owned by the stream, valid until the next call).
func (s *Stream) Push(tokens []int32) ([]float32, error) {
	if err := s.d.fsq.check(tokens); err != nil {
		return nil, err
	}
	s.tokens = append(s.tokens, tokens...)
	s.out = s.out[:0]
	for {
		if _, end := s.o.core(s.window); end+s.o.right(s.window) > len(s.tokens) {
			break
		}
		if err := s.decodeWindow(false); err != nil {
			return nil, err
		}
	}
	return s.out, nil
}

// Flush decodes the remaining windows at the end of the utterance and returns the rest of
// its samples; the stream is then empty (as after Reset).
func (s *Stream) Flush() ([]float32, error) {
	s.out = s.out[:0]
	for {
		if start, _ := s.o.core(s.window); start >= len(s.tokens) {
			break
		}
		if err := s.decodeWindow(true); err != nil {
			return nil, err
		}
	}
	out := s.out
	s.Reset()
	s.out = out
	return out, nil
}

// core is window w's core, tokens [start, end): the ramp's cores, then Core each.
func (o StreamOptions) core(w int) (start, end int) {
	for i, c := range o.Ramp {
		if i == w {
			return start, start + c
		}
		start += c
	}
	start += (w - len(o.Ramp)) * o.Core
	return start, start + o.Core
}

// right is window w's right context in tokens.
func (o StreamOptions) right(w int) int {
	if w >= len(o.Ramp) {
		return o.RightContext
	}
	if o.RampContext > 0 {
		return o.RampContext
	}
	return min(o.Ramp[w], o.RightContext)
}

// windowPlan is the program plan and the token range [start, end) of window w when the
// stream holds n tokens, and the window's core [core0, core1).
func (s *Stream) windowPlan(w, n int) (pl plan, start, end, core0, core1 int) {
	core0, core1 = s.o.core(w)
	core1 = min(core1, n)
	start = max(0, core0-s.o.LeftContext)
	end = min(n, core1+s.o.right(w))
	pl = s.d.tokenPlan(end - start)
	switch s.o.Stats {
	case StatsRunning:
		pl.gn, pl.newFrom, pl.coreEnd = gnRunning, core0-start, core1-start
	case StatsFrozen:
		pl.gn = gnFrozen
	}
	return pl, start, end, core0, core1
}

// Warm compiles the program of the stream's steady windows (those after the ramp, which
// streams with the same options share) for every batch size up to streams that has none
// yet, so that the first run of a size does not stall its streams on compiling. Call it
// when the streams decoding at once reach a new count.
func (s *Stream) Warm(streams int) error {
	o := s.o
	w := len(o.Ramp) + (o.LeftContext+o.Core-1)/o.Core + 1 // a whole left context before its core
	_, end := o.core(w)
	pl, _, _, _, _ := s.windowPlan(w, end+o.RightContext)
	for b := 1; b <= min(streams, MaxBatch); b *= 2 {
		pl.batch = b
		s.d.mu.Lock()
		_, err := s.d.program(pl)
		s.d.mu.Unlock()
		if err != nil {
			return fmt.Errorf("miocodec: warm a batch of %d windows: %w", b, err)
		}
	}
	return nil
}

// decodeWindow decodes window s.window and appends its final samples to s.out.
func (s *Stream) decodeWindow(flushing bool) error {
	n := len(s.tokens)
	pl, start, end, core0, core1 := s.windowPlan(s.window, n)
	last := core1 == n && flushing
	w := window{tokens: s.tokens[start:end], global: s.global, io: &s.io, wave: s.wave[:0]}
	err := s.d.decodeQueued(pl, &w)
	s.wave = w.wave
	s.decoded += end - start
	if err != nil {
		return fmt.Errorf("miocodec: stream window %d (tokens %d..%d): %w", s.window, start, end, err)
	}
	if s.o.Stats == StatsRunning {
		for i, c := range s.io.commit {
			for j, v := range c {
				s.io.acc[i][j] += v
			}
		}
		s.io.committed += core1 - core0
	}
	// Window-relative sample positions of this window's part: [from, to).
	base := start * s.spt
	from := core0*s.spt - base
	if s.window > 0 && s.half > 0 {
		// Blend the seam region with what the previous window left.
		from -= s.half
		for i, v := range s.tail {
			w := s.ramp[i]
			s.out = append(s.out, v*(1-w)+s.wave[from+i]*w)
		}
		from += len(s.tail)
	}
	to := core1*s.spt - base
	s.tail = s.tail[:0]
	if !last && s.half > 0 {
		s.tail = append(s.tail, s.wave[to-s.half:to+s.half]...)
		to -= s.half
	}
	s.out = append(s.out, s.wave[from:to]...)
	s.window++
	return nil
}
