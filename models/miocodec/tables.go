package miocodec

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine/weights"
)

// TensorSpec is a tensor of the published model's table.
type TensorSpec = weights.Spec

// Real MioCodec-25Hz-44.1kHz-v2 sizes (MANIFEST §2, "real" column).
const (
	realSSL        = 768 // WavLM-Base+ hidden
	realLocalDim   = 768
	realLocalFFN   = 2048
	realLocalLay   = 6
	realPrenetDim  = 768
	realPrenetFFN  = 2048
	realPrenetLay  = 6
	realWaveDim    = 512
	realDecoderFFN = 1536
	realDecoderLay = 8
	realCond       = 128
	realGEDim      = 384
	realGEInter    = 1152
	realGELayers   = 4
	realGEAttn     = 128
	realGEOut      = 128
	realNFFT       = 392
	realCodeDim    = 5
)

// RealTensors lists the `weights/` tensors of the real MioCodec-25Hz-44.1kHz-v2 checkpoint
// (model.safetensors keys: encoder, global encoder and decoder; the unused conv_upsample.*
// is left out), for writing random-weight models at real size. WavLM (`wavlm_weights/`)
// is listed by package wavlm.
func RealTensors() []TensorSpec {
	var ts []TensorSpec
	add := func(name string, shape ...int) { ts = append(ts, TensorSpec{Name: name, Shape: shape}) }
	ln := func(p string, d int) {
		add(p+".weight", d)
		add(p+".bias", d)
	}
	transformer := func(p string, dim, ffn, layers, out, cond int) {
		for i := range layers {
			l := fmt.Sprintf("%s.layers.%d.", p, i)
			for _, n := range []string{"wq", "wk", "wv", "wo"} {
				add(l+"attention."+n+".weight", dim, dim)
			}
			add(l+"feed_forward.w1.weight", ffn, dim)
			add(l+"feed_forward.w2.weight", dim, ffn)
			add(l+"feed_forward.w3.weight", ffn, dim)
			if cond > 0 {
				for _, n := range []string{"attention_norm", "ffn_norm"} {
					add(l+n+".condition_proj.1.weight", 3*dim, cond)
					add(l+n+".condition_proj.1.bias", 3*dim)
				}
			} else {
				ln(l+"attention_norm", dim)
				ln(l+"ffn_norm", dim)
			}
		}
		if cond > 0 {
			add(p+".norm.condition_proj.1.weight", 2*dim, cond)
			add(p+".norm.condition_proj.1.bias", 2*dim)
		} else {
			ln(p+".norm", dim)
		}
		if out > 0 {
			add(p+".output_proj.weight", out, dim)
			add(p+".output_proj.bias", out)
		}
	}
	resBlock := func(p string, c int) {
		for _, n := range []string{"1", "2"} {
			ln(p+".norm"+n, c)
			add(p+".conv"+n+".weight", c, c, 3)
			add(p+".conv"+n+".bias", c)
		}
	}

	transformer("local_encoder", realLocalDim, realLocalFFN, realLocalLay, 0, 0)
	add("local_quantizer.proj_in.weight", realCodeDim, realLocalDim)
	add("local_quantizer.proj_in.bias", realCodeDim)
	add("local_quantizer.proj_out.weight", realPrenetDim, realCodeDim)
	add("local_quantizer.proj_out.bias", realPrenetDim)
	add("conv_downsample.weight", realLocalDim, realLocalDim, 2)
	add("conv_downsample.bias", realLocalDim)

	ge := "global_encoder."
	add(ge+"backbone.embed.weight", realGEDim, realSSL, 7)
	add(ge+"backbone.embed.bias", realGEDim)
	ln(ge+"backbone.norm", realGEDim)
	for i := range realGELayers {
		b := fmt.Sprintf("%sbackbone.convnext.%d.", ge, i)
		add(b+"gamma", realGEDim)
		add(b+"dwconv.weight", realGEDim, 1, 7)
		add(b+"dwconv.bias", realGEDim)
		ln(b+"norm", realGEDim)
		add(b+"pwconv1.weight", realGEInter, realGEDim)
		add(b+"pwconv1.bias", realGEInter)
		add(b+"pwconv2.weight", realGEDim, realGEInter)
		add(b+"pwconv2.bias", realGEDim)
	}
	ln(ge+"backbone.final_layer_norm", realGEDim)
	add(ge+"pooling.attn.0.weight", realGEAttn, realGEDim, 1)
	add(ge+"pooling.attn.0.bias", realGEAttn)
	add(ge+"pooling.attn.2.weight", realGEDim, realGEAttn, 1)
	add(ge+"pooling.attn.2.bias", realGEDim)
	add(ge+"pooling.proj.weight", realGEOut, 2*realGEDim)
	add(ge+"pooling.proj.bias", realGEOut)
	ln(ge+"pooling.norm", realGEOut)

	transformer("wave_prenet", realPrenetDim, realPrenetFFN, realPrenetLay, realWaveDim, 0)
	add("wave_conv_upsample.weight", realWaveDim, realWaveDim, 2)
	add("wave_conv_upsample.bias", realWaveDim)
	for i := range 2 {
		resBlock(fmt.Sprintf("wave_prior_net.blocks.%d", i), realWaveDim)
	}
	transformer("wave_decoder", realWaveDim, realDecoderFFN, realDecoderLay, 0, realCond)
	for i := range 2 {
		resBlock(fmt.Sprintf("wave_post_net.blocks.%d", i), realWaveDim)
	}
	c := realWaveDim
	for i := range 2 {
		co := c / 2
		p := fmt.Sprintf("wave_upsampler.upsample_layers.%d.", i)
		add(p+"bias", co)
		add(p+"parametrizations.weight.original0", c, 1, 1)
		add(p+"parametrizations.weight.original1", c, co, 9)
		s := fmt.Sprintf("wave_upsampler.snake_activations.%d.", i)
		add(s+"alpha", co)
		add(s+"beta", co)
		resBlock(fmt.Sprintf("wave_upsampler.resnet_blocks.%d", i), co)
		c = co
	}
	add("wave_upsampler.out_proj.weight", realWaveDim, c)
	add("wave_upsampler.out_proj.bias", realWaveDim)
	add("wave_upsampler.out_snake.alpha", realWaveDim)
	add("wave_upsampler.out_snake.beta", realWaveDim)
	add("istft_head.out.weight", realNFFT+2, realWaveDim)
	add("istft_head.out.bias", realNFFT+2)
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
