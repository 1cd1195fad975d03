package stream

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// TTSJob is one text-to-speech request as every protocol runs it (the TTS WebSocket, the
// speech endpoint, WebRTC sessions in tts mode): wait for a slot of the model, synthesise
// with panics turned into errors, hand each chunk to Out, and account for what came out.
type TTSJob struct {
	Synth     Synthesizer
	Admission *Admission // nil: no slot needed
	Request   SynthRequest
	// Out gets each chunk in order; an error from it stops the synthesis and is returned.
	Out func(SynthChunk) error
	Log *slog.Logger
	// OnBusy, if set, is told when no slot was free in time (for metrics).
	OnBusy func()
}

// TTSResult is what a job produced.
type TTSResult struct {
	Samples int           // audio handed to Out, at the synthesizer's rate
	Audio   time.Duration // the same as a duration
	TTFA    time.Duration // from Run to the first chunk handed to Out (0: none)
	Elapsed time.Duration // from Run to its end, the wait for a slot included
	Err     error         // classify it with ClientError
}

// RTF is synthesis time over audio time (0 when no audio came out).
func (r TTSResult) RTF() float64 {
	if r.Audio <= 0 {
		return 0
	}
	return r.Elapsed.Seconds() / r.Audio.Seconds()
}

// Run runs the job until the text is spoken, Out fails, or ctx ends.
func (j TTSJob) Run(ctx context.Context) (res TTSResult) {
	start := time.Now()
	defer func() {
		res.Elapsed = time.Since(start)
		if rate := j.Synth.Info().SampleRate; rate > 0 {
			res.Audio = time.Duration(res.Samples) * time.Second / time.Duration(rate)
		}
	}()
	if j.Admission != nil {
		release, err := j.Admission.Acquire(ctx)
		if err != nil {
			if errors.Is(err, ErrBusy) && j.OnBusy != nil {
				j.OnBusy()
			}
			res.Err = err
			return res
		}
		defer release()
	}
	res.Err = Guard(j.Log, "synthesis", func() error {
		return j.Synth.Synthesize(ctx, j.Request, func(c SynthChunk) error {
			if res.TTFA == 0 && len(c.Samples) > 0 {
				res.TTFA = time.Since(start)
			}
			res.Samples += len(c.Samples)
			return j.Out(c)
		})
	})
	return res
}
