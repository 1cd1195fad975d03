package telephony

import (
	"encoding/base64"
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// frameTime is the audio of one outbound message: Twilio plays 20 ms media messages, and
// Asterisk's chan_websocket wants 20 ms frames.
const frameTime = 20 * time.Millisecond

// clockFrame is the clock's scratch, allocated once per call.
type clockFrame struct {
	in, out []float32
}

// clock sends the call's audio in real time: every 20 ms one frame (vc: the voice's output
// for the frame of input it took; tts: the next 20 ms of speech). A stall of the process is
// not made up for with a burst: the clock resumes from now.
func (c *call) clock() {
	f := &clockFrame{in: make([]float32, c.frame), out: make([]float32, c.frame)}
	timer := time.NewTimer(frameTime)
	defer timer.Stop()
	next := time.Now().Add(frameTime)
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-timer.C:
		}
		now := time.Now()
		if now.Sub(next) > 10*frameTime {
			next = now
		}
		for !next.After(now) {
			var more bool
			if c.vc != nil {
				more = c.vc.tick(f, now)
			} else {
				more = c.tts.tick(f)
			}
			if !more {
				c.closeWith(websocket.CloseNormalClosure, "stream stopped")
				return
			}
			next = next.Add(frameTime)
		}
		timer.Reset(time.Until(next))
	}
}

// sendMedia encodes one frame and sends it: a Twilio media message
// {"event":"media","streamSid":S,"media":{"payload":B64}}, or a raw binary frame. With gen
// set (tts), the frame is dropped when *gen moved on since the audio was taken: a clear
// went out meanwhile, and no audio from before it may follow it.
func (c *call) sendMedia(x []float32, want uint64, gen *atomic.Uint64) {
	enc, err := c.enc.Encode(c.scratchEnc[:0], x)
	if err != nil {
		return
	}
	c.scratchEnc = enc
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if gen != nil && gen.Load() != want {
		return
	}
	var ok bool
	if c.proto == ProtoRaw {
		ok = c.write(websocket.BinaryMessage, enc)
	} else {
		m := append(c.scratchMsg[:0], `{"event":"media","streamSid":`...)
		m = append(m, c.sidJSON...)
		m = append(m, `,"media":{"payload":"`...)
		m = base64.StdEncoding.AppendEncode(m, enc)
		m = append(m, `"}}`...)
		c.scratchMsg = m
		ok = c.write(websocket.TextMessage, m)
	}
	if ok {
		c.framesOut.Add(1)
	}
}

// sendMark tells the client that the audio before it has been sent: Twilio echoes the mark
// back once it has played that audio.
func (c *call) sendMark(name string, want uint64, gen *atomic.Uint64) {
	if c.proto != ProtoTwilio {
		return
	}
	b, _ := json.Marshal(map[string]any{"event": "mark", "streamSid": json.RawMessage(c.sidOrEmpty()), "mark": map[string]string{"name": name}})
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if gen != nil && gen.Load() != want {
		return
	}
	if c.write(websocket.TextMessage, b) {
		c.marks.Add(1)
	}
}

// sendClear tells Twilio to drop the audio it has buffered (barge-in).
func (c *call) sendClear() {
	c.sendEvent(map[string]any{"event": "clear", "streamSid": json.RawMessage(c.sidOrEmpty())})
}
