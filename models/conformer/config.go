// Package conformer is MeanVC2's streaming content encoder: the Kaldi fbank front end with
// the reference driver's chunking (frontend.go) and the Fast-U2++ streaming conformer
// (WeNet v2.2.1 ConformerEncoder.forward_chunk: Conv2dSubsampling4, relative positional
// encoding, macaron FFNs, relative-position attention without rel-shift over an attention
// cache, causal depthwise conv module over a conv cache) on the engine (model.go). Its output
// per window are the 40 ms "BN" (bottleneck) content features the DiT is conditioned on.
package conformer

import (
	"encoding/json"
	"fmt"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"

	"github.com/voxpipe/voxpipe/dsp"
)

// Namespace is where the encoder's tensors live in an audio.cpp MeanVC2 GGUF.
const Namespace = "asr"

// Config is the encoder's structure (config.json section "asr", WeNet names) and the
// streaming front end's constants (section "runtime"). Dimensions left zero are taken from
// the tensor shapes by Load; non-zero ones must agree with them.
type Config struct {
	InputDim     int     `json:"input_dim"`         // fbank bins
	OutputSize   int     `json:"output_size"`       // d_model
	Heads        int     `json:"attention_heads"`   //
	LinearUnits  int     `json:"linear_units"`      // FFN width
	NumBlocks    int     `json:"num_blocks"`        // conformer layers
	CNNKernel    int     `json:"cnn_module_kernel"` // causal depthwise kernel (cache = kernel−1)
	LayerNormEps float64 `json:"layer_norm_eps"`
	// SubsampleChannels is the width of the two Conv2d subsampling layers (WeNet uses
	// output_size; it is read from encoder.embed.conv.0).
	SubsampleChannels int `json:"-"`

	Fbank  dsp.FbankConfig `json:"fbank"`
	Stream StreamConfig    `json:"-"`
}

// StreamConfig are the front end's constants for one model variant (run_rt.py MODEL_PATHS
// and _init_cache; config.json section "runtime").
type StreamConfig struct {
	ChunkSamples     int     `json:"chunk_samples"`      // input chunk (2560 = 160 ms)
	SamplesCacheLen  int     `json:"samples_cache_len"`  // waveform tail (400 + 2·160)
	SamplesCacheInit float32 `json:"samples_cache_init"` // its initial value (−0.5 in the reference)
	FbankCacheFrames int     `json:"fbank_cache_frames"` // fbank frames carried to the next chunk
	Window           int     `json:"bn_window"`          // fbank frames per ASR call
	Stride           int     `json:"bn_stride"`
	RequiredCache    int     `json:"required_cache_size"` // attention cache frames
	OffsetInit       int     `json:"asr_offset_init"`
	OffsetStep       int     `json:"asr_offset_step"`
	OffsetReset      int     `json:"asr_offset_reset"`
}

// Stream120ms is the front end of the 120 ms + 40 ms MeanVC2 model (fastu2pp_160ms).
func Stream120ms() StreamConfig {
	return StreamConfig{ChunkSamples: 2560, SamplesCacheLen: 720, SamplesCacheInit: -0.5, FbankCacheFrames: 3,
		Window: 19, Stride: 16, RequiredCache: 8, OffsetInit: 8, OffsetStep: 4, OffsetReset: 4000}
}

// Stream40ms is the front end of the 40 ms + 40 ms MeanVC2 model (fastu2pp_80ms): two
// 11-frame windows per chunk, 2 BN frames each.
func Stream40ms() StreamConfig {
	return StreamConfig{ChunkSamples: 2560, SamplesCacheLen: 720, SamplesCacheInit: -0.5, FbankCacheFrames: 3,
		Window: 11, Stride: 8, RequiredCache: 4, OffsetInit: 4, OffsetStep: 2, OffsetReset: 4000}
}

// RealConfig is the published fastu2pp_160ms encoder as audio.cpp packages it
// (shared/reference/audiocpp.md §2.2–2.3): d 256, 4 heads, FFN 2048, 6 layers, kernel 9,
// subsampling width 256 (Linear 256·19 → 256), LayerNorm eps 1e-5, no global CMVN.
func RealConfig() Config {
	return Config{InputDim: 80, OutputSize: 256, Heads: 4, LinearUnits: 2048, NumBlocks: 6, CNNKernel: 9,
		LayerNormEps: 1e-5, SubsampleChannels: 256, Fbank: dsp.KaldiFbankConfig(), Stream: Stream120ms()}
}

// asrJSON is the "asr" section's structural switches: the only structure implemented is
// the one MeanVC2 uses, so anything else is refused rather than run wrongly.
type asrJSON struct {
	Config
	InputLayer   string           `json:"input_layer"`
	PosEnc       string           `json:"pos_enc_layer_type"`
	SelfAttn     string           `json:"selfattention_layer_type"`
	Activation   string           `json:"activation_type"`
	Macaron      *bool            `json:"macaron_style"`
	NormBefore   *bool            `json:"normalize_before"`
	UseCNN       *bool            `json:"use_cnn_module"`
	Causal       *bool            `json:"causal"`
	CNNNorm      string           `json:"cnn_module_norm"`
	GlobalCMVN   *json.RawMessage `json:"global_cmvn"`
	Subsampling  int              `json:"subsampling_rate"`
	RightContext int              `json:"right_context"`
}

// defaultConfig is RealConfig without the dimensions that the tensors give.
func defaultConfig() Config {
	c := RealConfig()
	c.OutputSize, c.Heads, c.LinearUnits, c.NumBlocks, c.CNNKernel, c.SubsampleChannels = 0, 0, 0, 0, 0, 0
	return c
}

// ParseConfig reads MeanVC2's config.json (sections "asr" and "runtime"). Front-end fields
// it lacks keep the RealConfig values; dimensions it lacks stay zero for Load to take from
// the tensors (those it has must agree with them).
func ParseConfig(data []byte) (Config, error) {
	var top struct {
		ASR     json.RawMessage `json:"asr"`
		Runtime json.RawMessage `json:"runtime"`
	}
	if err := json.Unmarshal(data, &top); err != nil {
		return Config{}, fmt.Errorf("conformer: config.json: %w", err)
	}
	a := asrJSON{Config: defaultConfig()}
	if len(top.ASR) > 0 {
		if err := json.Unmarshal(top.ASR, &a); err != nil {
			return Config{}, fmt.Errorf("conformer: config.json asr: %w", err)
		}
	}
	c := a.Config
	if len(top.Runtime) > 0 {
		if err := json.Unmarshal(top.Runtime, &c.Stream); err != nil {
			return Config{}, fmt.Errorf("conformer: config.json runtime: %w", err)
		}
	}
	want := func(field, got, ok string) error {
		if got != "" && got != ok {
			return fmt.Errorf("conformer: config.json asr.%s %q is not supported (want %q)", field, got, ok)
		}
		return nil
	}
	for _, e := range []error{
		want("input_layer", a.InputLayer, "conv2d"),
		want("pos_enc_layer_type", a.PosEnc, "rel_pos"),
		want("selfattention_layer_type", a.SelfAttn, "rel_selfattn"),
		want("activation_type", a.Activation, "swish"),
		want("cnn_module_norm", a.CNNNorm, "layer_norm"),
	} {
		if e != nil {
			return Config{}, e
		}
	}
	for _, b := range []struct {
		name string
		v    *bool
		want bool
	}{{"macaron_style", a.Macaron, true}, {"normalize_before", a.NormBefore, true},
		{"use_cnn_module", a.UseCNN, true}, {"causal", a.Causal, true}} {
		if b.v != nil && *b.v != b.want {
			return Config{}, fmt.Errorf("conformer: config.json asr.%s = %v is not supported", b.name, *b.v)
		}
	}
	if a.GlobalCMVN != nil && string(*a.GlobalCMVN) != "null" {
		return Config{}, fmt.Errorf("conformer: config.json asr.global_cmvn is not supported (MeanVC2 applies none)")
	}
	if a.Subsampling != 0 && a.Subsampling != 4 {
		return Config{}, fmt.Errorf("conformer: subsampling rate %d is not supported (Conv2dSubsampling4 only)", a.Subsampling)
	}
	return c, c.validateStream()
}

func (c Config) validateStream() error {
	s := c.Stream
	if s.ChunkSamples <= 0 || s.SamplesCacheLen < 0 || s.FbankCacheFrames < 0 || s.Window <= 0 || s.Stride <= 0 ||
		s.RequiredCache <= 0 || s.OffsetStep <= 0 {
		return fmt.Errorf("conformer: bad streaming constants %+v", s)
	}
	if s.Window < 7 {
		return fmt.Errorf("conformer: window of %d fbank frames is shorter than the subsampling's 7", s.Window)
	}
	return nil
}

// WindowsPerChunk is the number of ASR windows a whole input chunk gives once frames are
// carried from the one before (1 for the 120 ms model, 2 for the 40 ms one).
func (c Config) WindowsPerChunk() int {
	s := c.Stream
	frameLen := int(float64(c.Fbank.SampleRate) * c.Fbank.FrameLengthMs * 0.001)
	shift := int(float64(c.Fbank.SampleRate) * c.Fbank.FrameShiftMs * 0.001)
	n := s.SamplesCacheLen + s.ChunkSamples
	if shift <= 0 || n < frameLen || s.Stride <= 0 {
		return 0
	}
	total := s.FbankCacheFrames + 1 + (n-frameLen)/shift
	if total < s.Window {
		return 0
	}
	return (total-s.Window)/s.Stride + 1
}

// OutFrames is how many encoder frames a window of n fbank frames gives (two 3×3 stride-2
// convolutions without padding).
func OutFrames(n int) int { return ((n-1)/2 - 1) / 2 }

// subFreq is the frequency axis after subsampling.
func (c Config) subFreq() int { return ((c.InputDim-1)/2 - 1) / 2 }

// TensorSpec is a tensor of the published model's table.
type TensorSpec = weights.Spec

// Tensors lists every weight the encoder reads (audio.cpp names, without the "asr/"
// namespace), for writing random-weight models of real size.
func (c Config) Tensors() []TensorSpec { return nn.Specs(c.declare()) }
