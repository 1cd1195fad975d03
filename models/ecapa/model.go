// Package ecapa is the ECAPA-TDNN speaker head of MeanVC2 (UniSpeech's ECAPA_TDNN with
// feat_type wavlm_large): a softmax-weighted sum of WavLM hidden states, instance norm,
// a k5 conv, three SE-Res2 blocks, multi-layer feature aggregation, attentive statistics
// pooling, batch norm and a linear projection to the speaker embedding. Weights are the
// audio.cpp `speaker_ecapa/` names; every width comes from the tensor shapes.
package ecapa

import (
	"encoding/json"
	"fmt"

	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// Config holds what the tensor shapes do not tell: dilations and epsilons. The reference
// class hard-codes them; DefaultConfig has its values.
type Config struct {
	// Dilations of layer1 and of each SE-Res2 block (layer2, layer3, layer4).
	Dilations       []int
	BatchNormEps    float64
	InstanceNormEps float64
	StatsEps        float64 // clamp of the pooled variance
}

// DefaultConfig is the reference ECAPA_TDNN: dilations 1 (layer1), 2, 3, 4; eps 1e-5;
// statistics clamp 1e-9.
func DefaultConfig() Config {
	return Config{Dilations: []int{1, 2, 3, 4}, BatchNormEps: 1e-5, InstanceNormEps: 1e-5, StatsEps: 1e-9}
}

// ParseConfig reads the `speaker_ecapa` section of an audio.cpp MeanVC2 config.json (the
// whole file or just the section). Missing keys keep DefaultConfig's values; switches that
// describe another variant of the head are refused.
func ParseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	var whole map[string]json.RawMessage
	if err := json.Unmarshal(data, &whole); err != nil {
		return c, fmt.Errorf("ecapa: config.json: %w", err)
	}
	if sec, ok := whole["speaker_ecapa"]; ok {
		data = sec
	}
	var raw struct {
		Dilations      []int    `json:"dilations"`
		BNEps          *float64 `json:"batch_norm_eps"`
		INEps          *float64 `json:"instance_norm_eps"`
		StatsEps       *float64 `json:"stats_eps"`
		Order          string   `json:"conv_relu_bn_order"`
		Passthrough    string   `json:"res2_passthrough"`
		L2             bool     `json:"l2_normalize"`
		GlobalContext  bool     `json:"global_context_att"`
		FeatureSelectn string   `json:"feature_selection"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return c, fmt.Errorf("ecapa: config.json speaker_ecapa: %w", err)
	}
	switch {
	case raw.Order != "" && raw.Order != "conv,relu,bn":
		return c, fmt.Errorf("ecapa: conv_relu_bn_order %q is not supported (conv,relu,bn)", raw.Order)
	case raw.Passthrough != "" && raw.Passthrough != "last_chunk":
		return c, fmt.Errorf("ecapa: res2_passthrough %q is not supported (last_chunk)", raw.Passthrough)
	case raw.L2:
		return c, fmt.Errorf("ecapa: l2_normalize is not supported (the reference does not normalise)")
	case raw.GlobalContext:
		return c, fmt.Errorf("ecapa: global_context_att is not supported")
	case raw.FeatureSelectn != "" && raw.FeatureSelectn != "hidden_states":
		return c, fmt.Errorf("ecapa: feature_selection %q is not supported (hidden_states)", raw.FeatureSelectn)
	}
	if raw.Dilations != nil {
		c.Dilations = raw.Dilations
	}
	for _, p := range []struct {
		dst *float64
		src *float64
	}{{&c.BatchNormEps, raw.BNEps}, {&c.InstanceNormEps, raw.INEps}, {&c.StatsEps, raw.StatsEps}} {
		if p.src != nil {
			*p.dst = *p.src
		}
	}
	return c, c.validate()
}

func (c Config) validate() error {
	if len(c.Dilations) != 4 {
		return fmt.Errorf("ecapa: %d dilations, want 4 (layer1 and three SE-Res2 blocks)", len(c.Dilations))
	}
	for _, d := range c.Dilations {
		if d < 1 {
			return fmt.Errorf("ecapa: dilation %d", d)
		}
	}
	if c.BatchNormEps <= 0 || c.InstanceNormEps <= 0 || c.StatsEps < 0 {
		return fmt.Errorf("ecapa: epsilons must be positive: %+v", c)
	}
	return nil
}

// Dims are the widths of a head, all read from tensor shapes.
type Dims struct {
	Layers   int // hidden states mixed (feature_weight)
	Feat     int // hidden size of the features
	Channels int // TDNN channels
	Kernel1  int // layer1 kernel
	Scale    int // Res2 splits
	Kernel   int // Res2 conv kernel
	SE       int // SE bottleneck
	MFA      int // aggregation channels (3·Channels in the reference)
	Att      int // attention bottleneck of the pooling
	Emb      int // embedding size
	// SEConv is true when the SE linears are stored as 1×1 convs ([out, in, 1]).
	SEConv bool
}

// RealDims are MeanVC2's published head (WavLM-Large features, ECAPA_TDNN_SMALL widths).
var RealDims = Dims{Layers: 25, Feat: 1024, Channels: 512, Kernel1: 5, Scale: 8, Kernel: 3, SE: 128, MFA: 1536, Att: 128, Emb: 256}

// TensorSpec is a tensor of the published model's table.
type TensorSpec = weights.Spec

// Tensors lists every tensor of a head with dims d, in the published order.
func Tensors(d Dims) []TensorSpec { return nn.Specs(d.declare()) }

// RealTensors is the published speaker_ecapa table (RealDims), for random-weight models.
func RealTensors() []TensorSpec { return Tensors(RealDims) }
