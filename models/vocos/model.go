// Package vocos is the Vocos vocoder MeanVC2 uses (MeanVC's VocosBackbone + ISTFTHead with
// center padding): mel [80, F] in [0, 1] → embed conv → LayerNorm → ConvNeXt blocks → final
// LayerNorm → Linear head → magnitude (exp, clamped) and phase → inverse STFT, (F−1)·hop
// samples. The network runs on the engine; the inverse STFT is dsp.ISTFT. Stream adds the
// MeanVC2 streaming wrapper (mel overlap and crossfade with a held-back tail). Widths come
// from the tensor shapes; the hop and epsilons from Config.
package vocos

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// Config holds what the tensor shapes do not tell.
type Config struct {
	Hop          int     // ISTFT hop (0: n_fft/4, Vocos' usual ratio)
	LayerNormEps float64 // every LayerNorm
	MagClip      float64 // upper clamp of exp(log-magnitude)
	// Streaming (MeanVC2 run_rt): mel frames of the previous window prepended to each new
	// one, and samples crossfaded between consecutive decodes (the held-back tail).
	Overlap    int
	WavOverlap int
}

// DefaultConfig is MeanVC2's vocoder: hop n_fft/4 (160), LayerNorm eps 1e-6, magnitude
// clamp 100, 2-frame mel overlap, 160-sample crossfade.
func DefaultConfig() Config {
	return Config{LayerNormEps: 1e-6, MagClip: 100, Overlap: 2, WavOverlap: 160}
}

// ParseConfig reads the `vocos` and `runtime` sections of an audio.cpp MeanVC2 config.json.
// Missing keys keep DefaultConfig's values; variants this package does not implement are
// refused.
func ParseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	var whole struct {
		Vocos *struct {
			Hop        *int     `json:"hop_length"`
			Eps        *float64 `json:"layer_norm_eps"`
			MagClip    *float64 `json:"mag_clip"`
			Padding    string   `json:"padding"`
			Activation string   `json:"activation"`
			Window     string   `json:"window"`
			Transform  string   `json:"input_transform"`
		} `json:"vocos"`
		Runtime *struct {
			Overlap    *int `json:"vocoder_overlap"`
			WavOverlap *int `json:"vocoder_wav_overlap"`
			WavPad     *int `json:"vocoder_wav_pad"`
		} `json:"runtime"`
	}
	if err := json.Unmarshal(data, &whole); err != nil {
		return c, fmt.Errorf("vocos: config.json: %w", err)
	}
	if v := whole.Vocos; v != nil {
		switch {
		case v.Padding != "" && v.Padding != "center":
			return c, fmt.Errorf("vocos: padding %q is not supported (center)", v.Padding)
		case v.Activation != "" && v.Activation != "gelu_erf":
			return c, fmt.Errorf("vocos: activation %q is not supported (gelu_erf)", v.Activation)
		case v.Window != "" && v.Window != "hann_periodic":
			return c, fmt.Errorf("vocos: window %q is not supported (hann_periodic)", v.Window)
		case v.Transform != "" && v.Transform != "(mel+1)/2":
			return c, fmt.Errorf("vocos: input_transform %q is not supported ((mel+1)/2)", v.Transform)
		}
		setInt(&c.Hop, v.Hop)
		setFloat(&c.LayerNormEps, v.Eps)
		setFloat(&c.MagClip, v.MagClip)
	}
	if r := whole.Runtime; r != nil {
		if r.WavPad != nil && *r.WavPad != 0 {
			return c, fmt.Errorf("vocos: vocoder_wav_pad %d is not supported (0)", *r.WavPad)
		}
		setInt(&c.Overlap, r.Overlap)
		setInt(&c.WavOverlap, r.WavOverlap)
	}
	return c, c.validate()
}

func setInt(dst *int, src *int) {
	if src != nil {
		*dst = *src
	}
}

func setFloat(dst *float64, src *float64) {
	if src != nil {
		*dst = *src
	}
}

func (c Config) validate() error {
	if c.Hop < 0 || c.LayerNormEps <= 0 || c.MagClip <= 0 || c.Overlap < 0 || c.WavOverlap < 1 {
		return fmt.Errorf("vocos: invalid config %+v", c)
	}
	return nil
}

// Dims are the network's widths, read from the tensor shapes.
type Dims struct {
	Mels, Dim, Inter, Layers int
	Kernel, DWKernel         int // embed and depthwise conv kernels
	NFFT                     int // head outputs n_fft+2 values per frame
}

// RealDims are the published MeanVC/MeanVC2 Vocos (16 kHz).
var RealDims = Dims{Mels: 80, Dim: 320, Inter: 1536, Layers: 8, Kernel: 7, DWKernel: 7, NFFT: 640}

// TensorSpec is a tensor of the published model's table.
type TensorSpec = weights.Spec

// Tensors lists a vocoder's tensors with dims d in the published order.
func Tensors(d Dims) []TensorSpec { return nn.Specs(d.declare()) }

// RealTensors is the published vocos table (RealDims), for random-weight models.
func RealTensors() []TensorSpec { return Tensors(RealDims) }

// ---- weights ----

type block struct {
	Gamma nn.Tensor    `gguf:"gamma"`
	DW    nn.Conv1d    `gguf:"dwconv"`
	Norm  nn.LayerNorm `gguf:"norm"`
	PW1   nn.Linear    `gguf:"pwconv1"`
	PW2   nn.Linear    `gguf:"pwconv2"`
}

type net struct {
	Embed  nn.Conv1d    `gguf:"backbone.embed"`
	Norm   nn.LayerNorm `gguf:"backbone.norm"`
	Blocks []block      `gguf:"backbone.convnext.%d"`
	Final  nn.LayerNorm `gguf:"backbone.final_layer_norm"`
	Head   nn.Linear    `gguf:"head.out"`
	// The ISTFT window runs on the host (dsp.ISTFT); some converters drop it.
	Window weights.Tensor `gguf:"head.istft.window,optional"`
}

// declare is the network of dims d with every expected shape.
func (d Dims) declare() *net {
	w := &net{
		Embed:  nn.NewConv1d(d.Mels, d.Dim, d.Kernel, 1, true),
		Norm:   nn.NewLayerNorm(d.Dim),
		Blocks: make([]block, d.Layers),
		Final:  nn.NewLayerNorm(d.Dim),
		Head:   nn.NewLinear(d.Dim, d.NFFT+2, true),
		Window: weights.Tensor{Shape: []int{d.NFFT}},
	}
	for i := range w.Blocks {
		w.Blocks[i] = block{
			Gamma: nn.Shaped(d.Dim),
			DW:    nn.NewConv1d(d.Dim, d.Dim, d.DWKernel, d.Dim, true),
			Norm:  nn.NewLayerNorm(d.Dim),
			PW1:   nn.NewLinear(d.Dim, d.Inter, true),
			PW2:   nn.NewLinear(d.Inter, d.Dim, true),
		}
	}
	return w
}

func displayName(src weights.Source, name string) string {
	if p, ok := src.(interface{ Prefix() string }); ok {
		return p.Prefix() + name
	}
	return name
}

func shapeOf(src weights.Source, name string, rank int) ([]int, error) {
	if !src.Has(name) {
		return nil, fmt.Errorf("vocos: missing tensor %s", displayName(src, name))
	}
	_, shape, err := src.Get(name)
	if err != nil {
		return nil, fmt.Errorf("vocos: tensor %s: %w", displayName(src, name), err)
	}
	if len(shape) != rank {
		return nil, fmt.Errorf("vocos: tensor %s has shape %v, want rank %d", displayName(src, name), shape, rank)
	}
	return shape, nil
}

// dimsOf reads the widths from the tensors that define them.
func dimsOf(src weights.Source) (Dims, error) {
	var d Dims
	emb, err := shapeOf(src, "backbone.embed.weight", 3)
	if err != nil {
		return d, err
	}
	head, err := shapeOf(src, "head.out.weight", 2)
	if err != nil {
		return d, err
	}
	d = Dims{Dim: emb[0], Mels: emb[1], Kernel: emb[2], NFFT: head[0] - 2, DWKernel: 7}
	for src.Has(fmt.Sprintf("backbone.convnext.%d.pwconv1.weight", d.Layers)) {
		d.Layers++
	}
	if d.Layers > 0 {
		pw, err := shapeOf(src, "backbone.convnext.0.pwconv1.weight", 2)
		if err != nil {
			return d, err
		}
		dw, err := shapeOf(src, "backbone.convnext.0.dwconv.weight", 3)
		if err != nil {
			return d, err
		}
		d.Inter, d.DWKernel = pw[0], dw[2]
	}
	if d.NFFT < 2 || d.NFFT%2 != 0 {
		return d, fmt.Errorf("vocos: %s has %d outputs; want n_fft+2 with n_fft even", displayName(src, "head.out.weight"), head[0])
	}
	if d.Kernel%2 == 0 || d.DWKernel%2 == 0 {
		return d, fmt.Errorf("vocos: even kernels %d/%d have no same padding", d.Kernel, d.DWKernel)
	}
	return d, nil
}

// ---- model ----

// Model is a loaded vocoder. Decode and any number of Streams may be used from several
// goroutines; network runs are serialised.
type Model struct {
	Dims   Dims
	Config Config
	window []float32

	w *net

	mu      sync.Mutex
	backend engine.Backend
	progs   map[progKey]engine.Program // by frame count and batch; a map lookup keeps Push allocation-free
	istft   *dsp.ISTFT                 // Decode's
}

// Load binds a vocos weight view (e.g. model.Sub("vocos")) with DefaultConfig.
func Load(src weights.Source, backend engine.Backend) (*Model, error) {
	return LoadConfig(src, DefaultConfig(), backend)
}

// LoadConfig is Load with a Config (see ParseConfig).
func LoadConfig(src weights.Source, cfg Config, backend engine.Backend) (*Model, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d, err := dimsOf(src)
	if err != nil {
		return nil, err
	}
	if cfg.Hop == 0 {
		cfg.Hop = d.NFFT / 4
	}
	w := d.declare()
	w.Window.Shape = []int{-1} // checked against n_fft below
	if err := nn.Bind(src, backend, w); err != nil {
		return nil, fmt.Errorf("vocos: %w", err)
	}
	m := &Model{Dims: d, Config: cfg, backend: backend, progs: map[progKey]engine.Program{}, w: w}
	m.window = w.Window.Data
	if !w.Window.Present() {
		m.window = dsp.HannPeriodic(d.NFFT)
	}
	if len(m.window) > d.NFFT {
		m.Close()
		return nil, fmt.Errorf("vocos: %s has %d samples, more than n_fft %d", displayName(src, "head.istft.window"), len(m.window), d.NFFT)
	}
	if m.istft, err = dsp.NewISTFT(d.NFFT, cfg.Hop, m.window); err != nil {
		m.Close()
		return nil, fmt.Errorf("vocos: %w", err)
	}
	return m, nil
}

// Close releases the programs and the weights.
func (m *Model) Close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closePrograms()
	nn.Free(m.w)
}

// maxPrograms bounds the compiled programs kept (streaming uses two a batch size: first
// window and the overlapped ones; offline decodes of many lengths would otherwise pile up).
const maxPrograms = 16

// MaxBatch is the most streams one batched program decodes.
const MaxBatch = 16

// progKey names a program: F frames for each of B windows.
type progKey struct{ F, B int }

func (m *Model) closePrograms() {
	for k, p := range m.progs {
		p.Close()
		delete(m.progs, k)
	}
}

// program returns the compiled network for B windows of F frames; m.mu is held.
func (m *Model) program(F, B int) (engine.Program, error) {
	if p, ok := m.progs[progKey{F, B}]; ok {
		return p, nil
	}
	g, err := m.build(F, B)
	if err != nil {
		return nil, err
	}
	p, err := m.backend.Compile(g)
	if err != nil {
		return nil, err
	}
	if len(m.progs) >= maxPrograms {
		m.closePrograms()
	}
	m.progs[progKey{F, B}] = p
	return p, nil
}

// build is the network for B windows of F frames: mel [B, Mels, F] → spectrum re, im
// [B, F, n_fft/2+1]. Each window's results are bit for bit those it gets alone: the embed
// conv (whose kernel's blocking follows the batch) runs per window, everything else is
// row-wise or a row-independent product (Graph.SetRowGroups).
func (m *Model) build(F, B int) (*engine.Graph, error) {
	d, cfg := m.Dims, m.Config
	g := engine.NewGraph(fmt.Sprintf("vocos(F=%d,B=%d)", F, B))
	g.SetRowGroups(B)
	w := m.w
	eps := float32(cfg.LayerNormEps)

	mel := g.Input("mel", engine.F32, int64(B), int64(d.Mels), int64(F))
	g.Label("backbone.embed")
	pad := int64(d.Kernel-1) / 2
	embeds := make([]engine.Tensor, B)
	for b := range B {
		embeds[b] = w.Embed.Forward(g, g.Slice(mel, 0, int64(b), int64(b)+1), 1, pad, pad, 1)
	}
	x := g.Concat(0, embeds...)
	x = g.Transpose(x, 1, 2) // [B, F, Dim]: LayerNorm and the pointwise layers work on channels last
	g.Label("backbone.norm")
	x = w.Norm.Forward(g, x, eps)
	dwPad := int64(d.DWKernel-1) / 2
	for i := range w.Blocks {
		b := &w.Blocks[i]
		g.Label(fmt.Sprintf("backbone.convnext.%d", i))
		y := b.DW.Forward(g, g.Transpose(x, 1, 2), 1, dwPad, dwPad, 1)
		y = b.Norm.Forward(g, g.Transpose(y, 1, 2), eps)
		y = g.GELU(b.PW1.Forward(g, y), false)
		y = b.PW2.Forward(g, y)
		x = g.Add(x, g.Mul(y, b.Gamma.In(g)))
	}
	g.Label("backbone.final_layer_norm")
	x = w.Final.Forward(g, x, eps)
	g.Label("head")
	h := w.Head.Forward(g, x)
	nb := int64(d.NFFT/2 + 1)
	mag := g.Clamp(g.Exp(g.Slice(h, 2, 0, nb)), -math.MaxFloat32, float32(cfg.MagClip))
	phase := g.Slice(h, 2, nb, 2*nb)
	g.Output("re", g.Mul(mag, g.Cos(phase)))
	g.Output("im", g.Mul(mag, g.Sin(phase)))
	if err := g.Err(); err != nil {
		return nil, err
	}
	return g, nil
}

// SamplesFor is the length of Decode's output for F frames: (F−1)·hop.
func (m *Model) SamplesFor(frames int) int { return max(frames-1, 0) * m.Config.Hop }

// decodeInto runs the network and the inverse STFT (with st) into out, grown as needed.
func (m *Model) decodeInto(mel []float32, frames int, st *dsp.ISTFT, out []float32) ([]float32, error) {
	if frames < 1 || len(mel) != frames*m.Dims.Mels {
		return nil, fmt.Errorf("vocos: %d mel values for %d frames of %d bins", len(mel), frames, m.Dims.Mels)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prog, err := m.program(frames, 1)
	if err != nil {
		return nil, fmt.Errorf("vocos: %w", err)
	}
	copy(prog.Input("mel"), mel)
	if err := prog.Run(); err != nil {
		return nil, fmt.Errorf("vocos: run: %w", err)
	}
	out, err = st.Inverse(prog.Output("re"), prog.Output("im"), frames, out)
	if err != nil {
		return nil, fmt.Errorf("vocos: %w", err)
	}
	return out, nil
}

// Decode turns a vocoder-domain mel [Mels, frames] (channel-major, values in [0, 1], i.e.
// the DiT's mel already mapped by (mel+1)/2) into (frames−1)·hop samples.
func (m *Model) Decode(mel []float32, frames int) ([]float32, error) {
	return m.decodeInto(mel, frames, m.istft, nil)
}
