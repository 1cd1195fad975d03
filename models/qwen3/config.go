// Package qwen3 holds the Qwen3 language model that MioTTS runs: its configuration and tensor
// table (which the model file writer uses for random-weight models at real sizes) and the
// forward pass on the engine (model.go): Load binds the weights of an audio.cpp-packaged
// GGUF into persistent buffers; a Session owns a KV cache ([KVHeads, MaxT, HeadDim] per
// layer, keys after k_norm and RoPE) and runs prefill chunks and one-token steps, each a
// program compiled once per (tokens, start position) shape and kept in an engine.Cache.
package qwen3

import (
	"encoding/json"

	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/nn"
)

// Config is the part of a Hugging Face Qwen3 config.json the model needs.
type Config struct {
	Hidden     int      `json:"hidden_size"`
	Layers     int      `json:"num_hidden_layers"`
	Heads      int      `json:"num_attention_heads"`
	KVHeads    int      `json:"num_key_value_heads"`
	HeadDim    int      `json:"head_dim"`
	FFN        int      `json:"intermediate_size"`
	Vocab      int      `json:"vocab_size"`
	RMSEps     float64  `json:"rms_norm_eps"`
	RopeTheta  float64  `json:"rope_theta"`
	MaxPos     int      `json:"max_position_embeddings"`
	TieEmbed   bool     `json:"tie_word_embeddings"`
	ModelType  string   `json:"model_type"`
	EOSTokenID int      `json:"eos_token_id"`
	PadTokenID int      `json:"pad_token_id"`
	Attention  bool     `json:"attention_bias"`
	Archs      []string `json:"architectures"`
}

// Sizes are the MioTTS LM configurations: the published 0.6B and 1.7B, and a tiny one with
// the golden model's dimensions.
var Sizes = map[string]Config{
	"0.6b": base(1024, 3072),
	"1.7b": base(2048, 6144),
	"tiny": {Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FFN: 128, Vocab: 13568,
		RMSEps: 1e-6, RopeTheta: 1e6, MaxPos: 4096, TieEmbed: true, ModelType: "qwen3",
		EOSTokenID: 758, PadTokenID: 756, Archs: []string{"Qwen3ForCausalLM"}},
}

func base(hidden, ffn int) Config {
	return Config{Hidden: hidden, Layers: 28, Heads: 16, KVHeads: 8, HeadDim: 128, FFN: ffn,
		Vocab: 164480, RMSEps: 1e-6, RopeTheta: 1e6, MaxPos: 32768, TieEmbed: true, ModelType: "qwen3",
		EOSTokenID: 151645, PadTokenID: 151643, Archs: []string{"Qwen3ForCausalLM"}}
}

// TensorSpec is a tensor of the published model's table.
type TensorSpec = weights.Spec

// Tensors lists every weight of the model (tied embeddings: no lm_head).
func (c Config) Tensors() []TensorSpec { return nn.Specs(c.declare()) }

// JSON is the config as config.json.
func (c Config) JSON() ([]byte, error) { return json.MarshalIndent(c, "", "  ") }
