package rtc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/stream"
)

// Speaker is text to speech into an Opus track (a peer in tts mode, a LiveKit room's TTS
// agent): Speak queues texts, Run synthesises them one after another into a FIFO at the
// Opus rate, and the media clock plays that FIFO (Pull: silence when it is empty, so
// utterances are separated by silence). CancelAll stops the synthesis and empties the FIFO:
// the audio stops within one 20 ms frame.
//
// Synthesis starts only once Ready is closed (the media is negotiated) and never runs more
// than ttsAhead of playout: a client that never answers, or speaks a long text, costs a
// bounded FIFO, not memory that grows with the text.
type Speaker struct {
	cfg   SpeakerConfig
	jobs  chan ttsJob
	space chan struct{} // signalled by the media loop after it takes audio from the FIFO

	mu    sync.Mutex
	voice string
	fifo  *buffers.FIFO // audio at the Opus rate waiting to be sent
	cur   *ttsJob       // the job being synthesised, if any
}

// SpeakerConfig sets up a Speaker.
type SpeakerConfig struct {
	Synth     stream.Synthesizer
	Voice     string            // a voice library id or name ("" for the model's default)
	Owner     string            // the principal whose voices Voice may name
	Admission *stream.Admission // the model's synthesis slots (nil: none needed)
	Log       *slog.Logger
	// Event gets the speaking, done and error events of each text.
	Event func(Message)
	// Ready, if set, holds synthesis back until it is closed.
	Ready <-chan struct{}
}

// NewSpeaker makes a speaker; Run synthesises.
func NewSpeaker(cfg SpeakerConfig) *Speaker {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Speaker{cfg: cfg, voice: cfg.Voice, jobs: make(chan ttsJob, maxQueuedTexts),
		space: make(chan struct{}, 1), fifo: buffers.NewFIFO(ttsAhead + opusRate)}
}

// SetVoice changes the voice of the texts synthesised from now on.
func (t *Speaker) SetVoice(v string) {
	t.mu.Lock()
	t.voice = v
	t.mu.Unlock()
}

// ttsAhead is how far synthesis may run ahead of playout.
const ttsAhead = 2 * opusRate

// MaxSpeakText is the longest text one speak message may carry, in characters (the TTS
// WebSocket's limit per context).
const MaxSpeakText = 10000

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
	if t := p.tts.Load(); t != nil {
		if m.Voice != "" {
			t.SetVoice(m.Voice)
		}
		return "", nil
	}
	cfg := SpeakerConfig{Synth: syn, Voice: m.Voice, Owner: p.owner, Log: p.log, Event: p.event, Ready: p.negotiated}
	if adm := p.srv.cfg.TTSAdmission; adm != nil {
		cfg.Admission = adm(syn.Info().Name)
	}
	t := NewSpeaker(cfg)
	p.tts.Store(t)
	p.spawn(func() { t.Run(ctx) })
	return "", nil
}

// Speak queues a text, returning an error code and error if it cannot.
func (t *Speaker) Speak(ctx context.Context, m Message) (string, error) {
	if !stream.HasWords(m.Text) {
		return CodeBadMessage, errors.New("speak needs a non-empty text")
	}
	if n := utf8.RuneCountInString(m.Text); n > MaxSpeakText {
		return CodeTextTooLong, fmt.Errorf("text has %d characters; the limit is %d per speak message", n, MaxSpeakText)
	}
	if err := stream.CheckSynthOptions(0, m.MaxTokens); err != nil {
		return CodeBadMessage, err
	}
	jctx, cancel := context.WithCancel(ctx)
	j := ttsJob{id: m.ContextID, text: m.Text, max: m.MaxTokens, seed: m.Seed, start: time.Now(), ctx: jctx, cancel: cancel}
	select {
	case t.jobs <- j:
		return "", nil
	default:
		cancel()
		return CodeRateLimited, fmt.Errorf("%d texts are already waiting; cancel or wait", maxQueuedTexts)
	}
}

// CancelAll stops the current text, drops the queued ones and the unsent audio.
func (t *Speaker) CancelAll() {
drain:
	for {
		select {
		case j := <-t.jobs:
			j.cancel()
			t.cfg.Event(Message{Type: "done", ContextID: j.id, Canceled: true})
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

// Pull fills out from the FIFO (silence where it runs short); called by the media loop.
func (t *Speaker) Pull(out []float32) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.fifo.Read(out)
	clear(out[n:])
	if n > 0 {
		select {
		case t.space <- struct{}{}:
		default:
		}
	}
	return n
}

// Run synthesises the queued texts until ctx ends.
func (t *Speaker) Run(ctx context.Context) {
	if t.cfg.Ready != nil {
		select { // no playout before the media is negotiated: nothing to synthesise for yet
		case <-t.cfg.Ready:
		case <-ctx.Done():
			return
		}
	}
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
func (t *Speaker) run(j ttsJob) {
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
	rs, err := dsp.NewResampler(t.cfg.Synth.Info().SampleRate, opusRate)
	if err != nil {
		t.cfg.Event(Message{Type: "error", ContextID: j.id, Code: CodeInternal, Message: err.Error()})
		return
	}
	var buf []float32
	var ttfa time.Duration
	// push waits while the FIFO holds ttsAhead of audio: synthesis follows playout.
	push := func(x []float32) error {
		for {
			t.mu.Lock()
			if err := j.ctx.Err(); err != nil { // after a cancel nothing more may reach the FIFO
				t.mu.Unlock()
				return err
			}
			if t.fifo.Len() < ttsAhead {
				t.fifo.Write(x)
				t.mu.Unlock()
				return nil
			}
			t.mu.Unlock()
			select {
			case <-t.space:
			case <-j.ctx.Done():
			}
		}
	}
	job := stream.TTSJob{Synth: t.cfg.Synth, Log: t.cfg.Log, Admission: t.cfg.Admission,
		Request: stream.SynthRequest{Text: j.text, Voice: voice, Owner: t.cfg.Owner, MaxTokens: j.max, Seed: j.seed},
		Out: func(c stream.SynthChunk) error {
			buf = rs.Process(buf[:0], c.Samples)
			if len(buf) > 0 && ttfa == 0 {
				ttfa = time.Since(j.start)
				t.cfg.Event(Message{Type: "speaking", ContextID: j.id})
			}
			return push(buf)
		}}
	res := job.Run(j.ctx)
	err = res.Err
	if err == nil {
		err = push(rs.Flush(buf[:0]))
	}
	// Metrics count from the speak message, the wait behind earlier texts included.
	met := &TTSMetrics{TTFAMs: msOf(ttfa), AudioMs: msOf(res.Audio)}
	if res.Audio > 0 {
		met.RTF = time.Since(j.start).Seconds() / res.Audio.Seconds()
	}
	switch {
	case j.ctx.Err() != nil:
		t.cfg.Event(Message{Type: "done", ContextID: j.id, Canceled: true, Metrics: met})
	case err != nil:
		code, msg := stream.ClientError(t.cfg.Log, "synthesis", err, CodeSynthesis)
		t.cfg.Event(Message{Type: "error", ContextID: j.id, Code: code, Message: msg})
	default:
		t.cfg.Event(Message{Type: "done", ContextID: j.id, Metrics: met})
	}
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

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
