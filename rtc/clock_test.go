package rtc_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
	"github.com/voxpipe/voxpipe/stream"
)

// TestClockPacesWhileAModelStalls: the media clock never waits for model work. With a voice
// whose chunks block for 200 ms, the server still sends a packet every 20 ms, and a voice
// change is acknowledged within 40 ms while a step runs. (Before the scheduler the clock ran
// the chunk itself: 200 ms gaps, then bursts, and the change waited for the step.)
func TestClockPacesWhileAModelStalls(t *testing.T) {
	voices := stream.NewRegistry()
	// A voice whose every 160 ms chunk takes 200 ms: a model slower than the clock.
	voices.Register("stalling", func() (stream.Processor, error) {
		return stallFor{stream.NewDelay(16000, 2560, 0), 200 * time.Millisecond}, nil
	})
	_, url := startServerWith(t, rtc.Config{Voices: voices, DefaultVoice: "stalling"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: url})
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
	// A clock that ran the model would leave a gap of about 200 ms at every chunk and send
	// a third of its packets in bursts. The bounds leave room for a loaded machine (go test
	// runs packages side by side) without admitting either.
	if float64(within) < 0.7*float64(len(gaps)) || gaps[len(gaps)-1] >= 150*time.Millisecond {
		t.Errorf("packets not every 20±5 ms while the voice stalled: %d of %d within, longest gap %v", within, len(gaps), gaps[len(gaps)-1])
	}
}

// TestModelVoiceRefusedWhileWorkersSaturated: admission asks the scheduler: with its workers
// saturated, a session asking for a model voice gets busy and keeps its voice.
func TestModelVoiceRefusedWhileWorkersSaturated(t *testing.T) {
	sched := stream.NewScheduler(1)
	defer sched.Close()
	_, url := startServerWith(t, rtc.Config{Scheduler: sched, NewProcessor: modelVoice})
	saturate(t, sched)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := len(c.Messages())
	c.Send(map[string]any{"type": "session", "voice": "model"})
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, m := range c.Messages()[n:] {
			if m.Type == "error" {
				if m.Code != rtc.CodeBusy {
					t.Errorf("model voice while saturated: %s %s", m.Code, m.Message)
				}
				return
			}
		}
	}
	t.Fatal("no answer to the model voice while the workers were saturated")
}

// modelVoice makes the voice "model", a passthrough that runs on the scheduler's workers (a
// processor from NewProcessor), and leaves the other voices to the registry.
func modelVoice(_, name, _ string) (stream.Processor, error) {
	if name != "model" {
		return nil, nil
	}
	return stream.NewDelay(16000, 160, 0), nil
}

// saturate keeps the scheduler's one worker busy with another session's voice (10 ms chunks
// that take 30 ms) until the test ends, and returns once the scheduler says it is saturated.
func saturate(t *testing.T, sched *stream.Scheduler) {
	t.Helper()
	busy, err := sched.NewLive(stream.Config{IORate: 16000}, "busy", stalled(30*time.Millisecond), nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-done
		busy.Close()
	})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(25 * time.Millisecond):
				busy.Push(make([]float32, 160), time.Now())
			}
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for sched.HasCapacity() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if sched.HasCapacity() {
		t.Fatalf("the scheduler never saturated: %+v", sched.Stats())
	}
}

// TestDefaultVoiceBusyAtStart: when the server's default voice is a model voice with no room
// on the workers, a new session is refused busy (the client may retry), not as an internal
// error: on the signaling socket with the busy code, over WHIP with 503 and Retry-After.
func TestDefaultVoiceBusyAtStart(t *testing.T) {
	sched := stream.NewScheduler(1)
	defer sched.Close()
	cfg := rtc.Config{Scheduler: sched, NewProcessor: modelVoice, DefaultVoice: "model", Loopback: true}
	srv, err := rtc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(routes(srv))
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
	})
	saturate(t, sched)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(hs.URL)})
	if err == nil {
		c.Close()
		t.Fatal("a session started with its default voice's workers saturated")
	}
	if !strings.Contains(err.Error(), rtc.CodeBusy+": ") {
		t.Errorf("signaling: %v, want the busy code", err)
	}

	pc, err := pionAPI(t).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
		t.Fatal(err)
	}
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(hs.URL+"/v1/whip", "application/sdp", strings.NewReader(pc.LocalDescription().SDP))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.HasPrefix(string(body), rtc.CodeBusy+": ") {
		t.Errorf("WHIP: %d, Retry-After %q, %q; want 503 busy with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// stalled is a 10 ms-chunk passthrough whose every chunk takes d.
func stalled(d time.Duration) stream.Processor {
	return stallFor{stream.NewDelay(16000, 160, 0), d}
}

type stallFor struct {
	*stream.Delay
	d time.Duration
}

func (s stallFor) Process(out, in []float32) ([]float32, error) {
	time.Sleep(s.d)
	return s.Delay.Process(out, in)
}
