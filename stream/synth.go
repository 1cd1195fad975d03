package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// SynthRequest is one text-to-speech request.
type SynthRequest struct {
	Text string
	// Voice names the speaker (a voice library id or a preset); "" is the synthesizer's
	// default voice.
	Voice string
	// Owner is the principal asking (auth.PrincipalOf): a library voice must be one of its
	// own. "" is the server itself (its default voice).
	Owner string
	// Seed makes sampling reproducible; 0 is the synthesizer's fixed default.
	Seed uint64
	// Temperature overrides the model's sampling temperature when > 0.
	Temperature float64
	// MaxTokens caps generated tokens per text piece when > 0.
	MaxTokens int
}

// SynthChunk is audio as it leaves the synthesizer.
type SynthChunk struct {
	Samples []float32 // mono at SynthInfo.SampleRate; owned by the receiver
	// Offset is the position of Samples[0] in the utterance's audio.
	Offset time.Duration
	// Elapsed is the time from the start of Synthesize to this chunk being ready.
	Elapsed time.Duration
	// Final marks the last chunk of the request.
	Final bool
}

// ErrNothingToSay is returned (wrapped) by a Synthesizer for text with nothing to speak
// (no letters or digits): the client's mistake, not a failure.
var ErrNothingToSay = errors.New("nothing to say")

// HasWords reports whether text has anything but spaces and control characters: text
// without is not sent to a synthesizer at all.
func HasWords(text string) bool {
	for _, r := range text {
		if r > ' ' {
			return true
		}
	}
	return false
}

// SynthInfo describes a synthesizer.
type SynthInfo struct {
	Name       string
	SampleRate int
}

// Synthesizer turns text into audio chunks as it generates them. Synthesize calls out from
// its own goroutine, in order; an error from out, or ctx ending, stops generation within
// one model step and is returned. Implementations serve concurrent calls.
type Synthesizer interface {
	Info() SynthInfo
	Synthesize(ctx context.Context, req SynthRequest, out func(SynthChunk) error) error
}

// CapacityAware is a Synthesizer that knows whether one more concurrent stream, with active
// already running, would still generate in real time (from its measured step times).
// Admission asks it before a request takes a free slot (Admission.SetFits).
type CapacityAware interface {
	Fits(active int) bool
}

// AdmissionFor makes the admission control of the synthesizer name: slots streams at most,
// a wait of maxWait, and its measured capacity when it is CapacityAware.
func (s *Synthesizers) AdmissionFor(name string, slots int, maxWait time.Duration) *Admission {
	a := NewAdmission(slots, maxWait)
	if syn, err := s.Get(name); err == nil {
		if c, ok := syn.(CapacityAware); ok {
			a.SetFits(c.Fits)
		}
	}
	return a
}

// Synthesizers holds the loaded text-to-speech models by name.
type Synthesizers struct {
	mu sync.RWMutex
	m  map[string]Synthesizer
}

// Register adds or replaces a synthesizer under its Info().Name.
func (s *Synthesizers) Register(syn Synthesizer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]Synthesizer{}
	}
	s.m[syn.Info().Name] = syn
}

// Get finds a synthesizer by name; "" picks the only one when exactly one is loaded.
func (s *Synthesizers) Get(name string) (Synthesizer, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if name == "" && len(s.m) == 1 {
		for _, v := range s.m {
			return v, nil
		}
	}
	if v, ok := s.m[name]; ok {
		return v, nil
	}
	if len(s.m) == 0 {
		return nil, fmt.Errorf("no text-to-speech model is loaded (start the server with --tts-model and --codec)")
	}
	return nil, fmt.Errorf("unknown text-to-speech model %q (loaded: %v)", name, s.names())
}

// Names lists the loaded synthesizers.
func (s *Synthesizers) Names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.names()
}

func (s *Synthesizers) names() []string {
	var out []string
	for n := range s.m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
