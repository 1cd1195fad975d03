package stream

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// blocking is a processor whose chunks take long (a model step): each Process sleeps.
type blocking struct {
	Delay
	sleep time.Duration
	mu    sync.Mutex
	calls int
}

func (b *blocking) Process(out, in []float32) ([]float32, error) {
	time.Sleep(b.sleep)
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	return b.Delay.Process(out, in)
}

// TestLiveClockNeverWaits: with a processor that blocks 200 ms per 160 ms chunk, the clock's
// Push and Pull still return at once, and a swap queued during a step returns at once and is
// applied by the worker before the next chunk.
func TestLiveClockNeverWaits(t *testing.T) {
	sched := NewScheduler(1)
	defer sched.Close()
	const rate = 16000
	p := &blocking{Delay: *NewDelay(rate, 2560, 0), sleep: 200 * time.Millisecond}
	l, err := sched.NewLive(Config{IORate: rate}, "slow", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	block := rate / 50
	in := sine(block, rate, 440)
	buf := make([]float32, block)
	var worst time.Duration
	var swapTook time.Duration
	next := NewDelay(rate, 2560, 0)
	start := time.Now()
	for k := 0; k < 40; k++ { // 800 ms of 20 ms ticks
		t0 := time.Now()
		l.Push(in, t0)
		l.Pull(buf, t0)
		_ = l.Stats()
		worst = max(worst, time.Since(t0))
		if k == 12 { // the first chunk (after 8 ticks) is being processed now
			t1 := time.Now()
			l.Swap("next", next)
			swapTook = time.Since(t1)
		}
		time.Sleep(time.Until(start.Add(time.Duration(k+1) * 20 * time.Millisecond)))
	}
	if worst > 5*time.Millisecond {
		t.Errorf("a clock tick took %v while the processor blocked", worst)
	}
	if swapTook > 5*time.Millisecond {
		t.Errorf("a swap during a model step took %v", swapTook)
	}
	// Wait for the worker to apply the swap, then the old processor is no longer in use.
	deadline := time.Now().Add(2 * time.Second)
	for l.sess.Voice() != "next" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l.sess.Voice() != "next" {
		t.Fatal("the swap was never applied")
	}
	for _, q := range l.InUse() {
		if q == Processor(p) {
			t.Error("the swapped-out processor is still reported in use")
		}
	}
	if st := sched.Stats(); st.Sessions != 1 || st.Workers != 1 {
		t.Errorf("scheduler stats %+v", st)
	}
}

// TestLiveMatchesSession: run by a worker, a session gives the same output as when it is
// driven synchronously.
func TestLiveMatchesSession(t *testing.T) {
	sched := NewScheduler(2)
	defer sched.Close()
	const rate = 48000
	x := sine(rate, rate, 220)
	v1, _ := NewDSPVoice()
	ref, err := NewSession(Config{IORate: rate, MaxQueue: time.Hour}, "dsp", v1)
	if err != nil {
		t.Fatal(err)
	}
	v2, _ := NewDSPVoice()
	l, err := sched.NewLive(Config{IORate: rate, MaxQueue: time.Hour}, "dsp", v2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	block := rate / 50
	now := time.Now()
	for k := 0; k+block <= len(x); k += block {
		if err := ref.Push(x[k:k+block], now); err != nil {
			t.Fatal(err)
		}
		l.Push(x[k:k+block], now)
	}
	want := make([]float32, ref.Queued())
	ref.Pull(want, now)
	deadline := time.Now().Add(5 * time.Second)
	for l.sess.Queued() < len(want) && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	got := make([]float32, len(want))
	if n := l.Pull(got, now); n != len(want) {
		t.Fatalf("live session produced %d samples, the synchronous one %d", n, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sample %d: %g, want %g", i, got[i], want[i])
		}
	}
}

// TestLiveBoundsItsInbox: a processor far slower than real time loses old input, not memory.
func TestLiveBoundsItsInbox(t *testing.T) {
	sched := NewScheduler(1)
	defer sched.Close()
	const rate = 16000
	p := &blocking{Delay: *NewDelay(rate, 8000, 0), sleep: 200 * time.Millisecond}
	l, err := sched.NewLive(Config{IORate: rate}, "stuck", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	in := make([]float32, rate) // a second of input a call, far faster than processed
	for range 10 {
		l.Push(in, time.Now())
	}
	l.inMu.Lock()
	n := len(l.inbox)
	l.inMu.Unlock()
	if n > int(maxInbox.Seconds()*rate) {
		t.Errorf("inbox holds %d samples, bound %d", n, int(maxInbox.Seconds()*rate))
	}
	if st := l.Stats(); st.Dropped < 5*time.Second {
		t.Errorf("dropped %v of input, want the excess counted", st.Dropped)
	}
}

// sineSynth speaks a fixed number of 10 ms chunks of a tone (or fails with err).
type sineSynth struct {
	chunks int
	err    error
}

func (s sineSynth) Info() SynthInfo { return SynthInfo{Name: "sine", SampleRate: 1000} }

func (s sineSynth) Synthesize(ctx context.Context, req SynthRequest, out func(SynthChunk) error) error {
	for range s.chunks {
		if err := out(SynthChunk{Samples: sine(10, 1000, 50)}); err != nil {
			return err
		}
	}
	return s.err
}

// TestTTSJobAccounts: a job reports the audio it handed out, its TTFA and RTF, and takes and
// gives back a slot.
func TestTTSJobAccounts(t *testing.T) {
	adm := NewAdmission(1, 10*time.Millisecond)
	res := TTSJob{Synth: sineSynth{chunks: 30}, Admission: adm, Out: func(SynthChunk) error { return nil }}.Run(context.Background())
	if res.Err != nil || res.Samples != 300 || res.Audio != 300*time.Millisecond || res.TTFA <= 0 || res.RTF() <= 0 {
		t.Errorf("result %+v, RTF %v", res, res.RTF())
	}
	if st := adm.Stats(); st.Active != 0 {
		t.Errorf("slot still held: %+v", st)
	}
	boom := errors.New("boom")
	res = TTSJob{Synth: sineSynth{chunks: 2, err: boom}, Out: func(SynthChunk) error { return nil }}.Run(context.Background())
	if !errors.Is(res.Err, boom) || res.Samples != 20 {
		t.Errorf("failing synth: %+v", res)
	}
	if code, client := Classify(res.Err, CodeSynthesis); code != CodeSynthesis || client {
		t.Errorf("a server fault classified %s, client %v", code, client)
	}
}

// TestSchedulerLoad: workers kept busy report a load near 1 and no capacity; idle ones the
// opposite.
func TestSchedulerLoad(t *testing.T) {
	sched := NewScheduler(1)
	defer sched.Close()
	if !sched.HasCapacity() {
		t.Fatal("an idle scheduler has no capacity")
	}
	p := &blocking{Delay: *NewDelay(16000, 160, 0), sleep: 30 * time.Millisecond}
	l, err := sched.NewLive(Config{IORate: 16000}, "busy", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// 10 ms chunks, one every 25 ms, that take 30 ms each: the worker never rests, and the
	// backlog stays small.
	pushSteadily(sched, l, 160, 25*time.Millisecond)
	if st := sched.Stats(); st.Load < 0.8 || sched.HasCapacity() {
		t.Errorf("saturated worker: %+v, capacity %v", st, sched.HasCapacity())
	}
}

// pushSteadily pushes n samples to l every period for 2.5 s. The load is measured over
// windows of a second: a fresh one starts after 1.2 s, so the check after it reads a window
// of steady load throughout.
func pushSteadily(sched *Scheduler, l *Live, n int, period time.Duration) {
	start := time.Now()
	fresh := false
	for time.Since(start) < 2500*time.Millisecond {
		l.Push(make([]float32, n), time.Now())
		if !fresh && time.Since(start) > 1200*time.Millisecond {
			sched.Stats() // start a fresh window
			fresh = true
		}
		time.Sleep(period)
	}
}
