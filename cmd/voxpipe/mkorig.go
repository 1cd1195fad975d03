package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/engine/ckpt"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// `voxpipe mkmodel --originals DIR` writes random-weight ORIGINALS instead of a GGUF: the
// authors' checkpoint layout that `voxpipe import` reads (a Hugging Face folder for MioTTS,
// sharded in ~2 GB safetensors pieces with their index; MioCodec's model.safetensors,
// config.yaml and WavLM-Base+ folder; MeanVC2's DiT safetensors, Fast-U2++ and Vocos
// TorchScript archives and the speaker torch.save checkpoint), under the original tensor
// names (the inverse of import's mapping). The values are the ones mkmodel draws for the
// same family, dims and seed, so importing the originals (f32) reproduces the mkmodel file
// tensor for tensor. Everything is written in Go and streamed: each tensor is drawn a chunk
// at a time straight into its file, so memory stays small at any model size — the import
// benchmark (make bench) needs no Python.

const mkorigSynopsis = "mkmodel --family miotts|miocodec|meanvc2 --originals DIR [--dims real|tiny] [--size 0.6b|1.7b] [--variant 120ms|40ms] [--dtype f32|bf16|f16] [--shard-mb 2000] [--seed N]"

// runMkmodelOrOriginals is mkmodel: with --originals, the originals writer.
func runMkmodelOrOriginals(args []string, stdout, stderr io.Writer) error {
	for _, a := range args {
		if a == "--" {
			break
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "originals" {
			return runMkorig(args, stdout, stderr)
		}
	}
	err := runMkmodel(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stderr, "  -originals DIR\n    \twrite the authors' original checkpoints with random weights into DIR instead of a GGUF\n    \t(for voxpipe import; --dtype then is the checkpoints' tensor type: f32, bf16 or f16):\n    \tvoxpipe %s\n", mkorigSynopsis)
	}
	return err
}

func runMkorig(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("mkmodel", mkorigSynopsis, stderr)
	family := fs.String("family", "", "model family: miotts, miocodec or meanvc2")
	dims := fs.String("dims", "real", "real: a published model's dimensions; tiny: the golden test model's (miotts, meanvc2)")
	size := fs.String("size", "0.6b", "miotts size with --dims real: 0.6b or 1.7b")
	variant := fs.String("variant", "120ms", "meanvc2 variant: 120ms or 40ms (in the file names, as the published files carry it)")
	seed := fs.Uint64("seed", 1, "random seed (the values are mkmodel's for the same seed)")
	dir := fs.String("originals", "", "output folder for the original checkpoints")
	dtype := fs.String("dtype", "f32", "tensor type of the checkpoints: f32, bf16 or f16 (every float tensor)")
	shardMB := fs.Int("shard-mb", 2000, "miotts: largest safetensors shard in MB (Hugging Face max_shard_size); 0: one file")
	quiet := fs.Bool("quiet", false, "no progress output")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *dir == "" || *family == "" {
		fs.Usage()
		return errors.New("--family and --originals are required")
	}
	var dt ckpt.DType
	switch strings.ToLower(*dtype) {
	case "f32":
		dt = ckpt.F32
	case "bf16":
		dt = ckpt.BF16
	case "f16":
		dt = ckpt.F16
	default:
		return fmt.Errorf("--dtype %q: the originals are f32, bf16 or f16", *dtype)
	}
	o := mkOptions{dims: *dims, size: strings.ToLower(*size), variant: strings.ToLower(*variant), seed: *seed, dtype: gguf.F32}
	if o.dims != "real" && o.dims != "tiny" {
		return fmt.Errorf("--dims %q: use real or tiny", *dims)
	}
	if *family != "meanvc2" && flagGiven(fs, "variant") {
		return fmt.Errorf("--variant is for --family meanvc2 (120ms or 40ms), not %s", *family)
	}
	gen, ok := mkFamilies[*family]
	if !ok {
		return fmt.Errorf("unknown family %q (available: miotts, miocodec, meanvc2)", *family)
	}
	start := time.Now()
	m, err := gen(o) // the table and files mkmodel would write
	if err != nil {
		return err
	}
	set, err := origLayout(*family, o, m, int64(*shardMB)*1_000_000, dt)
	if err != nil {
		return err
	}
	var progress io.Writer = stderr
	if *quiet {
		progress = io.Discard
	}
	n, err := set.write(*dir, dt, o.seed, progress)
	if err != nil {
		return err
	}
	files := len(set.files) + len(set.sides)
	if set.index != "" {
		files++
	}
	fmt.Fprintf(stdout, "wrote %s: %s originals, %d files, %d tensors, %.1f MB of %s checkpoints, random weights (seed %d) in %.1f s\n",
		*dir, m.desc, files, len(m.table), float64(n)/1e6, strings.ToLower(dt.String()), o.seed, time.Since(start).Seconds())
	return nil
}

// origTensor is one tensor of an original file.
type origTensor struct {
	spec weights.Spec // packaged name and PyTorch shape: what mkmodel draws
	name string       // the name in the original file
	mlx  bool         // a conv weight stored in MLX's [out, kernel, in] layout
}

// origFile is one checkpoint file of the originals.
type origFile struct {
	rel     string // path under the folder
	kind    string // safetensors, torch (torch.save zip of {"model": state_dict}), torchscript
	tensors []origTensor
}

// origSet is a family's originals: the checkpoints (their tensors, taken in order, are the
// packaged table in mkmodel's order), the side files, and how values are drawn.
type origSet struct {
	files []origFile
	sides []gguf.EmbeddedFile // path under the folder → contents
	index string              // miotts shards: the index file's path ("" when unsharded)
	draw  origDraw
}

// origDraw draws values as mkmodel does: one PCG stream over the table in order; vectors
// 1 + 0.1·N(0,1), matrices and convolutions N(0, 1/fan_in).
type origDraw struct {
	// lastDim: miottsWeights' rule (vectors are rank 1, fan_in is the last dim); else
	// randomTensors' (vectors are rank 1 or [n, 1, …], fan_in is n / shape[0]).
	lastDim bool
	// fix overwrites what is not a learned weight (meanvc2's RoPE table, ISTFT window,
	// BN variances) on a whole drawn tensor; reports whether it applies to name.
	fix func(name string, data []float32) bool
}

// origChunk is how many values are drawn and written at a time.
const origChunk = 1 << 20

// tensor draws s's values with rng, giving them to emit in order, a chunk at a time (the
// whole tensor at once when whole is set or a fix applies).
func (d origDraw) tensor(rng *rand.Rand, s weights.Spec, whole bool, buf []float32, emit func([]float32) error) error {
	n := 1
	for _, x := range s.Shape {
		n *= x
	}
	if len(s.Shape) == 0 {
		return fmt.Errorf("%s: a scalar (mkmodel tables have none)", s.Name)
	}
	vector := len(s.Shape) == 1
	var sd float64
	if d.lastDim {
		sd = 1 / math.Sqrt(float64(s.Shape[len(s.Shape)-1]))
	} else {
		vector = vector || n == s.Shape[0]
		if !vector {
			sd = 1 / math.Sqrt(float64(n/s.Shape[0]))
		}
	}
	if d.fix != nil && d.fix(s.Name, nil) {
		whole = true
	}
	if whole || len(buf) < min(n, origChunk) {
		buf = make([]float32, n)
	}
	for done := 0; done < n; {
		c := buf[:min(n-done, len(buf))]
		if vector {
			for j := range c {
				c[j] = float32(1 + 0.1*rng.NormFloat64())
			}
		} else {
			for j := range c {
				c[j] = float32(sd * rng.NormFloat64())
			}
		}
		if whole && d.fix != nil {
			d.fix(s.Name, c)
		}
		if err := emit(c); err != nil {
			return err
		}
		done += len(c)
	}
	return nil
}

// origLayout maps a family's mkmodel table onto the original files (the inverse of
// import's renaming) and gives their side files.
func origLayout(family string, o mkOptions, m *mkModel, shardBytes int64, dt ckpt.DType) (*origSet, error) {
	switch family {
	case "miotts":
		return origMioTTS(m, shardBytes, dt)
	case "miocodec":
		return origMioCodec(m)
	case "meanvc2":
		d := mvc2Real()
		if o.dims == "tiny" {
			d = mvc2Tiny()
		}
		d, err := d.withVariant(cmp.Or(o.variant, "120ms"))
		if err != nil {
			return nil, err
		}
		return origMeanVC2(m, d)
	}
	return nil, fmt.Errorf("unknown family %q", family)
}

// origBytes is the size of s stored as dt.
func origBytes(s weights.Spec, dt ckpt.DType) int64 {
	n := int64(dt.Size())
	for _, d := range s.Shape {
		n *= int64(d)
	}
	return n
}

// origMioTTS is a Hugging Face Qwen3 folder: config.json, generation_config.json, the
// tokenizer files, and model.safetensors, or model-0000K-of-0000N.safetensors shards of at
// most shardBytes of dt (a tensor larger than that gets a shard of its own) with
// model.safetensors.index.json. The HF names are the packaged ones.
func origMioTTS(m *mkModel, shardBytes int64, dt ckpt.DType) (*origSet, error) {
	set := &origSet{sides: m.files, draw: origDraw{lastDim: true}}
	var shards [][]origTensor
	var cur []origTensor
	var curBytes int64
	for _, s := range m.table {
		b := origBytes(s, dt)
		if shardBytes > 0 && len(cur) > 0 && curBytes+b > shardBytes {
			shards = append(shards, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, origTensor{spec: s, name: s.Name})
		curBytes += b
	}
	shards = append(shards, cur)
	if len(shards) == 1 {
		set.files = []origFile{{rel: "model.safetensors", kind: "safetensors", tensors: shards[0]}}
		return set, nil
	}
	for i, ts := range shards {
		set.files = append(set.files, origFile{rel: fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards)), kind: "safetensors", tensors: ts})
	}
	set.index = "model.safetensors.index.json"
	return set, nil
}

// origMioCodec is MioCodec-25Hz-44.1kHz-v2's folder: model.safetensors (weights/, names as
// packaged), config.yaml, and wavlm-base-plus-mlx/ with weights.safetensors (wavlm_weights/,
// the feature extractor's and positional convolutions in MLX's [out, kernel, in] layout as
// the mlx-community conversion stores them) and its config.json.
func origMioCodec(m *mkModel) (*origSet, error) {
	set := &origSet{draw: origDraw{}}
	codec := origFile{rel: "model.safetensors", kind: "safetensors"}
	wl := origFile{rel: "wavlm-base-plus-mlx/weights.safetensors", kind: "safetensors"}
	for _, s := range m.table {
		if rest, ok := strings.CutPrefix(s.Name, "weights/"); ok && len(wl.tensors) == 0 {
			codec.tensors = append(codec.tensors, origTensor{spec: s, name: rest})
		} else if rest, ok := strings.CutPrefix(s.Name, "wavlm_weights/"); ok {
			mlx := len(s.Shape) == 3 && (strings.HasPrefix(rest, "feature_extractor.conv_layers.") || rest == "encoder.pos_conv.0.weight_v")
			wl.tensors = append(wl.tensors, origTensor{spec: s, name: rest, mlx: mlx})
		} else {
			return nil, fmt.Errorf("miocodec: %s is not weights/ or wavlm_weights/ in table order", s.Name)
		}
	}
	set.files = []origFile{codec, wl}
	for _, f := range m.files {
		if f.Name == "config.yaml" {
			set.sides = append(set.sides, f)
		}
	}
	conf, err := origWavLMConfig(wavlm.RealBasePlus())
	if err != nil {
		return nil, err
	}
	set.sides = append(set.sides, gguf.EmbeddedFile{Name: "wavlm-base-plus-mlx/config.json", Data: conf})
	return set, nil
}

// origWavLMConfig is a WavLM config.json in Hugging Face's WavLMConfig key names.
func origWavLMConfig(c wavlm.Config) ([]byte, error) {
	norm := "group"
	if c.ConvLayerNorm {
		norm = "layer"
	}
	return json.MarshalIndent(map[string]any{
		"model_type": "wavlm", "architectures": []string{"WavLMModel"}, "hidden_size": c.Hidden,
		"num_hidden_layers": c.Layers, "num_attention_heads": c.Heads, "intermediate_size": c.FFN,
		"hidden_act": "gelu", "conv_dim": c.ConvDims, "conv_kernel": c.ConvKernels, "conv_stride": c.ConvStrides,
		"conv_bias": false, "feat_extract_norm": norm, "do_stable_layer_norm": c.LayerNormFirst,
		"num_conv_pos_embeddings": c.PosConvKernel, "num_conv_pos_embedding_groups": c.PosConvGroups,
		"num_buckets": c.NumBuckets, "max_bucket_distance": c.MaxDistance, "layer_norm_eps": shortFloat(c.Eps),
	}, "", "  ")
}

// origMeanVC2 is the published MeanVC2 files: meanvc2_<variant>_40ms.safetensors (the DiT,
// vc/), fastu2pp_160ms.pt or fastu2pp_80ms.pt (TorchScript: encoder.*, asr/), vocos.pt
// (TorchScript, vocos/) and wavlm_large_finetune.pth (torch.save {"model": state_dict}: WavLM
// under feature_extract.model.* with unilm's conv LayerNorm names, the ECAPA head at the
// root). import reads the variant from the file names and config.json from the shapes.
func origMeanVC2(m *mkModel, d mvc2Dims) (*origSet, error) {
	asrFile := "fastu2pp_160ms.pt"
	if d.vc.Runtime.Model == "40ms" {
		asrFile = "fastu2pp_80ms.pt"
	}
	files := map[string]*origFile{
		"vc":                {rel: "meanvc2_" + d.vc.Runtime.Model + "_40ms.safetensors", kind: "safetensors"},
		conformer.Namespace: {rel: asrFile, kind: "torchscript"},
		"vocos":             {rel: "vocos.pt", kind: "torchscript"},
		"speaker_wavlm":     {rel: "wavlm_large_finetune.pth", kind: "torch"},
	}
	files["speaker_ecapa"] = files["speaker_wavlm"]
	set := &origSet{}
	var last *origFile
	for _, s := range m.table {
		ns := gguf.Namespace(s.Name)
		rest := strings.TrimPrefix(s.Name, ns+"/")
		f, ok := files[ns]
		if !ok {
			return nil, fmt.Errorf("meanvc2: %s: unknown namespace", s.Name)
		}
		if f != last {
			for _, g := range set.files {
				if g.rel == f.rel {
					return nil, fmt.Errorf("meanvc2: %s: the namespaces of %s are not together in the table", s.Name, f.rel)
				}
			}
			if last != nil {
				set.files = append(set.files, *last)
			}
			last = f
		}
		name := rest
		if ns == "speaker_wavlm" {
			name = "feature_extract.model." + origUnilmName(rest)
		}
		f.tensors = append(f.tensors, origTensor{spec: s, name: name})
	}
	set.files = append(set.files, *last)
	set.draw = origDraw{fix: func(name string, data []float32) bool {
		switch {
		case name == "vc/rotary_embed.inv_freq":
			for j := range data {
				data[j] = float32(math.Pow(d.vc.RopeBase, -2*float64(j)/float64(2*len(data))))
			}
		case name == "vocos/head.istft.window":
			copy(data, dsp.HannPeriodic(d.vocos.NFFT))
		case strings.HasSuffix(name, ".running_var"):
			for j, v := range data {
				data[j] = float32(math.Max(math.Abs(float64(v)), 0.05))
			}
		default:
			return false
		}
		return true
	}}
	return set, nil
}

// origUnilmName spells a packaged WavLM-Large name as unilm's checkpoint does: the per-conv
// LayerNorm "conv_layers.N.2.*" as "conv_layers.N.2.1.*" (the inverse of wavlmRename).
func origUnilmName(name string) string {
	if rest, ok := strings.CutPrefix(name, "feature_extractor.conv_layers."); ok {
		parts := strings.Split(rest, ".")
		if len(parts) == 3 && parts[1] == "2" {
			return "feature_extractor.conv_layers." + parts[0] + ".2.1." + parts[2]
		}
	}
	return name
}

// write writes the originals under dir and returns the checkpoint bytes written.
func (set *origSet) write(dir string, dt ckpt.DType, seed uint64, progress io.Writer) (int64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	for _, f := range set.sides {
		p := filepath.Join(dir, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return 0, err
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			return 0, err
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed)) // mkmodel's stream
	buf := make([]float32, origChunk)
	var total int64
	weightMap := map[string]string{}
	for _, f := range set.files {
		start := time.Now()
		p := filepath.Join(dir, filepath.FromSlash(f.rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return total, err
		}
		draw := func(t origTensor, emit func([]float32) error) error {
			if !t.mlx {
				return set.draw.tensor(rng, t.spec, false, buf, emit)
			}
			// MLX layout: the values drawn in PyTorch's [out, in, kernel] order, stored
			// transposed.
			return set.draw.tensor(rng, t.spec, true, nil, func(v []float32) error {
				return emit(importSwapLast2(v, t.spec.Shape))
			})
		}
		var n int64
		var err error
		if f.kind == "safetensors" {
			n, err = writeOrigSafetensors(p, f.tensors, dt, draw)
		} else {
			n, err = writeOrigTorch(p, f.kind == "torchscript", f.tensors, dt, draw)
		}
		if err != nil {
			os.Remove(p)
			return total, fmt.Errorf("%s: %w", p, err)
		}
		total += n
		for _, t := range f.tensors {
			weightMap[t.name] = f.rel
		}
		fmt.Fprintf(progress, "  %-40s %4d tensors  %9.1f MB  %5.1f s\n", f.rel, len(f.tensors), float64(n)/1e6, time.Since(start).Seconds())
	}
	if set.index != "" {
		var size int64
		for _, f := range set.files {
			for _, t := range f.tensors {
				size += origBytes(t.spec, dt)
			}
		}
		idx, err := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": size}, "weight_map": weightMap}, "", "  ")
		if err != nil {
			return total, err
		}
		if err := os.WriteFile(filepath.Join(dir, set.index), idx, 0o644); err != nil {
			return total, err
		}
	}
	return total, nil
}

// origShape is the shape of t as stored.
func origShape(t origTensor) []int {
	s := append([]int(nil), t.spec.Shape...)
	if t.mlx {
		s[len(s)-1], s[len(s)-2] = s[len(s)-2], s[len(s)-1]
	}
	return s
}
