package qwen3

import (
	goldendata "github.com/voxpipe/voxpipe/internal/golden"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
)

// goldenDir is the golden folder (see internal/golden).
func goldenDir(testing.TB) string { return goldendata.Root() }

type golden struct {
	model string
	cases *gguf.Model
}

func openGolden(t testing.TB) *golden {
	t.Helper()
	dir := filepath.Join(goldenDir(t), "miotts")
	mp, cp := filepath.Join(dir, "model.gguf"), filepath.Join(dir, "cases.gguf")
	for _, p := range []string{mp, cp} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("golden data not available (%v); set VOXPIPE_GOLDEN_DIR to the golden folder", err)
		}
	}
	c, err := gguf.OpenModel(cp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &golden{model: mp, cases: c}
}

func (gd *golden) f32(t testing.TB, name string) ([]float32, []int) {
	t.Helper()
	d, s, err := gd.cases.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}

func (gd *golden) i32(t testing.TB, name string) []int32 {
	t.Helper()
	v, _, err := gd.cases.GetInt32(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func loadGolden(t testing.TB) (*golden, *Model) {
	gd := openGolden(t)
	be, err := engine.NewCPU(runtime.NumCPU())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	m, err := Load(gd.model, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	// The golden tolerances are the reference's F32 arithmetic: tests of the F16 cache ask
	// for it (withKVCaches).
	if err := m.SetKVCache(engine.F32); err != nil {
		t.Fatal(err)
	}
	return gd, m
}

// relErr is max|got − want| / max|want| and the max abs error.
func relErr(got, want []float32) (rel, abs float64) {
	var peak float64
	for i := range want {
		abs = max(abs, math.Abs(float64(got[i])-float64(want[i])))
		peak = max(peak, math.Abs(float64(want[i])))
	}
	return abs / peak, abs
}

// restricted is the candidate order of the golden cases: <|s_0|>..<|s_12799|>, then EOS.
func restricted(logits []float32) []float32 {
	out := make([]float32, 0, 12801)
	out = append(out, logits[759:759+12800]...)
	return append(out, logits[758])
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

const tol = 1e-4

// kvCaches are the cache encodings the golden cases run with: F32 within the reference's
// tolerance, and F16 (the CPU default) within what rounding the cached keys and values to
// 11 significant bits (a relative 2^-11 ≈ 4.9e-4 each) gives the logits: 5.5e-4 measured
// on the golden model, so 2e-3 leaves room and still catches a wrong row or type.
var kvCaches = []struct {
	name string
	dt   engine.DType
	tol  float64
}{{"f32", engine.F32, tol}, {"f16", engine.F16, 2e-3}}

// withKVCaches runs f as a subtest for each cache encoding of m, with its tolerance.
func withKVCaches(t *testing.T, m *Model, f func(t *testing.T, tol float64)) {
	for _, kv := range kvCaches {
		t.Run(kv.name, func(t *testing.T) {
			if err := m.SetKVCache(kv.dt); err != nil {
				t.Fatal(err)
			}
			defer m.SetKVCache(engine.F32)
			f(t, kv.tol)
		})
	}
}

func TestConfigEmbedded(t *testing.T) {
	gd, m := loadGolden(t)
	_ = gd
	want := Sizes["tiny"]
	c := m.Config
	if c.Hidden != want.Hidden || c.Layers != want.Layers || c.Heads != want.Heads || c.KVHeads != want.KVHeads ||
		c.HeadDim != want.HeadDim || c.FFN != want.FFN || c.Vocab != want.Vocab || c.RopeTheta != want.RopeTheta || !c.TieEmbed {
		t.Fatalf("config %+v, want the tiny golden sizes %+v", c, want)
	}
}

func TestPrefillGolden(t *testing.T) {
	gd, m := loadGolden(t)
	withKVCaches(t, m, func(t *testing.T, tol float64) { testPrefillGolden(t, gd, m, tol) })
}

func testPrefillGolden(t *testing.T, gd *golden, m *Model, tol float64) {
	ids := gd.i32(t, "prompt.ids")
	s, err := m.NewSession(len(ids) + 24)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logits, err := s.Prefill(ids)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := gd.f32(t, "lm.prefill.logits_full")
	if len(logits) != len(want) {
		t.Fatalf("%d logits, want %d", len(logits), len(want))
	}
	rel, abs := relErr(logits, want)
	t.Logf("prefill logits_full: max abs err %.3g, rel %.3g", abs, rel)
	if rel > tol {
		t.Errorf("prefill logits: rel err %.3g > %g", rel, tol)
	}
	wantR, _ := gd.f32(t, "lm.prefill.logits_restricted")
	rel, abs = relErr(restricted(logits), wantR)
	t.Logf("prefill logits_restricted: max abs err %.3g, rel %.3g", abs, rel)
	if rel > tol {
		t.Errorf("restricted logits: rel err %.3g > %g", rel, tol)
	}
	// KV cache after prefill: [kv_head, position, head_dim], keys post-norm post-RoPE.
	c := m.Config
	for i := range c.Layers {
		for _, kv := range []struct {
			name string
			buf  []float32
		}{{"k", s.KCache(i)}, {"v", s.VCache(i)}} {
			want, _ := gd.f32(t, "lm.prefill."+kv.name+".layer"+string(rune('0'+i)))
			got := make([]float32, 0, len(want))
			for h := range c.KVHeads {
				base := h * s.maxT * c.HeadDim
				got = append(got, kv.buf[base:base+len(ids)*c.HeadDim]...)
			}
			rel, abs := relErr(got, want)
			t.Logf("layer %d %s cache: max abs err %.3g, rel %.3g", i, kv.name, abs, rel)
			if rel > tol {
				t.Errorf("layer %d %s cache: rel err %.3g > %g", i, kv.name, rel, tol)
			}
		}
	}
}

func TestGreedyGolden(t *testing.T) {
	gd, m := loadGolden(t)
	withKVCaches(t, m, func(t *testing.T, tol float64) { testGreedyGolden(t, gd, m, tol) })
}

func testGreedyGolden(t *testing.T, gd *golden, m *Model, tol float64) {
	ids := gd.i32(t, "prompt.ids")
	wantIDs := gd.i32(t, "lm.greedy.ids")
	wantLogits, shape := gd.f32(t, "lm.greedy.logits") // restricted: [s_0..s_12799, EOS]
	n := shape[1]
	s, err := m.NewSession(len(ids) + len(wantIDs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logits, err := s.Prefill(ids)
	if err != nil {
		t.Fatal(err)
	}
	var worstRel, worstAbs float64
	var got []int32
	start := time.Now()
	for step := range wantIDs {
		r := restricted(logits)
		rel, abs := relErr(r, wantLogits[step*n:(step+1)*n])
		worstRel, worstAbs = max(worstRel, rel), max(worstAbs, abs)
		if rel > tol {
			t.Errorf("step %d: restricted logits rel err %.3g > %g", step, rel, tol)
		}
		c := argmax(r)
		id := int32(759 + c)
		if c == 12800 {
			id = 758
		}
		got = append(got, id)
		if id != wantIDs[step] {
			t.Fatalf("step %d: greedy token %d, want %d (so far %v)", step, id, wantIDs[step], got)
		}
		if step == len(wantIDs)-1 {
			break
		}
		if logits, err = s.Step(id); err != nil {
			t.Fatal(err)
		}
	}
	el := time.Since(start)
	t.Logf("greedy: %d tokens match; worst per-row logits err abs %.3g rel %.3g; %d decode steps in %v (%.0f tokens/s, first use of each shape compiles)",
		len(got), worstAbs, worstRel, len(wantIDs)-1, el, float64(len(wantIDs)-1)/el.Seconds())

	// Same steps again after Reset: programs are cached, so this is the steady-state speed.
	s.Reset()
	if _, err := s.Prefill(ids); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for step := range len(wantIDs) - 1 {
		if logits, err = s.Step(wantIDs[step]); err != nil {
			t.Fatal(err)
		}
	}
	el = time.Since(start)
	r := restricted(logits)
	if id := int32(759 + argmax(r)); id != wantIDs[len(wantIDs)-1] {
		t.Errorf("after Reset: last greedy token %d, want %d", id, wantIDs[len(wantIDs)-1])
	}
	t.Logf("greedy rerun with compiled programs: %d steps in %v (%.0f tokens/s)", len(wantIDs)-1, el, float64(len(wantIDs)-1)/el.Seconds())
}

// candidateRows is the golden restricted order as vocabulary rows.
func candidateRows() []int32 {
	rows := make([]int32, 0, 12801)
	for c := range int32(12800) {
		rows = append(rows, 759+c)
	}
	return append(rows, 758)
}

// TestRestrictedHead runs the greedy case with the output head restricted to the candidates.
func TestRestrictedHead(t *testing.T) {
	gd, m := loadGolden(t)
	ids := gd.i32(t, "prompt.ids")
	wantIDs := gd.i32(t, "lm.greedy.ids")
	wantLogits, shape := gd.f32(t, "lm.greedy.logits")
	n := shape[1]
	s, err := m.NewSession(len(ids) + len(wantIDs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows := candidateRows()
	if err := s.SetOutputRows(rows); err != nil {
		t.Fatal(err)
	}
	logits, err := s.Prefill(ids)
	if err != nil {
		t.Fatal(err)
	}
	var worst float64
	for step := range wantIDs {
		if len(logits) != n {
			t.Fatalf("%d logits, want %d", len(logits), n)
		}
		rel, _ := relErr(logits, wantLogits[step*n:(step+1)*n])
		worst = max(worst, rel)
		id := rows[argmax(logits)]
		if id != wantIDs[step] {
			t.Fatalf("step %d: token %d, want %d", step, id, wantIDs[step])
		}
		if step < len(wantIDs)-1 {
			if logits, err = s.Step(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("restricted head: %d greedy tokens match, worst row rel err %.3g", len(wantIDs), worst)
	if worst > tol {
		t.Errorf("restricted logits rel err %.3g > %g", worst, tol)
	}
	// Back to the full vocabulary mid-session: the cache is kept.
	if err := s.SetOutputRows(nil); err != nil {
		t.Fatal(err)
	}
	s.Reset()
	if logits, err = s.Prefill(ids); err != nil || len(logits) != m.Config.Vocab {
		t.Fatalf("full head after restriction: %d logits, err %v", len(logits), err)
	}
	if err := s.SetOutputRows([]int32{int32(m.Config.Vocab)}); err == nil {
		t.Errorf("row outside the vocabulary: no error")
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
		"num_key_value_heads":2,"intermediate_size":128,"vocab_size":100,"rms_norm_eps":1e-6,
		"rope_theta":1e6,"eos_token_id":[7,8],"rope_scaling":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.EOSTokenID != 7 || c.HeadDim != 16 {
		t.Errorf("eos %d head_dim %d, want 7 and 16 (hidden/heads)", c.EOSTokenID, c.HeadDim)
	}
	if _, err := ParseConfig([]byte(`{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
		"num_key_value_heads":3,"head_dim":16,"intermediate_size":128,"vocab_size":100,"rms_norm_eps":1e-6,
		"rope_theta":1e6}`)); err == nil {
		t.Errorf("4 heads over 3 KV heads: no error")
	}
	if _, err := ParseConfig([]byte(`{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
		"num_key_value_heads":2,"intermediate_size":128,"vocab_size":100,"rms_norm_eps":1e-6,
		"rope_theta":1e6,"rope_scaling":{"type":"yarn"}}`)); err == nil {
		t.Errorf("rope_scaling: no error")
	}
}

// TestBindErrors checks that a config that does not fit the file is reported with full names.
func TestBindErrors(t *testing.T) {
	gd := openGolden(t)
	f, err := gguf.OpenModel(gd.model)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	cfg := Sizes["tiny"]
	cfg.FFN = 96
	if _, err := FromSource(cfg, f, be); err == nil || !strings.Contains(err.Error(), "model.layers.0.mlp.gate_proj.weight") {
		t.Errorf("wrong FFN: got %v", err)
	}
	cfg = Sizes["tiny"]
	cfg.Layers = 3
	if _, err := FromSource(cfg, f, be); err == nil || !strings.Contains(err.Error(), "model.layers.2.") {
		t.Errorf("too many layers: got %v", err)
	}
	cfg = Sizes["tiny"]
	cfg.Heads = 3
	if _, err := FromSource(cfg, f, be); err == nil {
		t.Errorf("heads not a multiple of KV heads: no error")
	}
}

// TestPrefillMatchesSteps checks that one prefill of a whole sequence and a shorter prefill
// followed by single steps (through the KV cache) give the same final logits.
func TestPrefillMatchesSteps(t *testing.T) {
	gd, m := loadGolden(t)
	ids := gd.i32(t, "prompt.ids")
	greedy := gd.i32(t, "lm.greedy.ids")
	seq := append([]int32{}, ids...)
	seq = append(seq, greedy[:8]...)
	s, err := m.NewSession(len(seq))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	full, err := s.Prefill(seq)
	if err != nil {
		t.Fatal(err)
	}
	full = append([]float32{}, full...)

	for _, split := range []int{len(ids), 5, 1} {
		s.Reset()
		last, err := s.Prefill(seq[:split])
		if err != nil {
			t.Fatal(err)
		}
		// Mix: a multi-token chunk in the middle, then single steps.
		i := split
		if i+3 < len(seq)-1 {
			if last, err = s.Prefill(seq[i : i+3]); err != nil {
				t.Fatal(err)
			}
			i += 3
		}
		for ; i < len(seq); i++ {
			if last, err = s.Step(seq[i]); err != nil {
				t.Fatal(err)
			}
		}
		rel, abs := relErr(last, full)
		t.Logf("prefill %d + steps vs one prefill of %d: max abs err %.3g, rel %.3g", split, len(seq), abs, rel)
		if rel > 1e-5 {
			t.Errorf("split %d: rel err %.3g", split, rel)
		}
	}
	if _, err := s.Step(1); err == nil {
		t.Errorf("step past the cache size: no error")
	}
}

// TestRealSize times decode on a random-weight model file (VOXPIPE_QWEN3_MODEL, e.g. made by
// `voxpipe mkmodel --family miotts --size 0.6b`); skipped without it.
func TestRealSize(t *testing.T) {
	path := os.Getenv("VOXPIPE_QWEN3_MODEL")
	if path == "" {
		t.Skip("set VOXPIPE_QWEN3_MODEL to a MioTTS LM GGUF to time a real-size model")
	}
	be, err := engine.NewCPU(runtime.NumCPU())
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	start := time.Now()
	m, err := Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	t.Logf("loaded %+v in %v", m.Config, time.Since(start))
	prompt := make([]int32, 32)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	const steps = 16
	s, err := m.NewSession(len(prompt) + steps)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tp := range [][2]int{{len(prompt), 0}, {1, len(prompt)}} {
		start = time.Now()
		st, err := s.ProgramStats(tp[0], tp[1])
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("program T=%d p=%d: built and compiled in %v: %+v", tp[0], tp[1], time.Since(start), st)
	}
	rows := make([]int32, 12801) // timing only: any 12801 rows stand in for the speech tokens
	for i := range rows {
		rows[i] = int32(m.Config.Vocab - len(rows) + i)
	}
	for round := range 3 {
		what := map[int]string{0: "full head, compiling", 1: "full head, cached programs", 2: "12801-row head, compiling"}[round]
		if round == 2 {
			if err := s.SetOutputRows(rows); err != nil {
				t.Fatal(err)
			}
		}
		s.Reset()
		start = time.Now()
		logits, err := s.Prefill(prompt)
		if err != nil {
			t.Fatal(err)
		}
		pre := time.Since(start)
		start = time.Now()
		for range steps {
			if logits, err = s.Step(int32(argmax(logits))); err != nil {
				t.Fatal(err)
			}
		}
		el := time.Since(start)
		t.Logf("round %d (%s): prefill %d tokens %v; %d steps %v = %.1f ms/token", round, what,
			len(prompt), pre, steps, el, float64(el.Milliseconds())/steps)
	}
}
