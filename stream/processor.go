// Package stream runs streaming audio sessions: it feeds a Processor (a voice conversion
// model, the embedded DSP voice) from a live or file source, resampling, chunking and
// queueing as needed, and accounts for where every output sample came from.
//
// stream/ never imports a model package: models satisfy the interfaces here in plain
// types, and cmd/ wires them together through a Registry.
package stream

import (
	"errors"
	"time"
)

// ProcessorInfo describes a processor's fixed properties.
type ProcessorInfo struct {
	// SampleRate is the processor's native rate in Hz.
	SampleRate int
	// ChunkSize is the number of input samples Process takes at a time.
	ChunkSize int
	// Latency is the processor's algorithmic latency in samples at SampleRate: output sample
	// k (counting from the first sample after a reset) corresponds to input sample k-Latency.
	Latency int
	// Overlap is the number of samples at the start of each output chunk that overlap the
	// end of the previous chunk and are crossfaded with it by the session (0: contiguous).
	Overlap int
	// Cushion is the output (samples at SampleRate) a live session should have queued before
	// it starts playing: what the processor's slowest chunks take to compute beyond their own
	// duration, as measured when it was made (0: none). Without it the first slow chunks
	// would each leave the listener a gap while the session's cushion grows to cover them.
	Cushion int
	// Shared is how the processor runs as one of many sessions of its model, measured when
	// the model was loaded (zero: not measured). Until the scheduler has learned the voice
	// from running sessions, it admits by Shared.Cost (Scheduler.Admit) and starts sessions
	// with a cushion for Shared.Slowest (Scheduler.startCushion).
	Shared Shared
}

// Shared is a measurement of sessions of one model running together.
type Shared struct {
	Sessions int           // how many ran together
	Cost     float64       // what a second of audio cost the machine per session, in core seconds
	Slowest  time.Duration // the slowest step one of them took
}

// Metered is a Processor whose calls' wall time is not what they cost the machine: a model
// that batches streams waits for, and runs, other streams' work within a call, and may run
// its own on several cores. Overcharge is the total of its calls' wall time less the core
// time of their own work (negative where the extra cores are the larger part). The
// scheduler counts a step's wall time less its processors' overcharge in the load and in
// the voice's learned cost; without it eight batched sessions would each count the whole
// batch.
type Metered interface {
	Overcharge() time.Duration
}

// Processor transforms audio chunk by chunk. It is driven by one goroutine at a time.
type Processor interface {
	Info() ProcessorInfo
	// Process consumes exactly Info().ChunkSize samples and appends its output to out.
	// Without overlap, it appends as many samples as it consumed.
	Process(out, in []float32) ([]float32, error)
	// Flush appends whatever output is still held back (the last Latency samples).
	Flush(out []float32) ([]float32, error)
	// Reset returns the processor to its state after construction.
	Reset()
}

// Tunable is implemented by processors whose parameters can change while streaming, without
// clicks. Unknown parameter names are an error.
type Tunable interface {
	SetParams(params map[string]float64) error
}

// ErrUnknownVoice is returned (wrapped) by a Registry for a voice name it does not know.
var ErrUnknownVoice = errors.New("unknown voice")
