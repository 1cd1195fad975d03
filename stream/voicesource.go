package stream

import "fmt"

// VoiceSource is where a session gets its voice: NewProcessor, if set, makes the voices that
// take a reference clip for an owner (MeanVC2) and returns (nil, nil) for the others, which
// the Registry makes. A voice from NewProcessor is a model on the Scheduler's workers: it is
// refused with ErrBusy when it would not fit (Scheduler.Admit).
type VoiceSource struct {
	Registry     *Registry
	NewProcessor func(owner, voice, ref string) (Processor, error)
	Scheduler    *Scheduler
}

// Make makes the voice name for owner, with the reference clip ref and the parameters
// params applied. Errors are classified for clients by Classify.
func (v VoiceSource) Make(owner, name, ref string, params map[string]float64) (Processor, error) {
	var proc Processor
	if v.NewProcessor != nil {
		p, err := v.NewProcessor(owner, name, ref)
		if err != nil {
			return nil, err
		}
		if p != nil && v.Scheduler != nil && !v.Scheduler.Admit(name, nil, p) {
			CloseProcessor(p)
			return nil, NoRoom(name)
		}
		proc = p
	}
	if proc == nil {
		if ref != "" {
			return nil, Mark(fmt.Errorf("voice %q takes no reference clip (ref)", name), ErrBadParams)
		}
		p, err := v.Registry.New(name)
		if err != nil {
			return nil, err
		}
		proc = p
	}
	if len(params) > 0 {
		t, ok := proc.(Tunable)
		if !ok {
			CloseProcessor(proc)
			return nil, Mark(fmt.Errorf("voice %q takes no parameters", name), ErrBadParams)
		}
		if err := t.SetParams(params); err != nil {
			CloseProcessor(proc)
			return nil, Mark(err, ErrBadParams)
		}
	}
	return proc, nil
}
