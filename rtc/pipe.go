package rtc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/interceptor"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/stream"
)

// RTPReader is where a Pipe's packets come from: a Pion *webrtc.TrackRemote, whoever
// negotiated it (a WebRTC session here, a LiveKit room in the worker).
type RTPReader interface {
	ReadRTP() (*rtp.Packet, interceptor.Attributes, error)
}

// SampleWriter is where a Pipe's Opus frames go: a *webrtc.TrackLocalStaticSample, or an
// adapter to another SDK's local track.
type SampleWriter interface {
	WriteSample(media.Sample) error
}

// PipeConfig sets up a Pipe. Zero fields take the defaults.
type PipeConfig struct {
	ID      string // the session id its reports carry
	Jitter  buffers.JitterConfig
	Encoder EncoderConfig
	Log     *slog.Logger
	// OnStats, if set, gets the once-a-second report (Voice and Passthrough are the
	// caller's to fill in), from the media clock's goroutine.
	OnStats func(StatsMessage, SessionReport)
	// Source, if set, is asked first every frame: when it fills out (text to speech) it
	// returns true and the session's output is not played.
	Source func(out []float32) bool
}

// Pipe is one session's media path: Opus RTP packets in through a jitter buffer, and a 20 ms
// clock that decodes (or conceals) a frame, hands it to the session, takes what the session
// has ready and encodes it, so that one Opus frame goes out every 20 ms whatever the network
// and the model do. Processing runs on the scheduler, never on the clock.
type Pipe struct {
	cfg  PipeConfig
	jbMu sync.Mutex
	jb   *buffers.JitterBuffer
	sess atomic.Pointer[stream.Live] // set by Run

	fecTotal, plcTotal atomic.Int64 // recovery counters, written only by the media loop
}

// NewPipe makes a pipe; Feed and Run start it.
func NewPipe(cfg PipeConfig) *Pipe {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Pipe{cfg: cfg, jb: buffers.NewJitterBuffer(cfg.Jitter)}
}

// Feed moves packets from a remote track into the jitter buffer until the track ends.
func (pp *Pipe) Feed(tr RTPReader) {
	for {
		pkt, _, err := tr.ReadRTP()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				pp.cfg.Log.Debug("rtp read ended", "err", err)
			}
			return
		}
		if len(pkt.Payload) == 0 {
			continue
		}
		now := time.Now()
		pp.jbMu.Lock()
		pp.jb.Push(pkt.SequenceNumber, pkt.Timestamp, opusRate, pkt.Payload, now)
		pp.jbMu.Unlock()
	}
}

// Run runs the media clock with sess until ctx ends; it fails only if the codecs cannot be
// made. A nil sess plays only what the Source gives (silence otherwise).
func (pp *Pipe) Run(ctx context.Context, sess *stream.Live, out SampleWriter) error {
	pp.sess.Store(sess)
	dec, err := opus.NewDecoder(opusRate, 1)
	if err != nil {
		return err
	}
	enc, err := newEncoder(pp.cfg.Encoder)
	if err != nil {
		return err
	}
	pp.runClock(ctx, out, &mediaFrame{dec: dec, enc: enc,
		in: make([]float32, opusRate*maxFrameMs/1000), merge: make([]float32, opusRate*maxFrameMs/1000),
		out: make([]float32, frameSize), packet: make([]byte, maxPacket), minWait: time.Hour})
	return nil
}

// Recovery is the jitter buffer's counters and the frames recovered by FEC and concealed by
// PLC so far.
func (pp *Pipe) Recovery() (js buffers.JitterStats, fec, plc int) {
	pp.jbMu.Lock()
	js = pp.jb.Stats()
	pp.jbMu.Unlock()
	return js, int(pp.fecTotal.Load()), int(pp.plcTotal.Load())
}

// drainFrames is how long an underflow keeps feeding the processor (PLC, then silence): longer
// than any voice's latency, so its tail is heard when the sender pauses.
const drainFrames = 500 / frameMs

// mediaFrame is the scratch of the media loop, allocated once per session.
type mediaFrame struct {
	dec     *opus.Decoder
	enc     *opus.Encoder
	in      []float32
	merge   []float32
	out     []float32
	packet  []byte
	decoded bool          // the decoder has seen a packet
	plcRun  int           // consecutive concealed frames
	minWait time.Duration // shortest jitter-buffer wait over waitN packets
	waitN   int
}

func (pp *Pipe) runClock(ctx context.Context, out SampleWriter, f *mediaFrame) {
	const frame = frameMs * time.Millisecond
	timer := time.NewTimer(frame)
	defer timer.Stop()
	next := time.Now().Add(frame)
	var acc statsAccumulator
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		now := time.Now()
		if now.Sub(next) > 10*frame { // the process stalled: don't burst, resume the clock
			next = now
		}
		for !next.After(now) {
			pp.frame(f, out, &acc, time.Now())
			next = next.Add(frame)
		}
		next = next.Add(-pp.phaseStep(f))
		if acc.frames >= 1000/frameMs {
			if pp.cfg.OnStats != nil {
				pp.cfg.OnStats(pp.stats(&acc))
			}
			acc = statsAccumulator{}
		}
		timer.Reset(time.Until(next))
	}
}

// phaseStep moves the playout clock towards the packets' arrival: once a second, if every
// packet waited longer than the measured jitter plus a margin, tick up to 4 ms earlier next
// time. The clock only moves earlier; an underflow (packets later than the clock) is the
// jitter buffer's to absorb.
func (pp *Pipe) phaseStep(f *mediaFrame) time.Duration {
	if f.waitN < 1000/frameMs {
		return 0
	}
	pp.jbMu.Lock()
	jitter := time.Duration(pp.jb.JitterMs() * float64(time.Millisecond))
	pp.jbMu.Unlock()
	slack := f.minWait - jitter - 2*time.Millisecond
	f.minWait, f.waitN = time.Hour, 0
	return min(max(slack, 0), 4*time.Millisecond)
}

// statsAccumulator sums per-frame timings between two stats messages.
type statsAccumulator struct {
	frames                  int
	jitter, decode, encode  time.Duration
	latency                 time.Duration
	latencyN                int
	resample0, process0     time.Duration
	haveBase                bool
	fecRecovered, plcFrames int
}

func (pp *Pipe) frame(f *mediaFrame, out SampleWriter, acc *statsAccumulator, now time.Time) {
	t0 := time.Now()
	n, arrival := pp.popDecode(f, acc, now)
	acc.decode += time.Since(t0)

	pp.process(f, acc, n, arrival, now)

	t1 := time.Now()
	size, err := f.enc.EncodeFloat32(f.out, f.packet)
	acc.encode += time.Since(t1)
	acc.frames++
	if err != nil {
		pp.cfg.Log.Warn("opus encode failed", "err", err)
		return
	}
	if err := out.WriteSample(media.Sample{Data: f.packet[:size], Duration: frameMs * time.Millisecond}); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		pp.cfg.Log.Debug("write sample", "err", err)
	}
}

// popDecode takes the frame due now from the jitter buffer and decodes (or conceals) it into
// f.in, returning the sample count and when its audio arrived. The lock is released by
// defer, so a panic here cannot leave the RTP reader blocked on it.
func (pp *Pipe) popDecode(f *mediaFrame, acc *statsAccumulator, now time.Time) (n int, arrival time.Time) {
	pp.jbMu.Lock()
	defer pp.jbMu.Unlock()
	fr := pp.jb.Pop(now)
	// Payloads point into the jitter buffer: decode them before it is touched again.
	n, arrival = 0, now
	switch fr.Kind {
	case buffers.Packet:
		n = pp.decode(f, fr.Payload, f.in)
		arrival = now.Add(-fr.Wait)
		acc.jitter += fr.Wait
		f.minWait = min(f.minWait, fr.Wait)
		f.waitN++
		if fr.Merge != nil && n > 0 {
			// The buffer shed a frame: play both in one frame time, crossfaded.
			if m := pp.decode(f, fr.Merge, f.merge); m == n {
				for i := 0; i < n; i++ {
					w := float32(i) / float32(n)
					f.in[i] = f.in[i]*(1-w) + f.merge[i]*w
				}
			}
		}
	case buffers.Lost:
		if f.decoded {
			n = frameSize
			if fr.Next != nil && f.dec.DecodeFECFloat32(fr.Next, f.in[:n]) == nil {
				acc.fecRecovered++
			} else if f.dec.DecodePLCFloat32(f.in[:n]) == nil {
				acc.plcFrames++
			} else {
				clear(f.in[:n])
			}
		}
	case buffers.Empty:
		if f.decoded && f.plcRun < drainFrames {
			// Underflow: conceal briefly, then feed silence until the voice's held-back tail
			// has played out; after that an idle sender costs no processing.
			n = frameSize
			if f.plcRun < 3 && f.dec.DecodePLCFloat32(f.in[:n]) == nil {
				acc.plcFrames++
			} else {
				clear(f.in[:n])
			}
			f.plcRun++
		}
	}
	if fr.Kind == buffers.Packet {
		f.plcRun = 0
	}
	return n, arrival
}

// settleBudget bounds the clock's wait for a step it started: voices whose chunks typically
// finish within it (small models) are played in the same tick; slower ones are not waited
// for at all. A send moves by at most this much, which a jitter buffer absorbs.
const settleBudget = 15 * time.Millisecond

// process hands one frame to the session and takes the output that is ready (or takes
// text-to-speech audio). Neither waits for a model: the scheduler's workers process.
func (pp *Pipe) process(f *mediaFrame, acc *statsAccumulator, n int, arrival, now time.Time) {
	sess := pp.sess.Load()
	if sess != nil && !acc.haveBase {
		st := sess.Stats()
		acc.resample0, acc.process0, acc.haveBase = st.Resample, st.Process, true
	}
	if pp.cfg.Source != nil && pp.cfg.Source(f.out) {
		return // text to speech: the input is not used
	}
	if sess == nil {
		clear(f.out)
		return
	}
	if n > 0 && sess.Push(f.in[:n], arrival) {
		sess.Settle(settleBudget)
	}
	sess.NoteQueueAge(now)
	if got := sess.Pull(f.out, now); got > 0 {
		acc.latency += sess.Stats().Latency
		acc.latencyN++
	}
}

// decode decodes one packet into dst and returns the sample count (0 on a corrupt packet).
func (pp *Pipe) decode(f *mediaFrame, payload []byte, dst []float32) int {
	n, err := f.dec.DecodeFloat32(payload, dst)
	if err != nil {
		pp.cfg.Log.Debug("opus decode failed", "err", err)
		return 0
	}
	f.decoded = true
	return n
}

func ms(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / 1000 / float64(n)
}

// stats builds the once-a-second report.
func (pp *Pipe) stats(acc *statsAccumulator) (StatsMessage, SessionReport) {
	sess := pp.sess.Load()
	fec := pp.fecTotal.Add(int64(acc.fecRecovered))
	plc := pp.plcTotal.Add(int64(acc.plcFrames))
	js, _, _ := pp.Recovery()
	var st stream.Stats
	var alg time.Duration
	if sess != nil {
		st, alg = sess.Stats(), sess.AlgorithmicLatency()
	}
	report := SessionReport{ID: pp.cfg.ID, Stream: st, Shed: js.Shed, JitterTarget: js.Target, Algorithmic: alg}
	load := 0.0
	if audio := time.Duration(acc.frames) * frameMs * time.Millisecond; audio > 0 {
		load = float64(st.Process-acc.process0) / float64(audio)
	}
	lat := ms(acc.latency, acc.latencyN)
	if lat > 0 {
		lat += ms(acc.encode, acc.frames)
	}
	return StatsMessage{
		Type: "stats", SessionID: pp.cfg.ID,
		Timings: StageTimings{
			Jitter: ms(acc.jitter, acc.frames), Decode: ms(acc.decode, acc.frames),
			Resample: ms(st.Resample-acc.resample0, acc.frames), Process: ms(st.Process-acc.process0, acc.frames),
			Encode: ms(acc.encode, acc.frames),
		},
		Queue: QueueStats{DepthMs: ms(st.QueueDepth, 1), AgeMs: ms(st.QueueAge, 1),
			OutputBufferMs: ms(st.OutputBuffer, 1), TrimmedMs: ms(st.Trimmed, 1), StretchedMs: ms(st.Stretched, 1), Underflows: st.Underflows},
		Chunks:        st.Chunks,
		LateChunks:    st.LateChunks,
		DroppedChunks: st.DroppedChunks + js.Shed,
		DroppedMs:     ms(st.Dropped, 1) + float64(js.Shed*frameMs),
		Packets: PacketStats{Received: js.Received, Lost: js.Lost, Late: js.Late, FECRecovered: int(fec),
			PLCFrames: int(plc), Underflows: js.Underflows, Shed: js.Shed},
		Latency: LatencyStats{Server: lat, Algorithmic: ms(alg, 1), Jitter: ms(js.Target, 1)},
		Load:    load,
	}, report
}
