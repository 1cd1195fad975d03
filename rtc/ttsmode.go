package rtc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/stream"
)

// ttsSession is a peer in text-to-speech mode: speak messages queue texts, a worker
// synthesises them one after another into a FIFO at the Opus rate, and the media loop plays
// that FIFO (silence when it is empty, so utterances are separated by silence). Cancel
// stops the synthesis and empties the FIFO: the audio stops within one 20 ms frame.
type ttsSession struct {
	p     *peer
	syn   stream.Synthesizer
	voice string
	jobs  chan ttsJob

	mu   sync.Mutex
	fifo *buffers.FIFO // audio at the Opus rate waiting to be sent
	cur  *ttsJob       // the job being synthesised, if any
}

type ttsJob struct {
	id     string
	text   string
	max    int
	seed   uint64
	start  time.Time
	ctx    context.Context
	cancel context.CancelFunc
}

// maxQueuedTexts bounds the texts waiting behind the one being spoken.
const maxQueuedTexts = 16

// startTTS switches the peer to text-to-speech mode (once; later session messages may
// change the voice).
func (p *peer) startTTS(ctx context.Context, m Message) (string, error) {
	if p.srv.cfg.Synthesizers == nil {
		return CodeBadMessage, errors.New("this server has no text-to-speech model (start it with --tts-model and --codec)")
	}
	syn, err := p.srv.cfg.Synthesizers.Get(m.Model)
	if err != nil {
		return CodeUnknownVoice, err
	}
	if t := p.tts; t != nil {
		if m.Voice != "" {
			t.mu.Lock()
			t.voice = m.Voice
			t.mu.Unlock()
		}
		return "", nil
	}
	t := &ttsSession{p: p, syn: syn, voice: m.Voice, jobs: make(chan ttsJob, maxQueuedTexts),
		fifo: buffers.NewFIFO(10 * opusRate)}
	p.mu.Lock()
	p.tts = t
	p.mu.Unlock()
	p.spawn(func() { t.work(ctx) })
	return "", nil
}

// speak queues a text.
func (t *ttsSession) speak(ctx context.Context, m Message) (string, error) {
	if !hasText(m.Text) {
		return CodeBadMessage, errors.New("speak needs a non-empty text")
	}
	jctx, cancel := context.WithCancel(ctx)
	if m.MaxTokens < 0 {
		cancel()
		return CodeBadMessage, errors.New("max_tokens must not be negative")
	}
	j := ttsJob{id: m.ContextID, text: m.Text, max: m.MaxTokens, seed: m.Seed, start: time.Now(), ctx: jctx, cancel: cancel}
	select {
	case t.jobs <- j:
		return "", nil
	default:
		cancel()
		return CodeRateLimited, fmt.Errorf("%d texts are already waiting; cancel or wait", maxQueuedTexts)
	}
}

// cancelAll stops the current text, drops the queued ones and the unsent audio.
func (t *ttsSession) cancelAll() {
drain:
	for {
		select {
		case j := <-t.jobs:
			j.cancel()
			t.p.event(Message{Type: "done", ContextID: j.id, Canceled: true})
		default:
			break drain
		}
	}
	t.mu.Lock()
	if t.cur != nil {
		t.cur.cancel()
	}
	t.fifo.Reset()
	t.mu.Unlock()
}

// pull fills out from the FIFO (silence where it runs short); called by the media loop.
func (t *ttsSession) pull(out []float32) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.fifo.Read(out)
	clear(out[n:])
	return n
}

func (t *ttsSession) work(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-t.jobs:
			t.run(j)
		}
	}
}

// run speaks one text, reporting speaking and done (or error) events.
func (t *ttsSession) run(j ttsJob) {
	defer j.cancel()
	if j.ctx.Err() != nil {
		return // cancelled while queued; its done event is already out
	}
	t.mu.Lock()
	t.cur = &j
	voice := t.voice
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.cur = nil
		t.mu.Unlock()
	}()
	name := t.syn.Info().Name
	if adm := t.p.srv.cfg.TTSAdmission; adm != nil {
		release, err := adm(name).Acquire(j.ctx)
		if err != nil {
			var busy *stream.BusyError
			if errors.As(err, &busy) {
				t.p.event(Message{Type: "error", ContextID: j.id, Code: CodeBusy, Message: err.Error()})
			}
			return
		}
		defer release()
	}
	rs, err := dsp.NewResampler(t.syn.Info().SampleRate, opusRate)
	if err != nil {
		t.p.event(Message{Type: "error", ContextID: j.id, Code: CodeInternal, Message: err.Error()})
		return
	}
	var buf []float32
	var ttfa time.Duration
	samples := 0
	push := func(x []float32) {
		t.mu.Lock()
		if j.ctx.Err() == nil { // after a cancel nothing more may reach the FIFO
			t.fifo.Write(x)
		}
		t.mu.Unlock()
	}
	err = t.syn.Synthesize(j.ctx, stream.SynthRequest{Text: j.text, Voice: voice, MaxTokens: j.max, Seed: j.seed}, func(c stream.SynthChunk) error {
		buf = rs.Process(buf[:0], c.Samples)
		samples += len(c.Samples)
		if len(buf) > 0 && ttfa == 0 {
			ttfa = time.Since(j.start)
			t.p.event(Message{Type: "speaking", ContextID: j.id})
		}
		push(buf)
		return nil
	})
	if err == nil {
		push(rs.Flush(buf[:0]))
	}
	busy := time.Since(j.start)
	audio := time.Duration(samples) * time.Second / time.Duration(t.syn.Info().SampleRate)
	met := &TTSMetrics{TTFAMs: msOf(ttfa), AudioMs: msOf(audio)}
	if audio > 0 {
		met.RTF = busy.Seconds() / audio.Seconds()
	}
	switch {
	case j.ctx.Err() != nil:
		t.p.event(Message{Type: "done", ContextID: j.id, Canceled: true, Metrics: met})
	case errors.Is(err, stream.ErrUnknownVoice):
		t.p.event(Message{Type: "error", ContextID: j.id, Code: CodeUnknownVoice, Message: err.Error()})
	case errors.Is(err, stream.ErrNothingToSay):
		t.p.event(Message{Type: "error", ContextID: j.id, Code: CodeBadMessage, Message: err.Error()})
	case err != nil:
		t.p.event(Message{Type: "error", ContextID: j.id, Code: CodeSynthesis, Message: err.Error()})
	default:
		t.p.event(Message{Type: "done", ContextID: j.id, Metrics: met})
	}
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func hasText(s string) bool {
	for _, r := range s {
		if r > ' ' {
			return true
		}
	}
	return false
}

// event sends a message on the signaling socket and, when the client opened one, on the
// data channel too (clients that keep only the peer connection still get the events).
func (p *peer) event(m Message) {
	p.send(m)
	if dc := p.events.Load(); dc != nil && dc.ReadyState() == webrtc.DataChannelStateOpen {
		if b, err := json.Marshal(m); err == nil {
			_ = dc.SendText(string(b))
		}
	}
}
