package stream

import (
	"math"
	"testing"
	"time"
)

func sine(n, rate int, hz float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(0.5 * math.Sin(2*math.Pi*hz*float64(i)/float64(rate)))
	}
	return x
}

// run pushes x in 20 ms blocks at simulated times and pulls 20 ms after each push.
func run(t *testing.T, s *Session, x []float32, rate int, t0 time.Time, pullDelay time.Duration) (out []float32, lat []time.Duration) {
	t.Helper()
	block := rate / 50
	buf := make([]float32, block)
	for k := 0; k+block <= len(x); k += block {
		at := t0.Add(time.Duration(k) * time.Second / time.Duration(rate))
		if err := s.Push(x[k:k+block], at); err != nil {
			t.Fatal(err)
		}
		s.Pull(buf, at.Add(pullDelay))
		out = append(out, buf...)
		lat = append(lat, s.Stats().Latency)
	}
	return out, lat
}

func TestSessionMapsEveryOutputSampleToItsInput(t *testing.T) {
	const rate = 48000
	for _, proc := range []Processor{NewDelay(24000, 240, 480), NewDelay(48000, 960, 0), NewDelay(16000, 2560, 320)} {
		s, err := NewSession(Config{IORate: rate, MaxQueue: time.Second}, "delay", proc)
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, rate)
		const at = 20000
		x[at] = 1 // an impulse at a known input index
		out, lat := run(t, s, x, rate, time.Unix(0, 0), 0)
		peak := 0
		for i := range out {
			if math.Abs(float64(out[i])) > math.Abs(float64(out[peak])) {
				peak = i
			}
		}
		// The output stream starts with the first pull; before output begins the session
		// pulls silence, which is not part of the mapping. Count where output started.
		first := 0
		for first < len(out) && out[first] == 0 && first < peak {
			first++
		}
		info := proc.Info()
		t.Logf("%d Hz chunk %d latency %d: impulse %d → output %d; reported latency %v", info.SampleRate, info.ChunkSize, info.Latency, at, peak, lat[len(lat)-1])
		// Wall-clock check: the impulse was pushed at at/rate s and pulled in the block that
		// holds it; the session's reported latency for that pull must agree within a block.
		block := rate / 50
		pulledAt := time.Duration(peak/block*block+block) * time.Second / rate // time of that pull (pushed block end)
		pulledAt -= time.Second / 50
		truth := pulledAt - time.Duration(at)*time.Second/rate + time.Duration(peak%block)*time.Second/rate
		got := lat[peak/block]
		if d := got - truth; d > time.Millisecond || d < -time.Millisecond {
			t.Errorf("reported latency %v, impulse shows %v", got, truth)
		}
		algo := time.Duration(info.Latency) * time.Second / time.Duration(info.SampleRate)
		if truth < algo {
			t.Errorf("impulse came out after %v, less than the processor's latency %v", truth, algo)
		}
	}
}

// burst is a processor with a long chunk and an overlap, like a neural vocoder.
type burst struct {
	chunk, overlap int
}

func (b *burst) Info() ProcessorInfo {
	return ProcessorInfo{SampleRate: 16000, ChunkSize: b.chunk, Overlap: b.overlap}
}
func (b *burst) Process(out, in []float32) ([]float32, error) {
	for range b.chunk + b.overlap {
		out = append(out, 1)
	}
	return out, nil
}
func (b *burst) Flush(out []float32) ([]float32, error) { return out, nil }
func (b *burst) Reset()                                 {}

func TestSessionCrossfadesOverlappingChunks(t *testing.T) {
	s, err := NewSession(Config{IORate: 16000, MaxQueue: time.Second}, "burst", &burst{chunk: 2560, overlap: 160})
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 16000)
	var out []float32
	buf := make([]float32, 16000)
	if err := s.Push(x, time.Now()); err != nil {
		t.Fatal(err)
	}
	n := s.Pull(buf[:s.Queued()], time.Now())
	out = append(out, buf[:n]...)
	if len(out) != 16000/2560*2560 {
		t.Fatalf("%d samples out of %d chunks", len(out), 16000/2560)
	}
	// After the first chunk's fade-in, every seam crossfades 1 into 1: the output is 1.
	for i := 160; i < len(out); i++ {
		if math.Abs(float64(out[i])-1) > 1e-6 {
			t.Fatalf("sample %d = %v at a chunk seam", i, out[i])
		}
	}
}

func TestSessionDropsStaleAudio(t *testing.T) {
	s, err := NewSession(Config{IORate: 16000, MaxQueue: 100 * time.Millisecond}, "burst", &burst{chunk: 1600})
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 1600)
	now := time.Now()
	for i := 0; i < 20; i++ { // 2 s of audio and nobody pulls
		if err := s.Push(x, now); err != nil {
			t.Fatal(err)
		}
		if q := s.Queued(); q > 1600+1600 {
			t.Fatalf("queue grew to %d samples, beyond its bound", q)
		}
	}
	st := s.Stats()
	if st.DroppedChunks == 0 || st.Dropped < time.Second {
		t.Fatalf("stale audio not dropped and counted: %+v", st)
	}
}

func TestSessionSwapKeepsTheStreamContinuous(t *testing.T) {
	v, err := NewDSPVoice()
	if err != nil {
		t.Fatal(err)
	}
	// Same shape: crossfade while both run. Different rate and latency: flush and fade.
	t.Run("same shape", func(t *testing.T) { testSwap(t, NewDelay(DSPVoiceRate, v.Info().ChunkSize, v.Info().Latency)) })
	t.Run("other rate", func(t *testing.T) { testSwap(t, NewDelay(16000, 160, 0)) })
}

func testSwap(t *testing.T, next Processor) {
	const rate = 48000
	v1, err := NewDSPVoice()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSession(Config{IORate: rate}, "dsp", v1)
	if err != nil {
		t.Fatal(err)
	}
	x := sine(rate, rate, 220)
	block := rate / 50
	buf := make([]float32, block)
	var out []float32
	for k := 0; k+block <= len(x); k += block {
		if k == rate/2 {
			if err := s.Swap("next", next); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Push(x[k:k+block], time.Now()); err != nil {
			t.Fatal(err)
		}
		s.Pull(buf, time.Now())
		out = append(out, buf...)
	}
	// Around the swap the sine may dip (a short fade) but never jump or go silent for long.
	var maxStep float64
	silent := 0
	for i := rate / 4; i < len(out)-block*2; i++ {
		maxStep = max(maxStep, math.Abs(float64(out[i]-out[i-1])))
		if math.Abs(float64(out[i])) < 1e-4 {
			silent++
		}
	}
	sineStep := 0.5 * 2 * math.Pi * 220 / rate
	if maxStep > 4*sineStep {
		t.Errorf("largest sample step %.4f vs the sine's %.4f: a click at the swap", maxStep, sineStep)
	}
	if silent > rate/100 { // a 220 Hz sine crosses zero; allow 10 ms of near-zero samples
		t.Errorf("%d near-silent samples: the swap left a gap", silent)
	}
	if s.Stats().Underflows > 1 {
		t.Errorf("%d underflows across the swap", s.Stats().Underflows)
	}
}

type slow struct{ Delay }

func (s *slow) Process(out, in []float32) ([]float32, error) {
	time.Sleep(15 * time.Millisecond) // a 10 ms chunk that takes 15 ms
	return s.Delay.Process(out, in)
}

func TestSessionCountsLateChunks(t *testing.T) {
	p := &slow{*NewDelay(16000, 160, 0)}
	s, err := NewSession(Config{IORate: 16000}, "slow", p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Push(make([]float32, 480), time.Now()); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.LateChunks != 3 || st.Chunks != 3 {
		t.Fatalf("late %d of %d chunks, want 3 of 3", st.LateChunks, st.Chunks)
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	if _, err := r.New("nope"); err == nil {
		t.Fatal("unknown voice accepted")
	}
	p, err := r.New("dsp")
	if err != nil {
		t.Fatal(err)
	}
	tun := p.(Tunable)
	if err := tun.SetParams(map[string]float64{"pitch_semitones": 13}); err == nil {
		t.Fatal("pitch 13 accepted")
	}
	if err := tun.SetParams(map[string]float64{"formant_shift": math.NaN()}); err == nil {
		t.Fatal("NaN accepted")
	}
	if err := tun.SetParams(map[string]float64{"pitch_semitones": -3, "formant_shift": 2}); err != nil {
		t.Fatal(err)
	}
}

// A pull that runs short (a slow step) makes the audio behind it play a pull later; once
// no pull has needed that cushion for a trim window, the session drops it again, and the
// measured latency comes back to the processor's. A cushion that every pull uses is kept.
func TestSessionTrimsAnUnusedCushion(t *testing.T) {
	const rate = 48000
	block := rate / 50
	s, err := NewSession(Config{IORate: rate, MaxQueue: time.Second}, "delay", NewDelay(rate, block, 0))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]float32, block)
	t0 := time.Unix(0, 0)
	x := sine(block, rate, 440)
	k := 0
	tick := func(push bool) time.Duration {
		at := t0.Add(time.Duration(k) * time.Second / 50)
		k++
		if push {
			if err := s.Push(x, at); err != nil {
				t.Fatal(err)
			}
		}
		s.Pull(buf, at.Add(time.Second/50))
		return s.Stats().Latency
	}
	for range 50 {
		tick(true)
	}
	base := s.Stats().Latency
	// One tick whose step is late: its input came but its pull finds nothing; the step then
	// lands with the next tick's.
	s.note(len(x), t0.Add(time.Duration(k)*time.Second/50))
	tick(false)
	if _, err := s.process(x); err != nil {
		t.Fatal(err)
	}
	late := tick(true)
	if late-base < 15*time.Millisecond {
		t.Fatalf("after a short pull the latency went from %v to %v; want a pull more", base, late)
	}
	if st := s.Stats(); st.Underflows != 1 {
		t.Fatalf("%d underflows, want 1", st.Underflows)
	}
	for range 400 { // 8 s: more than two trim windows without needing the cushion
		tick(true)
	}
	st := s.Stats()
	if st.Trimmed < 15*time.Millisecond || st.Latency-base > 6*time.Millisecond {
		t.Errorf("cushion not given back: trimmed %v, latency %v (was %v before the short pull)", st.Trimmed, st.Latency, base)
	}
	if st.OutputBuffer > 6*time.Millisecond {
		t.Errorf("output buffer %v after the trim", st.OutputBuffer)
	}

	// Two blocks per pull every other tick (a bursty processor): the cushion is used at
	// every second pull, so it stays.
	trimmed := st.Trimmed
	for i := range 400 {
		if i%2 == 0 {
			at := t0.Add(time.Duration(k) * time.Second / 50)
			for range 2 {
				if err := s.Push(x, at); err != nil {
					t.Fatal(err)
				}
			}
		}
		at := t0.Add(time.Duration(k) * time.Second / 50)
		k++
		s.Pull(buf, at.Add(time.Second/50))
	}
	if st := s.Stats(); st.Trimmed != trimmed {
		t.Errorf("a cushion every other pull used was trimmed (%v more)", st.Trimmed-trimmed)
	}
	// The input stops: pulls find nothing, but nothing was late.
	under := s.Stats().Underflows
	for range 10 {
		s.Pull(buf, t0.Add(time.Duration(k)*time.Second/50))
		k++
	}
	if st := s.Stats(); st.Underflows != under {
		t.Errorf("%d underflows counted after the input stopped", st.Underflows-under)
	}
}

// cushioned is a passthrough that asks for a start cushion.
type cushioned struct {
	*Delay
	cushion int
}

func (c cushioned) Info() ProcessorInfo {
	i := c.Delay.Info()
	i.Cushion = c.cushion
	return i
}

// A processor's start cushion holds the output back until that much is queued beyond the
// first pull; the wait shows in the measured latency, and playing then goes on as usual.
func TestSessionHoldsTheStartCushion(t *testing.T) {
	const rate = 48000
	block := rate / 50
	s, err := NewSession(Config{IORate: rate, MaxQueue: time.Second}, "cushioned", cushioned{NewDelay(rate, block, 0), 3 * block})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]float32, block)
	x := sine(block, rate, 440)
	t0 := time.Unix(0, 0)
	started := -1
	for k := range 20 {
		at := t0.Add(time.Duration(k) * time.Second / 50)
		if err := s.Push(x, at); err != nil {
			t.Fatal(err)
		}
		if n := s.Pull(buf, at.Add(time.Second/50)); n > 0 && started < 0 {
			started = k
		}
	}
	if started != 3 {
		t.Errorf("output began at pull %d, want 3 (after a 3-block cushion)", started)
	}
	if st := s.Stats(); st.Latency != 80*time.Millisecond || st.Underflows != 0 {
		t.Errorf("latency %v (want 80 ms: the block, the 60 ms cushion), %d underflows", st.Latency, st.Underflows)
	}
}

// A session that started alone with no cushion and is then asked for 50 ms as a second
// session joins its model replays its last pull until it has stretched its output by that
// much, in whole pulls: its latency grows by that, the output runs on without a jump, no
// pull counts as late, and asking for as much again, or less, stretches nothing more. Asked
// for more with no one joining, it stretches nothing.
func TestSessionStretchesForAGrownCushion(t *testing.T) {
	const rate = 16000
	block := rate / 50
	s, err := NewSession(Config{IORate: rate, MaxQueue: time.Second}, "model", NewDelay(rate, block, 0))
	if err != nil {
		t.Fatal(err)
	}
	x := sine(40*block, rate, 170) // 170 Hz: a 20 ms replay lands out of phase
	t0 := time.Unix(0, 0)
	s.setStartCushion(0, 1)
	out, lat := run(t, s, x[:10*block], rate, t0, 0)
	if lat[9] != 0 {
		t.Fatalf("latency %v before the stretch, want 0 (each block pulled as it is pushed)", lat[9])
	}
	s.setStartCushion(50*rate/1000, 1) // slower steps, no one joined
	more, _ := run(t, s, x[10*block:15*block], rate, t0.Add(200*time.Millisecond), 0)
	out = append(out, more...)
	if st := s.Stats().Stretched; st != 0 {
		t.Fatalf("stretched %v with no session joining", st)
	}
	s.setStartCushion(50*rate/1000, 2)
	more, lat = run(t, s, x[15*block:30*block], rate, t0.Add(300*time.Millisecond), 0)
	out = append(out, more...)
	s.setStartCushion(50*rate/1000, 3)
	s.setStartCushion(30*rate/1000, 4)
	more, lat2 := run(t, s, x[30*block:], rate, t0.Add(600*time.Millisecond), 0)
	out = append(out, more...)
	st := s.Stats()
	// 800 samples owed: three pulls (960), the last owing less than it gives.
	if st.Stretched != 60*time.Millisecond || st.Underflows != 0 {
		t.Errorf("stretched %v with %d underflows, want 60 ms and none", st.Stretched, st.Underflows)
	}
	if lat[len(lat)-1] != 60*time.Millisecond || lat2[len(lat2)-1] != 60*time.Millisecond {
		t.Errorf("latency %v then %v after the stretch, want 60 ms", lat[len(lat)-1], lat2[len(lat2)-1])
	}
	// A 170 Hz sine at 0.5 moves at most 0.034 a sample; the crossfades into the replays
	// blend two phases over 5 ms (80 samples), which adds at most 1/81 a sample.
	for i := 1; i < len(out); i++ {
		if d := math.Abs(float64(out[i] - out[i-1])); d > 0.05 {
			t.Fatalf("sample %d: jump %.3f in the output", i, d)
		}
	}
}

// After a pause in the input (nothing to play and nothing waiting for ten pulls), the next
// output starts as the first did: held until the cushion asked now is queued, with no pull
// counted late. A shorter gap does not restart it, and neither does a pause of a session
// that needs no cushion (TestSessionNeedsNoRestartWithoutACushion).
func TestSessionRestartsAfterAPause(t *testing.T) {
	const rate = 16000
	block := rate / 50
	s, err := NewSession(Config{IORate: rate, MaxQueue: time.Second}, "model", NewDelay(rate, block, 0))
	if err != nil {
		t.Fatal(err)
	}
	x := sine(block, rate, 170)
	buf := make([]float32, block)
	at := time.Unix(0, 0)
	step := func(push bool) int {
		at = at.Add(20 * time.Millisecond)
		if push {
			if err := s.Push(x, at); err != nil {
				t.Fatal(err)
			}
		}
		return s.Pull(buf, at)
	}
	for range 5 {
		step(true)
	}
	for range restartAfter - 1 {
		if n := step(false); n != 0 {
			t.Fatalf("played %d samples with no input", n)
		}
	}
	if n := step(true); n != block {
		t.Fatalf("after %d empty pulls played %d samples, want a whole pull at once", restartAfter-1, n)
	}
	s.setStartCushion(2*block, 1) // the sessions' steps now need 40 ms
	for range restartAfter {
		step(false)
	}
	for i := range 2 {
		if n := step(true); n != 0 {
			t.Fatalf("after a pause: played %d samples with %d ms queued, under the 40 ms cushion", n, 20*(i+1))
		}
	}
	if n := step(true); n != block {
		t.Fatalf("after a pause: played %d samples with 60 ms queued, want a whole pull", n)
	}
	if st := s.Stats(); st.Underflows != 0 || st.Stretched != 0 || st.Latency != 40*time.Millisecond {
		t.Errorf("%d underflows, %v stretched, latency %v: want none, none, 40 ms (the cushion)", st.Underflows, st.Stretched, st.Latency)
	}
}

// A session whose steps need no cushion plays what comes after a pause as it comes: a hold
// would only add latency.
func TestSessionNeedsNoRestartWithoutACushion(t *testing.T) {
	const rate = 16000
	block := rate / 50
	s, err := NewSession(Config{IORate: rate, MaxQueue: time.Second}, "model", NewDelay(rate, block/2, 0))
	if err != nil {
		t.Fatal(err)
	}
	x := sine(block, rate, 170)
	buf := make([]float32, block)
	at := time.Unix(0, 0)
	for range 3 {
		at = at.Add(20 * time.Millisecond)
		if err := s.Push(x, at); err != nil {
			t.Fatal(err)
		}
		s.Pull(buf, at)
	}
	for range 2 * restartAfter {
		at = at.Add(20 * time.Millisecond)
		s.Pull(buf, at)
	}
	// Half a pull arrives: it plays at once (a restarted session would hold it for a whole
	// pull).
	if err := s.Push(x[:block/2], at); err != nil {
		t.Fatal(err)
	}
	if n := s.Pull(buf, at); n != block/2 {
		t.Fatalf("after a pause: played %d samples of the %d that came", n, block/2)
	}
}
