package telephony

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/time/rate"

	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts/audioout"
)

// call is one telephony WebSocket: the reader (the handler's goroutine) parses messages and
// feeds the inbound audio into a bounded buffer; the clock (clock.go) sends 20 ms of audio a
// tick; in tts mode a worker (speech.go) synthesises into the clock's buffer; a pinger
// checks that the client still reads.
type call struct {
	srv     *Server
	conn    *websocket.Conn
	log     *slog.Logger
	proto   string
	cfg     callConfig
	owner   string // the principal of the call's key (auth.PrincipalOf)
	release func() // gives the key's session back; nil until the key is known

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the clock, the pinger, the tts worker, the read unblocker

	// The reader's state.
	started   bool
	limiter   *rate.Limiter
	unknown   int // unknown events ignored
	startedAt time.Time
	metered   string // the mode OnSession was told about, "" if none

	// Outbound framing: Twilio media messages carry the stream's sid; raw frames are bytes.
	sidJSON    []byte
	frame      int               // samples per 20 ms at the call's rate
	enc        *audioout.Encoder // the clock's, as are the scratch buffers
	scratchEnc []byte
	scratchMsg []byte

	writeMu  sync.Mutex // serialises data frames (media, mark, clear, error)
	readMu   sync.Mutex // orders read-deadline changes against the end of the call
	lastPong atomic.Int64

	closeMu     sync.Mutex
	closeCode   int
	closeReason string

	vc  *converter // mode vc
	tts *speaker   // mode tts

	framesOut atomic.Int64
	marks     atomic.Int64
}

func newCall(s *Server, conn *websocket.Conn, log *slog.Logger, proto string, cfg callConfig) *call {
	c := &call{srv: s, conn: conn, log: log, proto: proto, cfg: cfg,
		// Twilio sends 50 media messages a second; 200 leaves room for marks, speak and a
		// burst after a network stall.
		limiter: rate.NewLimiter(200, 400)}
	c.ctx, c.cancel = context.WithCancel(s.ctx)
	return c
}

// spawn runs fn on a goroutine the end of the call waits for; a panic in it ends the call
// with an internal error, not the process.
func (c *call) spawn(what string, fn func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := stream.Guard(c.log, what, func() error { fn(); return nil }); err != nil {
			c.fail(CodeInternal, err.Error())
		}
	}()
}

func (c *call) run() {
	defer c.finish()
	c.conn.SetReadLimit(c.srv.cfg.MaxMessage)
	c.conn.SetReadDeadline(time.Now().Add(c.srv.cfg.StartTimeout))
	c.conn.SetPongHandler(func(string) error {
		c.lastPong.Store(time.Now().UnixNano())
		if c.started {
			c.extendRead()
		}
		return nil
	})
	c.wg.Add(1)
	go func() { // the read blocks in the socket: a deadline in the past is how the end reaches it
		defer c.wg.Done()
		<-c.ctx.Done()
		c.readMu.Lock()
		c.conn.SetReadDeadline(time.Now())
		c.readMu.Unlock()
	}()
	c.spawn("telephony pinger", c.pinger)
	if c.proto == ProtoRaw && !c.begin(nil) {
		return
	}
	for {
		kind, data, err := c.conn.ReadMessage()
		if err != nil {
			c.readFailed(err)
			return
		}
		if !c.limiter.Allow() {
			c.fail(CodeRateLimited, "more than 200 messages a second")
			return
		}
		if c.started {
			c.extendRead()
		}
		var done bool
		if err := stream.Guard(c.log, "telephony message", func() error { done = c.handle(kind, data); return nil }); err != nil {
			c.fail(CodeInternal, err.Error())
			return
		}
		if done {
			return
		}
	}
}

// extendRead moves the read deadline ReadTimeout on, unless the call is ending.
func (c *call) extendRead() {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if c.ctx.Err() != nil {
		c.conn.SetReadDeadline(time.Now())
		return
	}
	c.conn.SetReadDeadline(time.Now().Add(c.srv.cfg.ReadTimeout))
}

// readFailed sets the close reason for a read that ended the call.
func (c *call) readFailed(err error) {
	var ne net.Error
	switch {
	case c.ctx.Err() != nil: // the call was ended (its reason is set) or the server shuts down
	case errors.Is(err, websocket.ErrReadLimit):
		c.closeWith(websocket.CloseMessageTooBig, fmt.Sprintf("message over %d bytes", c.srv.cfg.MaxMessage))
	case errors.As(err, &ne) && ne.Timeout():
		if !c.started {
			c.fail(CodeTimeout, fmt.Sprintf("no start message within %s", c.srv.cfg.StartTimeout))
		} else {
			c.fail(CodeTimeout, fmt.Sprintf("nothing from the client for %s", c.srv.cfg.ReadTimeout))
		}
	default:
		c.log.Debug("telephony read ended", "err", err) // the client closed or went away
	}
}

// handle acts on one inbound message; it returns true when the call must end.
func (c *call) handle(kind int, data []byte) bool {
	if c.proto == ProtoRaw {
		return c.handleRaw(kind, data)
	}
	if kind != websocket.TextMessage {
		c.fail(CodeBadMessage, "binary frames are not part of the Twilio protocol (use /v1/telephony/raw)")
		return true
	}
	m, err := ParseMessage(data)
	if err != nil {
		var pe *ParseError
		if errors.As(err, &pe) && m.Event == "speak" && c.started && pe.Code != CodeBadJSON {
			c.sendError(pe.Code, pe.Msg) // a bad speak is answered; the call goes on
			return false
		}
		code := CodeBadMessage
		if pe != nil {
			code = pe.Code
		}
		c.fail(code, err.Error())
		return true
	}
	if !m.Known {
		if c.unknown++; c.unknown <= 3 {
			c.log.Debug("telephony: unknown event ignored", "event", m.Event)
		}
		return false
	}
	switch m.Event {
	case "connected", "dtmf":
	case "start":
		if c.started {
			c.fail(CodeBadMessage, "a second start message")
			return true
		}
		return !c.begin(m.Start)
	case "media":
		if !c.started {
			c.fail(CodeBadMessage, "media before start")
			return true
		}
		if m.Media.Track == "" || m.Media.Track == "inbound" {
			c.audioIn(m.Media.Audio)
		}
	case "mark":
		c.log.Debug("telephony: mark played", "name", m.Mark)
	case "stop":
		return c.stop()
	case "speak", "cancel":
		if !c.started {
			c.fail(CodeBadMessage, m.Event+" before start")
			return true
		}
		c.speech(m)
	}
	return false
}

// handleRaw: binary frames are audio; text frames may be speak and cancel (JSON), and
// anything else (an Asterisk control event, say) is ignored.
func (c *call) handleRaw(kind int, data []byte) bool {
	if kind == websocket.BinaryMessage {
		width := 1
		if c.cfg.encoding == "pcm_s16le" {
			width = 2
		}
		if len(data)%width != 0 || len(data) > c.cfg.rate*width {
			c.fail(CodeBadMedia, fmt.Sprintf("a frame of %d bytes: want whole samples, at most one second", len(data)))
			return true
		}
		c.audioIn(data)
		return false
	}
	m, err := ParseMessage(data)
	if err != nil || !m.Known {
		return false
	}
	switch m.Event {
	case "speak", "cancel":
		c.speech(m)
	case "stop":
		return c.stop()
	}
	return false
}

// begin starts the call from the start message (raw: from the query alone). It returns
// false when the call was refused (the reason is set).
func (c *call) begin(s *Start) bool {
	sid := ""
	if s != nil {
		sid = s.StreamSid
		if err := c.cfg.apply(s.Params); err != nil {
			c.fail(CodeBadParams, "customParameters: "+err.Error())
			return false
		}
		if err := c.cfg.check(false); err != nil {
			c.fail(CodeBadParams, err.Error())
			return false
		}
	}
	if c.release == nil {
		// A keyed server, and no key came with the request: the start message brings it.
		if c.cfg.token == "" {
			c.fail(CodeUnauthorized, "missing API key: pass it as the token custom parameter (<Parameter name=\"token\" value=\"KEY\"/>)")
			return false
		}
		p, ok := c.srv.cfg.Keys.Lookup(c.cfg.token)
		if !ok {
			c.fail(CodeUnauthorized, "invalid API key")
			return false
		}
		rel, ok := c.srv.cfg.Sessions.Acquire(p)
		if !ok {
			c.fail(CodeTooMany, fmt.Sprintf("this API key already has %d open sessions", c.srv.cfg.Sessions.Max))
			return false
		}
		c.owner, c.release = p, rel
	}
	c.sidJSON, _ = json.Marshal(sid)
	c.frame = c.cfg.rate / 50
	f := audioout.Format{Encoding: audioout.MuLaw, SampleRate: c.cfg.rate}
	if c.cfg.encoding == "pcm_s16le" {
		f.Encoding = audioout.PCM
	}
	enc, err := audioout.NewEncoder(f, c.cfg.rate)
	if err != nil {
		c.fail(CodeBadParams, err.Error())
		return false
	}
	c.enc = enc
	var code string
	if c.cfg.mode == ModeTTS {
		code, err = c.startTTS()
	} else {
		code, err = c.startVC()
	}
	if err != nil {
		c.fail(code, err.Error())
		return false
	}
	c.started, c.startedAt = true, time.Now()
	c.extendRead()
	if f := c.srv.cfg.OnSession; f != nil {
		c.metered = modeLabel(c.cfg.mode)
		f(c.metered, true)
	}
	c.log.Info("call started", "mode", c.cfg.mode, "voice", c.voiceName(), "stream", sid)
	c.spawn("telephony clock", c.clock)
	return true
}

func (c *call) voiceName() string {
	if c.vc != nil {
		return c.vc.name
	}
	return c.cfg.voice
}

// stop ends the input: a vc call plays out what it holds and the voice's tail, then
// closes; a tts call closes now. It returns true when the call ends at once.
func (c *call) stop() bool {
	if c.vc == nil {
		c.closeWith(websocket.CloseNormalClosure, "stream stopped")
		return true
	}
	c.vc.stop()
	return false
}

// speech handles speak and cancel.
func (c *call) speech(m Message) {
	if c.tts == nil {
		c.sendError(CodeBadMessage, m.Event+" needs a call in mode=tts")
		return
	}
	if m.Event == "cancel" {
		c.tts.cancel()
		return
	}
	c.tts.speak(m.Text, m.MarkName, m.Seed, m.MaxTokens)
}

// pinger pings the client, and ends the call once a client that answered pings stops
// answering them: it no longer reads (one that never answers is left to the write
// deadline).
func (c *call) pinger() {
	t := time.NewTicker(c.srv.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		if last := c.lastPong.Load(); last != 0 && time.Since(time.Unix(0, last)) > c.srv.cfg.ReadTimeout {
			c.fail(CodeTimeout, fmt.Sprintf("the client stopped reading (no pong for %s)", c.srv.cfg.ReadTimeout))
			return
		}
		if err := c.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.srv.cfg.WriteTimeout)); err != nil {
			c.fail(CodeTimeout, "ping failed: the client does not read")
			return
		}
	}
}

// closeCode maps an error code to the WebSocket close code.
func closeCodeFor(code string) int {
	switch code {
	case CodeBadJSON, CodeBadMedia:
		return websocket.CloseInvalidFramePayloadData // 1007
	case CodeBadMessage:
		return websocket.CloseProtocolError // 1002
	case CodeTooMany, CodeBusy:
		return websocket.CloseTryAgainLater // 1013
	case CodeInternal, CodeSynthesis:
		return websocket.CloseInternalServerErr // 1011
	}
	return websocket.ClosePolicyViolation // 1008: keys, limits, parameters, voices, timeouts
}

// fail ends the call with an error: the close frame says "code: message".
func (c *call) fail(code, msg string) {
	c.log.Info("call ended by an error", "code", code, "message", msg)
	c.closeWith(closeCodeFor(code), code+": "+msg)
}

// closeWith ends the call with a close code and reason (the first reason set wins).
func (c *call) closeWith(code int, reason string) {
	c.closeMu.Lock()
	if c.closeCode == 0 {
		c.closeCode, c.closeReason = code, trunc(reason, 123) // a close frame's reason is ≤ 123 bytes
	}
	c.closeMu.Unlock()
	c.cancel()
}

// finish tears the call down: every goroutine, the voice, the close frame, the slot.
func (c *call) finish() {
	c.cancel()
	c.wg.Wait()
	if c.vc != nil {
		c.vc.close()
	}
	c.closeMu.Lock()
	code, reason := c.closeCode, c.closeReason
	c.closeMu.Unlock()
	if code == 0 {
		code, reason = websocket.CloseNormalClosure, "call ended"
		if c.srv.ctx.Err() != nil {
			// 1001: come back later; the call was not ended by its client.
			code, reason = websocket.CloseGoingAway, "server shutting down"
		}
	}
	_ = c.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	c.conn.Close()
	if c.release != nil {
		c.release()
	}
	if c.metered != "" {
		c.srv.cfg.OnSession(c.metered, false)
	}
	attrs := []any{"mode", c.cfg.mode, "voice", c.voiceName(), "close", code, "reason", reason,
		"frames_out", c.framesOut.Load(), "marks", c.marks.Load(), "unknown_events", c.unknown}
	if c.started {
		attrs = append(attrs, "duration", time.Since(c.startedAt).Round(time.Millisecond))
	}
	if c.vc != nil {
		attrs = append(attrs, c.vc.summary()...)
	}
	c.log.Info("call ended", attrs...)
}

// write sends one data frame under the write deadline; a failure ends the call.
func (c *call) write(kind int, b []byte) bool {
	c.conn.SetWriteDeadline(time.Now().Add(c.srv.cfg.WriteTimeout))
	if err := c.conn.WriteMessage(kind, b); err != nil {
		if c.ctx.Err() == nil {
			c.fail(CodeTimeout, "write failed: the client does not read")
		}
		return false
	}
	return true
}

// sendEvent writes a JSON event (Twilio protocol only: raw clients get audio alone).
func (c *call) sendEvent(v any) {
	if c.proto != ProtoTwilio {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.write(websocket.TextMessage, b)
}

// sendError reports a speak or cancel that could not be used (a voxpipe extension event;
// Twilio never sends what causes one).
func (c *call) sendError(code, msg string) {
	c.log.Info("telephony client error", "code", code, "message", msg)
	c.sendEvent(map[string]any{"event": "error", "streamSid": json.RawMessage(c.sidOrEmpty()), "code": code, "message": msg})
}

func (c *call) sidOrEmpty() []byte {
	if c.sidJSON == nil {
		return []byte(`""`)
	}
	return c.sidJSON
}

// newVoice makes a processor for a live voice: from NewProcessor if it makes that voice,
// otherwise from the registry (which takes no reference clip).
func (c *call) newVoice(name, ref string) (stream.Processor, string, error) {
	fail := func(err error) (stream.Processor, string, error) {
		code, msg := stream.ClientError(c.log, "voice "+name, err, CodeInternal)
		return nil, code, errors.New(msg)
	}
	if f := c.srv.cfg.NewProcessor; f != nil {
		proc, err := f(c.owner, name, ref)
		if err != nil {
			return fail(err)
		}
		if proc != nil {
			if !c.srv.sched.Admit(name, nil, proc) {
				stream.CloseProcessor(proc)
				return nil, CodeBusy, stream.NoRoom(name)
			}
			return proc, "", nil
		}
	}
	if ref != "" {
		return nil, CodeBadParams, fmt.Errorf("voice %q takes no reference clip (ref)", name)
	}
	proc, err := c.srv.cfg.Voices.New(name)
	if err != nil {
		return fail(err)
	}
	return proc, "", nil
}
