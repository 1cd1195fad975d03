package meanvc2

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/batcher"
	"github.com/voxpipe/voxpipe/internal/embcache"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/ecapa"
	"github.com/voxpipe/voxpipe/models/vocos"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// Namespaces of a MeanVC2 model file, all in one GGUF (audio.cpp packaging).
var Namespaces = []string{"vc", conformer.Namespace, "vocos", "speaker_wavlm", "speaker_ecapa"}

// Model is a whole MeanVC2 converter: content encoder, DiT, vocoder and the speaker path,
// loaded once; every Stream shares the weights. Timbre, SpeakerEmbedding and any number of
// Streams may be used from several goroutines (each Stream by one at a time).
type Model struct {
	Config  Config
	DiT     *DiT
	ASR     *conformer.Model
	Vocoder *vocos.Model
	WavLM   *wavlm.Model
	ECAPA   *ecapa.Model

	// Embeddings, when set, keeps speaker embeddings by clip content (SpeakerEmbedding).
	Embeddings *embcache.Cache

	// ID names the speaker path's weights in embedding-cache keys: the model name and a
	// hash of the ECAPA head's tensors (a different fine-tune gives different keys).
	ID string

	backend engine.Backend
	holds   int   // cores a run of its programs occupies (coresHeld)
	layers  []int // WavLM hidden states the ECAPA head mixes

	// exec serialises every program run of the streams' components: a CPU backend's context
	// (its thread pool and scratch memory) serves one execution at a time, and every stream's
	// programs run on it.
	exec sync.Mutex
	// speakerExec is the lock of the speaker path (WavLM, ECAPA): exec itself when they share
	// the streams' backend, a separate one when LoadWith gave them their own, so that
	// embedding a new reference clip (seconds on the real model) does not stall live streams.
	speakerExec *sync.Mutex
	speakerMu   sync.Mutex

	liveMu  sync.Mutex
	live    map[int]schedule // LiveSchedule's, by piece size
	cushion map[int]int      // WarmLive's, by piece size

	batch batchState // the streams' model work, batched across streams (batch.go)
}

// Load opens an audio.cpp MeanVC2 GGUF, checks its family and loads every component. Missing
// namespaces, missing or misshapen tensors and components that do not fit together are
// reported with their names. The file is closed again: all weights live in engine buffers.
func Load(path string, backend engine.Backend) (*Model, error) {
	return LoadWith(path, backend, backend)
}

// LoadWith is Load with the speaker path (WavLM-Large and ECAPA) on its own backend, so a
// reference clip being embedded runs beside the live streams instead of holding them up.
func LoadWith(path string, backend, speaker engine.Backend) (*Model, error) {
	return LoadOn(path, Backends{Main: backend, Speaker: speaker})
}

// Backends places a model's parts: the streaming path (ASR and DiT), the vocoder and the
// speaker path (WavLM-Large and ECAPA). A nil Vocoder or Speaker shares Main.
type Backends struct {
	Main, Vocoder, Speaker engine.Backend
}

// LoadOn is Load with each part on its own backend (for example the vocoder kept on the CPU
// while the rest runs on a GPU, as the reference does).
func LoadOn(path string, b Backends) (*Model, error) {
	f, err := gguf.OpenModel(path)
	if err != nil {
		return nil, fmt.Errorf("meanvc2: load %s: %w", path, err)
	}
	defer f.Close()
	m, err := loadFromModel(f, b)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return m, nil
}

// LoadFromModel is Load on an open file (which may be closed afterwards).
func LoadFromModel(f *gguf.Model, backend engine.Backend) (*Model, error) {
	return loadFromModel(f, Backends{Main: backend})
}

func loadFromModel(f *gguf.Model, b Backends) (*Model, error) {
	backend, speaker, vocoder := b.Main, b.Speaker, b.Vocoder
	if backend == nil {
		return nil, errors.New("meanvc2: load: no backend")
	}
	if speaker == nil {
		speaker = backend
	}
	if vocoder == nil {
		vocoder = backend
	}
	cfg, err := ConfigFromModel(f)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, ns := range Namespaces {
		if f.Sub(ns).Len() == 0 {
			missing = append(missing, ns+"/")
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("meanvc2: load: not a complete MeanVC2 file: no tensors in namespace(s) %v (it has %v)", missing, f.Namespaces())
	}
	m := &Model{Config: cfg, backend: backend, holds: coresHeld(backend)}
	m.batch.queue = batcher.New[batchKey](MaxBatch, m.runBatch)
	m.speakerExec = &m.exec
	if speaker != backend {
		m.speakerExec = &m.speakerMu
	}
	fail := func(what string, err error) (*Model, error) {
		m.Close()
		return nil, fmt.Errorf("meanvc2: load %s: %w", what, err)
	}
	if m.DiT, err = LoadDiT(f.Sub("vc"), cfg, backend); err != nil {
		return fail("vc/", err)
	}
	m.Config = m.DiT.Config // widths derived from the tensors
	if m.ASR, err = conformer.LoadGGUF(f, backend); err != nil {
		return fail("asr/", err)
	}
	vcfg, ecfg := vocos.DefaultConfig(), ecapa.DefaultConfig()
	if raw, ok := f.EmbeddedFile("config.json"); ok {
		if vcfg, err = vocos.ParseConfig(raw); err != nil {
			return fail("vocos/", err)
		}
		if ecfg, err = ecapa.ParseConfig(raw); err != nil {
			return fail("speaker_ecapa/", err)
		}
	}
	if m.Vocoder, err = vocos.LoadConfig(f.Sub("vocos"), vcfg, vocoder); err != nil {
		return fail("vocos/", err)
	}
	if m.WavLM, err = wavlm.Load(f.Sub("speaker_wavlm"), speaker, wavlm.Options{}); err != nil {
		return fail("speaker_wavlm/", err)
	}
	if m.ECAPA, err = ecapa.LoadConfig(f.Sub("speaker_ecapa"), ecfg, speaker); err != nil {
		return fail("speaker_ecapa/", err)
	}
	if err := m.checkFit(); err != nil {
		return fail("components", err)
	}
	if n := m.WavLM.Config.Layers; m.ECAPA.Dims.Layers > n+1 {
		// WavLM counts its layers by the tensors present: a gap ends the encoder early.
		return fail("speaker_wavlm/", fmt.Errorf("the ECAPA head mixes %d hidden states but WavLM stops after %d layers; layer %d lacks %v",
			m.ECAPA.Dims.Layers, n, n, missingLayer(f.Sub("speaker_wavlm"), n)))
	}
	m.layers = make([]int, m.ECAPA.Dims.Layers)
	for i := range m.layers {
		m.layers[i] = i
	}
	m.ID = modelID(f)
	return m, nil
}

// checkFit verifies that the separately loaded components agree on the widths and rates
// that connect them.
func (m *Model) checkFit() error {
	c, a, rt := m.Config, m.ASR.Config, m.Config.Runtime
	switch {
	case a.OutputSize != c.BNDim:
		return fmt.Errorf("the ASR emits %d-d features, the DiT takes %d", a.OutputSize, c.BNDim)
	case m.Vocoder.Dims.Mels != c.MelDim:
		return fmt.Errorf("the DiT emits %d mel bins, the vocoder takes %d", c.MelDim, m.Vocoder.Dims.Mels)
	case m.ECAPA.Dims.Emb != c.SpkDim:
		return fmt.Errorf("the ECAPA head embeds in %d dims, the DiT takes %d", m.ECAPA.Dims.Emb, c.SpkDim)
	case m.ECAPA.Dims.Feat != m.WavLM.Config.Hidden:
		return fmt.Errorf("the ECAPA head takes %d-d features, WavLM gives %d", m.ECAPA.Dims.Feat, m.WavLM.Config.Hidden)
	case a.Stream.ChunkSamples != rt.ChunkSamples:
		return fmt.Errorf("front-end chunk %d samples, runtime says %d", a.Stream.ChunkSamples, rt.ChunkSamples)
	case rt.SampleRate != 16000:
		return fmt.Errorf("runtime sample rate %d, want 16000", rt.SampleRate)
	case m.Vocoder.Config.Hop != fbankShift(a):
		return fmt.Errorf("vocoder hop %d samples, fbank shift %d: mel and content frames must share a rate", m.Vocoder.Config.Hop, fbankShift(a))
	case conformer.OutFrames(a.Stream.Window) < 1:
		return fmt.Errorf("an ASR window of %d fbank frames gives no BN frame", a.Stream.Window)
	case a.WindowsPerChunk() < 1:
		return fmt.Errorf("a %d-sample chunk holds no %d-frame ASR window", rt.ChunkSamples, a.Stream.Window)
	case rt.VCChunkFrames < 1 || rt.VCChunkFrames%(a.WindowsPerChunk()*conformer.OutFrames(a.Stream.Window)) != 0:
		return fmt.Errorf("%d condition frames per chunk are not a multiple of its %d BN frames", rt.VCChunkFrames, a.WindowsPerChunk()*conformer.OutFrames(a.Stream.Window))
	}
	return nil
}

// missingLayer lists the tensors of WavLM layer 0 (bar its relative-position table) that
// layer l lacks, by full name.
func missingLayer(src *gguf.Model, l int) []string {
	var out []string
	const first = "encoder.layers.0."
	for _, name := range src.Names() {
		if !strings.HasPrefix(name, first) || strings.Contains(name, "relative_attention_bias") {
			continue
		}
		want := fmt.Sprintf("encoder.layers.%d.%s", l, name[len(first):])
		if !src.Has(want) {
			out = append(out, src.Prefix()+want)
		}
	}
	return out
}

// modelID is the model's name and a short hash of the speaker head's tensors.
func modelID(f *gguf.Model) string {
	h := sha256.New()
	ecp := f.Sub("speaker_ecapa")
	for _, name := range ecp.Names() {
		data, _, err := ecp.Get(name)
		if err != nil {
			continue
		}
		h.Write([]byte(name))
		var b [4]byte
		for _, v := range data {
			u := math.Float32bits(v)
			b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
			h.Write(b[:])
		}
	}
	name, _ := f.File.KV.String("general.name")
	return "meanvc2:" + name + ":" + hex.EncodeToString(h.Sum(nil))[:16]
}

// Close frees every component; no Stream of the model may run afterwards.
func (m *Model) Close() {
	if m.DiT != nil {
		m.DiT.Close()
	}
	if m.ASR != nil {
		m.ASR.Close()
	}
	if m.Vocoder != nil {
		m.Vocoder.Close()
	}
	if m.WavLM != nil {
		m.WavLM.Close()
	}
	if m.ECAPA != nil {
		m.ECAPA.Close()
	}
	m.DiT, m.ASR, m.Vocoder, m.WavLM, m.ECAPA = nil, nil, nil, nil, nil
}

// Timbre turns a speaker embedding into the DiT's target voice (the GTM memory).
func (m *Model) Timbre(spk []float32) (Timbre, error) {
	m.exec.Lock()
	defer m.exec.Unlock()
	return m.DiT.Timbre(spk)
}

// NoiseFunc supplies the raw normal draw [Window, MelDim] of DiT step j (counted from the
// stream's start or last Reset), before the lookahead carry; nil (or a nil result) draws from
// the stream's seeded generator. Golden tests inject the reference's draws.
type NoiseFunc func(step int) []float32

// Stream is one streaming conversion: the front end, ASR caches, the BN carry and condition
// queue, the DiT caches and noise carry, and the vocoder overlap — a few kilobytes to a few
// megabytes (SessionBytes); the weights are the Model's. A Stream is used by one goroutine at
// a time.
type Stream struct {
	m      *Model
	fe     *conformer.FrontEnd
	asr    *conformer.State
	dit    *State
	voc    *vocos.Stream
	cond   *CondBuffer
	target Timbre

	adapter      condAdapter // BN frames → condition frames, a chunk at a time
	bnPerWin     int         // BN frames an ASR window gives
	chunkSteps   int         // DiT steps run for the current chunk (capped per chunk)
	chunkWindows int         // ASR windows run for the current chunk
	out          []float32   // the caller's output while Write or chunk runs
	steps        int         // DiT steps since Reset
	noise        NoiseFunc
	seed         uint64
	err          error // a failed step leaves the stream unusable until Reset

	spread     bool // Write runs at most one DiT step per call (SpreadSteps)
	writeSteps int  // DiT steps run in this Write call

	dry     bool // scheduling only (LiveSchedule): no model runs
	dryPrev int  // a dry stream's vocoder overlap frames

	job    job // this stream's model request (batch.go), reused
	closed bool

	overcharge atomic.Int64 // ns: see Overcharge
}

// NewStream starts a conversion into the target voice (Model.Timbre or VoiceFromClip).
func (m *Model) NewStream(target Timbre) (*Stream, error) {
	if err := m.checkTimbre(target); err != nil {
		return nil, err
	}
	fe, err := conformer.NewFrontEnd(m.ASR.Config)
	if err != nil {
		return nil, fmt.Errorf("meanvc2: stream: %w", err)
	}
	asr, err := m.ASR.NewState()
	if err != nil {
		return nil, fmt.Errorf("meanvc2: stream: %w", err)
	}
	voc, err := m.Vocoder.NewStream()
	if err != nil {
		asr.Close()
		return nil, fmt.Errorf("meanvc2: stream: %w", err)
	}
	s := &Stream{m: m, fe: fe, asr: asr, voc: voc, dit: m.DiT.NewState(), cond: m.Config.NewCondBuffer(),
		target: target, seed: DefaultSeed, bnPerWin: conformer.OutFrames(m.ASR.Config.Stream.Window),
		adapter: condAdapter{dim: m.Config.BNDim, points: m.Config.Runtime.VCChunkFrames}}
	s.job = job{s: s}
	m.exec.Lock()
	m.batch.open++
	err = m.warm(m.batch.open)
	m.exec.Unlock()
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("meanvc2: stream: batch programs: %w", err)
	}
	return s, nil
}

func (m *Model) checkTimbre(t Timbre) error {
	c := m.Config
	if len(t.Spk) != c.SpkDim || len(t.K) != c.GTMSlots*c.GTMHidden || len(t.V) != len(t.K) {
		return fmt.Errorf("meanvc2: target voice of %d/%d/%d values, want a %d-d embedding and %d×%d memories (Model.Timbre)",
			len(t.Spk), len(t.K), len(t.V), c.SpkDim, c.GTMSlots, c.GTMHidden)
	}
	return nil
}

// SampleRate is the rate of the input and the output (16 kHz).
func (s *Stream) SampleRate() int { return s.m.Config.Runtime.SampleRate }

// ChunkSize is the number of input samples Process takes (2560 = 160 ms).
func (s *Stream) ChunkSize() int { return s.m.Config.Runtime.ChunkSamples }

// Latency is the algorithmic latency in samples: the content of input sample k is at output
// sample k+Latency (counting both from the start or the last Reset). It is where the
// streaming driver puts the content relative to the offline alignment the model was trained
// on (mel frame m ↔ BN frame m/r at input time m·hop):
//
//   - the front end prefixes each chunk with the last SamplesCacheLen samples and replaces the
//     first FbankCacheFrames frames of a window by the previous chunk's, so the frames of a
//     window start SamplesCacheLen + FbankCacheFrames·hop samples earlier than the offline
//     windows (720 + 480);
//   - the BN adapter interpolates [previous last frame ‖ r new] and drops the first point, so
//     condition frame m sits at BN position (m+1)/r − 1 instead of m/r: r−1 frames later
//     (3·160 = 480);
//   - DiT mel frame m is condition frame m, and the vocoder's centred frames put mel frame m
//     at output sample m·hop (the overlap and crossfade keep this alignment).
//
// For the 120 ms model that is 1680 samples (105 ms). The first window (no carried frames,
// no previous BN frame) is aligned differently; the steady state holds from the second on.
// Output becomes available in bursts (1600, 1920, 1920, 3840, … samples per chunk), so a
// fixed-rate player also needs OutputSlack samples buffered.
func (s *Stream) Latency() int { return s.m.Latency() }

// Latency is Stream.Latency, the same for every stream of the model.
func (m *Model) Latency() int {
	a, rt := m.ASR.Config, m.Config.Runtime
	hop := fbankShift(a)
	r := rt.VCChunkFrames / (a.WindowsPerChunk() * conformer.OutFrames(a.Stream.Window)) // condition frames per BN frame
	return a.Stream.SamplesCacheLen + a.Stream.FbankCacheFrames*hop + (r-1)*hop
}

// OutputSlack is the most the output falls behind the input in a stream: the maximum over
// the chunks of (samples consumed − samples emitted). A player that starts at the first
// output and plays at a fixed rate needs this much buffered to never run dry (2240 samples
// for the 120 ms model, at the third chunk of every three). It follows from the schedule of
// DiT steps, which repeats every lcm(condition frames per chunk, frames per step).
func (m *Model) OutputSlack() int {
	c, rt := m.Config, m.Config.Runtime
	per := rt.VCChunkFrames // condition frames per input chunk (one window per chunk)
	hop, ov := m.Vocoder.Config.Hop, m.Vocoder.Config.WavOverlap
	queued, emitted, slack, steps := 0, 0, 0, 0
	chunks := 2 * c.ChunkSize / gcd(per, c.ChunkSize) // two periods
	for i := range chunks {
		queued += per
		for n := 0; queued >= c.Window() && n < max(rt.MaxDiTStepsPerChunk, 1); n++ {
			queued -= c.ChunkSize
			emitted += c.ChunkSize * hop
			if steps == 0 {
				// The first decode has no overlap frames: (chunk−1)·hop samples, tail held.
				emitted -= hop + ov
			}
			steps++
		}
		slack = max(slack, (i+1)*rt.ChunkSamples-emitted)
	}
	return slack
}

// fbankShift is the fbank hop in samples (= the mel hop).
func fbankShift(a conformer.Config) int {
	return int(float64(a.Fbank.SampleRate) * a.Fbank.FrameShiftMs * 0.001)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// SetTarget switches the voice from the next DiT step on (caches and noise are kept, so
// the change is as smooth as the model makes it).
func (s *Stream) SetTarget(target Timbre) error {
	if err := s.m.checkTimbre(target); err != nil {
		return err
	}
	s.target = target
	return nil
}

// Target is the current voice.
func (s *Stream) Target() Timbre { return s.target }

// Seed sets the noise generator's seed (DefaultSeed unless set) and restarts it; Reset keeps
// the seed.
func (s *Stream) Seed(seed uint64) {
	s.seed = seed
	s.dit.Seed(seed)
}

// SetNoise makes the stream take its raw noise draws from f (nil: the seeded generator).
func (s *Stream) SetNoise(f NoiseFunc) { s.noise = f }

// Reset returns the stream to its state after NewStream (same target, seed and noise
// source; compiled programs are kept).
func (s *Stream) Reset() {
	s.fe.Reset()
	s.asr.Reset()
	s.dit.Reset()
	s.dit.Seed(s.seed)
	s.voc.Reset()
	s.cond.Flush()
	s.adapter.hasPrev, s.adapter.span = false, 0
	s.steps, s.chunkSteps, s.err = 0, 0, nil
}

// Close frees the stream's caches.
func (s *Stream) Close() {
	if s.closed {
		return
	}
	s.closed = true
	if s.asr != nil {
		s.asr.Close()
	}
	if s.dit != nil {
		s.dit.Close()
	}
	s.err = errors.New("meanvc2: stream is closed")
	if !s.dry {
		s.m.exec.Lock()
		s.m.batch.open--
		s.m.exec.Unlock()
	}
}

// SessionBytes is what one more stream costs: its caches (ASR attention and conv caches, DiT
// KV caches), its share of the DiT step programs' inputs and outputs (the programs are the
// model's, shared by every stream; their arenas are not counted per stream), and the
// host-side buffers of the front end, condition queue and vocoder overlap. Not counted: the
// ASR program's arena (models/conformer does not expose its State's program statistics);
// weights are shared and not counted.
func (s *Stream) SessionBytes() (int64, error) {
	c := s.m.Config
	n := int64(len(s.asr.AttCache())+len(s.asr.CNNCache())) * 4
	for l := range s.dit.kc {
		n += int64(len(s.dit.kc[l])+len(s.dit.vc[l])) * 4
	}
	for i := range c.Timesteps {
		o := stepOpts{commit: i == len(c.Timesteps)-1}
		d := s.m.DiT
		s.m.exec.Lock() // compiling allocates through the backend too
		d.progMu.Lock()
		prog, err := d.stepProgram(1, o)
		d.progMu.Unlock()
		s.m.exec.Unlock()
		if err != nil {
			return 0, fmt.Errorf("meanvc2: session bytes: %w", err)
		}
		n += prog.Stats().IOBytes
	}
	a, rt := s.m.ASR.Config, c.Runtime
	frameLen := int(float64(a.Fbank.SampleRate) * a.Fbank.FrameLengthMs * 0.001)
	frames := a.Stream.FbankCacheFrames + (a.Stream.SamplesCacheLen+rt.ChunkSamples-frameLen)/fbankShift(a) + 1
	host := 2*(a.Stream.SamplesCacheLen+rt.ChunkSamples) + frames*a.InputDim // front end
	host += (c.Window() + c.ChunkSize) * c.BNDim                             // condition queue
	host += 3 * c.Window() * c.MelDim                                        // noise, carry, x
	vf := rt.VocoderOverlap + c.ChunkSize                                    // vocoder window frames
	host += 3*vf*c.MelDim + 2*vf*s.m.Vocoder.Config.Hop + 4*s.m.Vocoder.Dims.NFFT
	return n + int64(host)*4, nil
}

// Process consumes exactly ChunkSize samples as one reference chunk and appends the audio
// that is now final to out (none, one or more DiT steps' worth: 0, 1600, 1920 or 3840
// samples for the 120 ms model, 1600 then 2560 for the 40 ms one).
func (s *Stream) Process(out, in []float32) ([]float32, error) {
	if len(in) != s.ChunkSize() {
		return out, fmt.Errorf("meanvc2: process: %d samples, want a chunk of %d", len(in), s.ChunkSize())
	}
	if n := s.fe.Pending(); n > 0 {
		return out, fmt.Errorf("meanvc2: process: %d samples buffered by Write; keep writing", n)
	}
	return s.chunk(out, in)
}

// Write takes any number of samples and appends the audio now final. It is the live path:
// each ASR window runs as soon as the samples under it have arrived, each condition frame
// as soon as its BN frames exist, each DiT step as soon as its window of condition frames
// is queued, and the vocoder's output for a step is appended at once — up to 110 ms before
// the chunk that holds them is complete. The audio is the same, sample for sample, as
// Process gives for the same chunks, however the input is cut.
func (s *Stream) Write(out, in []float32) ([]float32, error) {
	if err := s.begin(out, in); err != nil {
		return out, err
	}
	defer func() { s.out = nil }()
	s.writeSteps = 0
	if err := s.runSteps(); err != nil { // a step an earlier call left for this one
		return s.out, err
	}
	n := s.ChunkSize()
	for len(in) > 0 {
		if s.fe.Pending() == 0 {
			s.beginChunk(s.fe.WindowsIn(n))
		}
		k := min(len(in), n-s.fe.Pending())
		err := s.fe.Push(in[:k], s.window)
		in = in[k:]
		if err == nil && s.fe.Pending() == 0 {
			err = s.endChunk()
		}
		if err != nil {
			return s.out, s.fail(err)
		}
	}
	return s.out, nil
}

// SpreadSteps makes each Write call run at most one DiT step, leaving the others a window
// made ready for the next calls: the 120 ms model's two steps every third chunk, and the
// 40 ms model's two after a chunk's second window, land on consecutive 20 ms pieces instead
// of one, so a live stream's slowest piece costs one step, not two. The audio is the same;
// only when it is computed changes (LiveDelay accounts for it). Flush runs whatever is left.
// Reset keeps the setting.
func (s *Stream) SpreadSteps(on bool) { s.spread = on }

// Flush ends the input: a partial chunk Write began is closed (its windows have run; if it
// has fewer than a whole chunk, its last BN frame stands in for the missing ones — where
// the reference, which sees the short chunk at once, stretches its frames instead), the
// queued condition frames are converted with the reference's flush padding, and the
// vocoder's held-back tail is appended. The stream is then Reset for a new input.
func (s *Stream) Flush(out []float32) ([]float32, error) {
	defer s.Reset()
	if err := s.begin(out, nil); err != nil {
		return out, err
	}
	spread := s.spread
	s.spread = false // the end of the input: every step now
	defer func() { s.out, s.spread = nil, spread }()
	if s.fe.Pending() > 0 {
		err := s.fe.Flush(s.window)
		if err == nil {
			err = s.endChunk()
		}
		if err != nil {
			return s.out, s.fail(err)
		}
	}
	for _, cond := range s.cond.Flush() {
		if err := s.step(cond); err != nil {
			return s.out, err
		}
	}
	return append(s.out, s.voc.Flush()...), nil
}

// chunk is run_rt's process_chunk on one chunk of input (a full one, or the last short one).
func (s *Stream) chunk(out, in []float32) ([]float32, error) {
	if err := s.begin(out, in); err != nil {
		return out, err
	}
	defer func() { s.out = nil }()
	s.beginChunk(s.fe.WindowsIn(len(in)))
	_, err := s.fe.Chunk(in, s.window)
	if err == nil {
		err = s.endChunk()
	}
	if err != nil {
		return s.out, s.fail(err)
	}
	return s.out, nil
}

// begin starts a call that appends to out: the stream must be usable and in finite (one bad
// sample would poison every cache for the rest of the stream). The caller clears s.out when
// it returns.
func (s *Stream) begin(out, in []float32) error {
	if s.err != nil {
		return s.err
	}
	for _, v := range in {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return errors.New("meanvc2: input holds NaN or Inf samples")
		}
	}
	s.out = out
	return nil
}

// fail records a content-encoder error (a step's error is recorded by step).
func (s *Stream) fail(err error) error {
	if s.err == nil {
		s.err = fmt.Errorf("meanvc2: content encoder: %w", err)
	}
	return s.err
}

// beginChunk opens an input chunk that will run windows ASR windows.
func (s *Stream) beginChunk(windows int) {
	s.adapter.begin(windows * s.bnPerWin)
	s.chunkSteps, s.chunkWindows = 0, 0
}

// window is the front end's EmitFunc: one ASR window, its condition frames, and the DiT
// steps they complete.
func (s *Stream) window(frames []float32, offset int) error {
	var bn []float32
	if s.dry {
		bn = make([]float32, s.bnPerWin*s.m.Config.BNDim)
	} else {
		j := &s.job
		j.kind, j.key, j.frames, j.offset = asrJob, len(frames), frames, offset
		err := s.m.run(j)
		j.frames = nil
		if err != nil {
			return err
		}
		bn = j.bn
	}
	s.chunkWindows++
	s.cond.Push(s.adapter.add(nil, bn))
	return s.runSteps()
}

// endChunk closes the chunk: its last condition frames, and the steps they complete. A
// chunk with no window runs no step, as in the reference.
func (s *Stream) endChunk() error {
	s.cond.Push(s.adapter.end(nil))
	if s.chunkWindows == 0 {
		return nil
	}
	return s.runSteps()
}

// runSteps runs the DiT steps the queued condition frames allow, at most
// MaxDiTStepsPerChunk per input chunk as run_rt's loop does.
func (s *Stream) runSteps() error {
	for s.chunkSteps < max(s.m.Config.Runtime.MaxDiTStepsPerChunk, 1) && !(s.spread && s.writeSteps > 0) {
		cond, ok := s.cond.Next()
		if !ok {
			return nil
		}
		s.chunkSteps++
		s.writeSteps++
		if err := s.step(cond); err != nil {
			return err
		}
	}
	return nil
}

// step runs one DiT step on cond [Window, BNDim] and the vocoder on its mel frames, and
// appends the audio to s.out.
func (s *Stream) step(cond []float32) error {
	if s.dry {
		s.steps++
		s.out = append(s.out, make([]float32, s.dryEmit())...)
		return nil
	}
	var raw []float32
	if s.noise != nil {
		raw = s.noise(s.steps)
	}
	x0, err := s.dit.Noise(raw)
	if err != nil {
		s.err = fmt.Errorf("meanvc2: DiT step %d: %w", s.steps, err)
		return s.err
	}
	j := &s.job
	j.kind, j.key, j.x0, j.cond, j.target = stepJob, 0, x0, cond, s.target
	if s.dit.trace {
		j.key = -1 // a traced step runs alone
	}
	err = s.m.run(j)
	j.x0, j.cond, j.mel = nil, nil, nil
	switch {
	case err != nil && j.ditErr:
		s.err = fmt.Errorf("meanvc2: DiT step %d: %w", s.steps, err)
		return s.err
	case err != nil:
		s.err = fmt.Errorf("meanvc2: vocoder step %d: %w", s.steps, err)
		s.steps++
		return s.err
	}
	s.steps++
	s.out = append(s.out, j.wav...)
	return nil
}
