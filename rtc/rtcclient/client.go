// Package rtcclient is a Go WebRTC client of voxpipe's live voice protocol: it sends Opus
// audio paced like a microphone and records what comes back with arrival times. The loopback
// benchmark and the tests use it as a real peer.
package rtcclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/pion/interceptor"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"
	"gopkg.in/hraban/opus.v2"

	"github.com/voxpipe/voxpipe/rtc"
)

const (
	rate      = 48000
	frameSize = 960 // 20 ms
	frameDur  = 20 * time.Millisecond
)

// Options configure a client.
type Options struct {
	URL     string             // ws://host:port/v1/rtc
	Voice   string             // "" leaves the server's default
	Params  map[string]float64 // voice parameters
	Trickle bool               // trickle candidates instead of sending a complete offer
	// DropRate is the fraction of outgoing RTP packets to drop (a lossy network), with Seed.
	DropRate float64
	Seed     uint64
	// Events opens a data channel "events" and records what the server sends on it.
	Events bool
}

// Received is the audio that came back, decoded, with the arrival time of each packet.
type Received struct {
	PCM     []float32
	Packets []ReceivedPacket
}

// ReceivedPacket locates one packet's samples in PCM.
type ReceivedPacket struct {
	At    time.Time
	Start int
	N     int
}

// Client is one live session.
type Client struct {
	opts  Options
	ws    *websocket.Conn
	pc    *webrtc.PeerConnection
	track *webrtc.TrackLocalStaticRTP

	writeMu sync.Mutex
	mu      sync.Mutex
	msgs    []rtc.Message
	events  []rtc.Message // received on the data channel
	stats   []rtc.StatsMessage
	statsAt []time.Time // when each stats message arrived
	recv    Received
	ready   chan struct{}
	answer  chan string
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	readyMu sync.Once

	// Sent frames: the time each 20 ms frame was handed to the network.
	sendTimes []time.Time
}

// Dial connects, negotiates and waits until the server says ready.
func Dial(ctx context.Context, o Options) (*Client, error) {
	ws, resp, err := websocket.DefaultDialer.DialContext(ctx, o.URL, http.Header{})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("rtcclient: dial %s: %s: %w", o.URL, resp.Status, err)
		}
		return nil, fmt.Errorf("rtcclient: dial %s: %w", o.URL, err)
	}
	c := &Client{opts: o, ws: ws, ready: make(chan struct{}), answer: make(chan string, 1), done: make(chan struct{})}
	if err := c.negotiate(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func newAPI() (*webrtc.API, error) {
	me := &webrtc.MediaEngine{}
	if err := me.RegisterCodec(webrtc.RTPCodecParameters{RTPCodecCapability: webrtc.RTPCodecCapability{
		MimeType: webrtc.MimeTypeOpus, ClockRate: rate, Channels: 2, SDPFmtpLine: "minptime=10;useinbandfec=1"},
		PayloadType: 111}, webrtc.RTPCodecTypeAudio); err != nil {
		return nil, err
	}
	ir := &interceptor.Registry{}
	if err := webrtc.RegisterDefaultInterceptors(me, ir); err != nil {
		return nil, err
	}
	se := webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	return webrtc.NewAPI(webrtc.WithMediaEngine(me), webrtc.WithInterceptorRegistry(ir), webrtc.WithSettingEngine(se)), nil
}

func (c *Client) negotiate(ctx context.Context) error {
	api, err := newAPI()
	if err != nil {
		return err
	}
	if c.pc, err = api.NewPeerConnection(webrtc.Configuration{}); err != nil {
		return err
	}
	c.track, err = webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: rate, Channels: 2}, "mic", "rtcclient")
	if err != nil {
		return err
	}
	if _, err := c.pc.AddTrack(c.track); err != nil {
		return err
	}
	connected := make(chan struct{})
	var connOnce sync.Once
	c.pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		if st == webrtc.PeerConnectionStateConnected {
			connOnce.Do(func() { close(connected) })
		}
	})
	c.pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.record(tr) }()
	})
	if c.opts.Trickle {
		c.pc.OnICECandidate(func(cand *webrtc.ICECandidate) {
			if cand == nil {
				return
			}
			init := cand.ToJSON()
			_ = c.Send(rtc.Message{Type: "candidate", Candidate: &init})
		})
	}
	if c.opts.Events {
		dc, err := c.pc.CreateDataChannel("events", nil)
		if err != nil {
			return err
		}
		dc.OnMessage(func(msg webrtc.DataChannelMessage) {
			var m rtc.Message
			if json.Unmarshal(msg.Data, &m) == nil {
				c.mu.Lock()
				c.events = append(c.events, m)
				c.mu.Unlock()
			}
		})
	}
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.readLoop() }()

	if c.opts.Voice != "" || len(c.opts.Params) > 0 {
		if err := c.Send(rtc.Message{Type: "session", Mode: "vc", Voice: c.opts.Voice, Params: c.opts.Params}); err != nil {
			return c.sendErr(err)
		}
	}
	offer, err := c.pc.CreateOffer(nil)
	if err != nil {
		return err
	}
	gathered := webrtc.GatheringCompletePromise(c.pc)
	if err := c.pc.SetLocalDescription(offer); err != nil {
		return err
	}
	sdp := offer.SDP
	if !c.opts.Trickle {
		select {
		case <-gathered:
		case <-ctx.Done():
			return ctx.Err()
		}
		sdp = c.pc.LocalDescription().SDP
	}
	if err := c.Send(rtc.Message{Type: "offer", SDP: sdp}); err != nil {
		return c.sendErr(err)
	}
	select {
	case ans := <-c.answer:
		if err := c.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: ans}); err != nil {
			return fmt.Errorf("rtcclient: set answer: %w", err)
		}
	case <-c.done:
		return fmt.Errorf("rtcclient: server closed before answering: %v", c.lastError())
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-c.ready:
	case <-c.done:
		return fmt.Errorf("rtcclient: server closed before ready: %v", c.lastError())
	case <-ctx.Done():
		return ctx.Err()
	}
	// Media sent before DTLS is up would be lost: start once connected, like a browser.
	select {
	case <-connected:
		return nil
	case <-c.done:
		return fmt.Errorf("rtcclient: server closed before the peer connected: %v", c.lastError())
	case <-ctx.Done():
		return fmt.Errorf("rtcclient: peer connection: %w", ctx.Err())
	}
}

// sendErr is a failed write's error, or the server's own error when the server ended the
// session (it sends its reason, then closes: a write after that fails without saying why).
func (c *Client) sendErr(err error) error {
	select {
	case <-c.done:
		return fmt.Errorf("rtcclient: server closed the session: %v", c.lastError())
	case <-time.After(time.Second):
		return err
	}
}

func (c *Client) lastError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.msgs) - 1; i >= 0; i-- {
		if c.msgs[i].Type == "error" {
			return fmt.Errorf("%s: %s", c.msgs[i].Code, c.msgs[i].Message)
		}
	}
	return errors.New("no error message")
}

// Send writes one signaling message.
func (c *Client) Send(m any) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	return c.ws.WriteJSON(m)
}

func (c *Client) readLoop() {
	defer close(c.done)
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			return
		}
		var m rtc.Message
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		switch m.Type {
		case "answer":
			c.answer <- m.SDP
		case "candidate":
			if m.Candidate != nil && c.pc != nil {
				_ = c.pc.AddICECandidate(*m.Candidate)
			}
		case "ready":
			c.readyMu.Do(func() { close(c.ready) })
		case "stats":
			var s rtc.StatsMessage
			if json.Unmarshal(data, &s) == nil {
				c.mu.Lock()
				c.stats = append(c.stats, s)
				c.statsAt = append(c.statsAt, time.Now())
				c.mu.Unlock()
			}
		}
		c.mu.Lock()
		c.msgs = append(c.msgs, m)
		c.mu.Unlock()
	}
}

// record decodes the returned track, concealing lost packets so sample positions stay true.
func (c *Client) record(tr *webrtc.TrackRemote) {
	dec, err := opus.NewDecoder(rate, 1)
	if err != nil {
		return
	}
	pcm := make([]float32, rate*120/1000)
	var last uint16
	first := true
	for {
		pkt, _, err := tr.ReadRTP()
		if err != nil {
			return
		}
		at := time.Now()
		if !first {
			for gap := pkt.SequenceNumber - last - 1; gap > 0 && gap < 50; gap-- {
				if dec.DecodePLCFloat32(pcm[:frameSize]) == nil {
					c.appendAudio(at, pcm[:frameSize])
				}
			}
		}
		first, last = false, pkt.SequenceNumber
		n, err := dec.DecodeFloat32(pkt.Payload, pcm)
		if err != nil {
			continue
		}
		c.appendAudio(at, pcm[:n])
	}
}

func (c *Client) appendAudio(at time.Time, s []float32) {
	c.mu.Lock()
	c.recv.Packets = append(c.recv.Packets, ReceivedPacket{At: at, Start: len(c.recv.PCM), N: len(s)})
	c.recv.PCM = append(c.recv.PCM, s...)
	c.mu.Unlock()
}

// EncodeFrames cuts 48 kHz mono audio into 20 ms Opus packets (the last frame zero-padded).
func EncodeFrames(pcm []float32) ([][]byte, error) {
	enc, err := opus.NewEncoder(rate, 1, opus.AppAudio)
	if err != nil {
		return nil, err
	}
	if err := enc.SetBitrate(64000); err != nil {
		return nil, err
	}
	if err := enc.SetInBandFEC(true); err != nil {
		return nil, err
	}
	if err := enc.SetPacketLossPerc(10); err != nil {
		return nil, err
	}
	frame := make([]float32, frameSize)
	buf := make([]byte, 1500)
	var out [][]byte
	for i := 0; i < len(pcm); i += frameSize {
		clear(frame)
		copy(frame, pcm[i:])
		n, err := enc.EncodeFloat32(frame, buf)
		if err != nil {
			return nil, err
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
	return out, nil
}

// SendPackets sends 20 ms Opus packets paced on a 20 ms clock, like a microphone, dropping
// DropRate of them. It records when each frame was sent.
func (c *Client) SendPackets(ctx context.Context, packets [][]byte) error {
	rng := rand.New(rand.NewPCG(c.opts.Seed, 42))
	ssrc := rng.Uint32()
	seq := uint16(rng.Uint32())
	ts := rng.Uint32()
	tick := time.NewTicker(frameDur)
	defer tick.Stop()
	times := make([]time.Time, 0, len(packets))
	for i, payload := range packets {
		if i > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			case <-c.done:
				return errors.New("rtcclient: server closed the session")
			}
		}
		now := time.Now()
		times = append(times, now)
		pkt := &rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: ts, SSRC: ssrc, Marker: i == 0}, Payload: payload}
		seq++
		ts += frameSize
		if c.opts.DropRate > 0 && i > 0 && rng.Float64() < c.opts.DropRate {
			continue
		}
		if err := c.track.WriteRTP(pkt); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			return err
		}
	}
	c.mu.Lock()
	c.sendTimes = times
	c.mu.Unlock()
	return nil
}

// SendTimes returns when each frame of the last SendPackets call went out.
func (c *Client) SendTimes() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.sendTimes...)
}

// Received returns a copy of the audio received so far.
func (c *Client) Received() Received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Received{PCM: append([]float32(nil), c.recv.PCM...), Packets: append([]ReceivedPacket(nil), c.recv.Packets...)}
}

// Stats returns the stats messages received so far.
func (c *Client) Stats() []rtc.StatsMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rtc.StatsMessage(nil), c.stats...)
}

// StatsSince returns the first stats message that arrived at or after t (false: none yet).
func (c *Client) StatsSince(t time.Time) (rtc.StatsMessage, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, at := range c.statsAt {
		if !at.Before(t) {
			return c.stats[i], true
		}
	}
	return rtc.StatsMessage{}, false
}

// Messages returns every message received so far.
func (c *Client) Messages() []rtc.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rtc.Message(nil), c.msgs...)
}

// Events returns the messages received on the events data channel so far.
func (c *Client) Events() []rtc.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rtc.Message(nil), c.events...)
}

// WaitMessage waits until a message of the given type (and, if code is not empty, error code)
// arrives, or the timeout passes.
func (c *Client) WaitMessage(typ, code string, timeout time.Duration) (rtc.Message, bool) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, m := range c.Messages() {
			if m.Type == typ && (code == "" || m.Code == code) {
				return m, true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return rtc.Message{}, false
}

// Done is closed when the server closes the socket.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close ends the session and waits for the client's goroutines.
func (c *Client) Close() {
	c.once.Do(func() {
		c.writeMu.Lock()
		_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
		c.writeMu.Unlock()
		if c.pc != nil {
			_ = c.pc.Close()
		}
		c.ws.Close()
		c.wg.Wait()
	})
}

// Abort drops the connection without a goodbye, like a browser tab that crashed.
func (c *Client) Abort() {
	c.once.Do(func() {
		c.ws.UnderlyingConn().Close()
		if c.pc != nil {
			_ = c.pc.Close()
		}
		c.wg.Wait()
	})
}

// WSURL turns an http:// base URL into the signaling URL.
func WSURL(base string) string {
	return strings.Replace(strings.TrimSuffix(base, "/"), "http", "ws", 1) + "/v1/rtc"
}
