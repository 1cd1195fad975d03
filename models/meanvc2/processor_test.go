package meanvc2

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

// golden loads the whole golden model, the reference's target voice and a source signal:
// input.src_wav followed by its first 2200 samples (a last short chunk long enough to give an
// ASR window).
func golden(t *testing.T) (*Model, Timbre, []float32) {
	t.Helper()
	return goldenVariant(t, Family)
}

// goldenVariant is golden for one golden folder: meanvc2 (the 120 ms model) or meanvc2_40ms.
func goldenVariant(t *testing.T, folder string) (*Model, Timbre, []float32) {
	t.Helper()
	return goldenVariantOn(t, folder, cpu(t))
}

// goldenVariantOn is goldenVariant with the model on be.
func goldenVariantOn(t *testing.T, folder string, be engine.Backend) (*Model, Timbre, []float32) {
	t.Helper()
	r := paritytest.Open(t, folder)
	m, err := Load(r.ModelPath(), be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	target := goldenTarget(t, r, m)
	src, _, err := r.Cases.Get("input.src_wav")
	if err != nil {
		t.Fatal(err)
	}
	return m, target, append(slices.Clone(src), src[:2200]...)
}

// goldenTarget is the golden case's target voice (its speaker embedding) for m.
func goldenTarget(t *testing.T, r *parity.Run, m *Model) Timbre {
	t.Helper()
	spk, _, err := r.Cases.Get("spk.embedding")
	if err != nil {
		t.Fatal(err)
	}
	target, err := m.Timbre(spk)
	if err != nil {
		t.Fatal(err)
	}
	return target
}

func newStream(t *testing.T, m *Model, target Timbre) *Stream {
	t.Helper()
	s, err := m.NewStream(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// byChunks runs whole chunks through Process, the rest through Write, then Flush.
func byChunks(t *testing.T, s *Stream, in []float32) []float32 {
	t.Helper()
	var out []float32
	var err error
	n := s.ChunkSize()
	for len(in) >= n {
		if out, err = s.Process(out, in[:n]); err != nil {
			t.Fatal(err)
		}
		in = in[n:]
	}
	if out, err = s.Write(out, in); err != nil {
		t.Fatal(err)
	}
	if out, err = s.Flush(out); err != nil {
		t.Fatal(err)
	}
	return out
}

// byPieces writes the input in pieces of the given sizes (cycled), then Flushes.
func byPieces(t *testing.T, s *Stream, in []float32, sizes ...int) []float32 {
	t.Helper()
	var out []float32
	var err error
	for i := 0; len(in) > 0; i++ {
		k := min(sizes[i%len(sizes)], len(in))
		if out, err = s.Write(out, in[:k]); err != nil {
			t.Fatal(err)
		}
		in = in[k:]
	}
	if out, err = s.Flush(out); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSamples(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d samples, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: sample %d is %v, want %v (bit-exact)", what, i, got[i], want[i])
		}
	}
}

// The output does not depend on how the input is cut: 20 ms pieces, odd sizes, single
// samples at the start and one large write give the 160 ms chunks' output bit for bit.
func TestWriteAnyPieces(t *testing.T) {
	for _, folder := range variants {
		t.Run(folder, func(t *testing.T) { testWriteAnyPieces(t, folder) })
	}
}

// variants are the golden folders of the two published models.
var variants = []string{Family, Family + "_40ms"}

func testWriteAnyPieces(t *testing.T, folder string) {
	m, target, src := goldenVariant(t, folder)
	s := newStream(t, m, target)
	want := byChunks(t, s, src)
	if len(want) == 0 {
		t.Fatal("no output")
	}
	for _, tc := range []struct {
		name  string
		sizes []int
	}{
		{"20ms", []int{320}},
		{"odd", []int{1, 777, 3001, 13, 2559, 2561}},
		{"primes", []int{127, 1021}},
		{"whole", []int{len(src)}},
		{"20ms spread", []int{320}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.SpreadSteps(strings.HasSuffix(tc.name, "spread"))
			defer s.SpreadSteps(false)
			sameSamples(t, tc.name, byPieces(t, s, src, tc.sizes...), want)
		})
	}
	// Flush reset the stream: the same input again gives the same output.
	sameSamples(t, "after flush", byChunks(t, s, src), want)
}

// Reset in the middle of a stream forgets everything, noise generator included.
func TestResetReproduces(t *testing.T) {
	m, target, src := golden(t)
	s := newStream(t, m, target)
	want := byChunks(t, s, src)
	if _, err := s.Write(nil, src[:7000]); err != nil {
		t.Fatal(err)
	}
	s.Reset()
	sameSamples(t, "after reset", byChunks(t, s, src), want)
}

// Two streams interleaved chunk by chunk (different voices and seeds) give what each gives
// alone: no state is shared but the weights.
func TestStreamsInterleaved(t *testing.T) {
	m, target, src := golden(t)
	other := target
	other.Spk = slices.Clone(target.Spk)
	for i := range other.Spk {
		other.Spk[i] = -other.Spk[i] * 0.7
	}
	other, err := m.Timbre(other.Spk)
	if err != nil {
		t.Fatal(err)
	}
	a, b := newStream(t, m, target), newStream(t, m, other)
	b.Seed(7)
	wantA, wantB := byChunks(t, a, src), byChunks(t, b, src)
	if slices.Equal(wantA, wantB) {
		t.Fatal("different voices and seeds gave the same output")
	}
	var gotA, gotB []float32
	n := a.ChunkSize()
	for i := 0; i+n <= len(src); i += n {
		if gotA, err = a.Process(gotA, src[i:i+n]); err != nil {
			t.Fatal(err)
		}
		if gotB, err = b.Process(gotB, src[i:i+n]); err != nil {
			t.Fatal(err)
		}
	}
	rest := src[len(src)/n*n:]
	for _, p := range []struct {
		s   *Stream
		out *[]float32
	}{{a, &gotA}, {b, &gotB}} {
		if *p.out, err = p.s.Write(*p.out, rest); err != nil {
			t.Fatal(err)
		}
	}
	if gotA, err = a.Flush(gotA); err != nil {
		t.Fatal(err)
	}
	if gotB, err = b.Flush(gotB); err != nil {
		t.Fatal(err)
	}
	sameSamples(t, "stream a", gotA, wantA)
	sameSamples(t, "stream b", gotB, wantB)
}

// SetTarget changes the voice from the next step on; what was emitted before is unchanged.
func TestSetTarget(t *testing.T) {
	m, target, src := golden(t)
	spk := slices.Clone(target.Spk)
	for i := range spk {
		spk[i] *= -1
	}
	other, err := m.Timbre(spk)
	if err != nil {
		t.Fatal(err)
	}
	s := newStream(t, m, target)
	n := s.ChunkSize()
	run := func(switchAt int) []float32 {
		var out []float32
		for i := 0; i+n <= len(src); i += n {
			if i == switchAt*n {
				if err := s.SetTarget(other); err != nil {
					t.Fatal(err)
				}
			}
			if out, err = s.Process(out, src[i:i+n]); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.SetTarget(target); err != nil {
			t.Fatal(err)
		}
		s.Reset()
		return out
	}
	base := run(-1)
	var before []float32
	for i := 0; i < 4*n; i += n {
		if before, err = s.Process(before, src[i:i+n]); err != nil {
			t.Fatal(err)
		}
	}
	s.Reset()
	switched := run(4)
	k := len(before)
	sameSamples(t, "before the switch", switched[:k], base[:k])
	if slices.Equal(switched[k:], base[k:]) {
		t.Error("the output after SetTarget did not change")
	}
	if err := s.SetTarget(Timbre{Spk: spk}); err == nil || !strings.Contains(err.Error(), "target voice") {
		t.Errorf("SetTarget with no memory: %v", err)
	}
}

func TestProcessRejects(t *testing.T) {
	m, target, src := golden(t)
	s := newStream(t, m, target)
	if _, err := s.Process(nil, src[:100]); err == nil || !strings.Contains(err.Error(), "2560") {
		t.Errorf("short chunk: %v", err)
	}
	bad := slices.Clone(src[:s.ChunkSize()])
	bad[5] = float32(math.NaN())
	if _, err := s.Process(nil, bad); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("NaN input: %v", err)
	}
	if _, err := s.Write(nil, src[:10]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Process(nil, src[:s.ChunkSize()]); err == nil || !strings.Contains(err.Error(), "buffered") {
		t.Errorf("Process after a partial Write: %v", err)
	}
	if _, err := m.NewStream(Timbre{}); err == nil {
		t.Error("NewStream without a voice")
	}
}

// onset predicts the first output sample that input sample k can change, from the
// pipeline's bookkeeping: the fbank frames covering k (each chunk is prefixed with the
// cached samples), the first ASR window holding one of them (the first window takes Window
// frames, later ones the carried frames plus Stride new), its condition frames, the first DiT
// step whose window reaches them, and where that step's audio starts (its first sample is
// the previous tail crossfaded with weight 0 for the new decode).
func onset(m *Model, k int) int {
	a, c := m.ASR.Config, m.Config
	hop := fbankShift(a)
	frameLen := int(float64(a.Fbank.SampleRate)*a.Fbank.FrameLengthMs*0.001 + 0.5)
	pre := a.Stream.SamplesCacheLen
	g := (k + pre - frameLen + 1 + hop - 1) / hop // first frame g with g·hop−pre+frameLen > k
	g = max(g, 0)
	w := 0
	if g >= a.Stream.Window {
		w = g / a.Stream.Stride
	}
	firstCond := w * c.Runtime.VCChunkFrames
	j := max(0, (firstCond-c.Window()+1+c.ChunkSize-1)/c.ChunkSize)
	if j == 0 {
		return 0
	}
	first := (c.ChunkSize-1)*hop - m.Vocoder.Config.WavOverlap
	return first + (j-1)*c.ChunkSize*hop + 1
}

// The dependency onset of an impulse, measured on the golden model, is where the pipeline's
// bookkeeping puts it; those are the same frame mappings Latency is built from.
func TestLatency(t *testing.T) {
	m, target, src := golden(t)
	if got := m.Latency(); got != 720+3*160+3*160 {
		t.Errorf("Latency %d, want 1680 for the 120 ms model", got)
	}
	s := newStream(t, m, target)
	base := byChunks(t, s, src)
	for _, k := range []int{100, 2559, 2561, 4000, 5000, 7000, 9000, 12345, 15000, 17000} {
		in := slices.Clone(src)
		in[k] += 0.25
		out := byChunks(t, s, in)
		got := len(out)
		for i := range min(len(out), len(base)) {
			if out[i] != base[i] {
				got = i
				break
			}
		}
		want := onset(m, k)
		t.Logf("impulse at %5d: first changed output sample %5d (predicted %5d); its content is at %5d", k, got, want, k+m.Latency())
		// Nothing before the predicted sample may change. The first changed one is that
		// sample or a little later, within the step's crossfade: an impulse that reaches the
		// step only through its lookahead frames can round away where the new decode
		// still has a tiny weight.
		if got < want || got >= want+m.Vocoder.Config.WavOverlap {
			t.Errorf("impulse at %d: first changed output sample %d, predicted %d", k, got, want)
		}
		if k >= s.ChunkSize() && got > k+m.Latency() {
			t.Errorf("impulse at %d changed nothing before sample %d, after its aligned position %d", k, got, k+m.Latency())
		}
	}
}

// The output falls behind the input by at most OutputSlack samples, and reaches it.
func TestOutputSlack(t *testing.T) {
	for _, tc := range []struct {
		folder string
		want   int
	}{{Family, 2240}, {Family + "_40ms", 960}} {
		t.Run(tc.folder, func(t *testing.T) { testOutputSlack(t, tc.folder, tc.want) })
	}
}

func testOutputSlack(t *testing.T, folder string, wantSlack int) {
	m, target, src := goldenVariant(t, folder)
	if got := m.Latency(); got != 1680 {
		t.Errorf("Latency %d, want 1680 (both models align the same way)", got)
	}
	s := newStream(t, m, target)
	var out []float32
	var err error
	slack := 0
	n := s.ChunkSize()
	for i := 0; i+n <= len(src); i += n {
		if out, err = s.Process(out, src[i:i+n]); err != nil {
			t.Fatal(err)
		}
		slack = max(slack, i+n-len(out))
	}
	if want := m.OutputSlack(); slack != want || want != wantSlack {
		t.Errorf("measured slack %d, OutputSlack %d (want %d)", slack, want, wantSlack)
	}
}

// Load refuses incomplete or foreign files, naming what is wrong.
func TestLoadErrors(t *testing.T) {
	_, f := goldenModel(t)
	be := cpu(t)
	for _, tc := range []struct {
		name, drop, family string
		want               []string
	}{
		{"family", "", "miotts", []string{"family", "miotts"}},
		{"wavlm tensor", "speaker_wavlm/encoder.layers.1.fc1.weight", Family, []string{"speaker_wavlm/", "encoder.layers.1.fc1.weight"}},
		{"asr tensor", "asr/encoder.after_norm.weight", Family, []string{"asr/", "encoder.after_norm.weight"}},
		{"vocos tensor", "vocos/head.out.weight", Family, []string{"vocos/", "head.out.weight"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeModel(t, f, tc.drop, "", nil, tc.family)
			m, err := Load(p, be)
			if err == nil {
				m.Close()
				t.Fatal("loaded a bad model")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			t.Log(err)
		})
	}
	t.Run("namespace", func(t *testing.T) {
		// A file without the ECAPA head at all.
		var keep []gguf.WriteTensor
		for _, mt := range f.Tensors() {
			if strings.HasPrefix(mt.Name, "speaker_ecapa/") {
				continue
			}
			data, sh, err := f.Get(mt.Name)
			if err != nil {
				t.Fatal(err)
			}
			keep = append(keep, gguf.WriteTensor{Name: mt.Name, Shape: sh, Data: data})
		}
		p := writeTensors(t, f, keep, "")
		m, err := Load(p, be)
		if err == nil {
			m.Close()
			t.Fatal("loaded a file without speaker_ecapa/")
		}
		if !strings.Contains(err.Error(), "speaker_ecapa/") {
			t.Errorf("error %q does not name the namespace", err)
		}
		t.Log(err)
	})
}

// writeTensors packages ts with m's metadata and config into a temporary file, with the
// family changed when family is not "".
func writeTensors(t *testing.T, m *gguf.Model, ts []gguf.WriteTensor, family string) string {
	t.Helper()
	kv := gguf.KV{}
	for _, k := range []string{"general.architecture", "general.name", "audiocpp.model_spec.family"} {
		kv[k] = m.File.KV[k]
	}
	if family != "" {
		if err := kv.Set("audiocpp.model_spec.family", family); err != nil {
			t.Fatal(err)
		}
	}
	var files []gguf.EmbeddedFile
	if raw, ok := m.EmbeddedFile("config.json"); ok {
		files = append(files, gguf.EmbeddedFile{Name: "config.json", Data: raw})
	}
	p := filepath.Join(t.TempDir(), "partial.gguf")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := gguf.WritePackaged(f, kv, ts, files); err != nil {
		t.Fatal(err)
	}
	return p
}

// Streams of one model on several goroutines at once give what each gives alone.
func TestStreamsConcurrent(t *testing.T) {
	m, target, src := golden(t)
	const n = 4
	want := make([][]float32, n)
	ss := make([]*Stream, n)
	for i := range ss {
		ss[i] = newStream(t, m, target)
		ss[i].Seed(uint64(i + 1))
		want[i] = byChunks(t, ss[i], src)
	}
	got := make([][]float32, n)
	errs := make([]error, n)
	done := make(chan int)
	for i, s := range ss {
		go func() {
			defer func() { done <- i }()
			for r := 0; r < 3 && errs[i] == nil; r++ {
				var out []float32
				if out, errs[i] = s.Write(nil, src); errs[i] == nil {
					out, errs[i] = s.Flush(out)
				}
				if r == 0 {
					got[i] = out
				} else if errs[i] == nil && !slices.Equal(out, got[i]) {
					got[i] = out
					return
				}
			}
		}()
	}
	for range ss {
		<-done
	}
	for i := range ss {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		sameSamples(t, "concurrent stream", got[i], want[i])
	}
}

// The live path's schedule: the dry stream liveDelay runs gives, piece by piece, exactly as
// many samples as the real stream (with and without SpreadSteps); Write runs windows and
// steps before their chunk is complete; and liveDelay is what the schedule needs (the 40 ms
// model's steady state: a step's audio 100 ms after the piece that completes it began).
// Spreading the steps is free for the 120 ms model and costs the 40 ms one a piece, so
// LiveSchedule spreads only the first.
func TestLiveDelay(t *testing.T) {
	for _, tc := range []struct {
		folder        string
		delay, spread int // at 20 ms pieces
	}{{Family, 4160, 4160}, {Family + "_40ms", 1600, 1920}} {
		t.Run(tc.folder, func(t *testing.T) {
			m, target, src := goldenVariant(t, tc.folder)
			// Output after i whole chunks through Process.
			ref := newStream(t, m, target)
			after := []int{0}
			var whole []float32
			var err error
			for k := 0; k+ref.ChunkSize() <= len(src); k += ref.ChunkSize() {
				if whole, err = ref.Process(whole, src[k:k+ref.ChunkSize()]); err != nil {
					t.Fatal(err)
				}
				after = append(after, len(whole))
			}
			const piece = 320
			for _, spread := range []bool{false, true} {
				s := newStream(t, m, target)
				s.SpreadSteps(spread)
				dry, err := m.dryStream()
				if err != nil {
					t.Fatal(err)
				}
				dry.spread = spread
				var out, dout []float32
				early := false
				for k := 0; k+piece <= len(src); k += piece {
					if out, err = s.Write(out, src[k:k+piece]); err != nil {
						t.Fatal(err)
					}
					if dout, err = dry.Write(dout, src[k:k+piece]); err != nil {
						t.Fatal(err)
					}
					if len(dout) != len(out) {
						t.Fatalf("spread %v, after %d samples: the dry stream gave %d, the real one %d", spread, k+piece, len(dout), len(out))
					}
					// Output beyond what the whole chunks before this one give: it ran early.
					if i := (k + piece) / s.ChunkSize(); i < len(after) {
						early = early || len(out) > after[i]
					}
				}
				if !early {
					t.Errorf("spread %v: Write never gave output before its chunk was complete", spread)
				}
			}
			if got := m.liveDelay(piece, false); got != tc.delay {
				t.Errorf("liveDelay(%d) = %d, want %d", piece, got, tc.delay)
			}
			if got := m.liveDelay(piece, true); got != tc.spread {
				t.Errorf("liveDelay(%d, spread) = %d, want %d", piece, got, tc.spread)
			}
			if d, spread := m.LiveSchedule(piece); d != tc.delay || spread != (tc.spread == tc.delay) {
				t.Errorf("LiveSchedule(%d) = %d, %v", piece, d, spread)
			}
			if got := m.liveDelay(m.Config.Runtime.ChunkSamples, false); got != m.OutputSlack() {
				t.Errorf("liveDelay(a chunk) = %d, OutputSlack %d: feeding whole chunks is Process's schedule", got, m.OutputSlack())
			}
		})
	}
}

// WarmLive leaves its stream as new (the first stream warmed, the second only asked, give
// the same output), and the model's first stream per piece size measures the start cushion
// that later ones are given without running.
func TestWarmLive(t *testing.T) {
	m, target, src := golden(t)
	piece := m.Config.Runtime.SampleRate / 50
	convert := func() ([]float32, int) {
		s, err := m.NewStream(target)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c, err := s.WarmLive(piece)
		if err != nil {
			t.Fatal(err)
		}
		var out []float32
		for k := 0; k+piece <= len(src); k += piece {
			if out, err = s.Write(out, src[k:k+piece]); err != nil {
				t.Fatal(err)
			}
		}
		return out, c
	}
	warmed, c1 := convert()
	if _, ok := m.cushion[piece]; !ok {
		t.Fatal("the first stream's cushion was not kept")
	}
	asked, c2 := convert()
	if c1 != c2 || !slices.Equal(warmed, asked) {
		t.Errorf("cushions %d, %d; outputs equal: %v", c1, c2, slices.Equal(warmed, asked))
	}
	m.liveMu.Lock()
	m.cushion[piece] = 12345 // what a later stream gets is the kept answer
	m.liveMu.Unlock()
	if _, c := convert(); c != 12345 {
		t.Errorf("a later stream measured its cushion again: %d", c)
	}
}
