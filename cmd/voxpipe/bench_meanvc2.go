package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/meanvc2"
)

// meanvc2Bench is one run of `voxpipe bench meanvc2`.
type meanvc2Bench struct {
	Model   string  `json:"model"`
	Variant string  `json:"variant"` // 120ms or 40ms (the file's runtime.model)
	FileMB  float64 `json:"file_mb"`
	Threads int     `json:"threads"`
	Backend string  `json:"backend"`
	// VocoderBackend is where the vocoder ran (the model's backend unless --vocoder-backend).
	VocoderBackend string  `json:"vocoder_backend"`
	Seconds        float64 `json:"seconds"`     // streamed audio
	RefSeconds     float64 `json:"ref_seconds"` // reference clip of the speaker figures
	LoadMs         float64 `json:"load_ms"`
	// LoadRSSMB is the resident set once the model is loaded (weights in engine buffers).
	LoadRSSMB float64 `json:"load_rss_mb"`
	// DeviceMB is the GPU memory (device-local and host-visible) the loaded model holds on
	// Vulkan, DevicePeakMB the most it held during the bench (sessions included); 0 on the CPU.
	DeviceMB     float64 `json:"device_mb"`
	DevicePeakMB float64 `json:"device_peak_mb"`
	// LoadPeakMB is the peak resident set up to the end of loading.
	LoadPeakMB float64 `json:"load_peak_rss_mb"`

	// Streaming path, one session, 160 ms chunks: compute time of Process per chunk.
	ChunkMs float64 `json:"chunk_ms"`
	// RTFTotal is the headline, the whole path: (ProcessMs + FlushMs) ÷ AudioSeconds, where
	// ProcessMs is Σ Process over every chunk of the source (ChunkTimesMs) and AudioSeconds
	// is Chunks × ChunkMs. RTFMedian and RTFP95 are one chunk's compute (the median, the
	// 95th percentile) ÷ the chunk's duration; the 120 ms model runs 1 or 2 DiT steps per
	// chunk, so its median hides the heavier chunks and reads low.
	RTFTotal     float64 `json:"rtf_total"`
	Chunks       int     `json:"chunks"`
	AudioSeconds float64 `json:"audio_seconds"`
	ProcessMs    float64 `json:"process_ms"`
	RTFMedian    float64 `json:"rtf_median"`
	RTFP95       float64 `json:"rtf_p95"`
	ChunkP50     float64 `json:"chunk_p50_ms"`
	ChunkP90     float64 `json:"chunk_p90_ms"`
	ChunkMax     float64 `json:"chunk_max_ms"`
	WarmupMs     float64 `json:"warmup_ms"` // first chunk, compiling the programs
	FlushMs      float64 `json:"flush_ms"`
	// ChunkTimesMs is every chunk's Process time in stream order (the first chunk's
	// compilation is outside: it ran once before the timed pass, see WarmupMs).
	ChunkTimesMs []float64 `json:"chunk_times_ms"`

	// Speaker path on a synthetic reference: warm (programs compiled) and first call.
	SpeakerMs      float64 `json:"speaker_ms"`
	SpeakerFirstMs float64 `json:"speaker_first_ms"`
	GTMMs          float64 `json:"gtm_ms"`
	WavLMFrames    int     `json:"wavlm_frames"`
	// SpeakerPeakMB is the peak resident set during the first embedding above the resident
	// set before it (programs, arena, hidden states): what one embedding adds.
	SpeakerPeakMB float64 `json:"speaker_peak_mb"`
	// ArenaMB / NaiveMB: the WavLM-Large program of the reference, intermediates shared by
	// liveness against each on its own.
	ArenaMB float64 `json:"arena_mb"`
	NaiveMB float64 `json:"naive_mb"`

	// SessionMB is one more stream's own state as the model accounts it (Stream.SessionBytes);
	// SessionRSSMB is the measured growth of the resident set per extra stream.
	SessionMB    float64 `json:"session_mb"`
	SessionRSSMB float64 `json:"session_rss_mb"`

	PeakRSSMB            float64 `json:"peak_rss_mb"`
	AlgorithmicLatencyMs float64 `json:"algorithmic_latency_ms"` // Stream.Latency
	OutputSlackMs        float64 `json:"output_slack_ms"`        // Model.OutputSlack
	LiveLatencyMs        float64 `json:"live_latency_ms"`        // the live path's, at 20 ms pieces

	// Concurrent sessions (--sessions N): one level per session count tried, and the most
	// sessions that stayed real time.
	Sessions            []sessionLevel `json:"sessions,omitempty"`
	MaxRealtimeSessions *int           `json:"max_realtime_sessions,omitempty"`
}

// sessionLevel is n sessions paced at real time on the shared model.
type sessionLevel struct {
	Sessions int `json:"sessions"`
	Chunks   int `json:"chunks"`
	// Late chunks finished after the next chunk of their session arrived.
	Late    int     `json:"late"`
	LatePct float64 `json:"late_pct"`
	// ChunkP50/P90: arrival to finish, waits for the shared backend included.
	ChunkP50 float64 `json:"chunk_p50_ms"`
	ChunkP90 float64 `json:"chunk_p90_ms"`
	// RTFLoaded / RTFMeanLoaded: median and mean Process time over the chunk length under
	// this load (waits for the shared backend included). SessionsXRTF is n × the mean RTF of
	// one session alone (level 1): what n sessions would cost run one after another, without
	// batching.
	RTFLoaded     float64 `json:"rtf_median_loaded"`
	RTFMeanLoaded float64 `json:"rtf_mean_loaded"`
	SessionsXRTF  float64 `json:"sessions_x_rtf"`
	// ModelBusy is the share of the wall time the model spent running batches; the mean
	// batches are the streams' ASR windows and DiT+vocoder steps per batched program.
	ModelBusy     float64 `json:"model_busy"`
	MeanASRBatch  float64 `json:"mean_asr_batch"`
	MeanStepBatch float64 `json:"mean_step_batch"`
	// Realtime: under 1 % of the chunks late. (A busy model batches more, so a level near
	// full use can still keep up; ModelBusy says how close it is.)
	Realtime bool `json:"realtime"`
	// DeviceSessionMB is the GPU memory a session added at this level: (the most held while
	// the level ran − before it) ÷ sessions (a session's caches are host memory: what grows is
	// the programs for a new batch size); 0 on the CPU.
	DeviceSessionMB float64 `json:"device_session_mb,omitempty"`
}

func runBenchMeanVC2(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench meanvc2", "bench meanvc2 --model FILE.gguf [--threads 2] [--seconds 20] [--ref-seconds 10] [--sessions N] [--batch N] [--json]", stderr)
	model := fs.String("model", "", "MeanVC2 model, either variant (single-file GGUF; voxpipe mkmodel --family meanvc2 [--variant 40ms] makes a random one at real size)")
	threads := fs.Int("threads", 2, "engine threads")
	backend := fs.String("backend", defaultBackend, "where the model runs: "+engine.BackendUsage)
	vocoderBackend := fs.String("vocoder-backend", "", "where the vocoder runs (same values; empty: with the model)")
	seconds := fs.Float64("seconds", 20, "seconds of synthetic speech streamed")
	refSeconds := fs.Float64("ref-seconds", 10, "reference clip length for the speaker figures")
	sessions := fs.String("sessions", "", "also run sessions concurrently at real-time pace: N runs 1…N and stops at the first level that is not real time; a comma-separated list (1,2,4,8,16) runs each level")
	batch := fs.Int("batch", meanvc2.MaxBatch, "the most concurrent sessions' model steps one batched program runs (1: no batching, for comparison)")
	profile := fs.Bool("profile", false, "print where the streamed conversion spends its time, by kind of op (to stderr)")
	fuse := fs.Bool("fuse", true, fuseUsage)
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	levels, err := parseCounts("--sessions", *sessions, 64)
	if err != nil {
		return err
	}
	stopEarly := len(levels) == 1 && !strings.Contains(*sessions, ",")
	if stopEarly {
		levels = make([]int, levels[0])
		for i := range levels {
			levels[i] = i + 1
		}
	}
	switch {
	case *model == "":
		fs.Usage()
		return errors.New("--model is required")
	case *threads < 1:
		return errors.New("--threads must be ≥ 1")
	case *seconds < 0.5:
		return errors.New("--seconds must be ≥ 0.5 (a few 160 ms chunks)")
	case *refSeconds < meanvc2.MinReferenceSeconds:
		return fmt.Errorf("--ref-seconds must be ≥ %.0f", meanvc2.MinReferenceSeconds)
	case *batch < 1 || *batch > meanvc2.MaxBatch:
		return fmt.Errorf("--batch must be 1…%d", meanvc2.MaxBatch)
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, format, a...) }
	res := meanvc2Bench{Model: *model, Threads: *threads, Seconds: *seconds, RefSeconds: *refSeconds}
	if st, err := os.Stat(*model); err == nil {
		res.FileMB = float64(st.Size()) / 1e6
	}
	var peak float64 // highest VmHWM seen (it is reset around the speaker figure)
	notePeak := func() { peak = max(peak, procStatusMB("VmHWM")) }

	be, voc, closeBE, err := placement(*backend, *vocoderBackend, "vocoder", *threads, stderr).Open()
	if err != nil {
		return err
	}
	defer closeBE()
	res.Backend, res.VocoderBackend = be.Name(), voc.Name()
	setFusion(*fuse, be, voc)
	prof, err := newProfiler(*profile, be, stderr)
	if err != nil {
		return err
	}
	logf("loading %s on %s…\n", *model, be.Name())
	t0 := time.Now()
	m, err := meanvc2.LoadOn(*model, meanvc2.Backends{Main: be, Vocoder: voc})
	if err != nil {
		return err
	}
	defer m.Close()
	m.SetBatchLimit(*batch)
	res.LoadMs = ms(time.Since(t0))
	res.DeviceMB, _ = deviceMB(be, voc)
	notePeak()
	res.LoadPeakMB = peak
	settleHeap()
	res.LoadRSSMB = procStatusMB("VmRSS")

	// Speaker first, on a fresh peak mark: its growth is what one embedding costs.
	logf("speaker embedding of %.0f s…\n", *refSeconds)
	// The first call compiles the reference-length programs; its peak is the cost of one
	// embedding. BenchSpeaker then times compiled calls.
	rate := m.Config.Runtime.SampleRate
	clip := meanvc2.SyntheticSpeech(int(*refSeconds*float64(rate)), rate, 2)
	reset := resetPeakRSS()
	before := procStatusMB("VmRSS")
	t0 = time.Now()
	if _, err := m.SpeakerEmbedding(clip, rate); err != nil {
		return err
	}
	res.SpeakerFirstMs = ms(time.Since(t0))
	if reset {
		res.SpeakerPeakMB = procStatusMB("VmHWM") - before
	} else {
		res.SpeakerPeakMB = math.NaN() // no clear_refs: the mark still holds the load's peak
	}
	notePeak()
	sp, err := meanvc2.BenchSpeaker(m, *refSeconds)
	if err != nil {
		return err
	}
	notePeak()
	res.SpeakerMs, res.GTMMs, res.WavLMFrames = sp.Ms, sp.GTMMs, sp.Frames
	plan, err := m.WavLMPlanStats(int(*refSeconds * float64(m.Config.Runtime.SampleRate)))
	if err != nil {
		return err
	}
	res.ArenaMB, res.NaiveMB = mib(plan.ArenaBytes), mib(plan.NaiveBytes)
	// A server embeds once per voice: drop the reference-length programs before streaming.
	m.WavLM.Trim()

	logf("streaming %.0f s…\n", *seconds)
	prof.start()
	st, err := meanvc2.BenchStream(m, *seconds, 1)
	if err != nil {
		return err
	}
	prof.stop(fmt.Sprintf("the streamed conversion of %.0f s (its warm-up chunk included)", *seconds))
	notePeak()
	res.ChunkMs, res.RTFMedian, res.RTFP95 = st.ChunkMs, st.RTFMedian, st.RTFP95
	res.Chunks, res.ChunkTimesMs = st.Chunks, st.ChunkTimesMs
	res.AudioSeconds = float64(st.Chunks) * st.ChunkMs / 1000
	for _, v := range st.ChunkTimesMs {
		res.ProcessMs += v
	}
	res.ChunkP50, res.ChunkP90, res.ChunkMax, res.WarmupMs, res.FlushMs = st.ChunkP50, st.ChunkP90, st.ChunkMax, st.WarmupMs, st.FlushMs
	res.Variant, res.RTFTotal, res.LiveLatencyMs = st.Variant, st.RTFTotal, st.LiveMs
	res.SessionMB, res.AlgorithmicLatencyMs, res.OutputSlackMs = st.SessionMB, st.LatencyMs, st.SlackMs

	logf("memory per session…\n")
	if res.SessionRSSMB, err = measureSessionRSS(m, 8); err != nil {
		return err
	}
	notePeak()

	if len(levels) > 0 {
		res.MaxRealtimeSessions = new(int)
	}
	for _, n := range levels {
		logf("%d concurrent session(s) at real-time pace for %.0f s…\n", n, *seconds)
		before, _ := deviceMB(be, voc)
		sampled := sampleDeviceMB(be, voc)
		lv, err := pacedSessions(m, n, *seconds)
		if most := sampled(); most > 0 {
			lv.DeviceSessionMB = max(0, most-before) / float64(n)
		}
		if err != nil {
			return err
		}
		lv.SessionsXRTF = float64(n) * lv.RTFMeanLoaded
		if len(res.Sessions) > 0 {
			lv.SessionsXRTF = float64(n) * res.Sessions[0].RTFMeanLoaded
		}
		lv.Realtime = lv.LatePct < 1
		res.Sessions = append(res.Sessions, lv)
		notePeak()
		if lv.Realtime {
			*res.MaxRealtimeSessions = max(*res.MaxRealtimeSessions, n)
		} else if stopEarly {
			break
		}
	}
	res.PeakRSSMB = peak
	_, res.DevicePeakMB = deviceMB(be, voc)

	if *asJSON {
		if math.IsNaN(res.SpeakerPeakMB) {
			res.SpeakerPeakMB = -1 // JSON has no NaN
		}
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "MeanVC2 %s, variant %s (the %s + 40 ms model), on %d thread(s) (%.0f MB file, load %.0f ms, %.0f MiB resident after load, peak %.0f MiB while loading):\n",
		res.Model, res.Variant, strings.TrimSuffix(res.Variant, "ms")+" ms", res.Threads, res.FileMB, res.LoadMs, res.LoadRSSMB, res.LoadPeakMB)
	fmt.Fprintf(stdout, "  rtf_total %.3f: the whole path, (Σ Process %.0f ms over %d chunks + flush %.1f ms) ÷ %.2f s of audio\n",
		res.RTFTotal, res.ProcessMs, res.Chunks, res.FlushMs, res.AudioSeconds)
	fmt.Fprintf(stdout, "  chunks of %.0f ms: chunk_p50_ms %.1f, chunk_p90_ms %.1f, chunk_max_ms %.1f (warm-up %.0f ms); "+
		"rtf_median %.3f, rtf_p95 %.3f (one chunk ÷ its %.0f ms: the median hides the chunks with two DiT steps)\n",
		res.ChunkMs, res.ChunkP50, res.ChunkP90, res.ChunkMax, res.WarmupMs, res.RTFMedian, res.RTFP95, res.ChunkMs)
	fmt.Fprintf(stdout, "  speaker embedding of %.0f s (%d WavLM frames): speaker_ms %.0f warm (first %.0f ms, GTM %.1f ms), speaker_peak_mb %.0f\n",
		res.RefSeconds, res.WavLMFrames, res.SpeakerMs, res.SpeakerFirstMs, res.GTMMs, res.SpeakerPeakMB)
	fmt.Fprintf(stdout, "  WavLM-Large plan: arena_mb %.1f vs naive_mb %.1f\n", res.ArenaMB, res.NaiveMB)
	fmt.Fprintf(stdout, "  session_mb %.2f (accounted), session_rss_mb %.2f (measured per extra session)\n", res.SessionMB, res.SessionRSSMB)
	fmt.Fprintf(stdout, "  algorithmic_latency_ms %.0f (+ output slack %.0f ms, + the %.0f ms chunk being filled); live_latency_ms %.0f (the live path, 20 ms pieces)\n",
		res.AlgorithmicLatencyMs, res.OutputSlackMs, res.ChunkMs, res.LiveLatencyMs)
	for _, lv := range res.Sessions {
		fmt.Fprintf(stdout, "  %d session(s): late %d of %d (%.2f%%), arrival→done p50 %.1f ms, p90 %.1f ms, rtf under load %.3f (mean %.3f), model busy %.0f%% (unbatched it would be %.0f%%), mean batch %.2f ASR windows / %.2f steps, real time: %v\n",
			lv.Sessions, lv.Late, lv.Chunks, lv.LatePct, lv.ChunkP50, lv.ChunkP90, lv.RTFLoaded, lv.RTFMeanLoaded, 100*lv.ModelBusy, 100*lv.SessionsXRTF, lv.MeanASRBatch, lv.MeanStepBatch, lv.Realtime)
		if lv.DeviceSessionMB > 0 {
			fmt.Fprintf(stdout, "    device_session_mb %.2f (GPU memory a session added)\n", lv.DeviceSessionMB)
		}
	}
	if len(levels) > 0 {
		fmt.Fprintf(stdout, "  max_realtime_sessions %d\n", *res.MaxRealtimeSessions)
	}
	fmt.Fprintf(stdout, "  peak_rss_mb %.0f\n", res.PeakRSSMB)
	if res.DevicePeakMB > 0 {
		fmt.Fprintf(stdout, "  device_mb %.1f after load, device_peak_mb %.1f (GPU memory, %s)\n", res.DeviceMB, res.DevicePeakMB, res.Backend)
	}
	return nil
}

// measureSessionRSS opens n extra streams, runs two chunks through each (so their programs
// are compiled and their caches written) and returns the resident-set growth per stream.
func measureSessionRSS(m *meanvc2.Model, n int) (float64, error) {
	target, err := m.Timbre(make([]float32, m.Config.SpkDim))
	if err != nil {
		return 0, err
	}
	k := m.Config.Runtime.ChunkSamples
	in := meanvc2.SyntheticSpeech(2*k, m.Config.Runtime.SampleRate, 3)
	settleHeap()
	before := procStatusMB("VmRSS")
	ss := make([]*meanvc2.Stream, 0, n)
	defer func() {
		for _, s := range ss {
			s.Close()
		}
	}()
	var out []float32
	for range n {
		s, err := m.NewStream(target)
		if err != nil {
			return 0, err
		}
		ss = append(ss, s)
		for c := range 2 {
			if out, err = s.Process(out[:0], in[c*k:(c+1)*k]); err != nil {
				return 0, err
			}
		}
	}
	settleHeap()
	return (procStatusMB("VmRSS") - before) / float64(n), nil
}

// pacedSessions runs n streams as a server would: each gets a 160 ms chunk every 160 ms
// (their phases spread over the period) and processes it when it arrives or when its
// previous chunk is done. A chunk is late when it finishes after its session's next chunk
// has arrived: the session then falls behind real time. The engine runs one program at a
// time on the shared backend: requests that arrive while it is busy are batched.
func pacedSessions(m *meanvc2.Model, n int, seconds float64) (sessionLevel, error) {
	lv := sessionLevel{Sessions: n}
	rt := m.Config.Runtime
	k := rt.ChunkSamples
	period := time.Duration(float64(k) / float64(rt.SampleRate) * float64(time.Second))
	chunks := int(seconds * float64(rt.SampleRate) / float64(k))
	target, err := m.Timbre(make([]float32, m.Config.SpkDim))
	if err != nil {
		return lv, err
	}
	in := meanvc2.SyntheticSpeech(chunks*k, rt.SampleRate, 4)
	ss := make([]*meanvc2.Stream, n)
	defer func() {
		for _, s := range ss {
			if s != nil {
				s.Close()
			}
		}
	}()
	for i := range ss {
		if ss[i], err = m.NewStream(target); err != nil {
			return lv, err
		}
		// Compile outside the timed run, as a warm server would have.
		if _, err := ss[i].Process(nil, in[:k]); err != nil {
			return lv, err
		}
		ss[i].Reset()
	}
	lat := make([][]float64, n)
	late := make([]int, n)
	busy := make([][]float64, n)
	errs := make([]error, n)
	start := time.Now().Add(10 * time.Millisecond)
	before := m.BatchStats()
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			phase := time.Duration(i) * period / time.Duration(n)
			out := make([]float32, 0, 4*k)
			for c := range chunks {
				arrive := start.Add(phase + time.Duration(c)*period)
				time.Sleep(time.Until(arrive))
				t0 := time.Now()
				var err error
				if out, err = s.Process(out[:0], in[c*k:(c+1)*k]); err != nil {
					errs[i] = err
					return
				}
				done := time.Now()
				busy[i] = append(busy[i], ms(done.Sub(t0)))
				lat[i] = append(lat[i], ms(done.Sub(arrive)))
				if done.After(arrive.Add(period)) {
					late[i]++
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	after := m.BatchStats()
	lv.ModelBusy = float64(after.Busy-before.Busy) / float64(wall)
	lv.MeanASRBatch = float64(after.ASRWindows-before.ASRWindows) / float64(max(after.ASRBatches-before.ASRBatches, 1))
	lv.MeanStepBatch = float64(after.Steps-before.Steps) / float64(max(after.StepBatches-before.StepBatches, 1))
	var all, proc []float64
	for i := range ss {
		if errs[i] != nil {
			return lv, errs[i]
		}
		all = append(all, lat[i]...)
		lv.Late += late[i]
		proc = append(proc, busy[i]...)
	}
	slices.Sort(all)
	slices.Sort(proc)
	lv.Chunks = len(all)
	if lv.Chunks == 0 {
		return lv, errors.New("meanvc2 bench: no chunk ran")
	}
	lv.LatePct = 100 * float64(lv.Late) / float64(lv.Chunks)
	lv.ChunkP50, lv.ChunkP90 = nearestRank(all, 0.5), nearestRank(all, 0.9)
	lv.RTFLoaded = nearestRank(proc, 0.5) / ms(period)
	var sum float64
	for _, v := range proc {
		sum += v
	}
	lv.RTFMeanLoaded = sum / float64(len(proc)) / ms(period)
	return lv, nil
}

// nearestRank is the q quantile of sorted values.
func nearestRank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// procStatusMB reads a kB field of /proc/self/status (VmRSS, VmHWM) in MB; 0 where /proc
// is absent.
func procStatusMB(field string) float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// resetPeakRSS sets VmHWM back to the current resident set (Linux clear_refs "5"), so a
// later VmHWM is the peak of what ran in between; false where that is not possible.
func resetPeakRSS() bool {
	settleHeap()
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// settleHeap returns the Go heap's garbage to the OS so resident-set differences measure
// what is live.
func settleHeap() {
	runtime.GC()
	debug.FreeOSMemory()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
