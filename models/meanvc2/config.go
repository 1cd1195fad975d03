// Package meanvc2 is the conversion core of MeanVC2 streaming voice conversion: the global
// timbre memory (GTM), the temporal timbre attention (TVT), the chunked DiT with per-layer
// rolling KV caches and chunk masks, the BN-feature upsampling to the mel frame rate, and the
// 2-step mean-flow sampler. Weights come from the `vc/` namespace of an audio.cpp-packaged
// GGUF; the embedded config.json carries the structural constants.
package meanvc2

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// Family is the audiocpp.model_spec.family of MeanVC2 model files.
const Family = "meanvc2"

// Config is the DiT's configuration. Widths are re-derived from tensor shapes when a model
// is loaded (LoadDiT); the rest (chunking, masks, norms' eps, schedule) only comes from here.
type Config struct {
	Dim     int `json:"dim"`      // transformer width
	Depth   int `json:"depth"`    // ChunkDiT blocks
	Heads   int `json:"heads"`    // attention heads
	DimHead int `json:"dim_head"` // per head
	FFMult  int `json:"ff_mult"`  // FFN width = FFMult·Dim (FF below once loaded)
	FF      int `json:"-"`
	BNDim   int `json:"bn_dim"` // content (BN) feature width = GTM width = speaker width
	MelDim  int `json:"mel_dim"`
	SpkDim  int `json:"spk_dim"`

	ChunkSize int `json:"chunk_size"` // frames emitted per step (12 for the 120 ms model)
	BlockSize int `json:"block_size"` // lookahead frames (4)

	// PastChunks and FutureChunks are each layer's t_p / t_f: a query chunk sees t_p
	// earlier chunks and the first t_f·BlockSize frames of the next one.
	PastChunks   []int `json:"-"`
	FutureChunks []int `json:"-"`

	GTMSlots   int `json:"-"` // timbre memory slots
	GTMHidden  int `json:"-"` // memory width
	TVTAttnDim int `json:"-"`
	TVTHeads   int `json:"-"`

	TimeFreqDim int     `json:"-"` // sinusoid width before the time MLP
	TimeScale   float64 `json:"-"` // sinusoid argument = scale·t
	RopeBase    float64 `json:"-"`
	AdaEps      float64 `json:"-"` // LayerNorm eps of the AdaLN modulations
	RMSEps      float64 `json:"-"` // q/k RMSNorm eps
	LNEps       float64 `json:"-"` // GTM and TVT LayerNorm eps
	OffsetReset int     `json:"-"` // the DiT offset and KV caches restart at this frame offset

	// Timesteps are the (t, r) pairs of the mean-flow calls of one step.
	Timesteps [][2]float64 `json:"-"`

	Runtime Runtime `json:"-"`

	// Sections are the raw sections of config.json (asr, vocos, speaker_wavlm, …) for the
	// other components of the pipeline.
	Sections map[string]json.RawMessage `json:"-"`
}

// Runtime is the streaming driver's section (run_rt.py's constants).
type Runtime struct {
	Model               string       `json:"model"`
	SampleRate          int          `json:"sample_rate"`
	ChunkSamples        int          `json:"chunk_samples"`
	SamplesCacheLen     int          `json:"samples_cache_len"`
	SamplesCacheInit    float64      `json:"samples_cache_init"`
	FbankCacheFrames    int          `json:"fbank_cache_frames"`
	BNWindow            int          `json:"bn_window"`
	BNStride            int          `json:"bn_stride"`
	RequiredCacheSize   int          `json:"required_cache_size"`
	ASROffsetInit       int          `json:"asr_offset_init"`
	ASROffsetStep       int          `json:"asr_offset_step"`
	ASROffsetReset      int          `json:"asr_offset_reset"`
	ChunkSize           int          `json:"chunk_size"`
	BlockSize           int          `json:"block_size"`
	VCChunkFrames       int          `json:"vc_chunk_frames"`
	MaxDiTStepsPerChunk int          `json:"max_dit_steps_per_chunk"`
	ODESteps            int          `json:"ode_steps"`
	Timesteps           [][2]float64 `json:"timesteps"`
	UpsampleFactor      int          `json:"upsample_factor"`
	VocoderOverlap      int          `json:"vocoder_overlap"`
	VocoderWavOverlap   int          `json:"vocoder_wav_overlap"`
	VocoderWavPad       int          `json:"vocoder_wav_pad"`
}

// DefaultConfig is the published meanvc2-120ms-40ms model (config_120ms_40ms.json plus the
// constants fixed in the reference code).
func DefaultConfig() Config {
	return Config{
		Dim: 512, Depth: 4, Heads: 2, DimHead: 64, FFMult: 2, FF: 1024, BNDim: 256, MelDim: 80, SpkDim: 256,
		ChunkSize: 12, BlockSize: 4,
		PastChunks: []int{2, 2, 1, 1}, FutureChunks: []int{1, 0, 0, 0},
		GTMSlots: 32, GTMHidden: 256, TVTAttnDim: 128, TVTHeads: 4,
		TimeFreqDim: 256, TimeScale: 1000, RopeBase: 10000,
		AdaEps: 1e-6, RMSEps: 1e-6, LNEps: 1e-5, OffsetReset: 4000,
		Timesteps: [][2]float64{{1, 0.5}, {0.5, 0}},
		Runtime: Runtime{
			Model: "120ms", SampleRate: 16000, ChunkSamples: 2560, SamplesCacheLen: 720, SamplesCacheInit: -0.5,
			FbankCacheFrames: 3, BNWindow: 19, BNStride: 16, RequiredCacheSize: 8,
			ASROffsetInit: 8, ASROffsetStep: 4, ASROffsetReset: 4000,
			ChunkSize: 12, BlockSize: 4, VCChunkFrames: 16, MaxDiTStepsPerChunk: 4, ODESteps: 2,
			Timesteps:      [][2]float64{{1, 0.5}, {0.5, 0}},
			UpsampleFactor: 160, VocoderOverlap: 2, VocoderWavOverlap: 160, VocoderWavPad: 0,
		},
	}
}

// Variants are the published models' names (Runtime.Model): the 120 ms + 40 ms model
// (meanvc2_120ms_40ms + fastu2pp_160ms) and the 40 ms + 40 ms one (meanvc2_40ms_40ms +
// fastu2pp_80ms). No weight's shape depends on the variant; the streaming constants do.
var Variants = []string{"120ms", "40ms"}

// WithVariant returns c with the streaming constants of a published variant (DiT chunk, ASR
// window, stride, cache and offsets), as run_rt.py's MODEL_PATHS sets them.
func (c Config) WithVariant(v string) (Config, error) {
	rt := &c.Runtime
	switch v {
	case "120ms":
		c.ChunkSize, rt.ChunkSize = 12, 12
		rt.BNWindow, rt.BNStride, rt.RequiredCacheSize, rt.ASROffsetInit, rt.ASROffsetStep = 19, 16, 8, 8, 4
	case "40ms":
		c.ChunkSize, rt.ChunkSize = 4, 4
		rt.BNWindow, rt.BNStride, rt.RequiredCacheSize, rt.ASROffsetInit, rt.ASROffsetStep = 11, 8, 4, 4, 2
	default:
		return c, fmt.Errorf("meanvc2: variant %q: use %s", v, strings.Join(Variants, " or "))
	}
	rt.Model = v
	return c, c.validate()
}

// Window is the number of frames one DiT call sees: the chunk plus the lookahead block.
func (c Config) Window() int { return c.ChunkSize + c.BlockSize }

// CacheFrames is layer l's KV capacity, (t_p+1)·chunk: the frames its mask can reach.
func (c Config) CacheFrames(l int) int { return (c.PastChunks[l] + 1) * c.ChunkSize }

// vcFixed is vc.fixed_in_code of the packaged config.json: constants the reference hard-codes.
type vcFixed struct {
	AdaEps          *float64 `json:"adaln_eps"`
	BackwardLayers  []int    `json:"backward_layers"`
	ForwardLayers   []int    `json:"forward_layers"`
	GTMHidden       *int     `json:"gtm_hidden_dim"`
	GTMSlots        *int     `json:"gtm_memory_slots"`
	LNEps           *float64 `json:"gtm_tvt_ln_eps"`
	KVCacheFrames   []int    `json:"kv_cache_frames"`
	MelDim          *int     `json:"mel_dim"`
	RMSEps          *float64 `json:"rms_eps"`
	RopeBase        *float64 `json:"rope_base"`
	SpkDim          *int     `json:"spk_dim"`
	TF              []int    `json:"t_f_num"`
	TP              []int    `json:"t_p_num"`
	TimeFreqDim     *int     `json:"time_freq_embed_dim"`
	TimeScale       *float64 `json:"time_sinus_scale"`
	TVTAttnDim      *int     `json:"tvt_attn_dim"`
	TVTHeads        *int     `json:"tvt_num_heads"`
	OffsetReset     *int     `json:"vc_offset_reset"`
	FFActivation    string   `json:"ff_activation"`
	ObsoleteDimHead *int     `json:"dim_head"`
}

// ParseConfig reads the packaged config.json (sections vc, runtime, …) over the defaults.
func ParseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	if err := json.Unmarshal(data, &c.Sections); err != nil {
		return c, fmt.Errorf("meanvc2: config.json: %w", err)
	}
	if rt, ok := c.Sections["runtime"]; ok {
		if err := json.Unmarshal(rt, &c.Runtime); err != nil {
			return c, fmt.Errorf("meanvc2: config.json runtime: %w", err)
		}
		if c.Runtime.ChunkSize > 0 {
			c.ChunkSize = c.Runtime.ChunkSize
		}
		if c.Runtime.BlockSize > 0 {
			c.BlockSize = c.Runtime.BlockSize
		}
		if len(c.Runtime.Timesteps) > 0 {
			c.Timesteps = c.Runtime.Timesteps
		}
	}
	if raw, ok := c.Sections["vc"]; ok {
		var vc struct {
			Model json.RawMessage `json:"model"`
			Fixed *vcFixed        `json:"fixed_in_code"`
		}
		if err := json.Unmarshal(raw, &vc); err != nil {
			return c, fmt.Errorf("meanvc2: config.json vc: %w", err)
		}
		if len(vc.Model) > 0 {
			if err := json.Unmarshal(vc.Model, &c); err != nil {
				return c, fmt.Errorf("meanvc2: config.json vc.model: %w", err)
			}
			c.FF = c.FFMult * c.Dim
		}
		if f := vc.Fixed; f != nil {
			if f.FFActivation != "" && f.FFActivation != "gelu_tanh" {
				return c, fmt.Errorf("meanvc2: config.json: ff_activation %q is not supported (gelu_tanh)", f.FFActivation)
			}
			setF := func(dst *float64, v *float64) {
				if v != nil {
					*dst = *v
				}
			}
			setI := func(dst *int, v *int) {
				if v != nil {
					*dst = *v
				}
			}
			setF(&c.AdaEps, f.AdaEps)
			setF(&c.LNEps, f.LNEps)
			setF(&c.RMSEps, f.RMSEps)
			setF(&c.RopeBase, f.RopeBase)
			setF(&c.TimeScale, f.TimeScale)
			setI(&c.GTMHidden, f.GTMHidden)
			setI(&c.GTMSlots, f.GTMSlots)
			setI(&c.MelDim, f.MelDim)
			setI(&c.SpkDim, f.SpkDim)
			setI(&c.TimeFreqDim, f.TimeFreqDim)
			setI(&c.TVTAttnDim, f.TVTAttnDim)
			setI(&c.TVTHeads, f.TVTHeads)
			setI(&c.OffsetReset, f.OffsetReset)
			if f.TP != nil {
				c.PastChunks = layerValues(f.TP, f.BackwardLayers, c.Depth)
			}
			if f.TF != nil {
				c.FutureChunks = layerValues(f.TF, f.ForwardLayers, c.Depth)
			}
			if f.KVCacheFrames != nil {
				for l, n := range f.KVCacheFrames {
					if l < len(c.PastChunks) && n != c.CacheFrames(l) {
						return c, fmt.Errorf("meanvc2: config.json: kv_cache_frames[%d] = %d, but (t_p+1)·chunk = %d", l, n, c.CacheFrames(l))
					}
				}
			}
		}
	}
	return c, c.validate()
}

// layerValues applies the reference's rule: layer i takes v[i] when i is in the enabled set
// (nil: every layer), else 0.
func layerValues(v, enabled []int, depth int) []int {
	on := map[int]bool{}
	for _, l := range enabled {
		on[l] = true
	}
	out := make([]int, max(depth, len(v)))
	for i := range out {
		if i < len(v) && (enabled == nil || on[i]) {
			out[i] = v[i]
		}
	}
	return out
}

func (c Config) validate() error {
	switch {
	case c.Dim <= 0, c.Depth <= 0, c.Heads <= 0, c.DimHead <= 0, c.BNDim <= 0, c.MelDim <= 0, c.SpkDim <= 0:
		return fmt.Errorf("meanvc2: config has a non-positive width: %+v", c)
	case c.ChunkSize <= 0 || c.BlockSize <= 0 || c.BlockSize > c.ChunkSize:
		return fmt.Errorf("meanvc2: chunk %d / block %d: want 0 < block ≤ chunk", c.ChunkSize, c.BlockSize)
	case len(c.PastChunks) < c.Depth || len(c.FutureChunks) < c.Depth:
		return fmt.Errorf("meanvc2: t_p %v / t_f %v do not cover %d layers", c.PastChunks, c.FutureChunks, c.Depth)
	case c.GTMSlots <= 0 || c.TVTHeads <= 0 || c.TVTAttnDim%c.TVTHeads != 0:
		return fmt.Errorf("meanvc2: GTM slots %d, TVT %d dims / %d heads", c.GTMSlots, c.TVTAttnDim, c.TVTHeads)
	case c.TimeFreqDim < 4 || c.TimeFreqDim%2 != 0:
		return fmt.Errorf("meanvc2: time embedding width %d must be even and ≥ 4", c.TimeFreqDim)
	case len(c.Timesteps) == 0:
		return fmt.Errorf("meanvc2: empty mean-flow schedule")
	}
	for l := range c.Depth {
		if c.PastChunks[l] < 0 || c.FutureChunks[l] < 0 || c.FutureChunks[l]*c.BlockSize > c.ChunkSize {
			return fmt.Errorf("meanvc2: layer %d: t_p %d / t_f %d", l, c.PastChunks[l], c.FutureChunks[l])
		}
	}
	return nil
}

// ConfigFromModel checks that m is a MeanVC2 file (audiocpp.model_spec.family) and parses
// its embedded config.json (the defaults when it has none).
func ConfigFromModel(m *gguf.Model) (Config, error) {
	if err := CheckFamily(m); err != nil {
		return Config{}, err
	}
	raw, ok := m.EmbeddedFile("config.json")
	if !ok {
		c := DefaultConfig()
		return c, c.validate()
	}
	return ParseConfig(raw)
}

// CheckFamily fails unless the file declares audiocpp.model_spec.family = meanvc2 (a file
// without the key is accepted: plain GGUF files carry no spec).
func CheckFamily(m *gguf.Model) error {
	if !m.File.KV.Has("audiocpp.model_spec.family") {
		return nil
	}
	fam, err := m.File.KV.String("audiocpp.model_spec.family")
	if err != nil {
		return fmt.Errorf("meanvc2: %w", err)
	}
	if fam != Family {
		return fmt.Errorf("meanvc2: model family is %q (audiocpp.model_spec.family), want %q", fam, Family)
	}
	return nil
}

// TensorSpec is a tensor of the published model's table.
type TensorSpec = weights.Spec

// Tensors lists the vc/ weights of a model of this config, in the release's order
// (cache_embed, unused and absent from the release, is not listed).
func (c Config) Tensors() []TensorSpec { return nn.Specs(c.declare()) }

// RealTensors lists the vc/ tensors of the published meanvc2-120ms-40ms model with their
// real shapes (17,707,216 parameters plus the 32-value rotary inv_freq buffer), for a
// real-size random model generator.
func RealTensors() []TensorSpec { return DefaultConfig().Tensors() }
