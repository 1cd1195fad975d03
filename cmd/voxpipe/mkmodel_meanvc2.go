package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/ecapa"
	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/models/vocos"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// mvc2Dims are the widths and depths of a whole MeanVC2 file, one entry per namespace. The
// structural constants (chunking, kernels, strides, epsilons, the GTM/TVT layout) are the
// published model's in both presets; only the sizes differ.
type mvc2Dims struct {
	name  string
	vc    meanvc2.Config
	asr   conformer.Config
	vocos vocos.Dims
	ecapa ecapa.Dims
	wavlm wavlm.Config
}

// mvc2Real is the published meanvc2-120ms-40ms file (audio.cpp's single-file package);
// withVariant makes it the 40 ms + 40 ms one and puts the variant in its name.
func mvc2Real() mvc2Dims {
	return mvc2Dims{name: "meanvc2-random", vc: meanvc2.DefaultConfig(), asr: conformer.RealConfig(),
		vocos: vocos.RealDims, ecapa: ecapa.RealDims, wavlm: wavlm.RealLarge()}
}

// mvc2Tiny is the golden test model's layout (shared/golden/meanvc2/MANIFEST.md §2).
func mvc2Tiny() mvc2Dims {
	d := mvc2Dims{name: "meanvc2-tiny-random", vc: meanvc2.DefaultConfig(), asr: conformer.RealConfig(),
		wavlm: wavlm.RealLarge()}
	d.vc.Dim, d.vc.DimHead, d.vc.FF, d.vc.BNDim, d.vc.SpkDim, d.vc.GTMHidden = 64, 32, 128, 32, 32, 32
	d.asr.OutputSize, d.asr.LinearUnits, d.asr.NumBlocks, d.asr.SubsampleChannels = 32, 64, 2, 32
	d.vocos = vocos.Dims{Mels: 80, Dim: 32, Inter: 64, Layers: 2, Kernel: 7, DWKernel: 7, NFFT: 640}
	d.ecapa = ecapa.Dims{Layers: 4, Feat: 32, Channels: 32, Kernel1: 5, Scale: 8, Kernel: 3, SE: 8, MFA: 96, Att: 8, Emb: 32}
	// conv_dim 24 ≠ hidden 32 keeps post_extract_proj, as WavLM-Large has it.
	w := &d.wavlm
	w.ConvDims = []int{24, 24, 24, 24, 24, 24, 24}
	w.Hidden, w.FFN, w.Layers, w.Heads = 32, 64, 3, 2
	return d
}

// specs lists every tensor under its namespace, in the published file's namespace order.
func (d mvc2Dims) specs() []weights.Spec {
	return slices.Concat(namespaced("vc", d.vc.Tensors()), namespaced("vocos", vocos.Tensors(d.vocos)),
		namespaced(conformer.Namespace, d.asr.Tensors()), namespaced("speaker_wavlm", d.wavlm.Tensors()),
		namespaced("speaker_ecapa", ecapa.Tensors(d.ecapa)))
}

// convFeatureLayers writes the conv stack in fairseq's string form, runs of equal layers
// grouped: "[(512,10,5)] + [(512,3,2)] * 4 + [(512,2,2)] * 2".
func convFeatureLayers(c wavlm.Config) string {
	var parts []string
	for i := 0; i < len(c.ConvDims); {
		j := i + 1
		for j < len(c.ConvDims) && c.ConvDims[j] == c.ConvDims[i] && c.ConvKernels[j] == c.ConvKernels[i] && c.ConvStrides[j] == c.ConvStrides[i] {
			j++
		}
		p := fmt.Sprintf("[(%d,%d,%d)]", c.ConvDims[i], c.ConvKernels[i], c.ConvStrides[i])
		if j-i > 1 {
			p += fmt.Sprintf(" * %d", j-i)
		}
		parts = append(parts, p)
		i = j
	}
	return strings.Join(parts, " + ")
}

// configJSON is the embedded config.json in the golden file's schema (sections asr, runtime,
// speaker_ecapa, speaker_wavlm, vc, vocos) with d's sizes. Keys come out sorted, as the
// reference tooling writes them.
func (d mvc2Dims) configJSON() ([]byte, error) {
	c, a, w, e, v := d.vc, d.asr, d.wavlm, d.ecapa, d.vocos
	layersWhere := func(vals []int) []int {
		out := []int{}
		for l := range c.Depth {
			if vals[l] > 0 {
				out = append(out, l)
			}
		}
		return out
	}
	kv := make([]int, c.Depth)
	for l := range kv {
		kv[l] = c.CacheFrames(l)
	}
	ff := c.FFMult
	if c.FF > 0 {
		ff = c.FF / c.Dim
	}
	vc := map[string]any{
		"model_type": "DiT",
		"model": map[string]any{
			"block_size": c.BlockSize, "bn_dim": c.BNDim, "chunk_size": c.ChunkSize, "conv_layers": 4,
			"depth": c.Depth, "dim": c.Dim, "dim_head": c.DimHead, "dropout": 0.0, "ff_mult": ff,
			"heads": c.Heads, "qk_norm": "rms_norm",
		},
		"fixed_in_code": map[string]any{
			"adaln_eps": c.AdaEps, "backward_layers": layersWhere(c.PastChunks), "ff_activation": "gelu_tanh",
			"forward_layers": layersWhere(c.FutureChunks), "gtm_hidden_dim": c.GTMHidden, "gtm_memory_slots": c.GTMSlots,
			"gtm_tvt_ln_eps": c.LNEps, "kv_cache_frames": kv, "mel_dim": c.MelDim, "rms_eps": c.RMSEps,
			"rope_base": c.RopeBase, "rope_dim": c.DimHead, "spk_dim": c.SpkDim,
			"t_f_num": c.FutureChunks[:c.Depth], "t_p_num": c.PastChunks[:c.Depth],
			"time_freq_embed_dim": c.TimeFreqDim, "time_sinus_scale": c.TimeScale,
			"tvt_attn_dim": c.TVTAttnDim, "tvt_num_heads": c.TVTHeads, "vc_offset_reset": c.OffsetReset,
		},
	}
	s := a.Stream
	asr := map[string]any{
		"activation_type": "swish", "attention_heads": a.Heads, "causal": true,
		"att_cache_shape":   []int{a.NumBlocks, a.Heads, s.RequiredCache, 2 * a.OutputSize / a.Heads},
		"cnn_cache_shape":   []int{a.NumBlocks, 1, a.OutputSize, a.CNNKernel - 1},
		"cnn_module_kernel": a.CNNKernel, "cnn_module_norm": "layer_norm",
		"encoder": "conformer (Fast-U2++ streaming path, WeNet forward_chunk)",
		"fbank": map[string]any{
			"dither": 0.0, "energy_floor": 0.0, "frame_length_ms": 25, "frame_shift_ms": 10, "high_freq": 0,
			"input_scale": 32768, "low_freq": 20, "num_mel_bins": a.InputDim, "preemphasis": 0.97,
			"remove_dc_offset": true, "round_to_power_of_two": true, "sample_frequency": 16000,
			"snip_edges": true, "use_log_fbank": true, "use_power": true, "window_type": "povey",
		},
		"global_cmvn": nil, "input_dim": a.InputDim, "input_layer": "conv2d", "layer_norm_eps": a.LayerNormEps,
		"linear_units": a.LinearUnits, "macaron_style": true, "normalize_before": true, "num_blocks": a.NumBlocks,
		"output_size": a.OutputSize, "pos_enc_layer_type": "rel_pos", "right_context": 6,
		"selfattention_layer_type": "rel_selfattn", "subsampling_rate": 4, "use_cnn_module": true,
	}
	ec := ecapa.DefaultConfig()
	spkECAPA := map[string]any{
		"attention_channels": e.Att, "batch_norm_eps": ec.BatchNormEps, "channels": e.Channels,
		"conv_relu_bn_order": "conv,relu,bn", "dilations": ec.Dilations, "emb_dim": e.Emb, "feat_dim": e.Feat,
		"feat_type": "wavlm_large", "feature_selection": "hidden_states", "feature_weight_len": e.Layers,
		"global_context_att": false, "instance_norm_eps": ec.InstanceNormEps,
		"kernel_sizes": []int{e.Kernel1, e.Kernel, e.Kernel, e.Kernel}, "l2_normalize": false,
		"mfa_channels": e.MFA, "res2_passthrough": "last_chunk", "res2_scale": e.Scale,
		"se_bottleneck_dim": e.SE, "stats_eps": ec.StatsEps,
	}
	spkWavLM := map[string]any{
		"activation_dropout": 0.0, "activation_fn": "gelu", "attention_dropout": 0.0, "conv_bias": false,
		"conv_feature_layers": convFeatureLayers(w), "conv_pos": w.PosConvKernel, "conv_pos_groups": w.PosConvGroups,
		"dropout": 0.0, "dropout_features": 0.0, "dropout_input": 0.0, "encoder_attention_heads": w.Heads,
		"encoder_embed_dim": w.Hidden, "encoder_ffn_embed_dim": w.FFN, "encoder_layerdrop": 0.0,
		"encoder_layers": w.Layers, "extractor_mode": "layer_norm", "feature_grad_mult": 0.0, "gru_rel_pos": true,
		"layer_norm_eps": shortFloat(w.Eps), "layer_norm_first": true, "mask_channel_prob": 0.0, "mask_prob": 0.0,
		"max_distance": w.MaxDistance, "normalize": true, "num_buckets": w.NumBuckets,
		"num_hidden_states": w.Layers + 1, "relative_position_embedding": true,
	}
	vcfg := vocos.DefaultConfig()
	voc := map[string]any{
		"activation": "gelu_erf", "dim": v.Dim, "hop_length": v.NFFT / 4, "input_channels": v.Mels,
		"input_transform": "(mel+1)/2", "intermediate_dim": v.Inter, "layer_norm_eps": vcfg.LayerNormEps,
		"mag_clip": vcfg.MagClip, "n_fft": v.NFFT, "num_layers": v.Layers, "padding": "center", "window": "hann_periodic",
	}
	return json.MarshalIndent(map[string]any{
		"asr": asr, "runtime": c.Runtime, "speaker_ecapa": spkECAPA, "speaker_wavlm": spkWavLM, "vc": vc, "vocos": voc,
	}, "", "  ")
}

// shortFloat is f as a float64 with f's shortest decimal (1e-05, not 9.9999997e-06).
func shortFloat(f float32) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
	return v
}

// mvc2Weights fills d's tensors with randomTensors' scheme and then sets what is not a
// learned weight: the RoPE frequency table (the loader recovers the base from it and refuses
// any other table) and the ISTFT window. BatchNorm running variances are made strictly
// positive, whatever the draw, so eval-mode BN never divides by a non-positive number.
func (d mvc2Dims) mvc2Weights(seed uint64, dt gguf.DType, progress io.Writer) []gguf.WriteTensor {
	ts := randomTensors(d.specs(), seed, dt, progress)
	for i := range ts {
		t := &ts[i]
		switch {
		case t.Name == "vc/rotary_embed.inv_freq":
			n := len(t.Data)
			for j := range t.Data {
				t.Data[j] = float32(math.Pow(d.vc.RopeBase, -2*float64(j)/float64(2*n)))
			}
		case t.Name == "vocos/head.istft.window":
			t.Data = dsp.HannPeriodic(d.vocos.NFFT)
		case strings.HasSuffix(t.Name, ".running_var"):
			for j, v := range t.Data {
				t.Data[j] = float32(math.Max(math.Abs(float64(v)), 0.05))
			}
		}
	}
	return ts
}

// withVariant returns d with the streaming constants of a published variant ("120ms" or
// "40ms", meanvc2.Variants): the DiT chunk (vc.model.chunk_size and runtime.chunk_size), the
// ASR window, stride, attention cache and offsets (runtime.bn_window, …, and the asr section's
// att_cache_shape), and the variant in its name. No tensor's shape depends on the variant.
func (d mvc2Dims) withVariant(variant string) (mvc2Dims, error) {
	if !slices.Contains(meanvc2.Variants, variant) {
		return d, fmt.Errorf("meanvc2: --variant %q: use %s", variant, strings.Join(meanvc2.Variants, " or "))
	}
	vc, err := d.vc.WithVariant(variant)
	if err != nil {
		return d, err
	}
	d.vc = vc
	rt, s := vc.Runtime, &d.asr.Stream
	s.Window, s.Stride, s.RequiredCache = rt.BNWindow, rt.BNStride, rt.RequiredCacheSize
	s.OffsetInit, s.OffsetStep = rt.ASROffsetInit, rt.ASROffsetStep
	d.name = strings.Replace(d.name, "meanvc2", d.published(), 1)
	return d, nil
}

// published is the name of the released model whose layout d has: meanvc2-120ms-40ms or
// meanvc2-40ms-40ms.
func (d mvc2Dims) published() string { return "meanvc2-" + d.vc.Runtime.Model + "-40ms" }

// mkMeanVC2 makes the published single-file MeanVC2 (meanvc2-120ms-40ms or, with --variant
// 40ms, meanvc2-40ms-40ms: vc/, asr/, vocos/, speaker_wavlm/, speaker_ecapa/ and config.json)
// with random weights: at real size with --dims real, in the golden test model's layout with
// --dims tiny. general.name is meanvc2-<variant>-40ms-random (…-tiny-random).
func mkMeanVC2(o mkOptions) (*mkModel, error) {
	d := mvc2Real()
	if o.dims == "tiny" {
		d = mvc2Tiny()
	}
	variant := cmp.Or(o.variant, "120ms")
	d, err := d.withVariant(variant)
	if err != nil {
		return nil, err
	}
	conf, err := d.configJSON()
	if err != nil {
		return nil, fmt.Errorf("meanvc2: config.json: %w", err)
	}
	kv, err := packagedKV(d.name)
	if err != nil {
		return nil, err
	}
	spec, err := d.spec()
	if err != nil {
		return nil, err
	}
	weightType := "orig"
	if o.dtype != gguf.F32 {
		weightType = strings.ToLower(o.dtype.String())
	}
	for k, v := range map[string]any{
		"audiocpp.source_format": "packed",
		"audiocpp.weight_type":   weightType,
	} {
		if err := kv.Set(k, v); err != nil {
			return nil, err
		}
	}
	return &mkModel{kv: kv, spec: spec, table: d.specs(), desc: "meanvc2 " + strings.TrimSuffix(variant, "ms") + " ms + 40 ms (" + o.dims + ")",
		files: []gguf.EmbeddedFile{{Name: "config.json", Data: conf}},
		fill: func(progress io.Writer) []gguf.WriteTensor {
			fmt.Fprintf(progress, "generating %d tensors…\n", len(d.specs()))
			return d.mvc2Weights(o.seed, o.dtype, progress)
		}}, nil
}

// spec is the package spec of d's file: the published MeanVC2 spec of its variant
// (gguf.FamilySpec), with the variant's model in its description.
func (d mvc2Dims) spec() (gguf.ModelSpec, error) {
	spec, err := gguf.FamilySpec(meanvc2.Family, d.vc.Runtime.Model)
	if err != nil {
		return spec, err
	}
	if ns := spec.Namespaces; len(ns) != 5 || ns[2].Name != conformer.Namespace {
		return spec, fmt.Errorf("meanvc2: spec namespaces %v, want vc, vocos, %s, speaker_wavlm, speaker_ecapa", ns, conformer.Namespace)
	}
	desc, _ := spec.Catalog["description"].(string)
	spec.Catalog["description"] = desc + " Random weights with the layout of " + d.published() + "."
	return spec, nil
}
