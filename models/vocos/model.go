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
func Tensors(d Dims) []TensorSpec {
	out := []TensorSpec{
		{Name: "backbone.embed.weight", Shape: []int{d.Dim, d.Mels, d.Kernel}}, {Name: "backbone.embed.bias", Shape: []int{d.Dim}},
		{Name: "backbone.norm.weight", Shape: []int{d.Dim}}, {Name: "backbone.norm.bias", Shape: []int{d.Dim}},
	}
	for i := range d.Layers {
		p := fmt.Sprintf("backbone.convnext.%d.", i)
		out = append(out,
			TensorSpec{Name: p + "gamma", Shape: []int{d.Dim}},
			TensorSpec{Name: p + "dwconv.weight", Shape: []int{d.Dim, 1, d.DWKernel}}, TensorSpec{Name: p + "dwconv.bias", Shape: []int{d.Dim}},
			TensorSpec{Name: p + "norm.weight", Shape: []int{d.Dim}}, TensorSpec{Name: p + "norm.bias", Shape: []int{d.Dim}},
			TensorSpec{Name: p + "pwconv1.weight", Shape: []int{d.Inter, d.Dim}}, TensorSpec{Name: p + "pwconv1.bias", Shape: []int{d.Inter}},
			TensorSpec{Name: p + "pwconv2.weight", Shape: []int{d.Dim, d.Inter}}, TensorSpec{Name: p + "pwconv2.bias", Shape: []int{d.Dim}})
	}
	return append(out,
		TensorSpec{Name: "backbone.final_layer_norm.weight", Shape: []int{d.Dim}}, TensorSpec{Name: "backbone.final_layer_norm.bias", Shape: []int{d.Dim}},
		TensorSpec{Name: "head.out.weight", Shape: []int{d.NFFT + 2, d.Dim}}, TensorSpec{Name: "head.out.bias", Shape: []int{d.NFFT + 2}},
		TensorSpec{Name: "head.istft.window", Shape: []int{d.NFFT}})
}

// RealTensors is the published vocos table (RealDims), for random-weight models.
func RealTensors() []TensorSpec { return Tensors(RealDims) }

// ---- weights ----

type lin struct {
	W weights.Tensor `gguf:"weight"`
	B weights.Tensor `gguf:"bias"`
}

type blockW struct {
	Gamma weights.Tensor `gguf:"gamma"`
	DW    lin            `gguf:"dwconv"`
	Norm  lin            `gguf:"norm"`
	PW1   lin            `gguf:"pwconv1"`
	PW2   lin            `gguf:"pwconv2"`
}

type netW struct {
	Embed  lin            `gguf:"backbone.embed"`
	Norm   lin            `gguf:"backbone.norm"`
	Blocks []blockW       `gguf:"backbone.convnext.%d"`
	Final  lin            `gguf:"backbone.final_layer_norm"`
	Head   lin            `gguf:"head.out"`
	Window weights.Tensor `gguf:"head.istft.window,optional"` // dropped by some converters
}

func (d Dims) expect(w *netW) {
	w.Embed.W.Shape, w.Embed.B.Shape = []int{d.Dim, d.Mels, d.Kernel}, []int{d.Dim}
	w.Norm.W.Shape, w.Norm.B.Shape = []int{d.Dim}, []int{d.Dim}
	w.Blocks = make([]blockW, d.Layers)
	for i := range w.Blocks {
		b := &w.Blocks[i]
		b.Gamma.Shape = []int{d.Dim}
		b.DW.W.Shape, b.DW.B.Shape = []int{d.Dim, 1, d.DWKernel}, []int{d.Dim}
		b.Norm.W.Shape, b.Norm.B.Shape = []int{d.Dim}, []int{d.Dim}
		b.PW1.W.Shape, b.PW1.B.Shape = []int{d.Inter, d.Dim}, []int{d.Inter}
		b.PW2.W.Shape, b.PW2.B.Shape = []int{d.Dim, d.Inter}, []int{d.Dim}
	}
	w.Final.W.Shape, w.Final.B.Shape = []int{d.Dim}, []int{d.Dim}
	w.Head.W.Shape, w.Head.B.Shape = []int{d.NFFT + 2, d.Dim}, []int{d.NFFT + 2}
	w.Window.Shape = []int{-1}
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

type ln struct{ w, b *engine.Buffer }

type block struct {
	gamma, dwW, dwB *engine.Buffer
	norm            ln
	pw1, pw2        ln
}

// Model is a loaded vocoder. Decode and any number of Streams may be used from several
// goroutines; network runs are serialised.
type Model struct {
	Dims   Dims
	Config Config
	window []float32

	embed, norm, final, head ln
	blocks                   []block

	mu      sync.Mutex
	backend engine.Backend
	progs   map[int]engine.Program // by frame count; a map lookup keeps Push allocation-free
	istft   *dsp.ISTFT             // Decode's
	bufs    []*engine.Buffer
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
	var w netW
	d.expect(&w)
	if err := weights.Bind(src, &w); err != nil {
		return nil, fmt.Errorf("vocos: %w", err)
	}
	m := &Model{Dims: d, Config: cfg, backend: backend, progs: map[int]engine.Program{}}
	m.window = w.Window.Data
	if !w.Window.Present() {
		m.window = dsp.HannPeriodic(d.NFFT)
	}
	if len(m.window) > d.NFFT {
		return nil, fmt.Errorf("vocos: %s has %d samples, more than n_fft %d", displayName(src, "head.istft.window"), len(m.window), d.NFFT)
	}
	if m.istft, err = dsp.NewISTFT(d.NFFT, cfg.Hop, m.window); err != nil {
		return nil, fmt.Errorf("vocos: %w", err)
	}
	if err := m.upload(&w); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Model) upload(w *netW) error {
	var firstErr error
	buf := func(name string, t *weights.Tensor) *engine.Buffer {
		shape := make([]int64, len(t.Shape))
		for i, v := range t.Shape {
			shape[i] = int64(v)
		}
		b, err := engine.NewBufferFrom(name, t.Data, shape...)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("vocos: %w", err)
			}
			return nil
		}
		m.bufs = append(m.bufs, b)
		return b
	}
	pair := func(name string, l *lin) ln { return ln{buf(name+".weight", &l.W), buf(name+".bias", &l.B)} }
	m.embed = pair("backbone.embed", &w.Embed)
	m.norm = pair("backbone.norm", &w.Norm)
	for i := range w.Blocks {
		bw := &w.Blocks[i]
		p := fmt.Sprintf("backbone.convnext.%d.", i)
		m.blocks = append(m.blocks, block{
			gamma: buf(p+"gamma", &bw.Gamma),
			dwW:   buf(p+"dwconv.weight", &bw.DW.W),
			dwB:   buf(p+"dwconv.bias", &bw.DW.B),
			norm:  pair(p+"norm", &bw.Norm),
			pw1:   pair(p+"pwconv1", &bw.PW1),
			pw2:   pair(p+"pwconv2", &bw.PW2),
		})
	}
	m.final = pair("backbone.final_layer_norm", &w.Final)
	m.head = pair("head.out", &w.Head)
	return firstErr
}

// Close releases the programs and the weights.
func (m *Model) Close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closePrograms()
	for _, b := range m.bufs {
		b.Free()
	}
	m.bufs = nil
}

// maxPrograms bounds the compiled frame counts kept (streaming uses two: first window and
// the overlapped ones; offline decodes of many lengths would otherwise pile up).
const maxPrograms = 8

func (m *Model) closePrograms() {
	for k, p := range m.progs {
		p.Close()
		delete(m.progs, k)
	}
}

// program returns the compiled network for F frames; m.mu is held.
func (m *Model) program(F int) (engine.Program, error) {
	if p, ok := m.progs[F]; ok {
		return p, nil
	}
	g, err := m.build(F)
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
	m.progs[F] = p
	return p, nil
}

// build is the network for F frames: mel [1, Mels, F] → spectrum re, im [1, F, n_fft/2+1].
func (m *Model) build(F int) (*engine.Graph, error) {
	d, cfg := m.Dims, m.Config
	g := engine.NewGraph(fmt.Sprintf("vocos(F=%d)", F))
	p := func(b *engine.Buffer) engine.Tensor { return g.Persistent(b) }
	pp := func(b *engine.Buffer) *engine.Tensor { t := g.Persistent(b); return &t }
	eps := float32(cfg.LayerNormEps)
	layerNorm := func(x engine.Tensor, l ln) engine.Tensor { return g.LayerNorm(x, pp(l.w), pp(l.b), eps) }

	mel := g.Input("mel", engine.F32, 1, int64(d.Mels), int64(F))
	g.Label("backbone.embed")
	pad := int64(d.Kernel-1) / 2
	x := g.Conv1D(mel, p(m.embed.w), pp(m.embed.b), 1, pad, pad, 1, 1)
	x = g.Transpose(x, 1, 2) // [1, F, Dim]: LayerNorm and the pointwise layers work on channels last
	g.Label("backbone.norm")
	x = layerNorm(x, m.norm)
	dwPad := int64(d.DWKernel-1) / 2
	for i, b := range m.blocks {
		g.Label(fmt.Sprintf("backbone.convnext.%d", i))
		y := g.Conv1D(g.Transpose(x, 1, 2), p(b.dwW), pp(b.dwB), 1, dwPad, dwPad, 1, int64(d.Dim))
		y = layerNorm(g.Transpose(y, 1, 2), b.norm)
		y = g.GELU(g.Linear(y, p(b.pw1.w), pp(b.pw1.b)), false)
		y = g.Linear(y, p(b.pw2.w), pp(b.pw2.b))
		x = g.Add(x, g.Mul(y, p(b.gamma)))
	}
	g.Label("backbone.final_layer_norm")
	x = layerNorm(x, m.final)
	g.Label("head")
	h := g.Linear(x, p(m.head.w), pp(m.head.b))
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
	prog, err := m.program(frames)
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
