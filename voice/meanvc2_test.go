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
	return tinyMeanVC2Variant(t, "meanvc2")
}

// variants are the golden folders of the two published MeanVC2 models.
var variants = []string{"meanvc2", "meanvc2_40ms"}

// tinyMeanVC2Variant is tinyMeanVC2 for one golden folder (meanvc2: 120 ms + 40 ms,
// meanvc2_40ms: 40 ms + 40 ms).
func tinyMeanVC2Variant(t *testing.T, folder string) (*meanvc2.Model, meanvc2.Timbre, []float32) {
	t.Helper()
	path := golden.Path(t, folder, "model.gguf")
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

// The adapter hands out exactly one piece per piece, and its output is the stream's
// reference output (whole chunks through Process) delayed by the priming: nothing is
// reordered or changed, only the first chunk's samples that came after their turn are
// silence, and the latency it reports is the model's plus the priming.
func TestMeanVC2ProcessorIsTheStreamDelayed(t *testing.T) {
	for _, folder := range variants {
		t.Run(folder, func(t *testing.T) { testStreamDelayed(t, folder) })
	}
}

// runBoth feeds src to p in its own chunks (each must give back as many samples) and to
// raw in whole stream chunks, flushes both, and returns their outputs.
func runBoth(t *testing.T, p stream.Processor, raw *meanvc2.Stream, src []float32) (got, want []float32) {
	t.Helper()
	var err error
	n, chunk := p.Info().ChunkSize, raw.ChunkSize()
	for i := 0; i+n <= len(src); i += n {
		before := len(got)
		if got, err = p.Process(got, src[i:i+n]); err != nil {
			t.Fatal(err)
		}
		if len(got)-before != n {
			t.Fatalf("piece %d: %d samples out, want %d", i/n, len(got)-before, n)
		}
	}
	for i := 0; i+chunk <= len(src); i += chunk {
		if want, err = raw.Process(want, src[i:i+chunk]); err != nil {
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

// The reference path (MeanVC2Reference, what convert runs) is the stream's whole-chunk
// output delayed by the priming it reports — every sample, the first chunk's included (the
// live path gives some of those up) — for both variants.
func TestMeanVC2ReferenceIsTheStream(t *testing.T) {
	for _, tc := range []struct{ folder, variant string }{{"meanvc2", "120ms"}, {"meanvc2_40ms", "40ms"}} {
		t.Run(tc.variant, func(t *testing.T) {
			m, target, src := tinyMeanVC2Variant(t, tc.folder)
			if got := m.Config.Runtime.Model; got != tc.variant {
				t.Fatalf("%s holds the %q model, want %q", tc.folder, got, tc.variant)
			}
			p, err := MeanVC2Reference(m, target)
			if err != nil {
				t.Fatal(err)
			}
			defer stream.CloseProcessor(p)
			raw, err := m.NewStream(target)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			info, prime, chunk := p.Info(), m.OutputSlack(), raw.ChunkSize()
			if info.SampleRate != 16000 || info.ChunkSize != chunk || info.Latency != m.Latency()+prime {
				t.Fatalf("info %+v; want 16 kHz, whole chunks of %d, latency %d+%d", info, chunk, m.Latency(), prime)
			}
			got, want := runBoth(t, p, raw, src[:len(src)/chunk*chunk])
			if len(got) != prime+len(want) || slices.ContainsFunc(got[:prime], func(x float32) bool { return x != 0 }) {
				t.Fatalf("%d samples out, want %d of silent priming and the stream's %d", len(got), prime, len(want))
			}
			if !slices.Equal(got[prime:], want) {
				t.Error("the reference path's output is not the stream's whole-chunk output")
			}
		})
	}
}

func testStreamDelayed(t *testing.T, folder string) {
	m, target, src := tinyMeanVC2Variant(t, folder)
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
	prime, _ := m.LiveSchedule(320)
	if info.SampleRate != 16000 || info.ChunkSize != 320 || info.Overlap != 0 || info.Latency != m.Latency()+prime {
		t.Fatalf("info %+v; want 16 kHz, 20 ms pieces, latency %d+%d", info, m.Latency(), prime)
	}
	chunk := raw.ChunkSize()
	src = src[:len(src)/chunk*chunk]

	got, want := runBoth(t, p, raw, src)
	if len(got) != prime+len(want) {
		t.Fatalf("adapter gave %d samples, want the stream's %d after %d of priming", len(got), len(want), prime)
	}
	if slices.ContainsFunc(got[:prime], func(v float32) bool { return v != 0 }) {
		t.Error("the priming is not silence")
	}
	given := 0 // first-chunk samples given up
	for i, v := range got[prime:] {
		if v != want[i] {
			if v != 0 || i >= chunk {
				t.Fatalf("output sample %d is %v, want the stream's %v", i, v, want[i])
			}
			given++
		}
	}
	if want := m.LiveGivenUp(320); given != want {
		t.Errorf("%d first-chunk samples given up, LiveGivenUp says %d", given, want)
	}
	t.Logf("%d chunks: stream gave %d samples, adapter %d (priming %d = %.0f ms, latency %d = %.0f ms, %d first-chunk samples given up)",
		len(src)/chunk, len(want), len(got), prime, float64(prime)/16, info.Latency, float64(info.Latency)/16, given)
	if rms(want) < 1e-4 {
		t.Errorf("converted audio is silent (RMS %.2g)", rms(want))
	}
	// Flush left both at their start: a second pass repeats the first exactly.
	again, want2 := runBoth(t, p, raw, src)
	if !slices.Equal(again, got) || !slices.Equal(want2, want) {
		t.Error("a second pass after Flush differs from the first")
	}
	// Reset mid-stream also starts over.
	var part []float32
	for i := 0; i < 3*info.ChunkSize; i += info.ChunkSize {
		if part, err = p.Process(part, src[i:i+info.ChunkSize]); err != nil {
			t.Fatal(err)
		}
	}
	p.Reset()
	raw.Reset()
	third, _ := runBoth(t, p, raw, src)
	if !slices.Equal(third, got) {
		t.Error("output after Reset differs from a fresh processor's")
	}
}

// In a live session (pulled every 20 ms at the processor's rate) the adapter never lets the
// output run dry, and the session's latency accounting matches its reported latency.
func TestMeanVC2ProcessorInASession(t *testing.T) {
	for _, folder := range variants {
		t.Run(folder, func(t *testing.T) { testInASession(t, folder) })
	}
}

func testInASession(t *testing.T, folder string) {
	m, target, src := tinyMeanVC2Variant(t, folder)
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
			// session says how long ago that input was captured: the processor latency plus
			// the piece being collected.
			lat := s.Stats().Latency
			lo := time.Duration(info.Latency) * time.Second / rate
			hi := time.Duration(info.Latency+info.ChunkSize) * time.Second / rate
			if lat < lo || lat > hi {
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

// MeanVC2Shared runs its sessions and measures a positive cost per second of audio and a
// slowest step; the voices made with it carry it to the scheduler (Info().Shared).
func TestMeanVC2Shared(t *testing.T) {
	m, _, _ := tinyMeanVC2(t)
	before := m.BatchStats()
	sh, err := MeanVC2Shared(m, 4, 48000)
	if err != nil {
		t.Fatal(err)
	}
	st := m.BatchStats()
	steps, batches := st.Steps-before.Steps, st.StepBatches-before.StepBatches
	t.Logf("%+v; %d steps in %d batches", sh, steps, batches)
	if sh.Sessions != 4 || sh.Cost <= 0 || sh.Cost > 2 || sh.Slowest <= 0 || sh.Slowest > 5*time.Second {
		t.Errorf("measured %+v, want 4 sessions, a positive fraction of a core (a tiny model) and a slowest step", sh)
	}
	if steps == 0 {
		t.Error("no DiT steps ran")
	}
	if _, err := MeanVC2Shared(m, 0, 48000); err == nil {
		t.Error("no error for 0 sessions")
	}

	_, file, _, _ := runtime.Caller(0)
	ref := filepath.Join(filepath.Dir(file), "..", "testdata", "speech_en_48k.wav")
	v := &MeanVC2Voices{Model: m, DefaultRef: ref, Shared: sh}
	p, err := v.Processor("someone", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseProcessor(p)
	if got := p.Info().Shared; got != sh {
		t.Errorf("processor's measurement %+v, want the voices' %+v", got, sh)
	}
}
