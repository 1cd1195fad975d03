package wavlm

import (
	"testing"

	"github.com/voxpipe/voxpipe/engine"
)

// The planner on WavLM-Large's real graph at 10 and 30 s: a valid plan (PlanStatsOf checks
// every pair of live tensors) whose arena is a small part of the naive sum.
func TestPlannerOnWavLMLarge(t *testing.T) {
	c := RealLarge()
	for _, secs := range []int{10, 30} {
		g, err := PlannerGraph(c, secs*16000)
		if err != nil {
			t.Fatal(err)
		}
		st, err := engine.PlanStatsOf(g)
		if err != nil {
			t.Fatal(err)
		}
		ratio := float64(st.ArenaBytes) / float64(st.NaiveBytes)
		t.Logf("%2d s: %d nodes, arena %.1f MB, naive %.1f MB (%.1f%%), persistent %.1f MB",
			secs, st.Nodes, float64(st.ArenaBytes)/1e6, float64(st.NaiveBytes)/1e6, 100*ratio, float64(st.PersistentBytes)/1e6)
		goal := map[int]float64{10: 0.25, 30: 0.15}[secs]
		if ratio > goal {
			t.Errorf("%d s: arena is %.1f%% of naive, goal ≤ %.0f%%", secs, 100*ratio, 100*goal)
		}
		// Weights and the dense relative bias: the planner only places what is not persistent.
		frames := int64(c.Frames(secs * 16000))
		if bias := 4 * int64(c.Heads) * frames * frames; st.PersistentBytes < bias {
			t.Errorf("%d s: persistent %d bytes, less than the relative bias alone (%d)", secs, st.PersistentBytes, bias)
		}
	}
	if _, err := PlannerGraph(c, 100); err == nil {
		t.Error("100 samples (no frame) accepted")
	}
}
