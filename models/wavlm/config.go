// Package wavlm runs the WavLM speech encoder (microsoft/unilm layout) on the engine, in both
// switch sets used by voxpipe's models: WavLM-Large (MeanVC2's speaker branch: input
// normalisation, LayerNorm after every conv, pre-LN layers, final encoder LayerNorm) and
// WavLM-Base+ (MioCodec's SSL front end: GroupNorm on the first conv only, post-LN layers,
// encoder LayerNorm before the layers).
//
// Every dimension comes from the tensor shapes; only the conv strides (the real
// [5,2,2,2,2,2,2] unless Options say otherwise) and the relative-position max distance (800)
// are not in the weights.
package wavlm

import (
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// Variant selects the switch set.
type Variant int

// Variants. VariantAuto infers it from the tensors: a per-conv LayerNorm on conv 1 means Large.
const (
	VariantAuto Variant = iota
	VariantLarge
	VariantBasePlus
)

func (v Variant) String() string {
	switch v {
	case VariantLarge:
		return "large"
	case VariantBasePlus:
		return "base+"
	}
	return "auto"
}

// Config is a WavLM encoder's structure.
type Config struct {
	Variant Variant

	ConvDims    []int // output channels of each feature-extractor conv
	ConvKernels []int
	ConvStrides []int

	Hidden        int
	FFN           int
	Layers        int
	Heads         int
	PosConvKernel int
	PosConvGroups int
	NumBuckets    int
	MaxDistance   int
	Eps           float32

	// Switches (Large: all true; Base+: all false).
	NormalizeInput bool // zero mean / unit variance of the whole waveform first
	ConvLayerNorm  bool // LayerNorm over channels after every conv (else GroupNorm on conv 0)
	LayerNormFirst bool // pre-LN layers; encoder.layer_norm on the last layer's output
}

// HeadDim is Hidden / Heads.
func (c Config) HeadDim() int { return c.Hidden / c.Heads }

// ConvDim is the feature extractor's output width.
func (c Config) ConvDim() int { return c.ConvDims[len(c.ConvDims)-1] }

// Hop is the samples per output frame (the product of the strides: 320).
func (c Config) Hop() int {
	h := 1
	for _, s := range c.ConvStrides {
		h *= s
	}
	return h
}

// ReceptiveField is the samples one output frame sees (400 for the real stack).
func (c Config) ReceptiveField() int {
	rf, jump := 1, 1
	for i, k := range c.ConvKernels {
		rf += (k - 1) * jump
		jump *= c.ConvStrides[i]
	}
	return rf
}

// Frames is the number of output frames for n input samples (0 when too short).
func (c Config) Frames(n int) int {
	for i, k := range c.ConvKernels {
		if n < k {
			return 0
		}
		n = (n-k)/c.ConvStrides[i] + 1
	}
	return n
}

func (c *Config) setSwitches(v Variant) {
	c.Variant = v
	large := v == VariantLarge
	c.NormalizeInput, c.ConvLayerNorm, c.LayerNormFirst = large, large, large
}

func (c Config) validate() error {
	n := len(c.ConvDims)
	switch {
	case n == 0 || len(c.ConvKernels) != n || len(c.ConvStrides) != n:
		return fmt.Errorf("wavlm: %d conv layers, %d kernels, %d strides", n, len(c.ConvKernels), len(c.ConvStrides))
	case c.Hidden <= 0 || c.FFN <= 0 || c.Layers <= 0 || c.Heads <= 0:
		return fmt.Errorf("wavlm: non-positive hidden %d, ffn %d, layers %d or heads %d", c.Hidden, c.FFN, c.Layers, c.Heads)
	case c.Hidden%c.Heads != 0:
		return fmt.Errorf("wavlm: hidden %d is not a multiple of %d heads", c.Hidden, c.Heads)
	case c.PosConvKernel <= 0 || c.PosConvGroups <= 0 || c.Hidden%c.PosConvGroups != 0:
		return fmt.Errorf("wavlm: positional conv kernel %d / %d groups for hidden %d", c.PosConvKernel, c.PosConvGroups, c.Hidden)
	case c.NumBuckets < 4 || c.NumBuckets%2 != 0 || c.MaxDistance <= c.NumBuckets/4:
		return fmt.Errorf("wavlm: %d buckets / max distance %d", c.NumBuckets, c.MaxDistance)
	}
	for i := range n {
		if c.ConvDims[i] <= 0 || c.ConvKernels[i] <= 0 || c.ConvStrides[i] <= 0 {
			return fmt.Errorf("wavlm: conv %d: dim %d kernel %d stride %d", i, c.ConvDims[i], c.ConvKernels[i], c.ConvStrides[i])
		}
	}
	return nil
}

func realStack(dim int) Config {
	c := Config{NumBuckets: 320, MaxDistance: 800, Eps: 1e-5, PosConvKernel: 128, PosConvGroups: 16}
	for i := range 7 {
		k, s := 3, 2
		switch {
		case i == 0:
			k, s = 10, 5
		case i >= 5:
			k = 2
		}
		c.ConvDims = append(c.ConvDims, dim)
		c.ConvKernels = append(c.ConvKernels, k)
		c.ConvStrides = append(c.ConvStrides, s)
	}
	return c
}

// RealLarge is WavLM-Large (unilm WavLM-Large.pt, MeanVC2's speaker encoder).
func RealLarge() Config {
	c := realStack(512)
	c.Hidden, c.FFN, c.Layers, c.Heads = 1024, 4096, 24, 16
	c.setSwitches(VariantLarge)
	return c
}

// RealBasePlus is WavLM-Base+ (MioCodec's SSL front end).
func RealBasePlus() Config {
	c := realStack(512)
	c.Hidden, c.FFN, c.Layers, c.Heads = 768, 3072, 12, 12
	c.setSwitches(VariantBasePlus)
	return c
}

// TensorSpec is a tensor of the published model's table.
type TensorSpec = weights.Spec

// Tensors lists the tensors of a checkpoint of this config in the unilm names of the
// published audio.cpp packages (per-conv LayerNorm of Large spelled "conv_layers.{i}.2.*").
func (c Config) Tensors() []TensorSpec { return nn.Specs(c.declare()) }

// bucket is the T5-style bidirectional bucket of a relative position r = key − query: half
// the buckets per direction, exact below a quarter of them, logarithmic up to maxDistance.
// The log branch runs in float32 like the reference, so truncation agrees at the edges.
func bucket(r, numBuckets, maxDistance int) int {
	half := numBuckets / 2
	base := 0
	if r > 0 {
		base = half
	}
	d := r
	if d < 0 {
		d = -d
	}
	exact := half / 2
	if d < exact {
		return base + d
	}
	l := float32(math.Log(float64(float32(d) / float32(exact))))
	v := l / float32(math.Log(float64(maxDistance)/float64(exact))) * float32(half-exact)
	return base + min(exact+int(v), half-1)
}
