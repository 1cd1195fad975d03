package buffers

import (
	"slices"
	"time"
)

// JitterConfig sizes a JitterBuffer. Zero fields take the defaults.
type JitterConfig struct {
	Frame    time.Duration // duration of one packet; default 20 ms
	Target   time.Duration // initial playout target; default 40 ms
	Min      time.Duration // the adaptive target never goes below this; default one frame
	Max      time.Duration // nor above this; default 200 ms
	Capacity int           // packets held at most; default 64 (must exceed Max/Frame)
}

// WithDefaults is c with its zero fields set to the defaults and the target clamped, as a
// JitterBuffer made from c uses it.
func (c JitterConfig) WithDefaults() JitterConfig {
	c.fill()
	return c
}

func (c *JitterConfig) fill() {
	if c.Frame <= 0 {
		c.Frame = 20 * time.Millisecond
	}
	if c.Target <= 0 {
		c.Target = 40 * time.Millisecond
	}
	if c.Min <= 0 {
		c.Min = c.Frame
	}
	if c.Max <= 0 {
		c.Max = 200 * time.Millisecond
	}
	if c.Capacity <= 0 {
		c.Capacity = 64
	}
	c.Capacity = max(c.Capacity, int(c.Max/c.Frame)+4)
	c.Target = min(max(c.Target, c.Min), c.Max)
}

// FrameKind says what Pop produced.
type FrameKind int

const (
	// Empty: nothing to play (not started yet, or the next packet has not arrived: underflow).
	Empty FrameKind = iota
	// Packet: Payload is the next packet in sequence.
	Packet
	// Lost: the next packet is missing while later ones are here; Next, if not nil, is the
	// packet after it, whose in-band FEC can rebuild the lost one.
	Lost
)

// Frame is one playout step. Payload, Next and Merge stay valid until the next Pop.
type Frame struct {
	Kind    FrameKind
	Payload []byte
	Next    []byte
	// Merge, if not nil, is the packet after Payload, popped too because the buffer holds more
	// delay than its target: the consumer plays both in one frame time, crossfaded.
	Merge []byte
	// Wait is how long Payload sat in the buffer.
	Wait time.Duration
}

// JitterStats are cumulative counters.
type JitterStats struct {
	Received, Late, Lost, Underflows, Shed, Resets int
	Target                                         time.Duration
	Depth                                          int
}

type slot struct {
	valid   bool
	seq     int64
	arrival time.Time
	payload []byte
}

// JitterBuffer reorders RTP packets of fixed duration and releases one per playout tick,
// adapting its delay to the jitter it measures. It is not safe for concurrent use.
type JitterBuffer struct {
	cfg   JitterConfig
	slots []slot

	started bool  // a first packet has been seen
	playing bool  // playout has begun (the initial fill reached the target)
	next    int64 // extended sequence number to play next
	highest int64 // highest extended sequence number seen
	lastSeq uint16

	transits   []float64 // recent relative transit times in ms (ring)
	transitPos int
	transitN   int
	baseTS     uint32
	baseTime   time.Time
	jitterMs   float64
	boostMs    float64 // extra target after underflows, decays over time
	lastDecay  time.Time
	minDepth   int // lowest depth seen in the current shedding window
	windowFrom time.Time
	idleSince  time.Time
	sorted     []float64
	stats      JitterStats
}

// NewJitterBuffer returns an empty buffer.
func NewJitterBuffer(cfg JitterConfig) *JitterBuffer {
	cfg.fill()
	j := &JitterBuffer{cfg: cfg, slots: make([]slot, cfg.Capacity), transits: make([]float64, 128), sorted: make([]float64, 0, 128)}
	for i := range j.slots {
		j.slots[i].payload = make([]byte, 0, 1500)
	}
	j.stats.Target = cfg.Target
	return j
}

// Push stores a copy of one packet. ts is its RTP timestamp at clockRate Hz.
func (j *JitterBuffer) Push(seq uint16, ts uint32, clockRate int, payload []byte, arrival time.Time) {
	j.stats.Received++
	var ext int64
	if !j.started {
		j.started = true
		ext = int64(seq) + 1<<16 // room below for reordered packets
		j.next, j.highest, j.lastSeq = ext, ext, seq
		j.baseTS, j.baseTime = ts, arrival
	} else {
		ext = j.highest + int64(int16(seq-j.lastSeq))
	}
	if ext > j.highest {
		j.highest, j.lastSeq = ext, seq
	}
	if ext < j.next {
		j.stats.Late++
		return
	}
	if ext >= j.next+int64(len(j.slots)) {
		// A jump far ahead (sender restart or a long gap): start over from this packet.
		j.resetTo(ext)
		j.stats.Resets++
	}
	s := &j.slots[ext%int64(len(j.slots))]
	if s.valid && s.seq == ext {
		return // duplicate
	}
	s.valid, s.seq, s.arrival = true, ext, arrival
	s.payload = append(s.payload[:0], payload...)
	j.noteTransit(ts, clockRate, arrival)
}

func (j *JitterBuffer) resetTo(ext int64) {
	for i := range j.slots {
		j.slots[i].valid = false
	}
	j.next, j.highest, j.playing = ext, ext, false
	j.lastSeq = uint16(ext)
}

// noteTransit records the packet's arrival relative to its media time.
func (j *JitterBuffer) noteTransit(ts uint32, clockRate int, arrival time.Time) {
	media := float64(int32(ts-j.baseTS)) / float64(clockRate) * 1000
	transit := float64(arrival.Sub(j.baseTime).Microseconds())/1000 - media
	j.transits[j.transitPos] = transit
	j.transitPos = (j.transitPos + 1) % len(j.transits)
	j.transitN = min(j.transitN+1, len(j.transits))
	if j.transitN < 16 {
		return
	}
	// Jitter: spread between the fastest packets and the 95th percentile of recent ones.
	j.sorted = append(j.sorted[:0], j.transits[:j.transitN]...)
	slices.Sort(j.sorted)
	j.jitterMs = j.sorted[j.transitN*95/100] - j.sorted[0]
}

// depth counts the packets buffered from next on.
func (j *JitterBuffer) depth() int {
	n := 0
	for e := j.next; e <= j.highest; e++ {
		s := &j.slots[e%int64(len(j.slots))]
		if s.valid && s.seq == e {
			n++
		}
	}
	return n
}

// target is the current adaptive playout delay.
func (j *JitterBuffer) target() time.Duration {
	if j.transitN < 50 {
		return j.cfg.Target
	}
	ms := j.jitterMs + 5 + j.boostMs
	t := time.Duration(ms * float64(time.Millisecond))
	return min(max(t, j.cfg.Min), j.cfg.Max)
}

func (j *JitterBuffer) targetFrames() int {
	t := j.target()
	return int((t + j.cfg.Frame - 1) / j.cfg.Frame)
}

// Pop releases the frame to play at time now; call it once per frame duration.
func (j *JitterBuffer) Pop(now time.Time) Frame {
	j.decayBoost(now)
	j.stats.Target = j.target()
	if !j.started {
		return Frame{}
	}
	d := j.depth()
	j.stats.Depth = d
	if !j.playing {
		if d >= j.targetFrames() || (d > 0 && j.highest-j.next+1 >= int64(j.targetFrames())) {
			j.playing = true
			j.minDepth, j.windowFrom = d, now
			// Start at the oldest packet we have.
			for !j.has(j.next) {
				j.next++
			}
		} else {
			return Frame{}
		}
	}
	if d == 0 {
		j.stats.Underflows++
		if j.idleSince.IsZero() {
			// Raise the target once per dry spell, not once per empty tick.
			j.boostMs = min(j.boostMs+float64(j.cfg.Frame/time.Millisecond), float64(j.cfg.Max/time.Millisecond))
			j.idleSince = now
		} else if now.Sub(j.idleSince) >= j.cfg.Max {
			// A long silence (the sender paused): refill to the target before playing again.
			j.playing = false
		}
		return Frame{}
	}
	j.idleSince = time.Time{}
	j.minDepth = min(j.minDepth, d)
	if !j.has(j.next) {
		j.stats.Lost++
		f := Frame{Kind: Lost}
		if j.has(j.next + 1) {
			f.Next = j.slot(j.next + 1).payload
		}
		j.next++
		return f
	}
	s := j.slot(j.next)
	s.valid = false
	j.next++
	f := Frame{Kind: Packet, Payload: s.payload, Wait: now.Sub(s.arrival)}
	// Shed delay that has stayed above the target for a whole window.
	if now.Sub(j.windowFrom) >= 500*time.Millisecond {
		excess := j.minDepth > j.targetFrames()
		j.minDepth, j.windowFrom = d, now
		if excess && j.has(j.next) {
			m := j.slot(j.next)
			m.valid = false
			j.next++
			f.Merge = m.payload
			j.stats.Shed++
		}
	}
	return f
}

func (j *JitterBuffer) decayBoost(now time.Time) {
	if j.lastDecay.IsZero() {
		j.lastDecay = now
		return
	}
	if dt := now.Sub(j.lastDecay); dt >= time.Second {
		j.boostMs *= 0.7
		j.lastDecay = now
	}
}

func (j *JitterBuffer) slot(e int64) *slot { return &j.slots[e%int64(len(j.slots))] }

func (j *JitterBuffer) has(e int64) bool {
	s := j.slot(e)
	return s.valid && s.seq == e
}

// Stats returns the counters so far.
func (j *JitterBuffer) Stats() JitterStats { return j.stats }

// JitterMs is the measured jitter (95th percentile spread of transit times) in ms.
func (j *JitterBuffer) JitterMs() float64 { return j.jitterMs }
