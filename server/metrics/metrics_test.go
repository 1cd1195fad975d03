package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/stream"
)

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestMetrics(t *testing.T) {
	m := New()
	m.VCSession("s1", true)
	m.Session("tts_ws", true)
	m.Session("tts_ws", true)
	m.Session("tts_ws", false)
	st := rtc.SessionReport{ID: "s1", Stream: stream.Stats{LateChunks: 2, DroppedChunks: 1, Dropped: 20 * time.Millisecond,
		Latency: 45 * time.Millisecond, QueueAge: 30 * time.Millisecond, Voice: "meanvc2-40ms",
		OutputBuffer: 20 * time.Millisecond, Trimmed: 10 * time.Millisecond, Stretched: 20 * time.Millisecond, Underflows: 2},
		Algorithmic: 185 * time.Millisecond}
	m.VCStats(st)
	st.Stream.LateChunks = 3 // totals grow: only the difference is added
	st.Shed = 1              // and a jitter-buffer shed frame counts as dropped audio
	st.Stream.Trimmed = 30 * time.Millisecond
	st.Stream.Stretched = 60 * time.Millisecond
	st.Stream.Underflows = 5
	m.VCStats(st)
	m.VCStats(rtc.SessionReport{ID: "s2", Stream: stream.Stats{Voice: "dsp"}, Algorithmic: 36500 * time.Microsecond})
	m.TTSDone("miotts", 250*time.Millisecond, 2*time.Second, 0.4)
	m.Rejected("miotts", "busy")
	a := stream.NewAdmission(3, time.Second)
	m.Admission("miotts", a)
	m.DecodeBatches("miotts", func() DecodeStats {
		return DecodeStats{Rounds: 3, Steps: 7, Capacity: 2, CodecRuns: 5, CodecWindows: 8}
	})
	m.VCBatches("meanvc2-120ms", func() VCBatchStats {
		return VCBatchStats{ASRBatches: 4, ASRWindows: 9, StepBatches: 5, Steps: 11, Busy: 1500 * time.Millisecond}
	})
	gpu := int64(3 << 20)
	m.DeviceMemory("miotts", "model", "vulkan:gpu", "tts", func() (int64, int64) { return gpu, 4096 })
	gpu += 1 << 20 // the open TTS stream's caches
	sched := stream.NewScheduler(1)
	defer sched.Close()
	m.Scheduler(sched)
	out := scrape(t, m)
	for _, want := range []string{
		`voxpipe_sessions{mode="vc"} 1`,
		`voxpipe_sessions{mode="tts_ws"} 1`,
		`voxpipe_late_chunks_total 3`,
		`voxpipe_dropped_chunks_total 2`,
		`voxpipe_dropped_audio_seconds_total 0.04`,
		`voxpipe_vc_latency_seconds_count 2`,
		`voxpipe_vc_algorithmic_latency_seconds{voice="meanvc2-40ms"} 0.185`,
		`voxpipe_vc_algorithmic_latency_seconds{voice="dsp"} 0.0365`,
		`voxpipe_vc_output_buffer_seconds_bucket{le="0.02"} 3`,
		`voxpipe_vc_trimmed_audio_seconds_total 0.03`,
		`voxpipe_vc_stretched_audio_seconds_total 0.06`,
		`voxpipe_vc_late_frames_total 5`,
		`voxpipe_tts_ttfa_seconds_bucket{model="miotts",le="0.3"} 1`,
		`voxpipe_tts_audio_seconds_total{model="miotts"} 2`,
		`voxpipe_tts_rtf_count{model="miotts"} 1`,
		`voxpipe_rejected_requests_total{model="miotts",reason="busy"} 1`,
		`voxpipe_admission_slots{model="miotts"} 3`,
		`voxpipe_admission_active{model="miotts"} 0`,
		`voxpipe_decode_rounds_total{model="miotts"} 3`,
		`voxpipe_decode_steps_total{model="miotts"} 7`,
		`voxpipe_decode_capacity_streams{model="miotts"} 2`,
		`voxpipe_codec_runs_total{model="miotts"} 5`,
		`voxpipe_codec_windows_total{model="miotts"} 8`,
		`voxpipe_vc_batches_total{model="meanvc2-120ms",stage="asr"} 4`,
		`voxpipe_vc_batched_total{model="meanvc2-120ms",stage="asr"} 9`,
		`voxpipe_vc_batches_total{model="meanvc2-120ms",stage="step"} 5`,
		`voxpipe_vc_batched_total{model="meanvc2-120ms",stage="step"} 11`,
		`voxpipe_vc_model_busy_seconds_total{model="meanvc2-120ms"} 1.5`,
		`voxpipe_device_memory_bytes{backend="vulkan:gpu",kind="device",model="miotts",part="model"} 4.194304e+06`,
		`voxpipe_device_session_memory_bytes{backend="vulkan:gpu",model="miotts",part="model"} 1.048576e+06`,
		`voxpipe_device_memory_bytes{backend="vulkan:gpu",kind="host",model="miotts",part="model"} 4096`,
		`voxpipe_scheduler_load 0`,
		`voxpipe_scheduler_queued 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	m.VCSession("s1", false)
	if out := scrape(t, m); !strings.Contains(out, `voxpipe_sessions{mode="vc"} 0`) {
		t.Error("session not counted out")
	}
}
