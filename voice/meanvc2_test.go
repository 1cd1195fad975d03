package voice

import (
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/stream"
)

// tinyMeanVC2 loads the golden tiny model and a target voice made from the first 3 s of the
// speech fixture; it returns them with 2 s of the fixture at 16 kHz as a source.
func tinyMeanVC2(t *testing.T) (*meanvc2.Model, meanvc2.Timbre, []float32) {
	t.Helper()
	path := golden.Path(t, "meanvc2", "model.gguf")
	be, err := engine.NewCPU(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	m, err := meanvc2.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	_, file, _, _ := runtime.Caller(0)
	a, err := wav.ReadFile(filepath.Join(filepath.Dir(file), "..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	x := a.Mono()
	target, err := m.VoiceFromClip(x[:3*a.SampleRate], a.SampleRate)
	if err != nil {
		t.Fatal(err)
	}
	src, err := dsp.Resample(x[:2*a.SampleRate], a.SampleRate, 16000)
	if err != nil {
		t.Fatal(err)
	}
	return m, target, src
}

// The adapter hands out exactly one chunk per chunk, and its output is the stream's output
// delayed by the priming: nothing is lost, reordered or changed, and the latency it reports
// is the model's plus the priming.
func TestMeanVC2ProcessorIsTheStreamDelayed(t *testing.T) {
	m, target, src := tinyMeanVC2(t)
	raw, err := m.NewStream(target)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	p, err := MeanVC2Processor(m, target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.(interface{ Close() }).Close()
	info := p.Info()
	prime := m.OutputSlack()
	if info.SampleRate != 16000 || info.ChunkSize != raw.ChunkSize() || info.Overlap != 0 || info.Latency != m.Latency()+prime {
		t.Fatalf("info %+v; want 16 kHz, chunk %d, latency %d+%d", info, raw.ChunkSize(), m.Latency(), prime)
	}
	n := info.ChunkSize
	src = src[:len(src)/n*n]

	run := func() (got, want []float32) {
		for i := 0; i < len(src); i += n {
			before := len(got)
			if got, err = p.Process(got, src[i:i+n]); err != nil {
				t.Fatal(err)
			}
			if len(got)-before != n {
				t.Fatalf("chunk %d: %d samples out, want %d", i/n, len(got)-before, n)
			}
			if want, err = raw.Process(want, src[i:i+n]); err != nil {
				t.Fatal(err)
			}
		}
		if got, err = p.Flush(got); err != nil {
			t.Fatal(err)
		}
		if want, err = raw.Flush(want); err != nil {
			t.Fatal(err)
		}
		return got, want
	}
	got, want := run()
	t.Logf("%d chunks: stream gave %d samples, adapter %d (priming %d = %.0f ms, latency %d = %.0f ms)",
		len(src)/n, len(want), len(got), prime, float64(prime)/16, info.Latency, float64(info.Latency)/16)
	if len(got) != prime+len(want) {
		t.Fatalf("adapter gave %d samples, want the stream's %d after %d of priming", len(got), len(want), prime)
	}
	if slices.ContainsFunc(got[:prime], func(v float32) bool { return v != 0 }) {
		t.Error("the priming is not silence")
	}
	if !slices.Equal(got[prime:], want) {
		t.Error("adapter output differs from the stream's output shifted by the priming")
	}
	if rms(want) < 1e-4 {
		t.Errorf("converted audio is silent (RMS %.2g)", rms(want))
	}
	// Flush left both at their start: a second pass repeats the first exactly.
	again, want2 := run()
	if !slices.Equal(again, got) || !slices.Equal(want2, want) {
		t.Error("a second pass after Flush differs from the first")
	}
	// Reset mid-stream also starts over.
	var part []float32
	for i := 0; i < 3*n; i += n {
		if part, err = p.Process(part, src[i:i+n]); err != nil {
			t.Fatal(err)
		}
	}
	p.Reset()
	raw.Reset()
	third, _ := run()
	if !slices.Equal(third, got) {
		t.Error("output after Reset differs from a fresh processor's")
	}
}

// In a live session (pulled every 20 ms at the processor's rate) the adapter never lets the
// output run dry, and the session's latency accounting matches its reported latency.
func TestMeanVC2ProcessorInASession(t *testing.T) {
	m, target, src := tinyMeanVC2(t)
	p, err := MeanVC2Processor(m, target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.(interface{ Close() }).Close()
	const rate = 16000
	s, err := stream.NewSession(stream.Config{IORate: rate, MaxQueue: time.Second}, "meanvc2", p)
	if err != nil {
		t.Fatal(err)
	}
	info := p.Info()
	if s.LatencyIO() != info.Latency {
		t.Fatalf("session latency %d samples, processor's %d", s.LatencyIO(), info.Latency)
	}
	block := rate / 50
	buf := make([]float32, block)
	t0 := time.Unix(0, 0)
	var out []float32
	started, pulled := -1, 0
	for k := 0; k+block <= len(src); k += block {
		at := t0.Add(time.Duration(k) * time.Second / rate)
		if err := s.Push(src[k:k+block], at); err != nil {
			t.Fatal(err)
		}
		end := at.Add(time.Second / 50) // the pull happens when the block has been captured
		if got := s.Pull(buf, end); got > 0 && started < 0 {
			started = k
		}
		out = append(out, buf...)
		if started >= 0 {
			pulled += block
		}
		if pulled > info.Latency+block {
			// The first sample of this pull came from input Latency samples before it in
			// the output stream (earlier ones are warm-up, from before the input began); the
			// session says how long ago that input was captured. It can never be less than
			// the processor latency nor more than that plus a chunk and a pull.
			lat := s.Stats().Latency
			lo := time.Duration(info.Latency) * time.Second / rate
			hi := time.Duration(info.Latency+info.ChunkSize) * time.Second / rate
			if lat < lo || lat > hi+time.Second/50 {
				t.Errorf("at %v: reported latency %v outside [%v, %v]", at.Sub(t0), lat, lo, hi)
			}
		}
	}
	st := s.Stats()
	t.Logf("output began after %.0f ms of input; %d chunks, %d underflows, last latency %v, algorithmic %v",
		float64(started)/16, st.Chunks, st.Underflows, st.Latency, s.AlgorithmicLatency())
	if st.Underflows != 0 {
		t.Errorf("%d underflows: the priming did not absorb the model's bursts", st.Underflows)
	}
	if want := time.Duration(info.Latency+info.ChunkSize) * time.Second / rate; s.AlgorithmicLatency() != want {
		t.Errorf("algorithmic latency %v, want latency + chunk = %v", s.AlgorithmicLatency(), want)
	}
	if rms(out) < 1e-4 {
		t.Error("the session gave back silence")
	}
}

func rms(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s / float64(max(len(x), 1)))
}
