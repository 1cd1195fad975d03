package stream

import (
	"fmt"
	"slices"
	"sync"
)

// Factory makes a new processor instance for one session.
type Factory func() (Processor, error)

// Registry maps voice names to processor factories. It is safe for concurrent use.
type Registry struct {
	mu        sync.RWMutex
	factories map[string]Factory
}

// NewRegistry returns a registry holding the embedded voices: "dsp" (pitch and formant shift)
// and "passthrough".
func NewRegistry() *Registry {
	r := &Registry{factories: map[string]Factory{}}
	r.Register("dsp", func() (Processor, error) { return NewDSPVoice() })
	r.Register("passthrough", func() (Processor, error) { return NewDelay(DSPVoiceRate, DSPVoiceRate/50, 0), nil })
	return r
}

// Register adds or replaces a voice.
func (r *Registry) Register(name string, f Factory) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.factories[name] = f
}

// New makes a processor for the named voice.
func (r *Registry) New(name string) (Processor, error) {
	r.mu.RLock()
	f, ok := r.factories[name]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q (available: %v)", ErrUnknownVoice, name, r.Names())
	}
	p, err := f()
	if err != nil {
		return nil, fmt.Errorf("stream: voice %q: %w", name, err)
	}
	return p, nil
}

// Names lists the registered voices in order.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
