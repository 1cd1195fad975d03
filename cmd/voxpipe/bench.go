package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

var benches = map[string]func(args []string, stdout, stderr io.Writer) error{
	"miotts":   runBenchMioTTS,
	"tts-load": runBenchTTSLoad,
	"soak":     runBenchSoak,
	"meanvc2":  runBenchMeanVC2,
	"loopback": runBenchLoopback,
	"planner":  runBenchPlanner,
	"gemm":     runBenchGemm,
	"gemv":     runBenchGemv,
	"dispatch": runBenchDispatch,
}

func runBench(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || benches[args[0]] == nil {
		fmt.Fprintln(stderr, `Usage: voxpipe bench NAME [flags] [--json]

  loopback  real WebRTC sessions over loopback: latency p50/p95 and its parts, CPU per session, RTF, late frames, dropped audio
  planner   memory plan of a model-shaped graph: arena vs naive bytes, persistent bytes
  gemm      our matmul against OpenBLAS called directly, GFLOP/s at each model's own shapes (MeanVC2, MioTTS, MioCodec), per part and against the peak
  gemv      one decode-step Linear (1×1024×3072) with F32, F16 (and F16P), Q8_0 (and Q8_0R8) weights: µs and GB/s
  dispatch  engine overhead per node on a graph of 1000 tiny ops
  tts-load  N concurrent TTS WebSocket sessions against a server: time to first audio p50/p95, rejected, late chunks, CPU
  soak      WebRTC sessions and TTS streams joining and leaving for --minutes: server RSS, heap, goroutines, fds flat
  miotts    MioTTS + MioCodec: prefill, decode tokens/s (mean over all steps with the model's sampler, and p50), speaker embedding, codec RTF, time to first audio, peak RSS
  meanvc2   MeanVC2 (either variant): rtf_total, chunk p50/p90, live-path latency, speaker embedding time and memory, WavLM arena, per-session memory, peak RSS, --sessions N`)
		return errors.New("unknown or missing benchmark")
	}
	return benches[args[0]](args[1:], stdout, stderr)
}

func runBenchLoopback(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench loopback", "bench loopback [flags]", stderr)
	voice := fs.String("voice", "dsp", "voice to run")
	pitch := fs.Float64("pitch", 4, "pitch shift of the dsp voice (non-zero so the voice does real work)")
	sessions := fs.Int("sessions", 1, "concurrent sessions")
	seconds := fs.Float64("seconds", 10, "seconds of audio each session sends")
	stagger := fs.Duration("stagger", 0, "start the sessions this far apart, each dialing when it starts, instead of all at once (sessions joining a busy server)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	server := fs.String("server", "", "benchmark a running server at this http:// URL instead of starting one (CPU is then not measured)")
	model := fs.String("model", "", "MeanVC2 model (GGUF) for the server it starts: --voice meanvc2 converts into --ref")
	ref := fs.String("ref", "", "target voice clip (WAV, FLAC, Ogg or MP3 file) for --model")
	place := serverPlacementFlags(fs, "vocoder-backend", "where the started server runs MeanVC2's vocoder")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if (*model == "") != (*ref == "") || *model != "" && *server != "" {
		return errors.New("--model and --ref go together, for the server the bench starts (not with --server)")
	}
	if *sessions < 1 || *seconds < 1 || *stagger < 0 || *stagger > time.Minute {
		return errors.New("--sessions must be ≥ 1, --seconds ≥ 1 and --stagger from 0 to 1m")
	}
	res, err := benchLoopback(loopbackOptions{voice: *voice, pitch: *pitch, sessions: *sessions, seconds: *seconds, stagger: *stagger, server: *server,
		model: *model, ref: *ref, place: place, log: stderr})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	if res.Refused > 0 {
		fmt.Fprintf(stdout, "loopback %s: %d of %d sessions refused (busy: admission), %d ran\n", res.Voice, res.Refused, res.Sessions, res.Sessions-res.Refused)
	}
	fmt.Fprintf(stdout, "loopback %s ×%d for %.0f s: latency p50 %.1f ms, p95 %.1f ms; CPU %.2f%% per session; late frames %d of %d (after the first 2 s: %d of %d) (slow chunks %d of %d); dropped %.0f ms; stretched %.0f ms; clicks found %d/%d\n",
		res.Voice, res.Sessions-res.Refused, res.Seconds, res.LatencyP50, res.LatencyP95, res.CPUPerSession, res.LateFrames, res.Frames, res.SteadyLateFrames, res.SteadyFrames, res.SlowChunks, res.Chunks, res.DroppedMs, res.StretchedMs, res.ClicksFound, res.ClicksSent)
	fmt.Fprintf(stdout, "  server latency p50 %.1f ms, p95 %.1f ms = algorithmic %.1f ms (voice, frame, resamplers) + jitter target %.1f ms + output cushion %.1f ms + the rest; rtf %.3f; real time: %v\n",
		res.ServerP50, res.ServerP95, res.AlgorithmicMs, res.JitterTargetMs, res.OutputBufferMs, res.RTF, res.RealTime)
	return nil
}

type loopbackOptions struct {
	voice    string
	pitch    float64
	sessions int
	seconds  float64
	stagger  time.Duration // between session starts; 0: all dialed first, then all send at once
	server   string
	model    string // MeanVC2 model and target clip for the server the bench starts
	ref      string
	place    *serverPlacement // nil: serve's defaults
	log      io.Writer
}

// loopbackResult is one run of the loopback benchmark.
type loopbackResult struct {
	Bench         string  `json:"bench"`
	Voice         string  `json:"voice"`
	Sessions      int     `json:"sessions"` // asked for
	Refused       int     `json:"refused"`  // of those, refused busy by admission; the rest ran
	Seconds       float64 `json:"seconds"`
	LatencyP50    float64 `json:"latency_ms_p50"`
	LatencyP95    float64 `json:"latency_ms_p95"`
	CPUPerSession float64 `json:"cpu_percent_per_session"`
	// Late frames: 20 ms output frames that were not ready when due (queue.underflows),
	// of all frames sent. Slow chunks: processor chunks whose compute took longer than the
	// audio they hold (a bursty model has them by design; they matter only if frames are late).
	LateFrames  int     `json:"late_frames"`
	Frames      int     `json:"frames"`
	LatePercent float64 `json:"late_frames_percent"`
	// The same from 2 s after the audio began on (each session's first stats report from
	// then): the steady state, without the start, where the output cushion is still
	// adapting to the load.
	SteadyLateFrames  int     `json:"steady_late_frames"`
	SteadyFrames      int     `json:"steady_frames"`
	SteadyLatePercent float64 `json:"steady_late_frames_percent"`
	SlowChunks        int     `json:"slow_chunks"`
	Chunks            int     `json:"chunks"`
	DroppedMs         float64 `json:"dropped_ms"`
	// StretchedMs is the output the sessions played twice to grow their cushions when
	// sessions joined (queue.stretched_ms), in all: not late frames, but not free either.
	StretchedMs float64 `json:"stretched_ms"`
	ServerMs    float64 `json:"server_latency_ms_mean"`
	// The server's own measurement, once a second per session (what a voice model's output
	// can be measured by when it turns clicks into something else), and its designed parts.
	ServerP50      float64 `json:"server_latency_ms_p50"`
	ServerP95      float64 `json:"server_latency_ms_p95"`
	AlgorithmicMs  float64 `json:"algorithmic_ms"`
	JitterTargetMs float64 `json:"jitter_target_ms"`
	QueueMs        float64 `json:"output_queue_ms_mean"`
	OutputBufferMs float64 `json:"output_buffer_ms_mean"` // the adaptive cushion (queue.output_buffer_ms)
	// RTF is the voice's compute (the sessions' processor time) ÷ the audio it processed,
	// per session; RealTime says every session kept up (late frames under 1 %).
	RTF         float64 `json:"rtf"`
	RealTime    bool    `json:"real_time"`
	ClicksSent  int     `json:"clicks_sent"`
	ClicksFound int     `json:"clicks_found"`
}

// benchLoopback runs sessions through a real server over loopback WebRTC and measures the
// input→output latency of a click train, the server's CPU, and late and dropped audio.
func benchLoopback(o loopbackOptions) (*loopbackResult, error) {
	base, pid := o.server, 0
	if base == "" {
		var stop func()
		var err error
		var extra []string
		if o.model != "" {
			extra = []string{"--vc-model", o.model, "--vc-ref", o.ref}
		}
		if o.place != nil {
			extra = append(extra, o.place.args()...)
		}
		base, pid, stop, err = startServer(o.log, extra...)
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	pcm, clicks := rtcclient.ClickTrain(o.seconds, 500*time.Millisecond)
	packets, err := rtcclient.EncodeFrames(pcm)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.seconds*float64(time.Second))+time.Duration(o.sessions)*o.stagger+60*time.Second)
	defer cancel()
	var params map[string]float64
	if o.voice == "dsp" {
		params = map[string]float64{"pitch_semitones": o.pitch}
	}
	// join dials session i; a nil client and no error: admission refused it (busy).
	join := func(i int) (*rtcclient.Client, error) {
		c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(base), Voice: o.voice, Params: params, Seed: uint64(i)})
		if err != nil {
			return nil, fmt.Errorf("session %d: %w", i, err)
		}
		err = checkVoice(c, o.voice)
		if errors.Is(err, errRefusedBusy) { // admission at work: the others run
			c.Close()
			return nil, nil
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("session %d: %w", i, err)
		}
		return c, nil
	}
	clients := make([]*rtcclient.Client, o.sessions)
	starts := make([]time.Time, o.sessions) // when each session began to send
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}()
	if o.stagger == 0 {
		for i := range clients {
			c, err := join(i)
			if err != nil {
				return nil, err
			}
			clients[i] = c
		}
	}
	cpu0, _ := cpuTime(pid)
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(clients))
	for i := range clients {
		if o.stagger == 0 && clients[i] == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i]
			if o.stagger > 0 {
				time.Sleep(time.Until(t0.Add(time.Duration(i) * o.stagger)))
				var err error
				if c, err = join(i); c == nil {
					errs[i] = err
					return
				}
				clients[i] = c // each goroutine its own index, read after wg.Wait
			}
			starts[i] = time.Now()
			errs[i] = c.SendPackets(ctx, packets)
		}()
	}
	wg.Wait()
	time.Sleep(1200 * time.Millisecond) // the tail comes back and a last stats message arrives
	cpu1, cpuErr := cpuTime(pid)
	wall := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	refused := 0
	for i := range clients {
		if clients[i] == nil {
			refused++
		}
	}
	clients = slices.DeleteFunc(clients, func(c *rtcclient.Client) bool { return c == nil })
	starts = slices.DeleteFunc(starts, func(t time.Time) bool { return t.IsZero() })
	if len(clients) == 0 {
		return nil, fmt.Errorf("the server refused all %d sessions (busy)", o.sessions)
	}
	res := &loopbackResult{Bench: "loopback", Voice: o.voice, Sessions: o.sessions, Refused: refused, Seconds: o.seconds}
	const settle = 2 * time.Second // the start the steady figures leave out
	steadyFrames := int((o.seconds - settle.Seconds()) * 50)
	var all, server []time.Duration
	var jitter, queue, cushion, process float64
	processN := 0
	for i, c := range clients {
		lat := rtcclient.ClickLatencies(pcm, clicks, c.SendTimes(), c.Received())
		all = append(all, lat...)
		res.ClicksSent += len(clicks)
		res.ClicksFound += len(lat)
		if st := c.Stats(); len(st) > 0 {
			last := st[len(st)-1]
			res.LateFrames += last.Queue.Underflows
			if from, ok := c.StatsSince(starts[i].Add(settle)); ok && steadyFrames > 0 {
				res.SteadyLateFrames += last.Queue.Underflows - from.Queue.Underflows
				res.SteadyFrames += steadyFrames
			}
			res.SlowChunks += last.LateChunks
			res.Chunks += last.Chunks
			res.DroppedMs += last.DroppedMs
			res.StretchedMs += last.Queue.StretchedMs
			for _, s := range st {
				if s.Latency.Server > 0 {
					server = append(server, time.Duration(s.Latency.Server*float64(time.Millisecond)))
					jitter += s.Latency.Jitter
					queue += s.Queue.DepthMs
					cushion += s.Queue.OutputBufferMs
				}
			}
			for _, s := range st {
				if s.Chunks > 0 {
					process += s.Timings.Process // mean ms of processor time per 20 ms frame
					processN++
				}
			}
			res.AlgorithmicMs = last.Latency.Algorithmic
		}
	}
	res.LatencyP50 = ms(rtcclient.Percentile(all, 50))
	res.LatencyP95 = ms(rtcclient.Percentile(all, 95))
	res.Frames = len(clients) * int(o.seconds*50)
	if res.Frames > 0 {
		res.LatePercent = 100 * float64(res.LateFrames) / float64(res.Frames)
	}
	if n := len(server); n > 0 {
		var sum time.Duration
		for _, d := range server {
			sum += d
		}
		res.ServerMs = ms(sum) / float64(n)
		res.ServerP50 = ms(rtcclient.Percentile(server, 50))
		res.ServerP95 = ms(rtcclient.Percentile(server, 95))
		res.JitterTargetMs, res.QueueMs, res.OutputBufferMs = jitter/float64(n), queue/float64(n), cushion/float64(n)
	}
	if processN > 0 {
		res.RTF = process / float64(processN) / 20
	}
	if res.SteadyFrames > 0 {
		res.SteadyLatePercent = 100 * float64(res.SteadyLateFrames) / float64(res.SteadyFrames)
	}
	res.RealTime = res.LatePercent < 1
	if pid != 0 && cpuErr == nil {
		res.CPUPerSession = 100 * (cpu1 - cpu0).Seconds() / wall.Seconds() / float64(len(clients)) // the sessions that ran
	}
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// errRefusedBusy is checkVoice's error for a session admission refused.
var errRefusedBusy = errors.New("the server refused the session: busy")

// checkVoice fails when the server refused the session's voice or runs another one: a
// bench must measure the voice it names (a refused voice used to leave the default
// running, and the figures were the DSP voice's).
func checkVoice(c *rtcclient.Client, voice string) error {
	running := ""
	for _, m := range c.Messages() {
		switch m.Type {
		case "error":
			err := fmt.Errorf("the server refused the session: %s: %s", m.Code, m.Message)
			if m.Code == rtc.CodeBusy {
				err = fmt.Errorf("%w: %s", errRefusedBusy, m.Message)
			}
			return err
		case "ready":
			running = m.Voice
		}
	}
	if voice != "" && running != voice {
		return fmt.Errorf("asked for voice %q, the server runs %q", voice, running)
	}
	return nil
}

// startServer runs this binary's serve command on a free loopback port.
func startServer(log io.Writer, extra ...string) (base string, pid int, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, err
	}
	addr := l.Addr().String()
	l.Close()
	exe, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	cmd := exec.Command(exe, append([]string{"serve", "--listen", addr, "--log-level", "warn"}, extra...)...)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("start server: %w", err)
	}
	// exited closes when the server has exited (waitErr is then its status): stop may be
	// called more than once (a test's cleanup after an explicit stop).
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	base = "http://" + addr
	// Up to 3 minutes: a server with real-size models loads them before it listens. One that
	// exits first (a bad flag, a model that does not load) is an error at once.
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			return "", 0, nil, fmt.Errorf("the server exited before it listened (%v): see its log above", waitErr)
		default:
		}
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			return base, cmd.Process.Pid, stop, nil
		}
	}
	stop()
	return "", 0, nil, errors.New("server did not come up within 3 minutes")
}

// cpuTime reads a process's user+system CPU time from /proc.
func cpuTime(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, errors.New("no process")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are the 14th and 15th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / ticks, nil
}

// parseCounts reads a comma-separated list of counts from 1 to most (empty: none).
func parseCounts(flag, value string, most int) ([]int, error) {
	var counts []int
	for f := range strings.SplitSeq(value, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > most {
			return nil, fmt.Errorf("%s %q: want counts from 1 to %d, comma-separated", flag, value, most)
		}
		counts = append(counts, n)
	}
	return counts, nil
}
