package qwen3

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/vulkantest"
)

// TestStepBatchMatchesSteps runs sessions at different positions through StepBatch — one
// leaving, another joining, batches of 1 to 3 — and compares every session's logits with the
// same tokens fed to a session of its own by Step, for F32, F16 and Q8_0 weights, F16 (the
// CPU default) and F32 caches, and with the restricted output head MioTTS uses. The stated tolerance is the kernels' rounding
// (a product of several rows may sum in another order than one row's).
func TestStepBatchMatchesSteps(t *testing.T) {
	be, err := engine.NewCPU(runtime.NumCPU())
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	testStepBatchMatchesSteps(t, be, nil)
}

// On Vulkan (lavapipe in CI) the batched steps match single steps too, with the weights
// in F32 and in Q8_0 (its Linear shaders for a few rows) and the restricted head.
func TestStepBatchMatchesStepsVulkan(t *testing.T) {
	vulkantest.Require(t)
	be, err := engine.NewVulkan(0)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	testStepBatchMatchesSteps(t, be, []string{"f32-restricted", "q8_0"})
}

// testStepBatchMatchesSteps runs the cases named in only (nil: all) on be.
func testStepBatchMatchesSteps(t *testing.T, be engine.Backend, only []string) {
	gd, f, cfg := openGoldenSource(t)
	prompt := gd.i32(t, "prompt.ids")
	greedy := gd.i32(t, "lm.greedy.ids")
	rows := make([]int32, 0, 12801)
	for i := range int32(12800) {
		rows = append(rows, 759+i)
	}
	rows = append(rows, 758)

	for _, c := range []struct {
		name   string
		src    func() (*Model, error)
		head   []int32
		maxRel float64
	}{
		{"f32", func() (*Model, error) { return FromSource(cfg, f, be) }, nil, 1e-5},
		{"f32-restricted", func() (*Model, error) { return FromSource(cfg, f, be) }, rows, 1e-5},
		{"f32-cache-f32", func() (*Model, error) {
			m, err := FromSource(cfg, f, be)
			if err == nil {
				err = m.SetKVCache(engine.F32)
			}
			return m, err
		}, rows, 1e-5},
		{"f16", func() (*Model, error) { return FromSource(cfg, quantSource{f, gguf.F16}, be) }, rows, 1e-4},
		{"q8_0", func() (*Model, error) { return FromSource(cfg, quantSource{f, gguf.Q8_0}, be) }, rows, 1e-4},
	} {
		if only != nil && !slices.Contains(only, c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			m, err := c.src()
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			open := func(prefix int) (*Session, *Session) {
				var pair [2]*Session
				for i := range pair {
					s, err := m.NewSession(len(prompt) + 32)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(s.Close)
					if err := s.SetOutputRows(c.head); err != nil {
						t.Fatal(err)
					}
					if _, err := s.Prefill(prompt[:prefix]); err != nil {
						t.Fatal(err)
					}
					pair[i] = s
				}
				return pair[0], pair[1] // batched, reference
			}
			type stream struct {
				batched, ref *Session
				next         int // index into greedy of its next token
			}
			// Three prompts of different lengths, so the sessions sit at different positions
			// (and, for the long one, in another cache bucket after a few steps).
			var streams []*stream
			for _, p := range []int{len(prompt), 5, 9} {
				b, r := open(p)
				streams = append(streams, &stream{batched: b, ref: r})
			}
			worst := 0.0
			active := []*stream{streams[0], streams[1]}
			for step := range 12 {
				switch step {
				case 3:
					active = append(active, streams[2]) // joins
				case 7:
					active = []*stream{active[0], active[2]} // streams[1] leaves
				case 10:
					active = active[1:] // one alone: its own Step program
				}
				order := slices.Clone(active)
				if step%2 == 1 {
					slices.Reverse(order) // any order of the same sessions
				}
				ss := make([]*Session, len(order))
				ids := make([]int32, len(order))
				for i, st := range order {
					ss[i], ids[i] = st.batched, greedy[st.next%len(greedy)]
				}
				got, err := m.StepBatch(ss, ids)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				for i, st := range order {
					want, err := st.ref.Step(ids[i])
					if err != nil {
						t.Fatal(err)
					}
					if st.batched.Pos() != st.ref.Pos() {
						t.Fatalf("step %d: position %d, want %d", step, st.batched.Pos(), st.ref.Pos())
					}
					rel, abs := relErr(got[i], want)
					worst = max(worst, rel)
					if rel > c.maxRel || argmax(got[i]) != argmax(want) {
						t.Errorf("step %d, session %d of %d: rel err %.3g (abs %.3g), argmax %d vs %d", step, i, len(active), rel, abs, argmax(got[i]), argmax(want))
					}
					st.next++
				}
			}
			t.Logf("%s: worst rel err of batched vs single steps %.3g (tolerance %.0e)", c.name, worst, c.maxRel)
		})
	}
}

// TestStepBatchOrderSharesAProgram: the same sessions in another order run the program
// compiled for them, not a new one.
func TestStepBatchOrderSharesAProgram(t *testing.T) {
	gd, f, cfg := openGoldenSource(t)
	prompt := gd.i32(t, "prompt.ids")
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	m, err := FromSource(cfg, f, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var ss []*Session
	for range 3 {
		s, err := m.NewSession(len(prompt) + 8)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Prefill(prompt[:4]); err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	for _, order := range [][]int{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}} {
		batch := []*Session{ss[order[0]], ss[order[1]], ss[order[2]]}
		if _, err := m.StepBatch(batch, []int32{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.batch.Len(); n != 1 {
		t.Errorf("%d batch programs for one set of sessions in three orders, want 1", n)
	}
}

// TestStepBatchErrors: what cannot run together is refused with an error, before any cache
// is written.
func TestStepBatchErrors(t *testing.T) {
	_, m := loadGolden(t)
	mk := func(n int) *Session {
		s, err := m.NewSession(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	a, b, full := mk(8), mk(8), mk(1)
	if _, err := full.Step(1); err != nil {
		t.Fatal(err)
	}
	other := mk(8)
	if err := other.SetOutputRows([]int32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	closed := mk(8)
	closed.Close()
	for name, c := range map[string]struct {
		ss  []*Session
		ids []int32
	}{
		"empty":           {nil, nil},
		"ids mismatch":    {[]*Session{a, b}, []int32{1}},
		"twice":           {[]*Session{a, a}, []int32{1, 2}},
		"other head":      {[]*Session{a, other}, []int32{1, 2}},
		"closed":          {[]*Session{a, closed}, []int32{1, 2}},
		"cache full":      {[]*Session{a, full}, []int32{1, 2}},
		"id out of range": {[]*Session{a, b}, []int32{1, int32(m.Config.Vocab)}},
	} {
		if _, err := m.StepBatch(c.ss, c.ids); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if a.Pos() != 0 || b.Pos() != 0 {
		t.Errorf("a refused batch moved the sessions: positions %d, %d", a.Pos(), b.Pos())
	}
	// Closing a session drops the batch programs over its caches.
	if _, err := m.StepBatch([]*Session{a, b}, []int32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if n := m.batch.Len(); n != 1 {
		t.Fatalf("%d batch programs, want 1", n)
	}
	b.Close()
	if n := m.batch.Len(); n != 0 {
		t.Errorf("%d batch programs after closing a session of the batch, want 0", n)
	}
}

// BenchmarkStepBatch times decode steps of 1, 2, 4 and 8 sessions stepping together on a
// real-size model (VOXPIPE_QWEN3_MODEL, e.g. `voxpipe mkmodel --family miotts --size 0.6b
// --dtype q8_0`), with the 12801-row head MioTTS uses, each session 64 tokens into its
// cache: tokens/s over all sessions, per session, and the compile time of a batch program.
func BenchmarkStepBatch(b *testing.B) {
	path := os.Getenv("VOXPIPE_QWEN3_MODEL")
	if path == "" {
		b.Skip("set VOXPIPE_QWEN3_MODEL to a MioTTS LM GGUF")
	}
	be, err := engine.NewCPU(runtime.NumCPU())
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	m, err := Load(path, be)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	rows := make([]int32, 12801) // any 12801 rows stand in for the speech tokens
	for i := range rows {
		rows[i] = int32(m.Config.Vocab - len(rows) + i)
	}
	prompt := make([]int32, 64)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			ss := make([]*Session, n)
			ids := make([]int32, n)
			for i := range ss {
				s, err := m.NewSession(256)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				if err := s.SetOutputRows(rows); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Prefill(prompt); err != nil {
					b.Fatal(err)
				}
				ss[i], ids[i] = s, int32(200+i)
			}
			t0 := time.Now()
			if _, err := m.StepBatch(ss, ids); err != nil { // compiles
				b.Fatal(err)
			}
			compile := time.Since(t0)
			b.ResetTimer()
			for range b.N {
				for _, s := range ss {
					s.pos = len(prompt) + 1 // the same cache bucket every step
				}
				if _, err := m.StepBatch(ss, ids); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			perStep := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(float64(n)/perStep, "tokens/s")
			b.ReportMetric(1/perStep, "tokens/s/session")
			b.ReportMetric(float64(compile.Microseconds())/1000, "first_step_ms")
		})
	}
}
