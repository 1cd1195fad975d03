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
