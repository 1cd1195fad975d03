package vocos

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

func openGolden(t *testing.T) (*parity.Run, *gguf.Model, engine.Backend) {
	t.Helper()
	r := paritytest.Open(t, "meanvc2")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	be, err := engine.NewCPU(min(runtime.NumCPU(), 2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	return r, m, be
}

func loadGolden(t *testing.T) (*parity.Run, *gguf.Model, *Model) {
	t.Helper()
	r, m, be := openGolden(t)
	raw, ok := m.EmbeddedFile("config.json")
	if !ok {
		t.Fatal("no embedded config.json")
	}
	cfg, err := ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	v, err := LoadConfig(m.Sub("vocos"), cfg, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return r, m, v
}

func TestGoldenVocos(t *testing.T) {
	r, m, be := openGolden(t)
	if err := GoldenVocos(r, m, be); err != nil {
		t.Fatal(err)
	}
	paritytest.Require(t, r.Stages())
	steps := len(r.Names("voc.step")) / 4
	if steps == 0 || len(r.Stages()) != 4*steps {
		t.Errorf("%d stages for %d steps", len(r.Stages()), steps)
	}
}

// TestDecodeTeacherForced decodes each step's golden vocoder input directly.
func TestDecodeTeacherForced(t *testing.T) {
	r, _, v := loadGolden(t)
	for j := 0; r.Has(fmt.Sprintf("voc.step%d.mel_in", j)); j++ {
		in, shape, err := r.F32(fmt.Sprintf("voc.step%d.mel_in", j))
		if err != nil {
			t.Fatal(err)
		}
		got, err := v.Decode(in, shape[1])
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != v.SamplesFor(shape[1]) {
			t.Errorf("step %d: %d samples, want %d", j, len(got), v.SamplesFor(shape[1]))
		}
		want, _, _ := r.F32(fmt.Sprintf("voc.step%d.decode", j))
		if s := parity.Compare(fmt.Sprintf("decode step %d", j), got, want, 1e-4); !s.OK() {
			t.Error(s)
		} else if j < 2 {
			t.Log(s)
		}
	}
}

// TestStreamOutput feeds every DiT step and the flush through a Stream and compares the
// whole waveform with the reference's output.wav (all emits, then the held-back tail), then
// checks that Reset starts over identically.
func TestStreamOutput(t *testing.T) {
	r, _, v := loadGolden(t)
	mel, shape, err := r.F32("dit.mel")
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := r.Cases.Get("output.wav") // read without claiming the e2e case
	if err != nil {
		t.Fatal(err)
	}
	s, err := v.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	per := shape[1] * shape[2]
	run := func() []float32 {
		var out []float32
		for j := range shape[0] {
			e, err := s.Push(mel[j*per : (j+1)*per])
			if err != nil {
				t.Fatal(err)
			}
			if want := 1920; j == 0 {
				if len(e) != 1600 {
					t.Errorf("first step emitted %d samples, want 1600", len(e))
				}
			} else if len(e) != want {
				t.Errorf("step %d emitted %d samples, want %d", j, len(e), want)
			}
			out = append(out, e...)
		}
		return append(out, s.Flush()...)
	}
	got := run()
	st := parity.Compare("stream vs output.wav", got, want, 1e-4)
	t.Log(st)
	if !st.OK() {
		t.Error(st)
	}
	again := run()
	if st := parity.Compare("after flush", again, got, 0); !st.OK() {
		t.Error(st)
	}
	if len(s.Flush()) != 0 {
		t.Errorf("flush of an empty stream returned samples")
	}
	if _, err := s.Push(make([]float32, 81)); err == nil {
		t.Errorf("push of a partial frame: no error")
	}
}

func TestTensorTable(t *testing.T) {
	_, m, v := loadGolden(t)
	sub := m.Sub("vocos")
	specs := Tensors(v.Dims)
	if len(specs) != sub.Len() {
		t.Errorf("table %d tensors, file %d", len(specs), sub.Len())
	}
	for _, s := range specs {
		mt, ok := sub.Tensor(s.Name)
		if !ok {
			t.Errorf("%s: not in the file", s.Name)
		} else if fmt.Sprint(mt.Shape) != fmt.Sprint(s.Shape) {
			t.Errorf("%s: table %v, file %v", s.Name, s.Shape, mt.Shape)
		}
	}
	if v.Config.Hop != 160 || v.Dims.NFFT != 640 || v.Dims.Layers != 2 {
		t.Errorf("dims %+v config %+v", v.Dims, v.Config)
	}
	if n := len(RealTensors()); n != 4+8*9+5 {
		t.Errorf("real table has %d tensors", n)
	}
}

type editSource struct {
	src   *gguf.Model
	drop  string
	shape map[string][]int
}

func (e editSource) Has(name string) bool { return name != e.drop && e.src.Has(name) }
func (e editSource) Prefix() string       { return e.src.Prefix() }
func (e editSource) Get(name string) ([]float32, []int, error) {
	d, s, err := e.src.Get(name)
	if ns, ok := e.shape[name]; ok {
		s = ns
	}
	return d, s, err
}

func TestBadWeights(t *testing.T) {
	_, m, be := openGolden(t)
	sub := m.Sub("vocos")
	for _, c := range []struct {
		src  editSource
		want string
	}{
		{editSource{src: sub, drop: "backbone.convnext.1.gamma"}, "vocos/backbone.convnext.1.gamma"},
		{editSource{src: sub, drop: "head.out.weight"}, "vocos/head.out.weight"},
		{editSource{src: sub, shape: map[string][]int{"backbone.convnext.0.pwconv2.weight": {32, 63}}}, "vocos/backbone.convnext.0.pwconv2.weight"},
		{editSource{src: sub, shape: map[string][]int{"backbone.final_layer_norm.bias": {31}}}, "vocos/backbone.final_layer_norm.bias"},
	} {
		_, err := Load(c.src, be)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error naming %s, got %v", c.want, err)
		}
	}
	// Without the window buffer the periodic Hann is used, as the reference builds it.
	v, err := Load(editSource{src: sub, drop: "head.istft.window"}, be)
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`{"vocos":{"hop_length":128},"runtime":{"vocoder_overlap":3}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Hop != 128 || c.Overlap != 3 || c.WavOverlap != 160 || c.MagClip != 100 {
		t.Errorf("parsed %+v", c)
	}
	for _, bad := range []string{
		`{"vocos":{"padding":"same"}}`, `{"vocos":{"activation":"gelu_tanh"}}`,
		`{"runtime":{"vocoder_wav_pad":80}}`, `{"vocos":{"mag_clip":0}}`, `{`,
	} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// TestStreamNoAllocs: once both window sizes are compiled, a step allocates nothing.
func TestStreamNoAllocs(t *testing.T) {
	r, _, v := loadGolden(t)
	mel, shape, err := r.F32("dit.mel")
	if err != nil {
		t.Fatal(err)
	}
	s, err := v.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	per := shape[1] * shape[2]
	for j := range 2 {
		if _, err := s.Push(mel[j*per : (j+1)*per]); err != nil {
			t.Fatal(err)
		}
	}
	// The engine's Run itself may allocate (cgo.Context.Execute's status word escapes);
	// Push must add nothing to that.
	prog := v.progs[progKey{14, 1}]
	if prog == nil {
		t.Fatal("no program for 14 frames")
	}
	base := testing.AllocsPerRun(5, func() {
		if err := prog.Run(); err != nil {
			t.Fatal(err)
		}
	})
	if a := testing.AllocsPerRun(5, func() {
		if _, err := s.Push(mel[2*per : 3*per]); err != nil {
			t.Fatal(err)
		}
	}); a > base {
		t.Errorf("%.0f allocations per Push, the engine run alone %.0f", a, base)
	}
}

func finite(x []float32) bool {
	for _, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return false
		}
	}
	return len(x) > 0
}

// TestRealDims builds the published vocoder from RealTensors with random weights and streams.
func TestRealDims(t *testing.T) {
	be, err := engine.NewCPU(min(runtime.NumCPU(), 2))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	v, err := Load(weights.Random(RealTensors(), 7), be)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if v.Dims != RealDims || v.Config.Hop != 160 {
		t.Errorf("dims %+v hop %d", v.Dims, v.Config.Hop)
	}
	s, err := v.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	mel := make([]float32, 12*RealDims.Mels)
	for step, want := range []int{1600, 1920} {
		for i := range mel {
			mel[i] = float32(rng.Float64()*2 - 1)
		}
		out, err := s.Push(mel)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != want || !finite(out) {
			t.Errorf("step %d: %d samples (want %d), finite %v", step, len(out), want, finite(out))
		}
	}
}

// TestPushBatchMatchesAlone: streams pushed together give each stream bit for bit the audio
// it gets alone — streams at different steps (so windows with and without overlap frames
// are batched only with their like), each with its own mel — and bad batches change nothing.
func TestPushBatchMatchesAlone(t *testing.T) {
	r, _, v := loadGolden(t)
	mel, shape, err := r.F32("dit.mel")
	if err != nil {
		t.Fatal(err)
	}
	per, steps := shape[1]*shape[2], shape[0]
	const streams = 4
	// Stream s pushes step (j+s) mod steps at its j-th push, its values scaled by 1 − s/10.
	input := func(s, j int) []float32 {
		out := slices.Clone(mel[(j+s)%steps*per : ((j+s)%steps+1)*per])
		for i := range out {
			out[i] *= 1 - float32(s)/10
		}
		return out
	}
	pushes := steps + 2
	want := make([][]float32, streams)
	for s := range streams {
		st, _ := v.NewStream()
		for j := range pushes {
			e, err := st.Push(input(s, j))
			if err != nil {
				t.Fatal(err)
			}
			want[s] = append(want[s], e...)
		}
		want[s] = append(want[s], st.Flush()...)
	}
	ss := make([]*Stream, streams)
	for s := range ss {
		ss[s], _ = v.NewStream()
	}
	got := make([][]float32, streams)
	// Stream s starts at push s: a batch holds streams on their first window and on later ones.
	for j := 0; j < pushes+streams; j++ {
		var first, later []*Stream
		var firstIn, laterIn [][]float32
		var firstIdx, laterIdx []int
		for s := range streams {
			k := j - s
			if k < 0 || k >= pushes {
				continue
			}
			if k == 0 {
				first, firstIn, firstIdx = append(first, ss[s]), append(firstIn, input(s, k)), append(firstIdx, s)
			} else {
				later, laterIn, laterIdx = append(later, ss[s]), append(laterIn, input(s, k)), append(laterIdx, s)
			}
		}
		if len(first) > 0 && len(later) > 0 {
			if _, err := v.PushBatch(append(slices.Clone(first), later...), append(slices.Clone(firstIn), laterIn...)); err == nil {
				t.Fatal("windows of two lengths in one batch: no error")
			}
		}
		for _, b := range []struct {
			streams []*Stream
			in      [][]float32
			idx     []int
		}{{first, firstIn, firstIdx}, {later, laterIn, laterIdx}} {
			if len(b.streams) == 0 {
				continue
			}
			outs, err := v.PushBatch(b.streams, b.in)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range b.idx {
				got[s] = append(got[s], outs[i]...)
			}
		}
	}
	for s := range streams {
		got[s] = append(got[s], ss[s].Flush()...)
		if !slices.Equal(got[s], want[s]) {
			t.Errorf("stream %d batched differs from the stream alone", s)
		}
	}
	if _, err := v.PushBatch([]*Stream{ss[0], ss[0]}, [][]float32{input(0, 0), input(0, 0)}); err == nil {
		t.Error("a stream twice in one batch: no error")
	}
}
