package worker_test

import (
	"context"
	"fmt"
	"github.com/voxpipe/voxpipe/engine"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice"
	"github.com/voxpipe/voxpipe/voice/voicetest"
	"github.com/voxpipe/voxpipe/worker"
	"github.com/voxpipe/voxpipe/worker/lktest"
)

// benchSeconds is how long each room's participant speaks in the rooms benchmark.
const benchSeconds = 10

// benchVoice is the voice the rooms benchmark converts with: the dsp voice, or MeanVC2 when
// $VOXPIPE_BENCH_VC_MODEL names a model file (real size: voxpipe mkmodel).
func benchVoice(b *testing.B) (cfg worker.Config, metadata, label string) {
	path := os.Getenv("VOXPIPE_BENCH_VC_MODEL")
	if path == "" {
		return worker.Config{}, `{"voice":"dsp","params":{"pitch_semitones":4}}`, "dsp"
	}
	m, closeModel, err := voice.LoadMeanVC2(path, engine.Placement{Backend: "cpu", Threads: 2}, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(closeModel)
	vc := &voice.MeanVC2Voices{Model: m, DefaultRef: voicetest.Speech()}
	cfg.NewProcessor = func(owner, name, ref string) (stream.Processor, error) {
		if name != "meanvc2" {
			return nil, nil
		}
		return vc.Processor(owner, ref)
	}
	return cfg, `{"voice":"meanvc2"}`, "meanvc2-" + m.Config.Runtime.Model
}

// BenchmarkRoomsPerWorker runs N LiveKit rooms through one worker on loopback: in each, a
// participant speaks for benchSeconds and hears its converted voice. A room is real time
// when under 1 % of the worker's 20 ms output frames for it were late (not ready when due),
// none of its audio was dropped as stale, and at least 95 % of the audio came back. The participants, livekit-server and the worker share the machine's cores.
func BenchmarkRoomsPerWorker(b *testing.B) {
	lk := lktest.Start(b)
	cfg, metadata, label := benchVoice(b)
	// One scheduler for every room count, as a worker keeps one: the voice's cost, learned in
	// the first runs, is what admission reserves for each conversion in the later ones.
	cfg.Scheduler = stream.NewScheduler(0)
	defer cfg.Scheduler.Close()
	counts := []int{1, 2, 4, 8, 16, 32}
	if label != "dsp" {
		counts = []int{1, 2, 4, 6, 8} // a model saturates two cores long before
	}
	for _, n := range counts {
		b.Run(fmt.Sprintf("%s/rooms=%d", label, n), func(b *testing.B) {
			for range b.N {
				r := runRooms(b, lk, cfg, metadata, n)
				b.ReportMetric(float64(r.realTime), "realtime_rooms")
				b.ReportMetric(float64(r.refused), "refused_rooms")
				b.ReportMetric(r.latePct, "late_frame_%")
				b.ReportMetric(r.droppedMs, "dropped_ms")
				b.ReportMetric(r.returned, "returned_audio_%")
				b.ReportMetric(r.load, "scheduler_load")
			}
		})
	}
}

type roomsResult struct {
	realTime, refused int
	latePct, returned float64
	droppedMs         float64
	load              float64
}

var benchRun int

func runRooms(b *testing.B, lk lktest.Server, cfg worker.Config, metadata string, n int) roomsResult {
	benchRun++
	agent := fmt.Sprintf("bench-%d", benchRun)
	var mu sync.Mutex
	reports := map[string]rtc.SessionReport{}
	cfg.AgentName, cfg.MaxRooms, cfg.MaxTracks = agent, 64, 64
	cfg.OnStats = func(r rtc.SessionReport) { mu.Lock(); reports[r.ID] = r; mu.Unlock() }
	// The previous run's last steps count in the shared scheduler's load for a second or two:
	// a worker registering then reports itself full, and LiveKit dispatches its rooms nowhere.
	for settle := time.Now().Add(10 * time.Second); cfg.Scheduler.Stats().Load > 0.05 && time.Now().Before(settle); {
		time.Sleep(250 * time.Millisecond)
	}
	w := startWorker(b, lk, cfg)
	defer w.Close()
	type room struct {
		p   *lktest.Participant
		mic lktest.Microphone
		out string
	}
	rooms := make([]room, n)
	for i := range rooms {
		name, who := fmt.Sprintf("%s-room-%d", agent, i), fmt.Sprintf("speaker-%d", i)
		p := lktest.Join(b, lk, name, who)
		rooms[i] = room{p: p, mic: p.Microphone(b), out: "voxpipe:" + who}
		dispatch(b, lk, agent, name, metadata)
	}
	// A room whose conversion the worker refused (busy: admission by cost) gets no track.
	var admitted []int
	deadline := time.Now().Add(20 * time.Second)
	for i, r := range rooms {
		if r.p.AwaitTrack(r.out, max(time.Until(deadline), time.Second)) {
			admitted = append(admitted, i)
		}
	}
	in := lktest.Speech(b)
	var sent []float32
	for len(sent) < benchSeconds*48000 {
		sent = append(sent, in...)
	}
	sent = sent[:benchSeconds*48000]
	starts := make([]int, n)
	for _, i := range admitted {
		starts[i] = len(rooms[i].p.Audio(rooms[i].out))
	}
	var wg sync.WaitGroup
	loadSum, loads := 0.0, 0
	done := make(chan struct{})
	go func() { // the scheduler's load, once a second while the rooms speak
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Second):
				loadSum += w.Capacity().Scheduler
				loads++
			}
		}
	}()
	for _, r := range rooms { // every participant speaks, admitted or not
		wg.Go(func() { r.mic.Speak(context.Background(), sent) })
	}
	wg.Wait()
	close(done)
	time.Sleep(1500 * time.Millisecond) // the voice's tail and the last stats report
	var res roomsResult
	mu.Lock()
	defer mu.Unlock()
	frames, late := 0, 0
	res.refused = n - len(admitted)
	for _, i := range admitted {
		r := rooms[i]
		got := r.p.Audio(r.out)[starts[i]:]
		frac := min(1, float64(len(got))/float64(len(sent)))
		res.returned += 100 * frac / float64(max(len(admitted), 1))
		rep := reports[fmt.Sprintf("%s-room-%d/speaker-%d", agent, i, i)] // the pipe's id: room/identity
		// Late frames: 20 ms output frames not ready when due (as bench loopback counts them;
		// a slow model chunk is not late if its audio still came out in time).
		n := benchSeconds * 50
		frames += n
		late += rep.Stream.Underflows
		res.droppedMs += float64(rep.Stream.Dropped.Milliseconds())
		if rep.Stream.Underflows*100 < n && rep.Stream.DroppedChunks == 0 && frac >= 0.95 {
			res.realTime++
		}
	}
	res.latePct = 100 * float64(late) / float64(max(frames, 1))
	if loads > 0 {
		res.load = loadSum / float64(loads)
	}
	return res
}

// BenchmarkSFULatency measures the mouth-to-ear latency of a click train through the dsp voice
// (pitch 0) two ways on loopback: directly over voxpipe's own WebRTC endpoint, and through a
// LiveKit room and the worker. The difference is what the SFU hop adds.
func BenchmarkSFULatency(b *testing.B) {
	lk := lktest.Start(b)
	clicks, at := rtcclient.ClickTrain(8, 400*time.Millisecond)
	params := map[string]float64{"pitch_semitones": 0}
	for range b.N {
		direct := median(directLatencies(b, clicks, at, params))
		viaSFU := median(sfuLatencies(b, lk, clicks, at))
		b.ReportMetric(direct, "direct_ms")
		b.ReportMetric(viaSFU, "livekit_ms")
		b.ReportMetric(viaSFU-direct, "added_ms")
	}
}

func directLatencies(b *testing.B, clicks []float32, at []int, params map[string]float64) []time.Duration {
	srv, err := rtc.NewServer(rtc.Config{Loopback: true})
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/rtc", srv)
	hs := httptest.NewServer(mux)
	defer func() { srv.Close(); hs.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(hs.URL), Voice: "dsp", Params: params})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	packets, err := rtcclient.EncodeFrames(clicks)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.SendPackets(ctx, packets); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second)
	return rtcclient.ClickLatencies(clicks, at, c.SendTimes(), c.Received())
}

func sfuLatencies(b *testing.B, lk lktest.Server, clicks []float32, at []int) []time.Duration {
	benchRun++
	agent := fmt.Sprintf("latency-%d", benchRun)
	w := startWorker(b, lk, worker.Config{AgentName: agent})
	defer w.Close()
	p := lktest.Join(b, lk, agent, "caller")
	mic := p.Microphone(b)
	dispatch(b, lk, agent, agent, `{"voice":"dsp","params":{"pitch_semitones":0}}`)
	p.WaitTrack(b, "voxpipe:caller", 30*time.Second)
	times, err := mic.Speak(context.Background(), clicks)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second)
	return rtcclient.ClickLatencies(clicks, at, times, p.Received("voxpipe:caller"))
}

func median(d []time.Duration) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2].Microseconds()) / 1000
}
