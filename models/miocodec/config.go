// Package miocodec runs MioCodec (25 Hz FSQ speech codec, 44.1 kHz v2 layout) on the engine:
// the token decoder (tokens + 128-d global embedding → waveform), the encode path (SSL
// features → tokens) and a streaming decoder over overlapping token windows.
//
// Dimensions come from tensor shapes; the embedded config.yaml supplies what shapes cannot
// (heads, attention windows, FSQ levels, upsampling factors, STFT sizes, SSL layers).
package miocodec

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// TransformerConfig is one MioCodec Transformer's init_args.
type TransformerConfig struct {
	Dim        int     `yaml:"dim"`
	OutputDim  int     `yaml:"output_dim"`
	Layers     int     `yaml:"n_layers"`
	Heads      int     `yaml:"n_heads"`
	Window     int     `yaml:"window_size"`
	RoPE       bool    `yaml:"use_rope"`
	RopeTheta  float64 `yaml:"rope_theta"`
	MaxSeqLen  int     `yaml:"max_seq_len"`
	CondDim    int     `yaml:"adanorm_condition_dim"`
	AdaLNZero  bool    `yaml:"use_adaln_zero"`
	FlashAttn  bool    `yaml:"use_flash_attention"`
	FFNHidden  int     `yaml:"-"` // from tensor shapes
	HalfWindow int     `yaml:"-"` // key j visible to query i iff |i−j| ≤ HalfWindow
}

// Config is the part of MioCodec's config.yaml the engine needs.
type Config struct {
	LocalSSLLayers    []int  `yaml:"local_ssl_layers"`
	GlobalSSLLayers   []int  `yaml:"global_ssl_layers"`
	NormalizeSSL      bool   `yaml:"normalize_ssl_features"`
	DownsampleFactor  int    `yaml:"downsample_factor"`
	UseConvDownsample bool   `yaml:"use_conv_downsample"`
	SampleRate        int    `yaml:"sample_rate"`
	NFFT              int    `yaml:"n_fft"`
	Hop               int    `yaml:"hop_length"`
	UseWaveDecoder    bool   `yaml:"use_wave_decoder"`
	WaveUpsample      int    `yaml:"wave_upsample_factor"`
	WaveInterpMode    string `yaml:"wave_interpolation_mode"`
	WaveDecoderDim    int    `yaml:"wave_decoder_dim"`
	ResNetBlocks      int    `yaml:"wave_resnet_num_blocks"`
	ResNetKernel      int    `yaml:"wave_resnet_kernel_size"`
	ResNetGroups      int    `yaml:"wave_resnet_num_groups"`
	ISTFTPadding      string `yaml:"istft_padding"`
	UpsamplerFactors  []int  `yaml:"wave_upsampler_factors"`
	UpsamplerKernels  []int  `yaml:"wave_upsampler_kernel_sizes"`

	LocalEncoder TransformerConfig `yaml:"-"`
	WavePrenet   TransformerConfig `yaml:"-"`
	WaveDecoder  TransformerConfig `yaml:"-"`
	Levels       []int             `yaml:"-"` // FSQ levels, e.g. [8 8 8 5 5]
}

type yamlModule struct {
	ClassPath string    `yaml:"class_path"`
	InitArgs  yaml.Node `yaml:"init_args"`
}

type yamlRoot struct {
	Model struct {
		InitArgs struct {
			Config         Config     `yaml:"config"`
			LocalEncoder   yamlModule `yaml:"local_encoder"`
			LocalQuantizer yamlModule `yaml:"local_quantizer"`
			WavePrenet     yamlModule `yaml:"wave_prenet"`
			WaveDecoder    yamlModule `yaml:"wave_decoder"`
		} `yaml:"init_args"`
	} `yaml:"model"`
}

// ParseConfig reads MioCodec's config.yaml (the lightning CLI schema of the checkpoints).
func ParseConfig(data []byte) (Config, error) {
	var root yamlRoot
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Config{}, fmt.Errorf("miocodec: config.yaml: %w", err)
	}
	ia := root.Model.InitArgs
	c := ia.Config
	tr := func(name string, m yamlModule, dst *TransformerConfig) error {
		if m.InitArgs.Kind == 0 {
			return nil // absent module (the decode path does not need local_encoder)
		}
		if err := m.InitArgs.Decode(dst); err != nil {
			return fmt.Errorf("miocodec: config.yaml %s: %w", name, err)
		}
		if dst.RopeTheta == 0 {
			dst.RopeTheta = 10000
		}
		dst.HalfWindow = dst.Window / 2
		return nil
	}
	if err := tr("local_encoder", ia.LocalEncoder, &c.LocalEncoder); err != nil {
		return c, err
	}
	if err := tr("wave_prenet", ia.WavePrenet, &c.WavePrenet); err != nil {
		return c, err
	}
	if err := tr("wave_decoder", ia.WaveDecoder, &c.WaveDecoder); err != nil {
		return c, err
	}
	if ia.LocalQuantizer.InitArgs.Kind != 0 {
		var q struct {
			Levels []int `yaml:"levels"`
		}
		if err := ia.LocalQuantizer.InitArgs.Decode(&q); err != nil {
			return c, fmt.Errorf("miocodec: config.yaml local_quantizer: %w", err)
		}
		c.Levels = q.Levels
	}
	return c, c.validate()
}

func (c Config) validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("miocodec: config.yaml: "+f, a...) }
	switch {
	case c.SampleRate <= 0 || c.NFFT <= 0 || c.Hop <= 0 || c.NFFT%2 != 0:
		return bad("sample_rate %d, n_fft %d, hop_length %d", c.SampleRate, c.NFFT, c.Hop)
	case (c.NFFT-c.Hop)%2 != 0:
		return bad("'same' padding needs n_fft − hop even (%d, %d)", c.NFFT, c.Hop)
	case c.ISTFTPadding != "" && c.ISTFTPadding != "same":
		return bad("istft_padding %q is not supported (only same)", c.ISTFTPadding)
	case c.WaveInterpMode != "" && c.WaveInterpMode != "linear":
		return bad("wave_interpolation_mode %q is not supported (only linear)", c.WaveInterpMode)
	case c.WaveUpsample <= 0:
		return bad("wave_upsample_factor %d", c.WaveUpsample)
	case c.ResNetGroups <= 0 || c.ResNetBlocks < 0 || c.ResNetKernel <= 0 || c.ResNetKernel%2 == 0:
		return bad("resnet groups %d, blocks %d, kernel %d", c.ResNetGroups, c.ResNetBlocks, c.ResNetKernel)
	case len(c.UpsamplerFactors) != len(c.UpsamplerKernels):
		return bad("%d upsampler factors but %d kernels", len(c.UpsamplerFactors), len(c.UpsamplerKernels))
	case len(c.Levels) == 0:
		return bad("local_quantizer.levels missing")
	}
	for i, f := range c.UpsamplerFactors {
		if k := c.UpsamplerKernels[i]; f <= 0 || (k-f)%2 != 0 || k < f {
			return bad("upsampler stage %d: factor %d, kernel %d (need (k − s) even)", i, f, k)
		}
	}
	for _, l := range c.Levels {
		if l < 2 {
			return bad("FSQ level %d", l)
		}
	}
	for _, t := range []struct {
		n string
		c TransformerConfig
	}{{"wave_prenet", c.WavePrenet}, {"wave_decoder", c.WaveDecoder}} {
		if t.c.Heads <= 0 || t.c.Window <= 0 || t.c.Layers <= 0 {
			return bad("%s: n_heads %d, window_size %d, n_layers %d", t.n, t.c.Heads, t.c.Window, t.c.Layers)
		}
	}
	return nil
}

// FramesPerToken is the STFT frames per token for token decoding (2·9 = 18 for the 25 Hz,
// hop-98 models).
func (c Config) FramesPerToken() int { return c.WaveUpsample * c.upsampleProduct() }

func (c Config) upsampleProduct() int {
	p := 1
	for _, f := range c.UpsamplerFactors {
		p *= f
	}
	return p
}

// SamplesPerToken is the waveform length of one token (1764 at 44.1 kHz).
func (c Config) SamplesPerToken() int { return c.FramesPerToken() * c.Hop }

// Codebook is the number of FSQ tokens (product of the levels).
func (c Config) Codebook() int {
	n := 1
	for _, l := range c.Levels {
		n *= l
	}
	return n
}
