package miocodec

import (
	"fmt"
	"math"
	"reflect"
	"unsafe"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/weights"
)

// norm is a LayerNorm's affine parameters.
type norm struct {
	W weights.Tensor `gguf:"weight"`
	B weights.Tensor `gguf:"bias"`
}

// adaNorm is an AdaLN(-Zero) norm: condition_proj = Sequential(SiLU, Linear).
type adaNorm struct {
	W weights.Tensor `gguf:"condition_proj.1.weight"`
	B weights.Tensor `gguf:"condition_proj.1.bias"`
}

type layer struct {
	Q  weights.Tensor `gguf:"attention.wq.weight"`
	K  weights.Tensor `gguf:"attention.wk.weight"`
	V  weights.Tensor `gguf:"attention.wv.weight"`
	O  weights.Tensor `gguf:"attention.wo.weight"`
	W1 weights.Tensor `gguf:"feed_forward.w1.weight"`
	W2 weights.Tensor `gguf:"feed_forward.w2.weight"`
	W3 weights.Tensor `gguf:"feed_forward.w3.weight"`
	// Plain blocks have affine LayerNorms; AdaLN blocks have condition projections.
	AttnNorm    norm    `gguf:"attention_norm,optional"`
	FFNNorm     norm    `gguf:"ffn_norm,optional"`
	AttnAdaNorm adaNorm `gguf:"attention_norm,optional"`
	FFNAdaNorm  adaNorm `gguf:"ffn_norm,optional"`
}

// transformer is a MioCodec Transformer (local_encoder, wave_prenet, wave_decoder).
type transformer struct {
	Layers  []layer        `gguf:"layers.%d"`
	Norm    norm           `gguf:"norm,optional"`
	AdaNorm adaNorm        `gguf:"norm,optional"`
	OutW    weights.Tensor `gguf:"output_proj.weight,optional"`
	OutB    weights.Tensor `gguf:"output_proj.bias,optional"`
}

type conv struct {
	W weights.Tensor `gguf:"weight"`
	B weights.Tensor `gguf:"bias"`
}

type resBlock struct {
	Norm1 norm `gguf:"norm1"`
	Conv1 conv `gguf:"conv1"`
	Norm2 norm `gguf:"norm2"`
	Conv2 conv `gguf:"conv2"`
}

type snake struct {
	Alpha weights.Tensor `gguf:"alpha"` // log α
	Beta  weights.Tensor `gguf:"beta"`  // log β
}

type upLayer struct {
	B weights.Tensor `gguf:"bias"`
	G weights.Tensor `gguf:"parametrizations.weight.original0"` // (C_in, 1, 1)
	V weights.Tensor `gguf:"parametrizations.weight.original1"` // (C_in, C_out, K)
	W weights.Tensor `gguf:"-"`                                 // folded g·v/‖v‖
}

// decoderWeights are the `weights/` tensors of the token decoder.
type decoderWeights struct {
	ProjOut struct {
		W weights.Tensor `gguf:"weight"`
		B weights.Tensor `gguf:"bias"`
	} `gguf:"local_quantizer.proj_out"`
	Prenet    transformer `gguf:"wave_prenet"`
	ConvUp    conv        `gguf:"wave_conv_upsample"`
	Prior     []resBlock  `gguf:"wave_prior_net.blocks.%d"`
	Decoder   transformer `gguf:"wave_decoder"`
	Post      []resBlock  `gguf:"wave_post_net.blocks.%d"`
	Upsampler struct {
		Layers  []upLayer  `gguf:"upsample_layers.%d"`
		Snakes  []snake    `gguf:"snake_activations.%d"`
		ResNets []resBlock `gguf:"resnet_blocks.%d"`
		OutProj conv       `gguf:"out_proj"`
		OutSnk  snake      `gguf:"out_snake"`
	} `gguf:"wave_upsampler"`
	Head conv `gguf:"istft_head.out"`
}

// encoderWeights are the `weights/` tensors of the encode path (SSL features → tokens).
type encoderWeights struct {
	Local    transformer `gguf:"local_encoder"`
	Down     conv        `gguf:"conv_downsample"`
	Quantize struct {
		InW  weights.Tensor `gguf:"proj_in.weight"`
		InB  weights.Tensor `gguf:"proj_in.bias"`
		OutW weights.Tensor `gguf:"proj_out.weight"`
		OutB weights.Tensor `gguf:"proj_out.bias"`
	} `gguf:"local_quantizer"`
}

func shp(d ...int) []int { return d }

// expectTransformer fills the shapes Bind checks for a Transformer of dim, ffn hidden size,
// optional output dim and AdaLN condition dim.
func expectTransformer(t *transformer, layers, dim, ffn, out, cond int) {
	t.Layers = make([]layer, layers)
	for i := range t.Layers {
		l := &t.Layers[i]
		l.Q.Shape, l.K.Shape, l.V.Shape, l.O.Shape = shp(dim, dim), shp(dim, dim), shp(dim, dim), shp(dim, dim)
		l.W1.Shape, l.W3.Shape, l.W2.Shape = shp(ffn, dim), shp(ffn, dim), shp(dim, ffn)
		l.AttnNorm = norm{W: weights.Tensor{Shape: shp(dim)}, B: weights.Tensor{Shape: shp(dim)}}
		l.FFNNorm = l.AttnNorm
		l.AttnAdaNorm = adaNorm{W: weights.Tensor{Shape: shp(3*dim, cond)}, B: weights.Tensor{Shape: shp(3 * dim)}}
		l.FFNAdaNorm = l.AttnAdaNorm
	}
	t.Norm = norm{W: weights.Tensor{Shape: shp(dim)}, B: weights.Tensor{Shape: shp(dim)}}
	t.AdaNorm = adaNorm{W: weights.Tensor{Shape: shp(2*dim, cond)}, B: weights.Tensor{Shape: shp(2 * dim)}}
	t.OutW.Shape, t.OutB.Shape = shp(out, dim), shp(out)
}

func expectResBlocks(n, c, k int) []resBlock {
	bs := make([]resBlock, n)
	for i := range bs {
		b := &bs[i]
		b.Norm1 = norm{W: weights.Tensor{Shape: shp(c)}, B: weights.Tensor{Shape: shp(c)}}
		b.Norm2 = b.Norm1
		b.Conv1 = conv{W: weights.Tensor{Shape: shp(c, c, k)}, B: weights.Tensor{Shape: shp(c)}}
		b.Conv2 = b.Conv1
	}
	return bs
}

// checkTransformer verifies that every block has one kind of norm (plain or AdaLN) as the
// module's config asks for.
func checkTransformer(name string, t *transformer, ada, out bool) error {
	for i, l := range t.Layers {
		plain := l.AttnNorm.W.Present() && l.FFNNorm.W.Present()
		adaln := l.AttnAdaNorm.W.Present() && l.FFNAdaNorm.W.Present()
		if (ada && !adaln) || (!ada && !plain) {
			return fmt.Errorf("miocodec: %s.layers.%d: missing %s norms", name, i, map[bool]string{true: "AdaLN", false: "affine"}[ada])
		}
	}
	if (ada && !t.AdaNorm.W.Present()) || (!ada && !t.Norm.W.Present()) {
		return fmt.Errorf("miocodec: %s.norm missing", name)
	}
	if out && !t.OutW.Present() {
		return fmt.Errorf("miocodec: %s.output_proj missing", name)
	}
	return nil
}

// foldWeightNorm computes W = g·v/‖v‖ with the norm over all but dim 0 (weight_norm dim=0).
func foldWeightNorm(g, v weights.Tensor) weights.Tensor {
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
	return weights.Tensor{Data: w, Shape: append([]int(nil), v.Shape...)}
}

// store keeps bound weights in persistent engine buffers. After upload each weights.Tensor's
// Data views its buffer's memory (the Go copy is dropped), and the buffer is found again by
// that memory's address.
type store struct {
	bufs  []*engine.Buffer
	byPtr map[unsafe.Pointer]*engine.Buffer
}

func newStore() *store { return &store{byPtr: map[unsafe.Pointer]*engine.Buffer{}} }

// upload moves every present Tensor reachable from v (a pointer to a struct) into buffers.
func (s *store) upload(prefix string, v any) error {
	return s.walk(prefix, reflect.ValueOf(v).Elem())
}

var tensorType = reflect.TypeFor[weights.Tensor]()

func (s *store) walk(name string, v reflect.Value) error {
	switch {
	case v.Type() == tensorType:
		t := v.Addr().Interface().(*weights.Tensor)
		if !t.Present() || len(t.Data) == 0 {
			return nil
		}
		shape := make([]int64, len(t.Shape))
		for i, d := range t.Shape {
			shape[i] = int64(d)
		}
		b, err := engine.NewBufferFrom(name, t.Data, shape...)
		if err != nil {
			return fmt.Errorf("miocodec: upload %s: %w", name, err)
		}
		s.bufs = append(s.bufs, b)
		t.Data = b.Float32s()
		s.byPtr[unsafe.Pointer(&t.Data[0])] = b
	case v.Kind() == reflect.Struct:
		for i := range v.NumField() {
			if err := s.walk(name+"."+v.Type().Field(i).Name, v.Field(i)); err != nil {
				return err
			}
		}
	case v.Kind() == reflect.Slice || v.Kind() == reflect.Array:
		for i := range v.Len() {
			if err := s.walk(fmt.Sprintf("%s.%d", name, i), v.Index(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// buf is the buffer holding t (nil when t was never uploaded).
func (s *store) buf(t weights.Tensor) *engine.Buffer {
	if len(t.Data) == 0 {
		return nil
	}
	return s.byPtr[unsafe.Pointer(&t.Data[0])]
}

// add keeps an extra buffer (constants) for Close.
func (s *store) add(b *engine.Buffer) *engine.Buffer {
	s.bufs = append(s.bufs, b)
	return b
}

func (s *store) close() {
	for _, b := range s.bufs {
		b.Free()
	}
	s.bufs, s.byPtr = nil, nil
}
