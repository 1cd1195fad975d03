package meanvc2

import (
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
