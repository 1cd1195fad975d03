package meanvc2

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/vulkantest"
)

// TestDenoiseBatchMatchesAlone: DiT steps of several states run as one batch give each state
// bit for bit its mel frames and caches alone — states at different positions (one across
// the offset reset), with different voices, in batches of changing size — and refused
// batches change nothing.
func TestDenoiseBatchMatchesAlone(t *testing.T) {
	sp := newStepper(t)
	c := sp.d.Config
	nc, nx := c.Window()*c.BNDim, c.Window()*c.MelDim
	steps := len(sp.cond) / nc
	other := sp.timbre
	other.Spk = slices.Clone(other.Spk)
	for i := range other.Spk {
		other.Spk[i] *= -0.5
	}
	const n = 4
	voice := func(s int) Timbre { return [...]Timbre{sp.timbre, other}[s%2] }
	step := func(s, j int) int { return (j + s) % steps } // the golden step stream s runs at its j-th step
	start := func(st *State, s int) {
		if s == 3 {
			st.SetOffset(c.OffsetReset - c.ChunkSize) // resets at its second step
		}
	}
	const rounds = 5
	var want [n][rounds][]float32
	for s := range n {
		st := sp.d.NewState()
		start(st, s)
		for j := range rounds {
			k := step(s, j)
			mel, err := st.Denoise(sp.noise[k*nx:(k+1)*nx], sp.cond[k*nc:(k+1)*nc], voice(s))
			if err != nil {
				t.Fatal(err)
			}
			want[s][j] = slices.Clone(mel)
		}
	}
	states := make([]*State, n)
	for s := range states {
		states[s] = sp.d.NewState()
		start(states[s], s)
	}
	for j := range rounds {
		b := 1 + j%n // batch sizes 1, 2, 3, 4, 1: the rest run alone
		var x0s, conds [][]float32
		var voices []Timbre
		for s := range n {
			k := step(s, j)
			x0s, conds, voices = append(x0s, sp.noise[k*nx:(k+1)*nx]), append(conds, sp.cond[k*nc:(k+1)*nc]), append(voices, voice(s))
		}
		mels, err := sp.d.DenoiseBatch(states[:b], x0s[:b], conds[:b], voices[:b])
		if err != nil {
			t.Fatal(err)
		}
		for s := b; s < n; s++ {
			mel, err := states[s].Denoise(x0s[s], conds[s], voices[s])
			if err != nil {
				t.Fatal(err)
			}
			mels = append(mels, mel)
		}
		for s := range n {
			if !slices.Equal(mels[s], want[s][j]) {
				t.Fatalf("step %d of state %d in a batch of %d differs from the state alone (rel %.3g)", j, s, b, rel(mels[s], want[s][j]))
			}
		}
	}
	k0, _, _, _ := states[0].KV(0)
	x0, cond := sp.noise[:nx], sp.cond[:nc]
	traced := sp.d.NewState()
	traced.SetTrace(true)
	for _, bad := range []struct {
		what   string
		states []*State
		conds  [][]float32
	}{
		{"a state twice", []*State{states[0], states[0]}, [][]float32{cond, cond}},
		{"a traced state among others", []*State{states[0], traced}, [][]float32{cond, cond}},
		{"a short condition", []*State{states[0], states[1]}, [][]float32{cond, cond[1:]}},
	} {
		if _, err := sp.d.DenoiseBatch(bad.states, [][]float32{x0, x0}, bad.conds, []Timbre{sp.timbre, sp.timbre}); err == nil {
			t.Errorf("%s: no error", bad.what)
		}
	}
	if k, _, _, _ := states[0].KV(0); !slices.Equal(k, k0) {
		t.Error("a refused batch changed a cache")
	}
}

// TestStreamsBatchMatchAlone: streams fed in lockstep from several goroutines share batched
// ASR windows and DiT+vocoder steps (BatchStats shows batches of more than one), and every
// stream's audio is bit for bit what it gets alone — streams with their own seeds, voices
// and inputs, one joining late, on both golden variants.
func TestStreamsBatchMatchAlone(t *testing.T) {
	for _, folder := range []string{Family, "meanvc2_40ms"} {
		t.Run(folder, func(t *testing.T) {
			testStreamsBatchMatchAlone(t, folder, cpu(t))
		})
	}
}

// The same on Vulkan (lavapipe in CI), for the 120 ms model: batching works on both
// backends, and a batched stream's audio is bit for bit its own there too.
func TestStreamsBatchMatchAloneVulkan(t *testing.T) {
	vulkantest.Require(t)
	be, err := engine.NewVulkan(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close) // after the model's own cleanup
	testStreamsBatchMatchAlone(t, Family, be)
}

func testStreamsBatchMatchAlone(t *testing.T, folder string, be engine.Backend) {
	m, target, src := goldenVariantOn(t, folder, be)
	spk := slices.Clone(target.Spk)
	for i := range spk {
		spk[i] *= -0.5
	}
	other, err := m.Timbre(spk)
	if err != nil {
		t.Fatal(err)
	}
	const n, piece = 4, 320
	input := func(s int) []float32 { return src[s*400:] }
	voice := func(s int) Timbre { return [...]Timbre{target, other}[s%2] }
	want := make([][]float32, n)
	ss := make([]*Stream, n)
	for s := range ss {
		ss[s] = newStream(t, m, voice(s))
		ss[s].Seed(uint64(s + 1))
		want[s] = byPieces(t, ss[s], input(s), piece)
	}
	before := m.BatchStats()
	over0 := make([]time.Duration, n)
	for s := range n {
		over0[s] = ss[s].Overcharge()
	}
	wall := make([]time.Duration, n)
	// Round r: every stream that has started writes its next piece, all at once; the
	// model is held for a moment while they start, so their jobs queue together.
	got := make([][]float32, n)
	errs := make([]error, n)
	const late = 5 // stream 0 joins at round 5
	var wg sync.WaitGroup
	for r := 0; ; r++ {
		active := false
		m.exec.Lock()
		for s := range n {
			k := r
			if s == 0 {
				k = r - late
			}
			in := input(s)
			pieces := (len(in) + piece - 1) / piece
			if k < 0 || k >= pieces || errs[s] != nil {
				continue
			}
			active = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				defer func() { wall[s] += time.Since(t0) }()
				got[s], errs[s] = ss[s].Write(got[s], in[k*piece:min((k+1)*piece, len(in))])
				if k == pieces-1 && errs[s] == nil {
					got[s], errs[s] = ss[s].Flush(got[s])
				}
			}()
		}
		time.Sleep(time.Millisecond)
		m.exec.Unlock()
		wg.Wait()
		if !active {
			break
		}
	}
	for s := range n {
		if errs[s] != nil {
			t.Fatal(errs[s])
		}
		sameSamples(t, "batched stream", got[s], want[s])
	}
	st := m.BatchStats()
	asr, steps := st.ASRWindows-before.ASRWindows, st.Steps-before.Steps
	asrB, stepB := st.ASRBatches-before.ASRBatches, st.StepBatches-before.StepBatches
	t.Logf("%d ASR windows in %d batches, %d steps in %d batches", asr, asrB, steps, stepB)
	if asr <= asrB || steps <= stepB {
		t.Errorf("no batching: %d ASR windows in %d batches, %d steps in %d batches", asr, asrB, steps, stepB)
	}
	// What the streams' calls cost (wall less overcharge) holds every batch's run on
	// the cores it used, plus at most their host work: not the time they waited.
	var own, total time.Duration
	for s := range n {
		own += wall[s] - (ss[s].Overcharge() - over0[s])
		total += wall[s]
	}
	busy, holds := st.Busy-before.Busy, time.Duration(m.holds)
	t.Logf("calls %v, their own cost %v, batches ran %v on %d cores", total, own, busy, holds)
	if slack := time.Millisecond; own < holds*busy-slack || own > holds*busy+total-busy+slack {
		t.Errorf("the calls' own cost %v is outside [%v, %v]: batches ran %v on %d cores, the calls took %v", own, holds*busy, holds*busy+total-busy, busy, holds, total)
	}
}

// TestBatchedPanicFailsOnlyThatStep: a panic inside a batched run (here a stream whose DiT
// caches were lost, a bug the model cannot check for) fails that step with an error naming
// where it happened; the process goes on, and another stream of the model still converts.
func TestBatchedPanicFailsOnlyThatStep(t *testing.T) {
	m, target, src := goldenVariant(t, Family)
	broken := newStream(t, m, target)
	broken.dit.kc = nil // as a use after Close would leave it, without Close's error
	_, err := broken.Write(nil, src)
	if err == nil || !strings.Contains(err.Error(), "DiT step 0: meanvc2: panic in a batched run at ") || !strings.Contains(err.Error(), ".go:") {
		t.Fatalf("broken stream: err %v, want a located panic in the DiT step", err)
	}
	t.Log(err)
	ok := newStream(t, m, target)
	out, err := ok.Write(nil, src)
	if err != nil || len(out) == 0 {
		t.Fatalf("another stream after the panic: %d samples, err %v", len(out), err)
	}
}
