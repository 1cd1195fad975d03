package rtc_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
	"github.com/voxpipe/voxpipe/stream"
)

// stalling is a voice whose every 160 ms chunk takes 200 ms: a model slower than the clock.
type stalling struct{ *stream.Delay }

func (s stalling) Process(out, in []float32) ([]float32, error) {
	time.Sleep(200 * time.Millisecond)
	return s.Delay.Process(out, in)
}

// TestClockPacesWhileAModelStalls: the media clock never waits for model work. With a voice
// whose chunks block for 200 ms, the server still sends a packet every 20 ms, and a voice
// change is acknowledged within 40 ms while a step runs. (Before the scheduler the clock ran
// the chunk itself: 200 ms gaps, then bursts, and the change waited for the step.)
func TestClockPacesWhileAModelStalls(t *testing.T) {
	voices := stream.NewRegistry()
	voices.Register("stalling", func() (stream.Processor, error) { return stalling{stream.NewDelay(16000, 2560, 0)}, nil })
	srv, err := rtc.NewServer(rtc.Config{Loopback: true, Voices: voices, DefaultVoice: "stalling"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/rtc", srv)
	hs := httptest.NewServer(mux)
	defer func() { srv.Close(); hs.Close() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(hs.URL)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	packets, err := rtcclient.EncodeFrames(speech(t)[:3*48000])
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() { sent <- c.SendPackets(ctx, packets) }()

	// Once the stalling voice is busy, change the voice and time the answer.
	time.Sleep(1500 * time.Millisecond)
	n := len(c.Messages())
	t0 := time.Now()
	c.Send(map[string]any{"type": "session", "voice": "passthrough"})
	var ack time.Duration
	for ack == 0 && time.Since(t0) < 5*time.Second {
		for _, m := range c.Messages()[n:] {
			if m.Type == "ready" || m.Type == "error" {
				ack = time.Since(t0)
			}
		}
		time.Sleep(time.Millisecond)
	}
	if ack == 0 || ack > 40*time.Millisecond {
		t.Errorf("voice change acknowledged after %v while a model step ran, want ≤ 40 ms", ack)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}

	// Packet spacing over the stalling part, as the client received them over loopback.
	recv := c.Received().Packets
	var gaps []time.Duration
	for i := 1; i < len(recv); i++ {
		if recv[i].At.Sub(t0) > 0 {
			break // after the change: no longer stalling
		}
		gaps = append(gaps, recv[i].At.Sub(recv[i-1].At))
	}
	if len(gaps) < 40 {
		t.Fatalf("only %d packets before the voice change", len(gaps))
	}
	within := 0
	for _, g := range gaps {
		if g >= 15*time.Millisecond && g <= 25*time.Millisecond {
			within++
		}
	}
	slices.Sort(gaps)
	t.Logf("%d gaps: median %v, p95 %v, max %v; %d within 20±5 ms; ack %v", len(gaps), gaps[len(gaps)/2], gaps[len(gaps)*95/100], gaps[len(gaps)-1], within, ack)
	if float64(within) < 0.9*float64(len(gaps)) || gaps[len(gaps)-1] > 80*time.Millisecond {
		t.Errorf("packets not every 20±5 ms while the voice stalled: %d of %d within, longest gap %v", within, len(gaps), gaps[len(gaps)-1])
	}
}
