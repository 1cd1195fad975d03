package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/ggufpack"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/models/bpe"
	"github.com/voxpipe/voxpipe/models/miocodec"
	"github.com/voxpipe/voxpipe/models/qwen3"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// mkOptions are mkmodel's settings.
type mkOptions struct {
	dims, size string // dims: real or tiny; size: miotts 0.6b or 1.7b
	variant    string // meanvc2: 120ms or 40ms
	seed       uint64
	dtype      gguf.DType // matrices; norms, biases and other vectors stay F32
}

// mkModel is one family's packaged model before its weights are drawn: metadata, the
// package spec, the tensor table, the embedded files and a short description for the
// summary line.
type mkModel struct {
	kv    gguf.KV        // metadata other than the spec's keys
	spec  gguf.ModelSpec // what audio.cpp loads the file by (audiocpp.model_spec.*)
	table []weights.Spec // logical tensor names and PyTorch shapes
	files []gguf.EmbeddedFile
	desc  string
	// fill draws the random weights of table.
	fill func(progress io.Writer) []gguf.WriteTensor
}

// check validates the spec against the tensor table and the embedded files without
// drawing any weight (gguf.ValidateModelSpec, as on the written file).
func (m *mkModel) check() error {
	kv := gguf.KV{}
	for k, v := range m.kv {
		kv[k] = v
	}
	names := make([]string, len(m.table))
	for i, t := range m.table {
		names[i] = t.Name
	}
	files := make([]string, len(m.files))
	for i, f := range m.files {
		files[i] = f.Name
	}
	return m.spec.Embed(kv, names, files)
}

// mkFamily lays out one family's packaged model.
type mkFamily func(o mkOptions) (*mkModel, error)

var mkFamilies = map[string]mkFamily{
	"miotts":   mkMioTTS,
	"miocodec": mkMioCodec,
	"meanvc2":  mkMeanVC2,
}

func runMkmodel(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("mkmodel", "mkmodel --family miotts|miocodec|meanvc2 [--dims real|tiny] [--size 0.6b|1.7b] [--variant 120ms|40ms] [--dtype f32|f16|bf16|q8_0|q4_k] [--seed N] --out FILE.gguf", stderr)
	family := fs.String("family", "", "model family: miotts, miocodec or meanvc2")
	dims := fs.String("dims", "real", "real: a published model's dimensions; tiny: the golden test model's")
	size := fs.String("size", "0.6b", "miotts size with --dims real: 0.6b or 1.7b")
	variant := fs.String("variant", "120ms", "meanvc2 variant: 120ms (the 120 ms + 40 ms model) or 40ms (the 40 ms + 40 ms one, lower latency): the same tensors, the variant's streaming constants in config.json")
	seed := fs.Uint64("seed", 1, "random seed")
	out := fs.String("out", "", "output file")
	dtype := fs.String("dtype", "f32", "stored matrix type: f32, f16, bf16, q8_0 or q4_k (norms stay f32; a q4_k matrix whose rows are not whole 256-value blocks is stored q8_0)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *out == "" {
		fs.Usage()
		return errors.New("--out is required")
	}
	o := mkOptions{dims: *dims, size: strings.ToLower(*size), variant: strings.ToLower(*variant), seed: *seed}
	switch *dtype {
	case "f32":
		o.dtype = gguf.F32
	case "f16":
		o.dtype = gguf.F16
	case "q8_0":
		o.dtype = gguf.Q8_0
	case "bf16":
		o.dtype = gguf.BF16
	case "q4_k":
		o.dtype = gguf.Q4_K
	default:
		return fmt.Errorf("--dtype %q: use f32, f16, bf16, q8_0 or q4_k", *dtype)
	}
	if o.dims != "real" && o.dims != "tiny" {
		return fmt.Errorf("--dims %q: use real or tiny", *dims)
	}
	gen, ok := mkFamilies[*family]
	if !ok {
		return fmt.Errorf("unknown family %q (available: miotts, miocodec, meanvc2)", *family)
	}
	if *family != "meanvc2" && flagGiven(fs, "variant") {
		return fmt.Errorf("--variant is for --family meanvc2 (120ms or 40ms), not %s", *family)
	}
	start := time.Now()
	m, err := gen(o)
	if err != nil {
		return err
	}
	if err := m.check(); err != nil {
		return fmt.Errorf("%s: %w", *family, err)
	}
	tensors := m.fill(stderr)
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	fmt.Fprintf(stderr, "writing %s…\n", *out)
	if err := gguf.WritePackagedSpec(w, m.kv, m.spec, tensors, m.files); err != nil {
		f.Close()
		os.Remove(*out)
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	st, _ := os.Stat(*out)
	fmt.Fprintf(stdout, "wrote %s: %s, %d tensors, %.1f MB, random weights (seed %d) in %.1f s\n",
		*out, m.desc, len(tensors), float64(st.Size())/1e6, *seed, time.Since(start).Seconds())
	return nil
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func mkMioTTS(o mkOptions) (*mkModel, error) {
	key := o.size
	if o.dims == "tiny" {
		key = "tiny"
	}
	cfg, ok := qwen3.Sizes[key]
	if !ok || key == "tiny" && o.dims != "tiny" {
		return nil, fmt.Errorf("unknown miotts size %q (0.6b or 1.7b)", o.size)
	}
	m, err := miottsModel(cfg, key, o.seed, o.dtype)
	if err != nil {
		return nil, err
	}
	m.desc = "miotts " + key
	return m, nil
}

// namespaced is a model's tensor table with every name under ns ("weights/…").
func namespaced(ns string, ts []weights.Spec) []weights.Spec {
	out := make([]weights.Spec, len(ts))
	for i, t := range ts {
		t.Name = ns + "/" + t.Name
		out[i] = t
	}
	return out
}

// randomTensors fills tensors like a freshly initialised model: vectors 1 + 0.1·N(0,1)
// (norm scales, biases, BN statistics all stay positive-ish and O(1)), matrices and
// convolutions N(0, 1/fan_in) so activations keep their scale through deep stacks. dt is
// the stored type of the tensors the models keep encoded (Linear and embedding matrices).
func randomTensors(specs []weights.Spec, seed uint64, dt gguf.DType, progress io.Writer) []gguf.WriteTensor {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]gguf.WriteTensor, len(specs))
	for i, s := range specs {
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		data := make([]float32, n)
		t := gguf.F32
		if len(s.Shape) == 1 || n == s.Shape[0] {
			for j := range data {
				data[j] = float32(1 + 0.1*rng.NormFloat64())
			}
		} else {
			fanIn := n / s.Shape[0]
			sd := 1 / math.Sqrt(float64(fanIn))
			for j := range data {
				data[j] = float32(sd * rng.NormFloat64())
			}
			// Only the matrices the models keep encoded are stored quantised (what the
			// engine's quantised Linear and row gather read).
			if s.Encoded && len(s.Shape) == 2 {
				t = matrixType(dt, s.Shape[1])
			}
		}
		out[i] = encodeTensor(s.Name, s.Shape, t, data)
		if (i+1)%100 == 0 {
			fmt.Fprintf(progress, "  %d/%d tensors\n", i+1, len(specs))
		}
	}
	return out
}

// packagedKV is the metadata of a packaged file besides its spec (gguf.ModelSpec.SetKV)
// and the tensor and file tables (gguf.WritePackaged).
func packagedKV(name string) (gguf.KV, error) {
	kv := gguf.KV{}
	for k, v := range map[string]any{
		"general.architecture":        "audiocpp",
		"general.name":                name,
		"audiocpp.tensor_name_format": "native",
	} {
		if err := kv.Set(k, v); err != nil {
			return nil, err
		}
	}
	return kv, nil
}

// mkMioCodec makes MioCodec-25Hz-44.1kHz-v2 at real dimensions: weights/ (decoder, encoders)
// and wavlm_weights/ (WavLM Base+), with its config.yaml.
func mkMioCodec(o mkOptions) (*mkModel, error) {
	if o.dims != "real" {
		return nil, errors.New("miocodec: only --dims real (the tiny model is the golden one)")
	}
	specs := append(namespaced("weights", miocodec.RealTensors()), namespaced("wavlm_weights", wavlm.RealBasePlus().Tensors())...)
	kv, err := packagedKV("miocodec-25hz-44k-v2-random")
	if err != nil {
		return nil, err
	}
	spec, err := gguf.FamilySpec("miocodec", "")
	if err != nil {
		return nil, err
	}
	return &mkModel{kv: kv, spec: spec, table: specs, desc: "miocodec 44.1 kHz v2",
		files: []gguf.EmbeddedFile{{Name: "config.yaml", Data: miocodec.RealConfigYAML()}},
		fill: func(progress io.Writer) []gguf.WriteTensor {
			return randomTensors(specs, o.seed, o.dtype, progress)
		}}, nil
}

// miottsModel lays out a random-weight MioTTS LM (norms 1 + 0.1·N(0,1), matrices
// N(0, 1/fan_in)) with its config.json, generation_config.json and tokenizer embedded.
func miottsModel(cfg qwen3.Config, size string, seed uint64, dt gguf.DType) (*mkModel, error) {
	specs := cfg.Tensors()
	conf, err := cfg.JSON()
	if err != nil {
		return nil, err
	}
	gen := fmt.Appendf(nil, `{"do_sample": true, "temperature": 0.8, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0, "max_new_tokens": 700, "eos_token_id": %d, "pad_token_id": %d}`,
		cfg.EOSTokenID, cfg.PadTokenID)
	kv, err := packagedKV("miotts-" + size + "-random")
	if err != nil {
		return nil, err
	}
	spec, err := gguf.FamilySpec("miotts", "")
	if err != nil {
		return nil, err
	}
	files := []gguf.EmbeddedFile{{Name: "config.json", Data: conf}, {Name: "generation_config.json", Data: gen}}
	tok, err := byteLevelTokenizer(cfg, size)
	if err != nil {
		return nil, err
	}
	return &mkModel{kv: kv, spec: spec, table: specs, files: append(files, tok...),
		fill: func(progress io.Writer) []gguf.WriteTensor { return miottsWeights(specs, seed, dt, progress) }}, nil
}

// miottsWeights draws the MioTTS LM's weights: norms 1 + 0.1·N(0,1), matrices
// N(0, 1/fan_in), stored as dt (norms stay F32 under Q8_0).
func miottsWeights(specs []weights.Spec, seed uint64, dt gguf.DType, progress io.Writer) []gguf.WriteTensor {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	tensors := make([]gguf.WriteTensor, len(specs))
	for i, s := range specs {
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		data := make([]float32, n)
		if len(s.Shape) == 1 {
			for j := range data {
				data[j] = float32(1 + 0.1*rng.NormFloat64())
			}
		} else {
			sd := 1 / math.Sqrt(float64(s.Shape[len(s.Shape)-1]))
			for j := range data {
				data[j] = float32(sd * rng.NormFloat64())
			}
		}
		t := matrixType(dt, s.Shape[len(s.Shape)-1])
		if len(s.Shape) == 1 && dt != gguf.F16 {
			t = gguf.F32 // norm weights: tiny, and kept F32 as converters do
		}
		tensors[i] = encodeTensor(s.Name, s.Shape, t, data)
		if (i+1)%50 == 0 {
			fmt.Fprintf(progress, "  %d/%d tensors\n", i+1, len(specs))
		}
	}
	return tensors
}

// byteLevelTokenizer makes tokenizer files for a random model: the 256 byte symbols, and at
// real sizes the merges learnt from englishCorpus (englishMerges: English prompts cost about
// the tokens the published tokenizer gives them; tiny models have no merges, so text costs
// one token per byte), and the chat and speech tokens at the ids the published tokenizer
// gives them (tiny: right after <|im_end|>).
func byteLevelTokenizer(cfg qwen3.Config, size string) ([]gguf.EmbeddedFile, error) {
	vocab := map[string]int{}
	for b, r := range bpe.ByteSymbols() {
		vocab[string(r)] = b
	}
	merges := []byte("#version: 0.2\n")
	if size != "tiny" {
		merges = mergesFile(englishMerges(), vocab, 256)
	}
	added := map[string]map[string]any{}
	add := func(id int, content string, special bool) {
		added[strconv.Itoa(id)] = map[string]any{"content": content, "special": special,
			"lstrip": false, "rstrip": false, "normalized": false, "single_word": false}
	}
	eos := cfg.EOSTokenID
	add(eos-2, "<|endoftext|>", true)
	add(eos-1, "<|im_start|>", true)
	add(eos, "<|im_end|>", true)
	speech0 := eos + 1
	if size != "tiny" {
		speech0 = 151669 // Qwen3 keeps 23 other added tokens between <|im_end|> and <|s_0|>
	}
	if speech0+12800 > cfg.Vocab || eos-2 < len(vocab) {
		return nil, fmt.Errorf("vocabulary of %d has no room for the speech tokens", cfg.Vocab)
	}
	for c := range 12800 {
		add(speech0+c, "<|s_"+strconv.Itoa(c)+"|>", false)
	}
	v, err := json.Marshal(vocab)
	if err != nil {
		return nil, err
	}
	tc, err := json.Marshal(map[string]any{"added_tokens_decoder": added, "eos_token": "<|im_end|>"})
	if err != nil {
		return nil, err
	}
	return []gguf.EmbeddedFile{{Name: "vocab.json", Data: v}, {Name: "merges.txt", Data: merges},
		{Name: "tokenizer_config.json", Data: tc}}, nil
}

// matrixType is the type a matrix with rows of k values is stored as for --dtype dt: block
// types need whole blocks per row (Q4_K falls back to Q8_0, then to F32).
func matrixType(dt gguf.DType, k int) gguf.DType {
	if dt == gguf.Q4_K && k%256 != 0 {
		dt = gguf.Q8_0
	}
	if dt == gguf.Q8_0 && k%32 != 0 {
		dt = gguf.F32
	}
	return dt
}

// encodeTensor is a tensor to write: the writer encodes F32, F16 and Q8_0 itself; BF16 and
// Q4_K are encoded here.
func encodeTensor(name string, shape []int, t gguf.DType, data []float32) gguf.WriteTensor {
	if t == gguf.BF16 || t == gguf.Q4_K {
		if raw, err := ggufpack.Encode(nil, data, t); err == nil {
			return gguf.WriteTensor{Name: name, Shape: shape, Type: t, Raw: raw}
		}
		t = gguf.F32 // not reached: matrixType gave whole blocks
	}
	return gguf.WriteTensor{Name: name, Shape: shape, Type: t, Data: data}
}
