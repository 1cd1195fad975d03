// Package metrics exports the server's Prometheus metrics at /metrics: sessions by mode,
// TTS time to first audio and real-time factor, live-voice latency (measured and, per voice,
// algorithmic), queue age and output cushion, late and dropped chunks, admission load and
// refused requests. Every name starts with voxpipe_.
package metrics

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/stream"
)

// Metrics holds the collectors; its methods are the hooks the servers call.
type Metrics struct {
	reg       *prometheus.Registry
	sessions  *prometheus.GaugeVec
	ttfa      *prometheus.HistogramVec
	rtf       *prometheus.HistogramVec
	audio     *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	latency   prometheus.Histogram
	queueAge  prometheus.Histogram
	late      prometheus.Counter
	dropped   prometheus.Counter
	droppedMs prometheus.Counter
	algorithm *prometheus.GaugeVec
	outBuffer prometheus.Histogram
	trimmed   prometheus.Counter
	stretched prometheus.Counter
	underflow prometheus.Counter

	lateTotal atomic.Int64 // what late counts, for LateChunks

	liveMu sync.Mutex
	live   map[string]int // open sessions by mode, what sessions shows (for DeviceMemory)

	mu   sync.Mutex
	last map[string]rtc.SessionReport // per live session: the previous totals, for deltas
}

// New registers the collectors, plus Go runtime and process metrics.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), last: map[string]rtc.SessionReport{}, live: map[string]int{}}
	lat := []float64{.02, .04, .06, .08, .1, .15, .2, .3, .5, 1, 2}
	m.sessions = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "voxpipe_sessions",
		Help: "Open sessions by mode (vc: live voice over WebRTC; tts_ws, tts_http: text to speech streams)."}, []string{"mode"})
	m.ttfa = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "voxpipe_tts_ttfa_seconds",
		Help: "Text to speech: request to first audio.", Buckets: []float64{.05, .1, .2, .3, .4, .6, .8, 1, 1.5, 2, 4}}, []string{"model"})
	m.rtf = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "voxpipe_tts_rtf",
		Help: "Text to speech: synthesis time / audio time per finished stream.", Buckets: []float64{.05, .1, .2, .3, .5, .75, 1, 1.5, 2}}, []string{"model"})
	m.audio = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "voxpipe_tts_audio_seconds_total",
		Help: "Text to speech: audio produced."}, []string{"model"})
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "voxpipe_rejected_requests_total",
		Help: "Requests refused (reason busy: no free stream slot within the queue deadline)."}, []string{"model", "reason"})
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "voxpipe_vc_latency_seconds",
		Help: "Live voice: server latency per session and second (RTP arrival to output frame sent).", Buckets: lat})
	m.queueAge = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "voxpipe_queue_age_seconds",
		Help: "Live voice: age of the oldest sample waiting in a session's output queue.", Buckets: lat})
	m.late = prometheus.NewCounter(prometheus.CounterOpts{Name: "voxpipe_late_chunks_total",
		Help: "Live voice: processor chunks whose compute took longer than their audio."})
	m.dropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "voxpipe_dropped_chunks_total",
		Help: "Live voice: chunks of audio dropped by the stale-audio policy and jitter shedding."})
	m.droppedMs = prometheus.NewCounter(prometheus.CounterOpts{Name: "voxpipe_dropped_audio_seconds_total",
		Help: "Live voice: audio dropped by the stale-audio policy and jitter shedding."})
	m.algorithm = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "voxpipe_vc_algorithmic_latency_seconds",
		Help: "Live voice: the delay a session's processing path adds by design (the voice's latency, chunking, resampling; not the jitter target), from the latest report of a session with that voice."}, []string{"voice"})
	m.outBuffer = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "voxpipe_vc_output_buffer_seconds",
		Help: "Live voice: the adaptive output cushion a session holds against slow model steps, per session and second.", Buckets: []float64{0, .01, .02, .04, .06, .08, .1, .15, .2, .3}})
	m.trimmed = prometheus.NewCounter(prometheus.CounterOpts{Name: "voxpipe_vc_trimmed_audio_seconds_total",
		Help: "Live voice: output dropped to shrink a session's output cushion back after slow steps."})
	m.stretched = prometheus.NewCounter(prometheus.CounterOpts{Name: "voxpipe_vc_stretched_audio_seconds_total",
		Help: "Live voice: output played twice to grow a session's cushion ahead of need when sessions joined its model."})
	m.underflow = prometheus.NewCounter(prometheus.CounterOpts{Name: "voxpipe_vc_late_frames_total",
		Help: "Live voice: 20 ms output frames a session could not fill when due while its input waited (audio late to the listener)."})
	m.reg.MustRegister(m.sessions, m.ttfa, m.rtf, m.audio, m.rejected, m.latency, m.queueAge, m.late, m.dropped, m.droppedMs,
		m.algorithm, m.outBuffer, m.trimmed, m.stretched, m.underflow,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// Session counts a session of a mode in (started) or out.
func (m *Metrics) Session(mode string, started bool) {
	d := 1
	if !started {
		d = -1
	}
	m.sessions.WithLabelValues(mode).Add(float64(d))
	m.liveMu.Lock()
	m.live[mode] += d
	m.liveMu.Unlock()
}

// liveSessions is the open sessions of the modes whose name holds kind ("vc": live voice
// over WebRTC and telephone calls; "tts": every text-to-speech stream).
func (m *Metrics) liveSessions(kind string) int {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	n := 0
	for mode, k := range m.live {
		if strings.Contains(mode, kind) {
			n += k
		}
	}
	return n
}

// VCSession is rtc.Config.OnSession: it also forgets the session's totals when it ends.
func (m *Metrics) VCSession(id string, started bool) {
	m.Session("vc", started)
	if !started {
		m.mu.Lock()
		delete(m.last, id)
		m.mu.Unlock()
	}
}

// VCStats is rtc.Config.OnStats: a live session's once-a-second report, from the stream's
// own counters (plus the frames its jitter buffer shed).
func (m *Metrics) VCStats(r rtc.SessionReport) {
	m.mu.Lock()
	prev := m.last[r.ID]
	m.last[r.ID] = r
	m.mu.Unlock()
	s, p := r.Stream, prev.Stream
	if s.Latency > 0 {
		m.latency.Observe(s.Latency.Seconds())
	}
	m.queueAge.Observe(s.QueueAge.Seconds())
	if r.Algorithmic > 0 && s.Voice != "" {
		m.algorithm.WithLabelValues(s.Voice).Set(r.Algorithmic.Seconds())
	}
	m.outBuffer.Observe(s.OutputBuffer.Seconds())
	m.trimmed.Add(max(0, (s.Trimmed - p.Trimmed).Seconds()))
	m.stretched.Add(max(0, (s.Stretched - p.Stretched).Seconds()))
	m.underflow.Add(float64(max(0, s.Underflows-p.Underflows)))
	late := max(0, s.LateChunks-p.LateChunks)
	m.late.Add(float64(late))
	m.lateTotal.Add(int64(late))
	m.dropped.Add(float64(max(0, s.DroppedChunks+r.Shed-p.DroppedChunks-prev.Shed)))
	shed := time.Duration(r.Shed-prev.Shed) * 20 * time.Millisecond // a shed frame is 20 ms
	m.droppedMs.Add(max(0, (s.Dropped - p.Dropped + shed).Seconds()))
}

// LateChunks is voxpipe_late_chunks_total: live-voice chunks whose compute took longer
// than their audio, since the start.
func (m *Metrics) LateChunks() int64 { return m.lateTotal.Load() }

// TTSDone records a finished text-to-speech stream.
func (m *Metrics) TTSDone(model string, ttfa time.Duration, audio time.Duration, rtf float64) {
	if ttfa > 0 {
		m.ttfa.WithLabelValues(model).Observe(ttfa.Seconds())
	}
	if audio > 0 {
		m.audio.WithLabelValues(model).Add(audio.Seconds())
		m.rtf.WithLabelValues(model).Observe(rtf)
	}
}

// Rejected counts a refused request.
func (m *Metrics) Rejected(model, reason string) { m.rejected.WithLabelValues(model, reason).Inc() }

// Scheduler exports the live sessions' scheduler load as gauges read at scrape time.
func (m *Metrics) Scheduler(s *stream.Scheduler) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "voxpipe_scheduler_load",
			Help: "Fraction of the scheduler workers' time spent running live sessions' steps."}, func() float64 { return s.Stats().Load }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "voxpipe_scheduler_expected_load",
			Help: "The load the open live sessions would make if all of them spoke, from their voices' learned costs; admission keeps it under the saturation limit."},
			func() float64 { return s.Stats().ExpectedLoad }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "voxpipe_scheduler_queued",
			Help: "Live sessions whose step waits for a worker."}, func() float64 { return float64(s.Stats().Queued) }),
	)
}

// DecodeStats describe a language model's batched decoding (see DecodeBatches).
type DecodeStats struct {
	Rounds, Steps int64 // decode rounds run, and the stream steps they held
	Capacity      int   // streams estimated to decode in real time together
	// CodecRuns, CodecWindows: codec decode runs, and the stream windows they held.
	CodecRuns, CodecWindows int64
}

// DecodeBatches exports a language model's batched decoding, read at scrape time: the decode
// rounds run and the stream steps they held (steps ÷ rounds is the mean batch), the
// capacity admission works from, and the codec's runs and the stream windows they held.
func (m *Metrics) DecodeBatches(model string, stats func() DecodeStats) {
	labels := prometheus.Labels{"model": model}
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "voxpipe_decode_rounds_total", ConstLabels: labels,
			Help: "Decode rounds run: one model step for every stream generating at the time."},
			func() float64 { return float64(stats().Rounds) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "voxpipe_decode_steps_total", ConstLabels: labels,
			Help: "Stream decode steps run in those rounds; divided by the rounds, the mean batch size."},
			func() float64 { return float64(stats().Steps) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "voxpipe_decode_capacity_streams", ConstLabels: labels,
			Help: "Streams the model is estimated to decode in real time together, from its measured round times; admission takes no more (and no more than the slots)."},
			func() float64 { return float64(stats().Capacity) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "voxpipe_codec_runs_total", ConstLabels: labels,
			Help: "Codec decode runs: one program for the stream windows of one shape that were due together."},
			func() float64 { return float64(stats().CodecRuns) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "voxpipe_codec_windows_total", ConstLabels: labels,
			Help: "Stream windows decoded in those runs; divided by the runs, the mean batch size."},
			func() float64 { return float64(stats().CodecWindows) }),
	)
}

// DeviceMemory exports the memory a model part holds on a device with memory of its own (a
// GPU through Vulkan), read at scrape time: device-local (weights, arenas, caches) and
// host-visible (inputs, outputs, staging); and what a session adds, as the benches report
// it: the device-local memory held beyond what the part held when this was called (once
// the model is loaded, before any session) over the open sessions of the modes that hold
// sessionKind ("vc" or "tts"), 0 with none open.
func (m *Metrics) DeviceMemory(model, part, backend, sessionKind string, inUse func() (device, host int64)) {
	base, _ := inUse()
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "voxpipe_device_session_memory_bytes",
		ConstLabels: prometheus.Labels{"model": model, "part": part, "backend": backend},
		Help:        "Device memory a model part holds beyond its memory at load, per open session using it (its caches, state and the programs compiled for them); 0 with none open."},
		func() float64 {
			n := m.liveSessions(sessionKind)
			if n <= 0 {
				return 0
			}
			d, _ := inUse()
			return float64(max(0, d-base)) / float64(n)
		}))
	for _, k := range []struct {
		kind string
		f    func() float64
	}{
		{"device", func() float64 { d, _ := inUse(); return float64(d) }},
		{"host", func() float64 { _, h := inUse(); return float64(h) }},
	} {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "voxpipe_device_memory_bytes",
			ConstLabels: prometheus.Labels{"model": model, "part": part, "backend": backend, "kind": k.kind},
			Help:        "Memory a model part holds on its device (GPU): kind device is device-local (weights, arenas, caches), host is host-visible (inputs, outputs, staging)."},
			k.f))
	}
}

// VCBatchStats describe a voice-conversion model's batched steps (see VCBatches).
type VCBatchStats struct {
	ASRBatches, ASRWindows int64         // content-encoder batches run, and the stream windows they held
	StepBatches, Steps     int64         // DiT+vocoder step batches run, and the stream steps they held
	Busy                   time.Duration // time spent running them
}

// VCBatches exports a voice-conversion model's batching across live sessions, read at scrape
// time: batches run per stage and the stream requests they held (held ÷ batches is the mean
// batch), and the time the model spent running them (its rate is the model's busy share).
func (m *Metrics) VCBatches(model string, stats func() VCBatchStats) {
	labels := func(stage string) prometheus.Labels { return prometheus.Labels{"model": model, "stage": stage} }
	for _, c := range []struct {
		stage            string
		batches, streams func(VCBatchStats) int64
	}{
		{"asr", func(s VCBatchStats) int64 { return s.ASRBatches }, func(s VCBatchStats) int64 { return s.ASRWindows }},
		{"step", func(s VCBatchStats) int64 { return s.StepBatches }, func(s VCBatchStats) int64 { return s.Steps }},
	} {
		m.reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "voxpipe_vc_batches_total", ConstLabels: labels(c.stage),
				Help: "Batched model runs for live voice conversion: ASR windows (stage asr) or DiT+vocoder steps (stage step) of the sessions due together."},
				func() float64 { return float64(c.batches(stats())) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "voxpipe_vc_batched_total", ConstLabels: labels(c.stage),
				Help: "Session requests those batches held; divided by the batches, the mean batch size."},
				func() float64 { return float64(c.streams(stats())) }),
		)
	}
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "voxpipe_vc_model_busy_seconds_total",
		ConstLabels: prometheus.Labels{"model": model},
		Help:        "Time the voice-conversion model spent running batches; its rate is the share of the time the model is busy."},
		func() float64 { return stats().Busy.Seconds() }))
}

// Admission exports a model's admission load as gauges read at scrape time.
func (m *Metrics) Admission(model string, a *stream.Admission) {
	for _, g := range []struct {
		name, help string
		f          func(stream.AdmissionStats) float64
	}{
		{"voxpipe_admission_active", "Stream slots in use.", func(s stream.AdmissionStats) float64 { return float64(s.Active) }},
		{"voxpipe_admission_slots", "Stream slots configured.", func(s stream.AdmissionStats) float64 { return float64(s.Slots) }},
		{"voxpipe_admission_queued", "Requests waiting for a slot.", func(s stream.AdmissionStats) float64 { return float64(s.Queued) }},
	} {
		f := g.f
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help,
			ConstLabels: prometheus.Labels{"model": model}}, func() float64 { return f(a.Stats()) }))
	}
}
