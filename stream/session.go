package stream

import (
	"fmt"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/dsp"
)

// Config sets up a Session. Zero fields take the defaults.
type Config struct {
	// IORate is the sample rate of the audio pushed in and pulled out (48 kHz for WebRTC).
	IORate int
	// MaxQueue bounds the processed audio waiting to be pulled, beyond one processor chunk
	// (and, in a Live session, beyond twice the longest recent step: the work queued behind a
	// slow step lands at once, on top of the cushion that covered for it); older audio is
	// dropped with a crossfade (default 100 ms).
	MaxQueue time.Duration
	// Crossfade is the length of the crossfades at drops and processor swaps (default 5 ms).
	Crossfade time.Duration
}

// Stats are a session's cumulative counters and timings.
type Stats struct {
	Voice         string
	Chunks        int           // processor chunks run
	LateChunks    int           // chunks whose compute took longer than their duration
	DroppedChunks int           // stale-audio drops
	Dropped       time.Duration // audio discarded by drops
	Underflows    int           // pulls that found too little audio while input waited to be processed (after output began)
	Resample      time.Duration // total compute time in the resamplers
	Process       time.Duration // total compute time in the processor
	Produced      time.Duration // processed audio produced
	QueueDepth    time.Duration // processed audio waiting now
	QueueAge      time.Duration // age of the oldest waiting sample at the last NoteQueueAge
	// Latency is the most recent measured latency: from the time the input of the first
	// pulled sample was pushed to the time it was pulled.
	Latency time.Duration
	// OutputBuffer is the output cushion the session holds beyond what each pull takes: the
	// least seen over the last trim window. It grows when a slow step makes a pull run
	// short (the audio behind it plays that much later) and is trimmed back when no pull
	// needed it for a whole window, so it holds what the steps' timing requires.
	OutputBuffer time.Duration
	Trimmed      time.Duration // output dropped to shrink the cushion, in all
	// Stretched is the output played twice, in all, to grow the cushion ahead of need: a
	// session that started with the cushion its steps needed then gets more when the steps
	// it should expect grow (model sessions joined it), instead of a gap at each slow step.
	Stretched time.Duration
}

// mark ties an input sample index to the time it was pushed.
type mark struct {
	index int64
	at    time.Time
}

// shift maps produced output indices from `from` on to input indices: in = out + delta.
type shift struct{ from, delta int64 }

// Session feeds a Processor from a stream of audio at IORate: it resamples to the processor's
// rate and back, cuts chunks, crossfades overlapping chunk outputs, keeps the output queue
// within its age bound, and knows for every output sample which input sample it came from.
//
// Two goroutines may drive it: one processes (Push, or note and process separately, Swap,
// Drain) and one plays out (Pull, NoteQueueAge, Stats). They share only the output side,
// under mu, held for copies and never across a Process call — so a live stream's clock
// (see Live) never waits for the processor.
type Session struct {
	cfg   Config
	name  string
	proc  Processor
	info  ProcessorInfo
	up    *dsp.Resampler // IORate → processor rate; nil when equal
	down  *dsp.Resampler // processor rate → IORate; nil when equal
	xfade int            // crossfade length at IORate

	// mu guards the output side (out, produced, shifts, marks, pushed, started, stats) and
	// the installed processor's name and info, which the playing side reads.
	mu sync.Mutex

	pending   []float32 // input at the processor rate not yet processed
	procOut   []float32 // scratch: one chunk's output at the processor rate
	ioOut     []float32 // scratch: resampled output
	upOut     []float32 // scratch: resampled input
	tail      []float32 // held-back overlap of the previous chunk
	skip      int       // processor output samples still to discard (warm-up after a swap)
	fade      *fade     // the previous processor, while it fades out
	fadeIn    int       // length of the fade-in after a flushing swap (processor rate)
	fadeInPos int
	out       *buffers.FIFO

	pushed   int64 // input samples pushed (IORate)
	taken    int64 // of those, processed (or dropped) — their output is queued
	produced int64 // output samples appended to out (IORate), including later-dropped ones
	shifts   []shift
	marks    [512]mark
	markN    int
	started  bool // output has begun (underflows count from here)
	// startCushion is the output a Live session holds its start for when that is more than
	// the processor's cushion (Scheduler.startCushion), in IO samples.
	startCushion int
	// granted is the most cushion (IO samples) asked of the session since it started (its
	// start cushion, then any larger one asked as sessions joined), and owed what of it the
	// output has not yet been stretched by.
	granted, owed int
	sessions      int // the most model sessions open since the start (setStartCushion)
	// last is the last pull's output, kept while a stretch is owed, and lastFull says it
	// was kept and all audio: a stretch replays it.
	last     []float32
	lastFull bool
	idle     int // pulls in a row that found no output and no input waiting
	cushion  cushion
	// slowStep is the longest recent step of a Live session, in IO samples: after such a
	// step the work that queued behind it lands at once on top of the cushion that covered
	// for it (as long again), and that is not stale audio.
	slowStep int

	stats Stats
}

// cushion tracks the output queued ahead of each pull, to give back what no pull needed.
type cushion struct {
	least  int // least queued beyond a pull in this window (-1: no pull yet)
	pulled int // IO samples pulled in this window
}

// restartAfter is how many empty pulls with no input waiting (20 ms each in a WebRTC
// session) make a pause in the input: the output after it starts as the first did.
const restartAfter = 10

// trimWindow is how long the output cushion must go unused before it is trimmed: long
// enough that a step pattern that needs it (a model's bursts, every 80–160 ms) always shows.
const trimWindow = 3 * time.Second

// NewSession builds a session around proc, registered under name.
func NewSession(cfg Config, name string, proc Processor) (*Session, error) {
	if cfg.IORate <= 0 {
		return nil, fmt.Errorf("stream: session: IO rate %d Hz is not positive", cfg.IORate)
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 100 * time.Millisecond
	}
	if cfg.Crossfade <= 0 {
		cfg.Crossfade = 5 * time.Millisecond
	}
	s := &Session{cfg: cfg, out: buffers.NewFIFO(cfg.IORate), xfade: int(cfg.Crossfade.Seconds() * float64(cfg.IORate)),
		cushion: cushion{least: -1}}
	if err := s.install(name, proc); err != nil {
		return nil, err
	}
	s.shifts = []shift{{0, -s.latencyIO()}}
	return s, nil
}

// install wires proc in with resamplers for its rate.
func (s *Session) install(name string, proc Processor) error {
	info := proc.Info()
	if info.SampleRate <= 0 || info.ChunkSize <= 0 || info.Latency < 0 || info.Overlap < 0 || info.Cushion < 0 {
		return fmt.Errorf("stream: voice %q: invalid processor info %+v", name, info)
	}
	var up, down *dsp.Resampler
	if info.SampleRate != s.cfg.IORate {
		var err error
		if up, err = dsp.NewResampler(s.cfg.IORate, info.SampleRate); err != nil {
			return fmt.Errorf("stream: voice %q: %w", name, err)
		}
		if down, err = dsp.NewResampler(info.SampleRate, s.cfg.IORate); err != nil {
			return fmt.Errorf("stream: voice %q: %w", name, err)
		}
	}
	if s.proc != nil && info.SampleRate == s.info.SampleRate {
		up, down = s.up, s.down // keep their history so the seam stays continuous
	} else {
		s.pending = s.pending[:0]
	}
	s.mu.Lock()
	s.name, s.proc, s.info, s.up, s.down = name, proc, info, up, down
	s.stats.Voice = name
	s.mu.Unlock()
	s.tail = s.tail[:0]
	s.procOut = growCap(s.procOut, info.ChunkSize+info.Overlap)
	return nil
}

// cushionIO is the processor's start cushion in IORate samples.
func (s *Session) cushionIO() int {
	return int(int64(s.info.Cushion) * int64(s.cfg.IORate) / int64(s.info.SampleRate))
}

// setStartCushion sets the cushion (n IO samples) the session should hold at its start with
// the given model sessions open. Once it has started, a cushion asked with more sessions open
// than ever before since the start is owed what it asks beyond the most granted, and the
// output is stretched by that (Pull). Only joins count: a step that ran slow for another
// reason (a stall, a noisy neighbour) may not recur, and a late pull covers it as it
// happens, the cushion trimmed again if it was a one-off.
func (s *Session) setStartCushion(n, sessions int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startCushion = n
	switch {
	case !s.started:
		s.sessions = sessions
	case sessions > s.sessions:
		s.sessions = sessions
		if n > s.granted {
			s.owed += n - s.granted
			s.granted = n
		}
	}
}

// latencyIO is the processor's latency in IORate samples.
func (s *Session) latencyIO() int64 {
	return int64(s.info.Latency) * int64(s.cfg.IORate) / int64(s.info.SampleRate)
}

// running is what a step may run: the current processor and the one fading out, if any.
// Only the goroutine that runs the session's steps calls it.
func (s *Session) running() (current, fading Processor) {
	if s.fade != nil {
		return s.proc, s.fade.old
	}
	return s.proc, nil
}

// Info is the current processor's info.
func (s *Session) Info() ProcessorInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

// Processor is the current processor.
func (s *Session) Processor() Processor {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Voice is the name the current processor was installed under.
func (s *Session) Voice() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.name
}

// AlgorithmicLatency is the delay a session at ioRate adds by design with a processor of
// this info: processor latency, chunking and resampler look-ahead.
func AlgorithmicLatency(ioRate int, info ProcessorInfo) time.Duration {
	sec := float64(info.Latency+info.ChunkSize) / float64(info.SampleRate)
	if info.SampleRate != ioRate {
		up, err1 := dsp.NewResampler(ioRate, info.SampleRate)
		down, err2 := dsp.NewResampler(info.SampleRate, ioRate)
		if err1 == nil && err2 == nil {
			sec += float64(up.LookaheadInput())/float64(ioRate) + float64(down.LookaheadInput())/float64(info.SampleRate)
		}
	}
	return time.Duration(sec * float64(time.Second))
}

// AlgorithmicLatency is the delay the processing path adds by design: processor latency,
// chunking and resampler look-ahead.
func (s *Session) AlgorithmicLatency() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	sec := float64(s.info.Latency+s.info.ChunkSize) / float64(s.info.SampleRate)
	if s.up != nil {
		sec += float64(s.up.LookaheadInput()) / float64(s.cfg.IORate)
		sec += float64(s.down.LookaheadInput()) / float64(s.info.SampleRate)
	}
	return time.Duration(sec * float64(time.Second))
}

// Push appends input audio that arrived at time at (the time of its first sample) and runs
// every chunk that is complete.
func (s *Session) Push(in []float32, at time.Time) error {
	s.note(len(in), at)
	_, err := s.process(in)
	return err
}

// note records that n input samples arrived at time at (for latency accounting).
func (s *Session) note(n int, at time.Time) {
	s.mu.Lock()
	s.marks[s.markN%len(s.marks)] = mark{s.pushed, at}
	s.markN++
	s.pushed += int64(n)
	s.mu.Unlock()
}

// skipInput accounts for n noted input samples that will never be processed (dropped
// because processing fell behind): later output comes from input n samples further on.
func (s *Session) skipInput(n int) {
	s.mu.Lock()
	last := s.shifts[len(s.shifts)-1]
	s.shifts = append(s.shifts, shift{s.produced, last.delta + int64(n)})
	s.taken += int64(n)
	s.mu.Unlock()
}

// process resamples noted input and runs every chunk that is complete; it returns how many
// ran.
func (s *Session) process(in []float32) (int, error) {
	defer func() { // its output is queued now (or never will be)
		s.mu.Lock()
		s.taken += int64(len(in))
		s.mu.Unlock()
	}()
	src := in
	if s.up != nil {
		t0 := time.Now()
		s.upOut = s.up.Process(s.upOut[:0], in)
		d := time.Since(t0)
		s.mu.Lock()
		s.stats.Resample += d
		s.mu.Unlock()
		src = s.upOut
	}
	s.pending = append(s.pending, src...)
	n := s.info.ChunkSize
	done := 0
	for len(s.pending)-done >= n {
		if err := s.runChunk(s.pending[done : done+n]); err != nil {
			return done / n, err
		}
		done += n
	}
	s.pending = s.pending[:copy(s.pending, s.pending[done:])]
	return done / n, nil
}

// runChunk processes one chunk and queues its output.
func (s *Session) runChunk(chunk []float32) error {
	t0 := time.Now()
	out, err := s.proc.Process(s.procOut[:0], chunk)
	elapsed := time.Since(t0)
	if err != nil {
		return fmt.Errorf("stream: voice %q: %w", s.name, err)
	}
	if s.fade != nil {
		if err := s.crossfade(out, chunk); err != nil {
			return fmt.Errorf("stream: outgoing voice: %w", err)
		}
		elapsed = time.Since(t0)
	}
	s.procOut = out[:0]
	s.mu.Lock()
	s.stats.Process += elapsed
	s.stats.Chunks++
	if elapsed > time.Duration(float64(len(chunk))/float64(s.info.SampleRate)*float64(time.Second)) {
		s.stats.LateChunks++
	}
	s.mu.Unlock()
	s.emit(s.joinOverlap(out))
	return nil
}

// joinOverlap crossfades the overlapping start of a chunk's output into the held-back end of
// the previous one and holds back this chunk's end in turn.
func (s *Session) joinOverlap(out []float32) []float32 {
	ov := s.info.Overlap
	if ov == 0 || len(out) < 2*ov {
		return out
	}
	for i := 0; i < ov; i++ {
		w := float32(i+1) / float32(ov+1)
		prev := float32(0)
		if i < len(s.tail) {
			prev = s.tail[i]
		}
		out[i] = prev*(1-w) + out[i]*w
	}
	s.tail = append(s.tail[:0], out[len(out)-ov:]...)
	return out[:len(out)-ov]
}

// emit resamples processor output to IORate and queues it, enforcing the stale-audio bound.
func (s *Session) emit(out []float32) {
	if s.skip > 0 {
		k := min(s.skip, len(out))
		out, s.skip = out[k:], s.skip-k
	}
	for i := 0; i < len(out) && s.fadeInPos < s.fadeIn; i++ {
		out[i] *= float32(s.fadeInPos) / float32(s.fadeIn)
		s.fadeInPos++
	}
	var resample time.Duration
	if s.down != nil {
		t0 := time.Now()
		s.ioOut = s.down.Process(s.ioOut[:0], out)
		resample = time.Since(t0)
		out = s.ioOut
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Resample += resample
	s.out.Write(out)
	s.produced += int64(len(out))
	s.stats.Produced += s.samplesToDuration(len(out))
	chunkIO := s.info.ChunkSize * s.cfg.IORate / s.info.SampleRate
	limit := chunkIO + int(s.cfg.MaxQueue.Seconds()*float64(s.cfg.IORate)) + 2*s.slowStep + s.granted
	if excess := s.out.Len() - chunkIO; s.out.Len() > limit {
		n := s.out.DiscardCrossfade(excess, s.xfade)
		s.stats.DroppedChunks++
		s.stats.Dropped += s.samplesToDuration(n)
	}
}

// Pull fills dst with the next output audio at time now, padding with silence when too little
// is queued, and returns how many samples were real audio.
func (s *Session) Pull(dst []float32, now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trim(len(dst))
	if !s.started && s.out.Len() < len(dst)+max(s.cushionIO(), s.startCushion) {
		clear(dst) // hold the start until the processor's cushion is queued
		return 0
	}
	// A stretch only ever plays ahead of need, with a pull's worth queued: it never stands
	// in for output that came late (that is an underflow).
	if s.started && 2*s.owed >= len(dst) && s.out.Len() >= len(dst) && s.replayLast(dst) {
		s.owed -= len(dst) // a whole pull: what it gives beyond the debt is credit
		s.stats.Stretched += s.samplesToDuration(len(dst))
		return len(dst)
	}
	head := s.produced - int64(s.out.Len())
	n := s.out.Read(dst)
	clear(dst[n:])
	if n > 0 {
		if !s.started {
			s.granted = max(s.cushionIO(), s.startCushion)
		}
		s.started = true
		if at, ok := s.inputTime(head + s.deltaAt(head)); ok {
			s.stats.Latency = now.Sub(at)
		}
	}
	if n == 0 && s.started && s.taken >= s.pushed {
		if s.idle++; s.idle >= restartAfter && max(s.cushionIO(), s.startCushion) > 0 {
			// The input paused (the client stopped sending, or sends nothing in silence)
			// and all its output has played: what comes next starts again, held until its
			// cushion is queued, as the first output was. Its cushion is the one its steps
			// need now, which may have grown since the first start; no stretch is owed.
			// A session that needs none plays what comes as it comes.
			s.started, s.owed, s.idle = false, 0, 0
		}
	} else {
		s.idle = 0
	}
	if n < len(dst) && s.started && s.taken < s.pushed {
		s.stats.Underflows++ // input waits that would have filled it: its output came late
		// The gap delayed what follows as a stretch would have.
		s.owed = max(s.owed-(len(dst)-n), 0)
	}
	// Only a session that owes a stretch keeps its pull to replay (the next one replays it).
	s.lastFull = s.owed > 0 && n == len(dst)
	if s.lastFull {
		s.last = append(s.last[:0], dst...)
	}
	return n
}

// replayLast fills dst with the last pull's audio again, its start blended from the queued
// audio (what would have followed) into the replay, so the output runs on without a jump:
// the replay ends as the last pull did, and the queued audio follows it as it followed
// that. It returns false, filling nothing, when the last pull was not all audio or not as
// long as dst.
func (s *Session) replayLast(dst []float32) bool {
	if !s.lastFull || len(s.last) != len(dst) {
		return false
	}
	copy(dst, s.last)
	q := s.out.Peek()
	xf := min(s.xfade, len(q))
	for i := range xf {
		w := float32(i+1) / float32(xf+1)
		dst[i] = q[i]*(1-w) + dst[i]*w
	}
	return true
}

// trim notes how much output waits beyond a pull of n samples and, once a whole window of
// pulls found more than they needed, drops the surplus (leaving a quarter pull of guard)
// with a crossfade. Dropping from the queue's head keeps the sample accounting exact: the
// audio that plays next is later audio, so the measured latency falls by what was dropped.
func (s *Session) trim(n int) {
	c := &s.cushion
	ahead := s.out.Len() - n
	if !s.started || n <= 0 {
		return
	}
	if c.least < 0 || ahead < c.least {
		c.least = max(ahead, 0)
	}
	c.pulled += n
	if c.pulled < int(trimWindow.Seconds()*float64(s.cfg.IORate)) {
		return
	}
	s.stats.OutputBuffer = s.samplesToDuration(c.least)
	if surplus := c.least - n/4; surplus >= n/2 {
		dropped := s.out.DiscardCrossfade(surplus, s.xfade)
		s.stats.Trimmed += s.samplesToDuration(dropped)
		s.stats.OutputBuffer = s.samplesToDuration(c.least - dropped)
	}
	c.least, c.pulled = -1, 0
}

// NoteQueueAge records how long ago the input of the oldest queued output sample arrived.
func (s *Session) NoteQueueAge(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out.Len() == 0 {
		s.stats.QueueAge = 0
		return
	}
	head := s.produced - int64(s.out.Len())
	if at, ok := s.inputTime(head + s.deltaAt(head)); ok {
		s.stats.QueueAge = now.Sub(at)
	}
}

// deltaAt finds the index shift in force for produced output index o.
func (s *Session) deltaAt(o int64) int64 {
	d := s.shifts[0].delta
	drop := 0
	for i, sh := range s.shifts {
		if sh.from <= o {
			d = sh.delta
			drop = i
		}
	}
	s.shifts = s.shifts[drop:] // earlier shifts can no longer be asked for
	return d
}

// inputTime is when input sample idx was pushed.
func (s *Session) inputTime(idx int64) (time.Time, bool) {
	for k := 1; k <= min(s.markN, len(s.marks)); k++ {
		m := s.marks[(s.markN-k)%len(s.marks)]
		if m.index <= idx {
			return m.at.Add(s.samplesToDuration(int(idx - m.index))), true
		}
	}
	return time.Time{}, false
}

func (s *Session) samplesToDuration(n int) time.Duration {
	return time.Duration(float64(n) / float64(s.cfg.IORate) * float64(time.Second))
}

// Swap replaces the processor without a gap or a click. A processor with the same rate, chunk
// and latency (another voice of the same model, passthrough for A/B) runs beside the old one
// for one crossfade. Otherwise the old one is flushed so the audio it still holds plays out
// with a fade-out, and the new one fades in after its warm-up output is skipped.
func (s *Session) Swap(name string, proc Processor) error {
	old := s.info
	if i := proc.Info(); i.SampleRate == old.SampleRate && i.ChunkSize == old.ChunkSize && i.Latency == old.Latency && i.Overlap == old.Overlap {
		s.fade = &fade{old: s.proc, n: int(s.cfg.Crossfade.Seconds() * float64(old.SampleRate)), warm: old.Latency}
		s.mu.Lock()
		s.name, s.proc, s.info, s.stats.Voice = name, proc, i, name
		s.mu.Unlock()
		return nil
	}
	flushed, err := s.proc.Flush(s.procOut[:0])
	if err != nil {
		return fmt.Errorf("stream: voice %q: flush: %w", s.name, err)
	}
	flushed = s.joinOverlap(flushed)
	flushed = append(flushed, s.tail...)
	fadeOut(flushed, int(s.cfg.Crossfade.Seconds()*float64(old.SampleRate)))
	s.procOut = flushed[:0]
	s.emit(flushed)
	if s.down != nil && proc.Info().SampleRate != old.SampleRate {
		// The resampler back to IORate is replaced too: let out what it still holds.
		s.ioOut = s.down.Flush(s.ioOut[:0])
		s.mu.Lock()
		s.out.Write(s.ioOut)
		s.produced += int64(len(s.ioOut))
		s.mu.Unlock()
	}
	s.fade = nil
	if err := s.install(name, proc); err != nil {
		return err
	}
	s.skip = s.info.Latency
	s.fadeIn = int(s.cfg.Crossfade.Seconds() * float64(s.info.SampleRate))
	s.fadeInPos = 0
	// From here on, output index produced+k comes from input index (pushed - pending) + k.
	pendingIO := int64(len(s.pending)) * int64(s.cfg.IORate) / int64(s.info.SampleRate)
	s.mu.Lock()
	s.shifts = append(s.shifts, shift{s.produced, s.pushed - pendingIO - s.produced})
	s.mu.Unlock()
	return nil
}

// fade is an outgoing processor that still runs while its output fades into the new one's:
// the new one's first warm samples are its warm-up, then n samples crossfade.
type fade struct {
	old          Processor
	out          []float32
	pos, n, warm int
}

// crossfade mixes the outgoing processor's output for the same chunk into out.
func (s *Session) crossfade(out, chunk []float32) error {
	f := s.fade
	old, err := f.old.Process(f.out[:0], chunk)
	if err != nil {
		return err
	}
	f.out = old[:0]
	for i := range min(len(out), len(old)) {
		w := min(max(float32(f.pos+i-f.warm)/float32(f.n), 0), 1)
		out[i] = old[i]*(1-w) + out[i]*w
	}
	if f.pos += len(out); f.pos >= f.warm+f.n {
		s.fade = nil
	}
	return nil
}

// Drain flushes the processor and resamplers at the end of the input: every remaining output
// sample is queued.
func (s *Session) Drain() error {
	if s.up != nil {
		s.upOut = s.up.Flush(s.upOut[:0])
		s.pending = append(s.pending, s.upOut...)
		n := s.info.ChunkSize
		for len(s.pending) >= n {
			if err := s.runChunk(s.pending[:n]); err != nil {
				return err
			}
			s.pending = s.pending[:copy(s.pending, s.pending[n:])]
		}
	}
	if len(s.pending) > 0 {
		// Complete the last chunk with silence; the extra output is trimmed by the caller.
		pad := s.info.ChunkSize - len(s.pending)
		s.pending = append(s.pending, make([]float32, pad)...)
		if err := s.runChunk(s.pending); err != nil {
			return err
		}
		s.pending = s.pending[:0]
	}
	out, err := s.proc.Flush(s.procOut[:0])
	if err != nil {
		return fmt.Errorf("stream: voice %q: flush: %w", s.name, err)
	}
	out = s.joinOverlap(out)
	out = append(out, s.tail...)
	s.tail = s.tail[:0]
	if s.down != nil {
		s.ioOut = s.down.Process(s.ioOut[:0], out)
		s.ioOut = s.down.Flush(s.ioOut)
		out = s.ioOut
	}
	s.mu.Lock()
	s.out.Write(out)
	s.produced += int64(len(out))
	s.mu.Unlock()
	return nil
}

// Queued is the number of output samples waiting to be pulled.
func (s *Session) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Len()
}

// Stats returns the counters so far.
func (s *Session) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.QueueDepth = s.samplesToDuration(s.out.Len())
	return st
}

// LatencyIO is the processor latency in IORate samples: output sample k of a fresh session
// comes from input sample k-LatencyIO.
func (s *Session) LatencyIO() int { return int(s.latencyIO()) }

func fadeOut(x []float32, n int) {
	n = min(n, len(x))
	for i := 0; i < n; i++ {
		x[len(x)-n+i] *= 1 - float32(i+1)/float32(n)
	}
}

func growCap(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, 0, n)
	}
	return b[:0]
}
