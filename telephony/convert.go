package telephony

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// converter is a call in vc mode: the caller's audio, decoded, waits in a bounded buffer;
// each 20 ms tick of the clock takes one frame of it into a stream.Live session on the
// server's scheduler (which resamples it to the voice's rate and back) and takes one frame of
// the voice's output back out. The buffer is the call's jitter buffer: the clock starts
// taking from it once it holds the jitter target, and collects that much again after it
// ran dry, so audio that arrives unevenly still plays evenly.
type converter struct {
	c     *call
	name  string
	live  *stream.Live
	procs []stream.Processor // made for this call; closed at its end

	mu       sync.Mutex
	in       *buffers.FIFO
	scratch  []float32
	playing  bool // taking a frame a tick (false: collecting the jitter target)
	stopping bool // the input ended: play out what is left, then end the call
	target   int  // jitter target, samples
	maxIn    int  // most input held, samples
	excess   int  // input beyond the target at which a frame a tick is shed
	dropped  int  // input samples dropped (over maxIn, or shed)
	under    int  // ticks that found too little input while playing

	// The clock's own.
	drainFrames int // frames of silence that push the voice's held-back tail out
	drainLeft   int
	pcm         bool // pcm_s16le (else μ-law)
}

// startVC makes the call's voice and its live session.
func (c *call) startVC() (string, error) {
	name := c.cfg.voice
	if name == "" {
		name = c.srv.cfg.DefaultVoice
	}
	proc, code, err := c.newVoice(name, c.cfg.ref)
	if err != nil {
		return code, err
	}
	v := &converter{c: c, name: name, procs: []stream.Processor{proc}, pcm: c.cfg.encoding == "pcm_s16le"}
	defer func() { // on an error, or a panic on its way to the call's guard
		if c.vc != v {
			v.close()
		}
	}()
	if len(c.cfg.params) > 0 {
		t, ok := proc.(stream.Tunable)
		if !ok {
			return CodeBadParams, fmt.Errorf("voice %q takes no parameters", name)
		}
		if err := t.SetParams(c.cfg.params); err != nil { // not installed yet: set directly
			return CodeBadParams, err
		}
	}
	v.live, err = c.srv.sched.NewLive(stream.Config{IORate: c.cfg.rate, MaxQueue: c.srv.cfg.MaxQueue}, name, proc, c.log)
	if err != nil {
		code, msg := stream.ClientError(c.log, "voice "+name, err, CodeInternal)
		return code, errors.New(msg)
	}
	rate := float64(c.cfg.rate)
	v.target = max(int(c.srv.cfg.JitterTarget.Seconds()*rate), c.frame)
	v.maxIn = int(c.srv.cfg.MaxBuffered.Seconds() * rate)
	v.excess = v.target + int(0.3*rate)
	v.in = buffers.NewFIFO(v.maxIn + c.cfg.rate/10)
	// The voice's tail: its designed latency (chunking, resampling) and 100 ms more, at
	// most a second.
	alg := stream.AlgorithmicLatency(c.cfg.rate, proc.Info()) + 100*time.Millisecond
	v.drainFrames = min(int(math.Ceil(alg.Seconds()*50)), 50)
	c.vc = v
	return "", nil
}

// muLaw is G.711 μ-law decoded, scaled to −1…1.
var muLaw = func() (t [256]float32) {
	for i := range t {
		t[i] = float32(audioout.MuLawToLinear(byte(i))) / 32768
	}
	return t
}()

// audioIn queues inbound audio (μ-law or 16-bit little-endian PCM) for the clock.
func (c *call) audioIn(b []byte) {
	v := c.vc
	if v == nil || len(b) == 0 {
		return // a tts call does not use the caller's audio
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stopping {
		return
	}
	x := v.scratch[:0]
	if v.pcm {
		for i := 0; i+1 < len(b); i += 2 {
			x = append(x, float32(int16(uint16(b[i])|uint16(b[i+1])<<8))/32768)
		}
	} else {
		for _, u := range b {
			x = append(x, muLaw[u])
		}
	}
	v.scratch = x
	v.in.Write(x)
	if over := v.in.Len() - v.maxIn; over > 0 {
		v.dropped += v.in.Discard(over)
	}
}

// stop: no more input; what is buffered plays out, then the call ends.
func (v *converter) stop() {
	v.mu.Lock()
	v.stopping = true
	v.mu.Unlock()
}

// tick is the clock's 20 ms step in vc mode: one frame of input into the voice, one frame of
// output to the client. It returns false once a stopped call has played everything out.
func (v *converter) tick(f *clockFrame, now time.Time) bool {
	c := v.c
	v.mu.Lock()
	n := v.in.Len()
	if !v.playing && (n >= v.target || v.stopping && n > 0) {
		v.playing = true
	}
	got := 0
	if v.playing {
		if !v.stopping && n > v.excess {
			// Sustained surplus (a sender's clock faster than ours, a burst after a stall):
			// shed a frame, crossfaded, rather than let the delay grow.
			v.dropped += v.in.DiscardCrossfade(c.frame, c.frame/4)
		}
		got = v.in.Read(f.in)
		if got < c.frame {
			v.playing = false // ran dry: collect the target again
			if !v.stopping {
				v.under++
			}
		}
	}
	stopping := v.stopping
	v.mu.Unlock()

	pushed := false
	switch {
	case got > 0:
		v.drainLeft = v.drainFrames
		pushed = true
		if v.live.Push(f.in[:got], now) {
			v.live.Settle(settleBudget)
		}
	case v.drainLeft > 0:
		// No input now: silence pushes the voice's held-back tail out.
		v.drainLeft--
		pushed = true
		clear(f.in)
		if v.live.Push(f.in, now) {
			v.live.Settle(settleBudget)
		}
	}
	v.live.NoteQueueAge(now)
	real := v.live.Pull(f.out, now)
	if pushed || real > 0 {
		c.sendMedia(f.out, 0, nil)
	}
	return !(stopping && got == 0 && v.drainLeft == 0)
}

// settleBudget bounds the clock's wait for a step it started (as the WebRTC clock's): voices
// whose chunks typically finish within it are played in the same tick.
const settleBudget = 15 * time.Millisecond

func (v *converter) close() {
	if v.live != nil {
		v.live.Close() // waits for a running step; then no processor is in use
	}
	for _, p := range v.procs {
		stream.CloseProcessor(p)
	}
	v.procs = nil
}

func (v *converter) summary() []any {
	v.mu.Lock()
	defer v.mu.Unlock()
	rate := float64(v.c.cfg.rate)
	st := v.live.Stats()
	return []any{"input_dropped_ms", math.Round(float64(v.dropped) / rate * 1000), "input_underflows", v.under,
		"late_chunks", st.LateChunks, "latency", st.Latency}
}
