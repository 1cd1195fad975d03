package tts

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/time/rate"

	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// closeTimeout bounds the close frame written on shutdown: a client that does not read
// gets its connection closed without one.
const closeTimeout = time.Second

// socket is one TTS WebSocket: a read loop that dispatches messages, one writer goroutine
// that owns the connection's write side, and a worker goroutine per open context.
type socket struct {
	s     *Server
	conn  *websocket.Conn
	log   *slog.Logger
	owner string // the principal of the socket's key: voices are looked up among its own

	ctx    context.Context
	cancel context.CancelFunc
	out    chan outMsg
	wg     sync.WaitGroup // context workers

	mu       sync.Mutex
	contexts map[string]*ttsContext

	limiter *rate.Limiter // 50 messages a second, bursts of 50
}

type outMsg struct {
	m ServerMessage
	c *ttsContext // audio of a cancelled context is dropped, not written
}

// ttsContext is one utterance stream: text arrives in pieces and is spoken in order.
type ttsContext struct {
	id     string
	syn    stream.Synthesizer
	req    stream.SynthRequest
	enc    *audioout.Encoder
	ctx    context.Context
	cancel context.CancelFunc
	pieces chan piece
	text   string     // received text not yet handed to the worker
	chars  int        // all text received, for the limit
	closed bool       // continue:false seen; no more text
	binary bool       // audio goes out as binary frames
	timer  *wordTimer // word timestamps, when asked for

	// dropped is set by a client's cancel: its queued audio is not sent. (A context that
	// simply finished still has its last audio waiting in the queue.)
	dropped atomic.Bool

	mu      sync.Mutex // the fields below are written by the worker, read on cancel
	start   time.Time
	seq     int
	ttfa    time.Duration
	busy    time.Duration // time spent synthesizing
	samples int
}

func newSocket(s *Server, conn *websocket.Conn, log *slog.Logger, owner string) *socket {
	ctx, cancel := context.WithCancel(s.ctx)
	return &socket{s: s, conn: conn, log: log, owner: owner, ctx: ctx, cancel: cancel, out: make(chan outMsg, 64),
		contexts: map[string]*ttsContext{}, limiter: rate.NewLimiter(50, 50)}
}

func (k *socket) run() {
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		k.writer()
	}()
	k.conn.SetReadLimit(k.s.cfg.MaxMessage)
	closed := make(chan struct{})
	go func() { // the read loop blocks in the socket; closing it is how shutdown reaches it
		defer close(closed)
		<-k.ctx.Done()
		if k.s.ctx.Err() != nil {
			// The server is shutting down: tell the client so (1001), rather than leaving it an
			// abnormal closure (1006). WriteControl may run alongside the writer goroutine, and
			// its deadline bounds it when the writer is stuck on a client that does not read.
			msg := websocket.FormatCloseMessage(websocket.CloseGoingAway, "server shutting down")
			if err := k.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(closeTimeout)); err != nil {
				k.log.Debug("tts socket close frame", "err", err)
			}
		}
		k.conn.Close()
	}()
	for {
		typ, data, err := k.conn.ReadMessage()
		if err != nil {
			break
		}
		if typ != websocket.TextMessage {
			k.sendError("", CodeBadMessage, "binary messages are not part of the protocol; send JSON text", 0)
			continue
		}
		if !k.limiter.Allow() {
			k.sendError("", CodeRateLimited, "more than 50 messages per second", 0)
			continue
		}
		k.handle(data)
	}
	k.cancel()
	k.wg.Wait()
	close(k.out)
	<-writerDone
	<-closed // the connection is closed when the server's wait for this socket ends
}

func (k *socket) writer() {
	for o := range k.out {
		if o.c != nil && o.m.Type == "audio" && o.c.dropped.Load() {
			continue // cancelled: queued audio is dropped at once
		}
		if k.ctx.Err() != nil {
			continue // draining after the socket ended
		}
		k.conn.SetWriteDeadline(time.Now().Add(k.s.cfg.WriteTimeout))
		var err error
		if o.c != nil && o.c.binary && o.m.Type == "audio" {
			err = k.conn.WriteMessage(websocket.BinaryMessage, binaryAudio(o.m))
		} else {
			err = k.conn.WriteJSON(o.m)
		}
		if err != nil {
			k.log.Info("tts socket write failed", "err", err)
			k.cancel()
		}
	}
}

// send queues a message; it gives up when the socket or (for audio) the context ends.
func (k *socket) send(m ServerMessage, c *ttsContext) error {
	var done <-chan struct{}
	if c != nil && m.Type == "audio" {
		done = c.ctx.Done()
	}
	select {
	case k.out <- outMsg{m, c}:
		return nil
	case <-k.ctx.Done():
		return errClosed
	case <-done:
		return c.ctx.Err()
	}
}

func (k *socket) sendError(ctxID, code, msg string, retry time.Duration) {
	k.send(ServerMessage{Type: "error", ContextID: ctxID, Code: code, Message: msg, RetryAfterMs: retry.Milliseconds()}, nil)
}

func (k *socket) handle(data []byte) {
	m, code, err := decodeClientMessage(data)
	if err != nil {
		k.sendError(m.ContextID, code, err.Error(), 0)
		return
	}
	k.mu.Lock()
	c := k.contexts[m.ContextID]
	k.mu.Unlock()
	switch m.Type {
	case "cancel":
		if c == nil {
			k.sendError(m.ContextID, CodeBadMessage, "no open context "+m.ContextID, 0)
			return
		}
		c.dropped.Store(true)
		c.cancel()
		k.forget(c)
		k.send(ServerMessage{Type: "done", ContextID: c.id, Canceled: true, Metrics: c.metrics()}, nil)
	case "flush":
		if c == nil {
			k.sendError(m.ContextID, CodeBadMessage, "no open context "+m.ContextID, 0)
			return
		}
		if !c.closed { // a context whose text has ended is spoken to the end: done follows
			k.dispatch(c, c.text, true)
		}
	case "speak":
		if c == nil {
			if c = k.open(m); c == nil {
				return
			}
		} else if c.closed {
			k.sendError(m.ContextID, CodeBadMessage, "context "+m.ContextID+" already ended its text (continue was false)", 0)
			return
		}
		if c.chars += textLen(m.Text); c.chars > k.s.cfg.MaxText {
			k.sendError(c.id, CodeTextTooLong, "text of a context is limited to "+itoa(k.s.cfg.MaxText)+" characters", 0)
			c.cancel()
			k.forget(c)
			return
		}
		c.text += m.Text
		if !m.Continue {
			k.dispatch(c, c.text, false)
			c.closed = true
			close(c.pieces)
			return
		}
		ready, _ := splitReady(c.text)
		k.dispatch(c, ready, false)
	}
}

// piece is text for a context's worker; flush asks it to say flush_done once the text so
// far has been spoken.
type piece struct {
	text  string
	flush bool
}

// dispatch hands the first len(text) bytes of the context's text to its worker (with the
// flush marker, even when there is nothing to say).
func (k *socket) dispatch(c *ttsContext, text string, flush bool) {
	c.text = c.text[len(text):]
	if !stream.HasWords(text) {
		if !flush {
			return
		}
		text = ""
	}
	select {
	case c.pieces <- piece{text, flush}:
	default:
		k.sendError(c.id, CodeBadMessage, "too many pieces waiting; send longer text pieces", 0)
	}
}

func (k *socket) open(m ClientMessage) *ttsContext {
	k.mu.Lock()
	n := len(k.contexts)
	k.mu.Unlock()
	if n >= k.s.cfg.MaxContexts {
		k.sendError(m.ContextID, CodeTooMany, "at most "+itoa(k.s.cfg.MaxContexts)+" open contexts per socket", 0)
		return nil
	}
	syn, err := k.s.cfg.Synthesizers.Get(m.Model)
	if err != nil {
		k.sendError(m.ContextID, CodeUnknownModel, err.Error(), 0)
		return nil
	}
	f := audioout.Format{}
	if m.Format != nil {
		f = *m.Format
	}
	enc, err := audioout.NewEncoder(f, syn.Info().SampleRate)
	if err != nil {
		k.sendError(m.ContextID, CodeBadFormat, err.Error(), 0)
		return nil
	}
	c := &ttsContext{id: m.ContextID, syn: syn, enc: enc, pieces: make(chan piece, 256), start: time.Now(),
		req: stream.SynthRequest{Voice: m.Voice, Owner: k.owner}, binary: m.Binary}
	if m.AddTimestamps {
		c.timer = newWordTimer(syn.Info().SampleRate)
	}
	if o := m.Options; o != nil {
		c.req.Seed, c.req.Temperature, c.req.MaxTokens = o.Seed, o.Temperature, o.MaxTokens
	}
	c.ctx, c.cancel = context.WithCancel(k.ctx)
	k.mu.Lock()
	k.contexts[c.id] = c
	k.mu.Unlock()
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		k.work(c)
	}()
	return c
}

func (k *socket) forget(c *ttsContext) {
	k.mu.Lock()
	if k.contexts[c.id] == c {
		delete(k.contexts, c.id)
	}
	k.mu.Unlock()
}

// work speaks the context's pieces in order, then flushes the encoder and reports done.
func (k *socket) work(c *ttsContext) {
	defer c.enc.Close() // only the worker uses the encoder
	defer c.cancel()
	defer k.forget(c)
	sendAudio := func(b []byte) error {
		c.mu.Lock()
		c.seq++
		seq := c.seq
		if seq == 1 {
			c.ttfa = time.Since(c.start)
		}
		c.mu.Unlock()
		return k.send(ServerMessage{Type: "audio", ContextID: c.id, Seq: seq, Data: append([]byte(nil), b...)}, c)
	}
pieces:
	for {
		var p piece
		select {
		case next, ok := <-c.pieces:
			if !ok {
				break pieces
			}
			p = next
		case <-c.ctx.Done(): // cancelled, or the socket ended with the context still open
			return
		}
		if p.text == "" { // a flush with nothing left to say
			if k.send(ServerMessage{Type: "flush_done", ContextID: c.id}, c) != nil {
				return
			}
			continue
		}
		req := c.req
		req.Text = p.text
		t0 := time.Now()
		// Samples are counted as they are made, so a cancel's done reports the audio so far.
		_, err := k.s.synthesize(c.ctx, c.syn, req, c.enc, sendAudio, func(samples []float32) {
			c.mu.Lock()
			c.samples += len(samples)
			c.mu.Unlock()
			if c.timer != nil {
				c.timer.add(samples)
			}
		})
		c.mu.Lock()
		c.busy += time.Since(t0)
		c.mu.Unlock()
		if err != nil {
			if c.ctx.Err() != nil {
				return // cancelled (done already sent) or the socket ended
			}
			code, msg := stream.ClientError(k.log.With("context", c.id), "synthesis", err, CodeSynthesis)
			var retry time.Duration
			if busy := (*stream.BusyError)(nil); errors.As(err, &busy) {
				retry = busy.RetryAfter
			}
			k.forget(c) // the slot is free before the client hears the context ended
			k.sendError(c.id, code, msg, retry)
			return
		}
		if c.timer != nil {
			ts := c.timer.piece(p.text)
			if k.send(ServerMessage{Type: "timestamps", ContextID: c.id, WordTimestamps: &ts}, c) != nil {
				return
			}
		}
		if p.flush && k.send(ServerMessage{Type: "flush_done", ContextID: c.id}, c) != nil {
			return
		}
	}
	if c.ctx.Err() != nil {
		return
	}
	if b, err := c.enc.Flush(nil); err == nil && len(b) > 0 {
		if sendAudio(b) != nil {
			return
		}
	}
	met := c.metrics()
	k.s.done(c.syn.Info().Name, time.Duration(met.TTFAMs*1e6), time.Duration(met.AudioMs*1e6), time.Duration(met.RTF*met.AudioMs*1e6))
	k.forget(c) // the slot is free before the client hears the context ended
	k.send(ServerMessage{Type: "done", ContextID: c.id, Metrics: met}, nil)
}

func (c *ttsContext) metrics() *Metrics {
	c.mu.Lock()
	defer c.mu.Unlock()
	rate := c.syn.Info().SampleRate
	audio := time.Duration(c.samples) * time.Second / time.Duration(rate)
	m := &Metrics{TTFAMs: ms(c.ttfa), AudioMs: ms(audio)}
	if audio > 0 {
		m.RTF = c.busy.Seconds() / audio.Seconds()
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
