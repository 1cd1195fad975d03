package rtc_test

import (
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
	"github.com/voxpipe/voxpipe/stream"
)

// TestLivePathAddsOneFrameAndTheJitterTarget runs a model voice of known constant latency
// (a 16 kHz passthrough delayed by 100 ms in 20 ms pieces, each taking 2 ms on a scheduler
// worker, as a model's small step would) over a real Pion peer. The server's measured
// latency, from a packet's arrival to its audio's departure, may exceed the voice's own
// latency by no more than one Opus frame, the jitter buffer's wait (at most its target) and
// the resamplers' look-ahead: the path itself waits for nothing else.
func TestLivePathAddsOneFrameAndTheJitterTarget(t *testing.T) {
	const rate, piece, latency = 16000, 320, 1600
	known := func(_, name, _ string) (stream.Processor, error) {
		if name != "known" {
			return nil, nil
		}
		return stallFor{stream.NewDelay(rate, piece, latency), 2 * time.Millisecond}, nil
	}
	sched := stream.NewScheduler(2)
	defer sched.Close()
	_, url := startServerWith(t, rtc.Config{Scheduler: sched, NewProcessor: known})
	c, got := roundTrip(t, url, rtcclient.Options{Voice: "known"}, speech(t))
	if rms(got.PCM) < 1e-3 {
		t.Fatal("the voice gave back silence")
	}
	st := c.Stats()
	if len(st) < 2 {
		t.Fatalf("%d stats messages", len(st))
	}
	last := st[len(st)-1]
	if last.Voice != "known" {
		t.Fatalf("stats of voice %q", last.Voice)
	}
	voiceMs := float64(latency) * 1000 / rate
	info := stream.ProcessorInfo{SampleRate: rate, ChunkSize: piece, Latency: latency}
	// AlgorithmicLatency is the voice's latency + its piece + the resamplers' look-ahead.
	resampleMs := float64(stream.AlgorithmicLatency(48000, info).Microseconds())/1000 - voiceMs - float64(piece)*1000/rate
	added := last.Latency.Server - voiceMs
	wait := min(last.Timings.Jitter, last.Latency.Jitter)
	limit := 20 + wait + resampleMs + 8 // 8 ms for the step, the encoder and a loaded machine's timers: less than a frame
	t.Logf("server latency %.1f ms = voice %.1f ms + %.1f ms added (limit %.1f: frame 20, jitter wait %.1f of target %.1f, resamplers %.1f); algorithmic %.1f ms",
		last.Latency.Server, voiceMs, added, limit, last.Timings.Jitter, last.Latency.Jitter, resampleMs, last.Latency.Algorithmic)
	if added > limit {
		t.Errorf("the live path added %.1f ms to a voice of %.1f ms; allowed %.1f", added, voiceMs, limit)
	}
	if added < 0 {
		t.Errorf("server latency %.1f ms is below the voice's own %.1f ms: the accounting is wrong", last.Latency.Server, voiceMs)
	}
}
