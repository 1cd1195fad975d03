package meanvc2

import (
	"math"
	"slices"
	"testing"
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
