package miocodec

import (
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// TensorSpec is a tensor of the published model's table.
type TensorSpec = weights.Spec

// Real MioCodec-25Hz-44.1kHz-v2 widths (MANIFEST §2, "real" column); the rest is in
// realConfigYAML.
var (
	realEncoder = struct{ D, FFN, Out int }{D: 768, FFN: 2048, Out: 768}
	realGlobal  = GlobalEncoderConfig{In: 768, Dim: 384, Intermediate: 1152, Blocks: 4, AttnChannels: 128, Out: 128, EmbedKernel: 7, DwKernel: 7}
	realDecoder = decoderDims{P: 768, D: 512, FFNP: 2048, FFND: 1536, Cond: 128, Codes: 5}
)

// RealTensors lists the `weights/` tensors of the real MioCodec-25Hz-44.1kHz-v2 checkpoint
// (model.safetensors keys: encoder, global encoder and decoder; the unused conv_upsample.*
// is left out), for writing random-weight models at real size. WavLM (`wavlm_weights/`)
// is listed by package wavlm. The table is the three loaders' declarations; the decoder's
// local_quantizer.proj_out, shared with the encoder, is listed once.
func RealTensors() []TensorSpec {
	cfg, err := ParseConfig(RealConfigYAML())
	if err != nil {
		panic(err) // the embedded config is a constant
	}
	var ts []TensorSpec
	seen := map[string]bool{}
	for _, decl := range []any{
		declareEncoder(cfg, realEncoder.D, realEncoder.FFN, realEncoder.Out, len(cfg.Levels)),
		realGlobal.declare(),
		declareDecoder(cfg, realDecoder),
	} {
		for _, t := range nn.Specs(decl) {
			if !seen[t.Name] {
				seen[t.Name] = true
				ts = append(ts, t)
			}
		}
	}
	return ts
}

// RealConfigYAML is the config.yaml of MioCodec-25Hz-44.1kHz-v2 (same schema as the
// checkpoint's; the values the engine reads are the real ones).
func RealConfigYAML() []byte { return []byte(realConfigYAML) }

const realConfigYAML = `# MioCodec-25Hz-44.1kHz-v2 configuration (values as published; written by voxpipe).
model:
  class_path: miocodec.model.MioCodecModel
  init_args:
    config:
      local_ssl_layers: [6, 9]
      global_ssl_layers: [1, 2]
      normalize_ssl_features: true
      downsample_factor: 2
      use_conv_downsample: true
      sample_rate: 44100
      n_fft: 392
      hop_length: 98
      use_wave_decoder: true
      wave_upsample_factor: 2
      wave_interpolation_mode: linear
      wave_decoder_dim: 512
      wave_resnet_num_blocks: 2
      wave_resnet_kernel_size: 3
      wave_resnet_num_groups: 32
      wave_resnet_dropout: 0.1
      istft_padding: same
      wave_upsampler_factors: [3, 3]
      wave_upsampler_kernel_sizes: [9, 9]
    ssl_feature_extractor:
      class_path: miocodec.module.ssl_extractor.SSLFeatureExtractor
      init_args: {model_name: wavlm_base_plus, output_layer: 9, sample_rate: 44100}
    local_encoder:
      class_path: miocodec.module.transformer.Transformer
      init_args: {dim: 768, n_layers: 6, n_heads: 12, window_size: 125, use_rope: true,
        rope_theta: 10000.0, max_seq_len: 512, use_flash_attention: true}
    local_quantizer:
      class_path: miocodec.module.fsq.FiniteScalarQuantizer
      init_args:
        input_dim: 768
        output_dim: 768
        levels: [8, 8, 8, 5, 5]
    feature_decoder: null
    global_encoder:
      class_path: miocodec.module.global_encoder.GlobalEncoder
      init_args: {input_channels: 768, output_channels: 128, num_layers: 4, dim: 384,
        intermediate_dim: 1152}
    mel_prenet: null
    mel_decoder: null
    mel_postnet: null
    wave_prenet:
      class_path: miocodec.module.transformer.Transformer
      init_args: {dim: 768, output_dim: 512, n_layers: 6, n_heads: 12, window_size: 65,
        use_rope: true, rope_theta: 10000.0, max_seq_len: 512, use_flash_attention: true}
    wave_decoder:
      class_path: miocodec.module.transformer.Transformer
      init_args: {dim: 512, n_layers: 8, n_heads: 8, window_size: 65, use_rope: true,
        rope_theta: 10000.0, max_seq_len: 512, adanorm_condition_dim: 128, use_adaln_zero: true,
        use_flash_attention: true}
`
