package miocodec

import (
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// adaNorm is an AdaLN(-Zero) norm: condition_proj = Sequential(SiLU, Linear).
type adaNorm struct {
	Proj nn.Linear `gguf:"condition_proj.1"`
}

type layer struct {
	Q  nn.Linear `gguf:"attention.wq"`
	K  nn.Linear `gguf:"attention.wk"`
	V  nn.Linear `gguf:"attention.wv"`
	O  nn.Linear `gguf:"attention.wo"`
	W1 nn.Linear `gguf:"feed_forward.w1"`
	W2 nn.Linear `gguf:"feed_forward.w2"`
	W3 nn.Linear `gguf:"feed_forward.w3"`
	// Plain blocks have affine LayerNorms; AdaLN blocks have condition projections.
	AttnNorm    nn.LayerNorm `gguf:"attention_norm,optional"`
	FFNNorm     nn.LayerNorm `gguf:"ffn_norm,optional"`
	AttnAdaNorm adaNorm      `gguf:"attention_norm,optional"`
	FFNAdaNorm  adaNorm      `gguf:"ffn_norm,optional"`
}

// transformer is a MioCodec Transformer (local_encoder, wave_prenet, wave_decoder).
type transformer struct {
	Layers  []layer      `gguf:"layers.%d"`
	Norm    nn.LayerNorm `gguf:"norm,optional"`
	AdaNorm adaNorm      `gguf:"norm,optional"`
	Out     nn.Linear    `gguf:"output_proj,optional"`
}

type resBlock struct {
	Norm1 nn.GroupNorm `gguf:"norm1"`
	Conv1 nn.Conv1d    `gguf:"conv1"`
	Norm2 nn.GroupNorm `gguf:"norm2"`
	Conv2 nn.Conv1d    `gguf:"conv2"`
}

type snake struct {
	Alpha nn.Tensor `gguf:"alpha"` // log α
	Beta  nn.Tensor `gguf:"beta"`  // log β
}

// upLayer is a weight-normed ConvTranspose1d; the norm is folded on the host at load.
type upLayer struct {
	B nn.Tensor      `gguf:"bias"`
	G weights.Tensor `gguf:"parametrizations.weight.original0"` // (C_in, 1, 1)
	V weights.Tensor `gguf:"parametrizations.weight.original1"` // (C_in, C_out, K)
	W *engine.Buffer `gguf:"-"`                                 // folded g·v/‖v‖
}

// decoderWeights are the `weights/` tensors of the token decoder.
type decoderWeights struct {
	ProjOut   nn.Linear          `gguf:"local_quantizer.proj_out"`
	Prenet    transformer        `gguf:"wave_prenet"`
	ConvUp    nn.ConvTranspose1d `gguf:"wave_conv_upsample"`
	Prior     []resBlock         `gguf:"wave_prior_net.blocks.%d"`
	Decoder   transformer        `gguf:"wave_decoder"`
	Post      []resBlock         `gguf:"wave_post_net.blocks.%d"`
	Upsampler struct {
		Layers  []upLayer  `gguf:"upsample_layers.%d"`
		Snakes  []snake    `gguf:"snake_activations.%d"`
		ResNets []resBlock `gguf:"resnet_blocks.%d"`
		OutProj nn.Linear  `gguf:"out_proj"`
		OutSnk  snake      `gguf:"out_snake"`
	} `gguf:"wave_upsampler"`
	Head nn.Linear `gguf:"istft_head.out"`
}

// encoderWeights are the `weights/` tensors of the encode path (SSL features → tokens).
type encoderWeights struct {
	Local    transformer `gguf:"local_encoder"`
	Down     nn.Conv1d   `gguf:"conv_downsample"`
	Quantize struct {
		In  nn.Linear `gguf:"proj_in"`
		Out nn.Linear `gguf:"proj_out"`
	} `gguf:"local_quantizer"`
}

// declareTransformer is a Transformer of dim with the ffn hidden size, an output projection
// to out (0: none) and AdaLN norms over a condition of cond values (0: affine norms).
func declareTransformer(layers, dim, ffn, out, cond int) transformer {
	var t transformer
	t.Layers = make([]layer, layers)
	for i := range t.Layers {
		l := &t.Layers[i]
		l.Q, l.K, l.V, l.O = nn.NewLinear(dim, dim, false), nn.NewLinear(dim, dim, false), nn.NewLinear(dim, dim, false), nn.NewLinear(dim, dim, false)
		l.W1, l.W2, l.W3 = nn.NewLinear(dim, ffn, false), nn.NewLinear(ffn, dim, false), nn.NewLinear(dim, ffn, false)
		if cond > 0 {
			l.AttnAdaNorm, l.FFNAdaNorm = adaNorm{nn.NewLinear(cond, 3*dim, true)}, adaNorm{nn.NewLinear(cond, 3*dim, true)}
		} else {
			l.AttnNorm, l.FFNNorm = nn.NewLayerNorm(dim), nn.NewLayerNorm(dim)
		}
	}
	if cond > 0 {
		t.AdaNorm = adaNorm{nn.NewLinear(cond, 2*dim, true)}
	} else {
		t.Norm = nn.NewLayerNorm(dim)
	}
	if out > 0 {
		t.Out = nn.NewLinear(dim, out, true)
	}
	return t
}

func declareResBlocks(n, c, k int) []resBlock {
	bs := make([]resBlock, n)
	for i := range bs {
		bs[i] = resBlock{nn.NewGroupNorm(c), nn.NewConv1d(c, c, k, 1, true), nn.NewGroupNorm(c), nn.NewConv1d(c, c, k, 1, true)}
	}
	return bs
}

// decoderDims are the decoder's widths (from the tensor shapes): prenet P, wave D, the
// ffn sizes, the condition and the FSQ code size.
type decoderDims struct{ P, D, FFNP, FFND, Cond, Codes int }

// declareDecoder is the token decoder of cfg and dims with every expected shape.
func declareDecoder(cfg Config, dd decoderDims) *decoderWeights {
	D := dd.D
	w := &decoderWeights{
		ProjOut: nn.NewLinear(dd.Codes, dd.P, true),
		Prenet:  declareTransformer(cfg.WavePrenet.Layers, dd.P, dd.FFNP, D, 0),
		ConvUp:  nn.NewConvTranspose1d(D, D, cfg.WaveUpsample, 1, true),
		Prior:   declareResBlocks(cfg.ResNetBlocks, D, cfg.ResNetKernel),
		Decoder: declareTransformer(cfg.WaveDecoder.Layers, D, dd.FFND, 0, dd.Cond),
		Post:    declareResBlocks(cfg.ResNetBlocks, D, cfg.ResNetKernel),
		Head:    nn.NewLinear(D, cfg.NFFT+2, true),
	}
	stages := len(cfg.UpsamplerFactors)
	u := &w.Upsampler
	u.Layers = make([]upLayer, stages)
	u.Snakes = make([]snake, stages)
	u.ResNets = make([]resBlock, stages)
	c := D
	for i := range stages {
		co := D >> (i + 1)
		u.Layers[i] = upLayer{B: nn.Shaped(co), G: weights.Tensor{Shape: []int{c, 1, 1}}, V: weights.Tensor{Shape: []int{c, co, cfg.UpsamplerKernels[i]}}}
		u.Snakes[i] = snake{nn.Shaped(co), nn.Shaped(co)}
		u.ResNets[i] = declareResBlocks(1, co, cfg.ResNetKernel)[0]
		c = co
	}
	u.OutProj = nn.NewLinear(c, D, true)
	u.OutSnk = snake{nn.Shaped(D), nn.Shaped(D)}
	return w
}

// declareEncoder is the encode path of cfg with local_encoder width D, ffn hidden size,
// content embedding width out and k FSQ code values.
func declareEncoder(cfg Config, D, ffn, out, k int) *encoderWeights {
	w := &encoderWeights{
		Local: declareTransformer(cfg.LocalEncoder.Layers, D, ffn, 0, 0),
		Down:  nn.NewConv1d(D, D, cfg.DownsampleFactor, 1, true),
	}
	w.Quantize.In, w.Quantize.Out = nn.NewLinear(D, k, true), nn.NewLinear(k, out, true)
	return w
}

// checkTransformer verifies that every block has one kind of norm (plain or AdaLN) as the
// module's config asks for.
func checkTransformer(name string, t *transformer, ada, out bool) error {
	for i, l := range t.Layers {
		plain := l.AttnNorm.Weight.Present() && l.FFNNorm.Weight.Present()
		adaln := l.AttnAdaNorm.Proj.Weight.Present() && l.FFNAdaNorm.Proj.Weight.Present()
		if (ada && !adaln) || (!ada && !plain) {
			return fmt.Errorf("miocodec: %s.layers.%d: missing %s norms", name, i, map[bool]string{true: "AdaLN", false: "affine"}[ada])
		}
	}
	if (ada && !t.AdaNorm.Proj.Weight.Present()) || (!ada && !t.Norm.Weight.Present()) {
		return fmt.Errorf("miocodec: %s.norm missing", name)
	}
	if out && !t.Out.Weight.Present() {
		return fmt.Errorf("miocodec: %s.output_proj missing", name)
	}
	return nil
}

// foldWeightNorm computes W = g·v/‖v‖ with the norm over all but dim 0 (weight_norm dim=0).
func foldWeightNorm(g, v weights.Tensor) []float32 {
	n := v.Shape[0]
	per := len(v.Data) / n
	w := make([]float32, len(v.Data))
	for c := range n {
		row := v.Data[c*per : (c+1)*per]
		var ss float64
		for _, x := range row {
			ss += float64(x) * float64(x)
		}
		s := float64(g.Data[c]) / math.Sqrt(ss)
		for i, x := range row {
			w[c*per+i] = float32(float64(x) * s)
		}
	}
	return w
}
