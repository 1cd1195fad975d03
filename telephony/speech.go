package telephony

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/stream"
)

// speaker is a call in tts mode. An utterance (the greeting, a speak message) is synthesised
// by a worker into a buffer at the call's rate, at most ttsAhead ahead of what the clock has
// sent; the clock sends it 20 ms a tick, and a mark once the utterance's last audio is out.
// A new speak, or a cancel, is a barge-in: the utterance being spoken stops, its unsent
// audio is dropped, and a clear tells Twilio to drop what it has buffered.
type speaker struct {
	c   *call
	syn stream.Synthesizer

	mu      sync.Mutex
	fifo    *buffers.FIFO
	written int64 // samples ever written to fifo (after a barge-in: as if played)
	played  int64 // samples ever taken by the clock
	marks   []pendingMark
	queue   []*utterance
	cur     *utterance
	count   int // speak messages so far (names their marks)
	limiter *rate.Limiter

	// gen counts barge-ins: audio taken before one is not sent after its clear.
	gen   atomic.Uint64
	wake  chan struct{} // a new utterance waits
	space chan struct{} // the clock took audio from fifo
}

type utterance struct {
	name      string
	text      string
	seed      uint64
	maxTokens int
	ctx       context.Context
	cancel    context.CancelFunc
}

type pendingMark struct {
	name string
	pos  int64 // sent once played reaches it
}

// startTTS sets the call up for text to speech and queues its greeting.
func (c *call) startTTS() (string, error) {
	if c.srv.cfg.Synthesizers == nil {
		return CodeBadMessage, errors.New("this server has no text-to-speech model (start it with --tts-model and --codec)")
	}
	syn, err := c.srv.cfg.Synthesizers.Get(c.cfg.model)
	if err != nil {
		return CodeUnknownModel, err
	}
	ahead := c.ahead()
	sp := &speaker{c: c, syn: syn, fifo: buffers.NewFIFO(ahead + c.cfg.rate),
		limiter: rate.NewLimiter(10, 20), wake: make(chan struct{}, 1), space: make(chan struct{}, 1)}
	c.tts = sp
	if stream.HasWords(c.cfg.text) {
		sp.enqueue("greeting", c.cfg.text, c.cfg.seed, c.cfg.maxTokens)
	}
	c.spawn("telephony speech", sp.work)
	return "", nil
}

// ahead is how far synthesis may run ahead of the clock: 2 s of audio.
func (c *call) ahead() int { return 2 * c.cfg.rate }

func (sp *speaker) enqueue(name, text string, seed uint64, maxTokens int) {
	ctx, cancel := context.WithCancel(sp.c.ctx)
	u := &utterance{name: name, text: text, seed: seed, maxTokens: maxTokens, ctx: ctx, cancel: cancel}
	sp.mu.Lock()
	sp.queue = append(sp.queue, u)
	sp.mu.Unlock()
	select {
	case sp.wake <- struct{}{}:
	default:
	}
}

// speak starts a new utterance, interrupting the one being spoken (a barge-in: clear).
func (sp *speaker) speak(text, markName string, seed uint64, maxTokens int) {
	if !sp.limiter.Allow() {
		sp.c.sendError(CodeRateLimited, "more than 10 speak messages a second")
		return
	}
	sp.mu.Lock()
	sp.count++
	if markName == "" {
		markName = "utterance-" + strconv.Itoa(sp.count)
	}
	interrupted := sp.interruptLocked()
	sp.mu.Unlock()
	if interrupted {
		sp.c.sendClear()
	}
	if seed == 0 {
		seed = sp.c.cfg.seed
	}
	if maxTokens == 0 {
		maxTokens = sp.c.cfg.maxTokens
	}
	sp.enqueue(markName, text, seed, maxTokens)
}

// cancel stops the utterance being spoken and drops what waits; clear follows, always.
func (sp *speaker) cancel() {
	sp.mu.Lock()
	sp.interruptLocked()
	sp.mu.Unlock()
	sp.c.sendClear()
}

// interruptLocked stops every utterance and drops the audio not yet sent; sp.mu is held. It
// reports whether anything was being spoken or waited to be.
func (sp *speaker) interruptLocked() bool {
	active := sp.cur != nil || len(sp.queue) > 0 || sp.fifo.Len() > 0 || len(sp.marks) > 0
	if sp.cur != nil {
		sp.cur.cancel()
	}
	for _, u := range sp.queue {
		u.cancel()
	}
	sp.queue = nil
	sp.fifo.Reset()
	sp.marks = nil
	sp.written = sp.played
	sp.gen.Add(1)
	return active
}

// tick is the clock's 20 ms step in tts mode: the next 20 ms of speech (nothing while there
// is none), then the marks of utterances whose last audio that was.
func (sp *speaker) tick(f *clockFrame) bool {
	sp.mu.Lock()
	n := sp.fifo.Read(f.out)
	sp.played += int64(n)
	gen := sp.gen.Load()
	var due []string
	for len(sp.marks) > 0 && sp.marks[0].pos <= sp.played {
		due = append(due, sp.marks[0].name)
		sp.marks = sp.marks[1:]
	}
	sp.mu.Unlock()
	if n > 0 {
		select {
		case sp.space <- struct{}{}:
		default:
		}
		clear(f.out[n:])
		sp.c.sendMedia(f.out, gen, &sp.gen)
	}
	for _, name := range due {
		sp.c.sendMark(name, gen, &sp.gen)
	}
	return true
}

// work speaks the utterances one after another.
func (sp *speaker) work() {
	for {
		select {
		case <-sp.c.ctx.Done():
			return
		case <-sp.wake:
		}
		for {
			sp.mu.Lock()
			if len(sp.queue) == 0 {
				sp.mu.Unlock()
				break
			}
			u := sp.queue[0]
			sp.queue = sp.queue[1:]
			sp.cur = u
			sp.mu.Unlock()
			sp.run(u)
			sp.mu.Lock()
			if sp.cur == u {
				sp.cur = nil
			}
			sp.mu.Unlock()
		}
	}
}

// run synthesises one utterance into the buffer and queues its mark.
func (sp *speaker) run(u *utterance) {
	defer u.cancel()
	if u.ctx.Err() != nil {
		return
	}
	c := sp.c
	var rs *dsp.Resampler
	if from := sp.syn.Info().SampleRate; from != c.cfg.rate {
		var err error
		if rs, err = dsp.NewResampler(from, c.cfg.rate); err != nil {
			c.sendError(CodeSynthesis, stream.Opaque(c.log, "resampler", err))
			return
		}
	}
	ahead := c.ahead()
	// push waits while the buffer holds ahead of audio: synthesis follows the clock.
	push := func(x []float32) error {
		for {
			sp.mu.Lock()
			if err := u.ctx.Err(); err != nil { // after a barge-in nothing more may reach the buffer
				sp.mu.Unlock()
				return err
			}
			if sp.fifo.Len() < ahead {
				sp.fifo.Write(x)
				sp.written += int64(len(x))
				sp.mu.Unlock()
				return nil
			}
			sp.mu.Unlock()
			select {
			case <-sp.space:
			case <-u.ctx.Done():
			}
		}
	}
	var buf []float32
	job := stream.TTSJob{Synth: sp.syn, Log: c.log,
		Request: stream.SynthRequest{Text: u.text, Voice: c.cfg.voice, Owner: c.owner, Seed: u.seed, MaxTokens: u.maxTokens},
		Out: func(ch stream.SynthChunk) error {
			x := ch.Samples
			if rs != nil {
				buf = rs.Process(buf[:0], x)
				x = buf
			}
			return push(x)
		}}
	if adm := c.srv.cfg.TTSAdmission; adm != nil {
		job.Admission = adm(sp.syn.Info().Name)
	}
	err := job.Run(u.ctx).Err
	if err == nil && rs != nil {
		err = push(rs.Flush(buf[:0]))
	}
	switch {
	case u.ctx.Err() != nil: // interrupted: no mark (the clear said so)
	case err != nil:
		code, msg := stream.ClientError(c.log, "synthesis", err, CodeSynthesis)
		c.sendError(code, fmt.Sprintf("%s (mark %s)", msg, u.name))
	default:
		sp.mu.Lock()
		if u.ctx.Err() == nil {
			sp.marks = append(sp.marks, pendingMark{u.name, sp.written})
		}
		sp.mu.Unlock()
	}
}
