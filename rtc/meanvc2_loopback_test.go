package rtc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/internal/vulkantest"
	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice"
)

// TestLoopbackMeanVC2 runs the tiny MeanVC2 model as the live voice: a real Pion client sends
// Opus speech over loopback and gets converted audio back. The server's default voice is
// meanvc2 with a default reference (like serve --vc-ref), refs name clips, unknown or
// unusable refs get their error codes, and the latency the client measures matches the
// algorithmic latency the server reports.
func TestLoopbackMeanVC2(t *testing.T) {
	cpu := func() (engine.Backend, error) { return engine.NewCPU(2) }
	// Both published variants: 120 ms + 40 ms, and 40 ms + 40 ms (lower latency).
	for _, folder := range []string{"meanvc2", "meanvc2_40ms"} {
		t.Run(folder, func(t *testing.T) {
			testLoopbackMeanVC2(t, folder, cpu, latencySlack{first: 80 * time.Millisecond, server: 80 * time.Millisecond})
		})
	}
	// And once with the model on Vulkan. CI's device is lavapipe, which runs the shaders on
	// the CPU many times slower than a GPU (or the CPU backend): the early chunks' compute
	// delays the first sound by ~200–300 ms more (303 ms seen on a loaded machine). With
	// another package's tests beside it on 2 cores the session runs at ~0.96 load, so later
	// chunks come late too and the server's running figure (an average over the session)
	// drifts further: 900 ms against 432 ms algorithmic was seen in CI. The bounds allow
	// that; a stream that falls seconds behind still fails.
	t.Run("meanvc2/vulkan", func(t *testing.T) {
		vulkantest.Require(t)
		testLoopbackMeanVC2(t, "meanvc2", func() (engine.Backend, error) { return engine.NewVulkan(0) },
			latencySlack{first: 400 * time.Millisecond, server: 1500 * time.Millisecond})
	})
}

// latencySlack is how far above the algorithmic latency the measured ones may be (compute
// and scheduling on the machine): the first sound the client hears, and the server's
// running figure in its stats.
type latencySlack struct{ first, server time.Duration }

// testLoopbackMeanVC2 runs the test on a backend.
func testLoopbackMeanVC2(t *testing.T, folder string, newBackend func() (engine.Backend, error), slack latencySlack) {
	path := golden.Path(t, folder, "model.gguf")
	be, err := newBackend()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	m, err := meanvc2.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the server (startServerWith's) ends its sessions before the
	// model they run on is freed.
	t.Cleanup(m.Close)
	in := speech(t)
	clips := map[string][]float32{"": in[:3*48000], "speech": in[48000:], "silence": make([]float32, 3*48000)}
	newProc := func(_, name, ref string) (stream.Processor, error) {
		if name != "meanvc2" {
			return nil, nil
		}
		clip, ok := clips[ref]
		if !ok {
			return nil, fmt.Errorf("%w: no clip %q", stream.ErrUnknownVoice, ref)
		}
		target, err := m.VoiceFromClip(clip, 48000)
		if errors.Is(err, meanvc2.ErrBadReference) {
			return nil, fmt.Errorf("%w: %w", stream.ErrBadParams, err)
		}
		if err != nil {
			return nil, err
		}
		return voice.MeanVC2Processor(m, target)
	}
	_, url := startServerWith(t, rtc.Config{DefaultVoice: "meanvc2", NewProcessor: newProc})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ready, ok := c.WaitMessage("ready", "", time.Second)
	if !ok || ready.Voice != "meanvc2" || ready.SampleRate != 16000 {
		t.Fatalf("ready: %+v", ready)
	}
	pcm := in[:3*48000]
	packets, err := rtcclient.EncodeFrames(pcm)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendPackets(ctx, packets); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // the tail and a stats message
	got := c.Received()
	sent := c.SendTimes()

	if r := rms(got.PCM); r < 0.01 {
		t.Fatalf("received %.2f s with RMS %.4f: no converted audio", float64(len(got.PCM))/48000, r)
	}
	// The adapter's priming is exact silence, and the model's first output sample stands for
	// input sample −Latency: the content of the first sent sample is Latency after the first
	// sound. Onset of sound: the first 2.5 ms window above −50 dBFS after the first send.
	const win = 120
	onset := -1
	for _, p := range got.Packets {
		if p.At.Before(sent[0]) {
			continue
		}
		for j := p.Start; j+win <= len(got.PCM) && onset < 0; j += win / 4 {
			if rms(got.PCM[j:j+win]) > 0.003 {
				onset = j
			}
		}
		break
	}
	if onset < 0 {
		t.Fatal("no onset of sound in the returned audio")
	}
	pk := got.Packets[packetIndex(got.Packets, onset)]
	heard := pk.At.Add(time.Duration(onset-pk.Start) * time.Second / 48000)
	modelLatency := time.Duration(m.Latency()) * time.Second / 16000
	// The first chunk's late output is given up for silence (LiveGivenUp): the first sound
	// is that much later than the output sample standing for input −Latency.
	givenUp := time.Duration(m.LiveGivenUp(320)) * time.Second / 16000
	captured := sent[0].Add(-20 * time.Millisecond) // a frame sent at T holds the 20 ms before T
	measured := heard.Add(modelLatency - givenUp).Sub(captured)
	alg := time.Duration(ready.AlgorithmicLatency * float64(time.Millisecond))
	st := c.Stats()
	if len(st) == 0 {
		t.Fatal("no stats")
	}
	last := st[len(st)-1]
	t.Logf("MeanVC2 %s over loopback: measured %.1f ms from capture to playable (first sound at %.1f ms + model latency %.0f ms − %.0f ms given up); "+
		"algorithmic %.1f ms (ready); server-measured %.1f ms; stats %+v",
		m.Config.Runtime.Model, ms(measured), ms(heard.Sub(captured)), ms(modelLatency), ms(givenUp), ms(alg), last.Latency.Server, last)
	// Loopback, Opus and the 20 ms clocks add a little; the designed part must account for
	// the rest.
	if measured < alg-20*time.Millisecond || measured > alg+slack.first {
		t.Errorf("measured latency %.1f ms, algorithmic %.1f ms", ms(measured), ms(alg))
	}
	if last.Voice != "meanvc2" || last.Latency.Server < ms(alg)-60 || last.Latency.Server > ms(alg+slack.server) {
		t.Errorf("stats: voice %q, server latency %.1f ms vs algorithmic %.1f ms", last.Voice, last.Latency.Server, ms(alg))
	}

	// Refs: unknown and unusable ones are refused with their codes and leave the session
	// as it was; a known one swaps in.
	for _, tc := range []struct{ ref, code string }{{"nobody", rtc.CodeUnknownVoice}, {"silence", rtc.CodeBadParams}, {"speech", ""}} {
		if reply := sessionReply(t, c, rtc.Message{Type: "session", Voice: "meanvc2", Ref: tc.ref}); reply.Code != tc.code || (tc.code == "" && reply.Type != "ready") {
			t.Errorf("ref %q: got %+v, want code %q", tc.ref, reply, tc.code)
		}
	}
	// A new session that picks its reference before it sends audio converts with it. (A
	// second call of SendPackets on the same client would repeat its RTP sequence numbers.)
	// The first one ends first: on a slow machine (lavapipe) the workers have room for one
	// session, and the new one is refused busy until the server has let the first go.
	c.Close()
	var c2 *rtcclient.Client
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if c2, err = rtcclient.Dial(ctx, rtcclient.Options{URL: url}); err == nil {
			break
		}
		if !strings.Contains(err.Error(), rtc.CodeBusy+": ") || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	defer c2.Close()
	if reply := sessionReply(t, c2, rtc.Message{Type: "session", Voice: "meanvc2", Ref: "speech"}); reply.Type != "ready" {
		t.Fatalf("ref speech: %+v", reply)
	}
	if err := c2.SendPackets(ctx, packets[:75]); err != nil {
		t.Fatal(err)
	}
	r := 0.0
	for deadline := time.Now().Add(3 * time.Second); r < 0.01 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		r = rms(c2.Received().PCM)
	}
	switch {
	case r >= 0.01:
	case last.Load >= 0.9:
		// The backend runs the model at about real time (lavapipe at a slow moment: load
		// 0.93-1.15 seen), so a session that also embeds its reference at the start stays
		// behind and its audio is given up as stale, by design. The CPU runs of this test
		// (load ~0.01) check this part.
		t.Logf("no audio with the chosen reference (RMS %.4f) at load %.2f: the backend is too slow to hear it", r, last.Load)
	default:
		t.Errorf("no audio with the chosen reference (RMS %.4f, load %.2f)", r, last.Load)
	}
}

// sessionReply sends a session message and returns the ready or error that answers it.
func sessionReply(t *testing.T, c *rtcclient.Client, m rtc.Message) rtc.Message {
	t.Helper()
	n := len(c.Messages())
	if err := c.Send(m); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, r := range c.Messages()[n:] {
			if r.Type == "ready" || r.Type == "error" {
				t.Logf("ref %q: %s %s %s", m.Ref, r.Type, r.Code, r.Message)
				return r
			}
		}
	}
	return rtc.Message{}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func packetIndex(ps []rtcclient.ReceivedPacket, j int) int {
	for i, p := range ps {
		if p.Start <= j && j < p.Start+p.N {
			return i
		}
	}
	return len(ps) - 1
}
