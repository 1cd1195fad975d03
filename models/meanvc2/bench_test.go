package meanvc2

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/vocos"
)

// The benchmark helpers run on the golden model and report sane numbers (timings are not
// checked: the machine is shared).
func TestBenchHelpers(t *testing.T) {
	m, _, _ := golden(t)
	res, err := BenchStream(m, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.Chunks != 2*6 || res.RTFMedian <= 0 || res.SessionMB <= 0 || res.LatencyMs != 105 || res.SlackMs != 140 {
		t.Errorf("stream bench %+v", res)
	}
	// The whole cost is at least the median chunk's: it adds the slower chunks and the flush.
	if res.Variant != "120ms" || res.RTFTotal < res.RTFMedian*0.5 || res.LiveMs != 105+260+20 {
		t.Errorf("stream bench: variant %q, rtf_total %v (median %v), live latency %v ms", res.Variant, res.RTFTotal, res.RTFMedian, res.LiveMs)
	}
	// rtf_total is the recorded Process and Flush times over the audio streamed, per stream.
	if len(res.ChunkTimesMs) != res.Chunks || len(res.FlushTimesMs) != res.Streams {
		t.Fatalf("%d chunk times for %d chunks, %d flush times for %d streams", len(res.ChunkTimesMs), res.Chunks, len(res.FlushTimesMs), res.Streams)
	}
	var sum float64
	for _, v := range append(slices.Clone(res.ChunkTimesMs), res.FlushTimesMs...) {
		if v < 0 {
			t.Errorf("a recorded time is %v ms", v)
		}
		sum += v
	}
	audioMs := float64(res.Chunks/res.Streams) * res.ChunkMs
	if want := sum / float64(res.Streams) / audioMs; math.Abs(res.RTFTotal-want) > 1e-9*want {
		t.Errorf("rtf_total %v, want Σ times / audio = %v", res.RTFTotal, want)
	}
	m40, _, _ := goldenVariant(t, Family+"_40ms")
	if res, err := BenchStream(m40, 1, 1); err != nil || res.Variant != "40ms" || res.LiveMs != 105+100+20 || res.RTFTotal <= 0 {
		t.Errorf("40 ms model: %+v, %v", res, err)
	}
	sp, err := BenchSpeaker(m, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", sp)
	if sp.Frames != m.WavLM.Config.Frames(48000) || sp.Ms <= 0 {
		t.Errorf("speaker bench %+v", sp)
	}
	st, err := m.WavLMPlanStats(48000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wavlm 3 s: %+v", st)
	if st.ArenaBytes <= 0 || st.ArenaBytes > st.NaiveBytes {
		t.Errorf("plan stats %+v", st)
	}
	s, err := m.NewStream(mustTimbre(t, m))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b, err := s.SessionBytes()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("session bytes %d", b)
}

func mustTimbre(t *testing.T, m *Model) Timbre {
	t.Helper()
	tb, err := m.Timbre(make([]float32, m.Config.SpkDim))
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// BenchmarkBatch times one batched program per stage for B streams of a real-size model
// (VOXPIPE_MEANVC2_MODEL: `voxpipe mkmodel --family meanvc2`): an ASR window, a DiT step
// (both calls) and a vocoder step, each for B streams at once. ms/stream is the batch's time
// over B: what batching saves is the weights read once for all B.
func BenchmarkBatch(b *testing.B) {
	path := os.Getenv("VOXPIPE_MEANVC2_MODEL")
	if path == "" {
		b.Skip("set VOXPIPE_MEANVC2_MODEL to a real-size MeanVC2 file (voxpipe mkmodel --family meanvc2)")
	}
	be, err := engine.NewCPU(2)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	m, err := Load(path, be)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	c := m.Config
	target, err := m.Timbre(make([]float32, c.SpkDim))
	if err != nil {
		b.Fatal(err)
	}
	win := m.ASR.Config.Stream.Window
	for _, n := range []int{1, 2, 4, 8, 16} {
		ss := make([]*Stream, n)
		for i := range ss {
			if ss[i], err = m.NewStream(target); err != nil {
				b.Fatal(err)
			}
			defer ss[i].Close()
		}
		asr, frames, offsets := make([]*conformer.State, n), make([][]float32, n), make([]int, n)
		dit, x0s, conds, tbs := make([]*State, n), make([][]float32, n), make([][]float32, n), make([]Timbre, n)
		voc, mels := make([]*vocos.Stream, n), make([][]float32, n)
		for i, s := range ss {
			asr[i], frames[i], offsets[i] = s.asr, make([]float32, win*m.ASR.Config.InputDim), m.ASR.Config.Stream.RequiredCache
			dit[i], x0s[i], conds[i], tbs[i] = s.dit, make([]float32, c.Window()*c.MelDim), make([]float32, c.Window()*c.BNDim), target
			voc[i], mels[i] = s.voc, make([]float32, c.ChunkSize*c.MelDim)
		}
		stages := []struct {
			name string
			run  func() error
		}{
			{"asr", func() error { _, err := m.ASR.ForwardBatch(asr, frames, offsets); return err }},
			{"dit", func() error {
				for _, s := range dit {
					s.SetOffset(0) // stay clear of the offset reset
				}
				_, err := m.DiT.DenoiseBatch(dit, x0s, conds, tbs)
				return err
			}},
			{"vocoder", func() error { _, err := m.Vocoder.PushBatch(voc, mels); return err }},
		}
		for _, st := range stages {
			b.Run(fmt.Sprintf("%s/B=%d", st.name, n), func(b *testing.B) {
				if err := st.run(); err != nil { // compile
					b.Fatal(err)
				}
				b.ResetTimer()
				for range b.N {
					if err := st.run(); err != nil {
						b.Fatal(err)
					}
				}
				per := float64(b.Elapsed().Microseconds()) / 1000 / float64(b.N)
				b.ReportMetric(per, "ms/batch")
				b.ReportMetric(per/float64(n), "ms/stream")
			})
		}
	}
}
