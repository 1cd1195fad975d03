package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/ecapa"
	"github.com/voxpipe/voxpipe/models/meanvc2"
	"github.com/voxpipe/voxpipe/models/miocodec"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/models/qwen3"
	"github.com/voxpipe/voxpipe/models/vocos"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// graphs the planner benchmark can plan: a model's real graph over shape-only weights, for
// seconds of its input.
var shapeGraphs = map[string]func(seconds float64) (*engine.Graph, error){
	"wavlm-large": func(s float64) (*engine.Graph, error) { return wavlm.PlannerGraph(wavlm.RealLarge(), int(s*16000)) },
}

func runBenchPlanner(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench planner", "bench planner [--graph wavlm-large] [--seconds S] [--json]", stderr)
	name := fs.String("graph", "wavlm-large", "model-shaped graph to plan")
	seconds := fs.Float64("seconds", 10, "seconds of input audio")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	build := shapeGraphs[*name]
	if build == nil {
		return fmt.Errorf("unknown graph %q (available: wavlm-large)", *name)
	}
	if *seconds <= 0 || *seconds > 600 {
		return errors.New("--seconds must be in (0, 600]")
	}
	g, err := build(*seconds)
	if err != nil {
		return err
	}
	st, err := engine.PlanStatsOf(g)
	if err != nil {
		return err
	}
	res := struct {
		Bench   string  `json:"bench"`
		Graph   string  `json:"graph"`
		Seconds float64 `json:"seconds"`
		engine.PlanStats
		Ratio float64 `json:"ratio"`
	}{"planner", *name, *seconds, st, float64(st.ArenaBytes) / float64(st.NaiveBytes)}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "%s, %.0f s: %d nodes; arena %.1f MB vs naive %.1f MB (%.1f%%); persistent %.1f MB\n",
		res.Graph, res.Seconds, st.Nodes, mb(st.ArenaBytes), mb(st.NaiveBytes), 100*res.Ratio, mb(st.PersistentBytes))
	return nil
}

func mb(b int64) float64 { return float64(b) / 1e6 }

func runBenchDispatch(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench dispatch", "bench dispatch [--nodes N] [--json]", stderr)
	nodes := fs.Int("nodes", 1000, "tiny ops in the graph")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *nodes < 1 || *nodes > 1_000_000 {
		return errors.New("--nodes must be in [1, 1000000]")
	}
	cpu, err := engine.NewCPU(1)
	if err != nil {
		return err
	}
	defer cpu.Close()
	g := engine.NewGraph("dispatch")
	x := g.Input("x", engine.F32, 4)
	for range *nodes {
		x = g.Scale(x, 1, 0)
	}
	g.Output("y", x)
	prog, err := cpu.Compile(g)
	if err != nil {
		return err
	}
	defer prog.Close()
	perRun, err := medianRun(prog, 21)
	if err != nil {
		return err
	}
	ns := float64(perRun.Nanoseconds()) / float64(*nodes)
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"bench": "dispatch", "nodes": *nodes, "ns_per_node": ns})
	}
	fmt.Fprintf(stdout, "dispatch: %d tiny nodes, %.0f ns per node (median of 21 runs)\n", *nodes, ns)
	return nil
}

// gemmShape is one kind of matrix product a model runs: x [M, K] · Wᵀ with W [N, K] (as
// nn.Linear stores it), Count times per Unit of the model's work. Conv marks a convolution
// listed by the GEMM its im2col form would be (M output positions, K = Cin·kernel, N = Cout):
// the engine runs those through its conv kernels, so the row shows what the product costs,
// not what that kernel does.
type gemmShape struct {
	Model string `json:"model"`
	Part  string `json:"part"`
	Unit  string `json:"unit"`
	Kind  string `json:"kind"`
	M     int    `json:"m"`
	K     int    `json:"k"`
	N     int    `json:"n"`
	Count int    `json:"count"`
	Conv  bool   `json:"conv,omitempty"`
}

func (s gemmShape) flops() float64 { return 2 * float64(s.M) * float64(s.K) * float64(s.N) }

// miottsPrefillTokens is the prompt length of `bench miotts` (58 tokens: a short sentence).
const miottsPrefillTokens = 58

// modelGemmShapes lists the products of the models' graphs at their real sizes: the
// configurations `voxpipe mkmodel` writes (meanvc2.DefaultConfig, conformer.RealConfig,
// vocos.RealDims, wavlm.RealLarge, ecapa.RealDims; qwen3.Sizes["0.6b"]; MioCodec's
// RealConfigYAML and RealTensors), with the rows each graph gives them (models/meanvc2
// dit.go buildStep, models/conformer build, models/vocos, models/wavlm, models/qwen3 build,
// models/miocodec Decoder.build and its Stream windows).
func modelGemmShapes() ([]gemmShape, error) {
	var out []gemmShape
	add := func(model, part, unit string, rows ...gemmShape) {
		for _, r := range rows {
			r.Model, r.Part, r.Unit = model, part, unit
			if r.M > 0 && r.K > 0 && r.N > 0 && r.Count > 0 {
				out = append(out, r)
			}
		}
	}

	// MeanVC2, 120 ms + 40 ms model. The DiT sees Window() = chunk + lookahead frames per
	// call, ODESteps calls per DiT step, one step per 120 ms of audio. Its time MLP and AdaLN
	// modulations depend on (t, r) alone and run once per model, not per call (timeConds).
	vc := meanvc2.DefaultConfig()
	W, inner, depth := vc.Window(), vc.Heads*vc.DimHead, vc.Depth
	add("meanvc2", "dit", fmt.Sprintf("DiT call (%d frames; %d per DiT step, one step per %d ms)", W, vc.Runtime.ODESteps, 10*vc.ChunkSize),
		gemmShape{Kind: "tvt q", M: W, K: vc.BNDim, N: vc.TVTAttnDim, Count: 1},
		gemmShape{Kind: "tvt k, v (GTM slots)", M: vc.GTMSlots, K: vc.GTMHidden, N: vc.TVTAttnDim, Count: 2},
		gemmShape{Kind: "tvt out", M: W, K: vc.TVTAttnDim, N: vc.BNDim, Count: 1},
		gemmShape{Kind: "input_embed", M: W, K: vc.MelDim + vc.BNDim + vc.SpkDim, N: vc.Dim, Count: 1},
		gemmShape{Kind: "attn q, k, v", M: W, K: vc.Dim, N: inner, Count: 3 * depth},
		gemmShape{Kind: "attn out", M: W, K: inner, N: vc.Dim, Count: depth},
		gemmShape{Kind: "ff.0", M: W, K: vc.Dim, N: vc.FF, Count: depth},
		gemmShape{Kind: "ff.2", M: W, K: vc.FF, N: vc.Dim, Count: depth},
		gemmShape{Kind: "proj_out", M: W, K: vc.Dim, N: vc.MelDim, Count: 1},
	)
	asr := conformer.RealConfig()
	nf := asr.Stream.Window
	T := conformer.OutFrames(nf)
	d, blocks := asr.OutputSize, asr.NumBlocks
	// Conv2dSubsampling4: two 3×3 stride-2 convs over [frames, bins].
	f1 := (asr.InputDim-3)/2 + 1
	f2 := (f1-3)/2 + 1
	R, KC := asr.Stream.RequiredCache, asr.CNNKernel-1
	add("meanvc2", "asr", fmt.Sprintf("ASR window (%d fbank frames → %d BN frames, one per 160 ms)", nf, T),
		gemmShape{Kind: "embed.conv.2 (3×3 s2)", M: T * f2, K: asr.SubsampleChannels * 9, N: asr.SubsampleChannels, Count: 1, Conv: true},
		gemmShape{Kind: "embed.out", M: T, K: asr.SubsampleChannels * f2, N: d, Count: 1},
		gemmShape{Kind: "ffn w_1 (macaron and final)", M: T, K: d, N: asr.LinearUnits, Count: 2 * blocks},
		gemmShape{Kind: "ffn w_2 (macaron and final)", M: T, K: asr.LinearUnits, N: d, Count: 2 * blocks},
		gemmShape{Kind: "attn q, k, v, out", M: T, K: d, N: d, Count: 4 * blocks},
		gemmShape{Kind: "attn linear_pos (cache + window)", M: R + T, K: d, N: d, Count: blocks},
		gemmShape{Kind: "conv pointwise_conv1 (cache + window)", M: KC + T, K: d, N: 2 * d, Count: blocks},
		gemmShape{Kind: "conv pointwise_conv2", M: T, K: d, N: d, Count: blocks},
	)
	voc := vocos.RealDims
	vf := vc.Runtime.VocoderOverlap + vc.ChunkSize
	add("meanvc2", "vocoder", fmt.Sprintf("vocoder step (%d mel frames, one per DiT step)", vf),
		gemmShape{Kind: fmt.Sprintf("embed conv k%d", voc.Kernel), M: vf, K: voc.Mels * voc.Kernel, N: voc.Dim, Count: 1, Conv: true},
		gemmShape{Kind: "pwconv1", M: vf, K: voc.Dim, N: voc.Inter, Count: voc.Layers},
		gemmShape{Kind: "pwconv2", M: vf, K: voc.Inter, N: voc.Dim, Count: voc.Layers},
		gemmShape{Kind: "head", M: vf, K: voc.Dim, N: voc.NFFT + 2, Count: 1},
	)
	wl := wavlm.RealLarge()
	samples := 10 * 16000
	frames := wl.Frames(samples)
	conv1 := (samples-wl.ConvKernels[0])/wl.ConvStrides[0] + 1 // after conv 0
	conv1 = (conv1-wl.ConvKernels[1])/wl.ConvStrides[1] + 1
	last := wl.ConvDims[len(wl.ConvDims)-1]
	add("meanvc2", "speaker wavlm-large", fmt.Sprintf("10 s reference (%d frames)", frames),
		gemmShape{Kind: fmt.Sprintf("feature conv 1 (k%d s%d)", wl.ConvKernels[1], wl.ConvStrides[1]), M: conv1, K: wl.ConvDims[0] * wl.ConvKernels[1], N: wl.ConvDims[1], Count: 1, Conv: true},
		gemmShape{Kind: "post_extract_proj", M: frames, K: last, N: wl.Hidden, Count: 1},
		gemmShape{Kind: "attn q, k, v, out", M: frames, K: wl.Hidden, N: wl.Hidden, Count: 4 * wl.Layers},
		gemmShape{Kind: "ffn in", M: frames, K: wl.Hidden, N: wl.FFN, Count: wl.Layers},
		gemmShape{Kind: "ffn out", M: frames, K: wl.FFN, N: wl.Hidden, Count: wl.Layers},
	)
	ec := ecapa.RealDims
	add("meanvc2", "speaker ecapa", fmt.Sprintf("10 s reference (%d frames)", frames),
		gemmShape{Kind: fmt.Sprintf("layer1 conv k%d", ec.Kernel1), M: frames, K: ec.Feat * ec.Kernel1, N: ec.Channels, Count: 1, Conv: true},
		gemmShape{Kind: "SE-Res2 1×1 convs", M: frames, K: ec.Channels, N: ec.Channels, Count: 6, Conv: true},
		gemmShape{Kind: "mfa 1×1 conv", M: frames, K: 3 * ec.Channels, N: ec.MFA, Count: 1, Conv: true},
	)

	// MioTTS 0.6B LM: a prompt prefill and single-token decode steps; the output head is
	// restricted to the speech tokens and EOS and runs on the last row only.
	q := qwen3.Sizes["0.6b"]
	qd, kvd := q.Heads*q.HeadDim, q.KVHeads*q.HeadDim
	head := miotts.SpeechTokens + 1
	lm := func(rows int) []gemmShape {
		return []gemmShape{
			{Kind: "q_proj", M: rows, K: q.Hidden, N: qd, Count: q.Layers},
			{Kind: "k_proj, v_proj", M: rows, K: q.Hidden, N: kvd, Count: 2 * q.Layers},
			{Kind: "o_proj", M: rows, K: qd, N: q.Hidden, Count: q.Layers},
			{Kind: "gate_proj, up_proj", M: rows, K: q.Hidden, N: q.FFN, Count: 2 * q.Layers},
			{Kind: "down_proj", M: rows, K: q.FFN, N: q.Hidden, Count: q.Layers},
			{Kind: "head (speech tokens + EOS, last row)", M: 1, K: q.Hidden, N: head, Count: 1},
		}
	}
	add("miotts", "prefill", fmt.Sprintf("prompt of %d tokens", miottsPrefillTokens), lm(miottsPrefillTokens)...)
	add("miotts", "decode", "token", lm(1)...)

	// MioCodec decoder over one stream window: core + context on both sides, tokens → 2
	// decoder frames per token → ×3 ×3 upsampling → STFT frames.
	mc, err := miocodec.ParseConfig(miocodec.RealConfigYAML())
	if err != nil {
		return nil, err
	}
	ffn := map[string]int{}
	for _, t := range miocodec.RealTensors() {
		for _, pre := range []string{"wave_prenet", "wave_decoder"} {
			if t.Name == pre+".layers.0.feed_forward.w1.weight" {
				ffn[pre] = t.Shape[0]
			}
		}
	}
	if ffn["wave_prenet"] == 0 || ffn["wave_decoder"] == 0 {
		return nil, errors.New("bench gemm: MioCodec's table lacks the feed-forward widths")
	}
	win := miocodec.DefaultCore + 2*miocodec.DefaultContext
	pd, dd := mc.WavePrenet.Dim, mc.WaveDecoder.Dim
	f0 := win * mc.WaveUpsample
	rows := []gemmShape{
		{Kind: "prenet wq, wk, wv, wo", M: win, K: pd, N: pd, Count: 4 * mc.WavePrenet.Layers},
		{Kind: "prenet w1, w3", M: win, K: pd, N: ffn["wave_prenet"], Count: 2 * mc.WavePrenet.Layers},
		{Kind: "prenet w2", M: win, K: ffn["wave_prenet"], N: pd, Count: mc.WavePrenet.Layers},
		{Kind: "prenet output", M: win, K: pd, N: dd, Count: 1},
		{Kind: fmt.Sprintf("prior/post resnet conv k%d", mc.ResNetKernel), M: f0, K: dd * mc.ResNetKernel, N: dd, Count: 2 * 2 * mc.ResNetBlocks, Conv: true},
		{Kind: "decoder wq, wk, wv, wo", M: f0, K: dd, N: dd, Count: 4 * mc.WaveDecoder.Layers},
		{Kind: "decoder w1, w3", M: f0, K: dd, N: ffn["wave_decoder"], Count: 2 * mc.WaveDecoder.Layers},
		{Kind: "decoder w2", M: f0, K: ffn["wave_decoder"], N: dd, Count: mc.WaveDecoder.Layers},
		{Kind: "decoder adaLN", M: 1, K: mc.WaveDecoder.CondDim, N: 3 * dd, Count: 2 * mc.WaveDecoder.Layers},
	}
	f, c := f0, dd
	for i, up := range mc.UpsamplerFactors {
		f, c = f*up, c/2
		rows = append(rows, gemmShape{Kind: fmt.Sprintf("upsampler %d resnet conv k%d", i, mc.ResNetKernel), M: f, K: c * mc.ResNetKernel, N: c, Count: 2, Conv: true})
	}
	bins := mc.NFFT + 2
	rows = append(rows,
		gemmShape{Kind: "upsampler out_proj", M: f, K: c, N: dd, Count: 1},
		gemmShape{Kind: "istft_head", M: f, K: dd, N: bins, Count: 1},
		gemmShape{Kind: "inverse DFT (matmul)", M: f, K: bins, N: mc.NFFT, Count: 1})
	add("miocodec", "decode", fmt.Sprintf("stream window (%d tokens: %d emitted)", win, miocodec.DefaultCore), rows...)
	return out, nil
}

// gemmRow is one shape's measurement.
type gemmRow struct {
	Bench string `json:"bench"`
	gemmShape
	DType          string  `json:"dtype"` // our weights' encoding (OpenBLAS is F32)
	Threads        int     `json:"threads"`
	PerCall        int     `json:"per_call"`
	Copies         int     `json:"weight_copies"` // distinct weights cycled through (1: one, in cache)
	OursUs         float64 `json:"ours_us"`
	OpenBLASUs     float64 `json:"openblas_us"`
	OursGFLOPS     float64 `json:"ours_gflops"`
	OpenBLASGFLOPS float64 `json:"openblas_gflops"`
	Ratio          float64 `json:"ratio"` // OpenBLAS time ÷ ours: > 1 is ours faster
}

// gemmPart is the sum over a model part's products per unit of its work.
type gemmPart struct {
	Bench      string  `json:"bench"`
	Model      string  `json:"model"`
	Part       string  `json:"part"`
	Unit       string  `json:"unit"`
	Products   int     `json:"products"`
	GFLOP      float64 `json:"gflop"`
	OursMs     float64 `json:"ours_ms"`
	OpenBLASMs float64 `json:"openblas_ms"`
	OursGFLOPS float64 `json:"ours_gflops"`
	// PeakFraction is OursGFLOPS over the machine's peak (GemmPeak.GFLOPS) when measured.
	PeakFraction float64 `json:"peak_fraction,omitempty"`
	Ratio        float64 `json:"ratio"`
	// WeightMB is what the part's products read of their weights, in our encoding.
	WeightMB float64 `json:"weight_mb"`
	// The part's floors: its GFLOP at the peak, its weights at the memory bandwidth (when
	// they come from memory: not with --weights-in-cache); Bound names the higher.
	ComputeFloorMs float64 `json:"compute_floor_ms,omitempty"`
	MemoryFloorMs  float64 `json:"memory_floor_ms,omitempty"`
	Bound          string  `json:"bound,omitempty"` // "compute" or "memory"
	// int8 parts (Q8_0 weights) run integer dot products, whose peak is not the F32
	// product's: they get no compute floor.
	int8 bool
}

// memBandwidth is the machine's memory read rate (cgo.ReadBandwidth), on the bench's threads
// and on one.
type memBandwidth struct {
	Bench       string  `json:"bench"`
	MB          int     `json:"mb"`
	Threads     int     `json:"threads"`
	GBps        float64 `json:"gbps"`
	GBps1Thread float64 `json:"gbps_1_thread"`
}

// gemmPeak is a large square product, the machine's practical peak.
type gemmPeak struct {
	Bench          string  `json:"bench"`
	M              int     `json:"m"`
	K              int     `json:"k"`
	N              int     `json:"n"`
	Threads        int     `json:"threads"`
	OursGFLOPS     float64 `json:"ours_gflops"`
	OpenBLASGFLOPS float64 `json:"openblas_gflops"`
	GFLOPS         float64 `json:"gflops"` // the better of the two (each the best of its rounds)
}

func runBenchGemm(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench gemm", "bench gemm [--threads N] [--model meanvc2|miotts|miocodec] [--dtype f32|f16|q8_0] [--per-call 16] [--rounds 5] [--peak 2048] [--bandwidth-mb 512] [--weights-in-cache] [--backend cpu|vulkan[:N]] [--json]", stderr)
	threads := fs.Int("threads", 2, "threads for both our engine and OpenBLAS")
	backend := fs.String("backend", "cpu", "where our products run (OpenBLAS is always the CPU): "+engine.BackendUsage)
	only := fs.String("model", "", "only this model's shapes (meanvc2, miotts or miocodec; default all)")
	dtype := fs.String("dtype", "f32", "our weights' encoding: f32, f16 or q8_0 (Q8_0 where K is a multiple of 32, as the model files store them; OpenBLAS is always F32)")
	perCall := fs.Int("per-call", 16, "products per engine program run and per OpenBLAS cgo call, as a model's program runs many in one call (products of 0.2 GFLOP or more run fewer, down to one)")
	rounds := fs.Int("rounds", 5, "alternating timed rounds per shape (the median is reported)")
	peak := fs.Int("peak", 2048, "size of the square product measured as the machine's peak, the best of the rounds (0: skip)")
	bwMB := fs.Int("bandwidth-mb", 512, "megabytes streamed to measure the memory read bandwidth, the best of the rounds (0: skip)")
	inCache := fs.Bool("weights-in-cache", false, "every product of a shape reads the same weight (which then stays in cache) instead of as many distinct weights as the model has of that shape, read in turn as its layers are")
	asJSON := fs.Bool("json", false, "print one JSON object per shape, per model part and for the peak")
	// Plain parsing: --model names a model's shapes here, not a file (or a pulled model) to load.
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case *threads < 1:
		return errors.New("--threads must be ≥ 1")
	case *perCall < 1 || *perCall > 256:
		return errors.New("--per-call must be in [1, 256]")
	case *rounds < 1 || *rounds > 99:
		return errors.New("--rounds must be in [1, 99]")
	case *peak < 0 || *peak > 8192:
		return errors.New("--peak must be in [0, 8192]")
	case *bwMB < 0 || *bwMB > 4096:
		return errors.New("--bandwidth-mb must be in [0, 4096]")
	}
	var wdt engine.DType
	switch *dtype {
	case "f32":
		wdt = engine.F32
	case "f16":
		wdt = engine.F16
	case "q8_0":
		wdt = engine.Q8_0
	default:
		return fmt.Errorf("unknown --dtype %q (f32, f16 or q8_0)", *dtype)
	}
	shapes, err := modelGemmShapes()
	if err != nil {
		return err
	}
	if *only != "" {
		shapes = slices.DeleteFunc(shapes, func(s gemmShape) bool { return s.Model != *only })
		if len(shapes) == 0 {
			return fmt.Errorf("unknown --model %q (meanvc2, miotts or miocodec)", *only)
		}
	}
	be, _, closeBE, err := placement(*backend, "", "", *threads, stderr).Open()
	if err != nil {
		return err
	}
	defer closeBE()
	fmt.Fprintf(stderr, "ours on %s\n", be.Name())
	emit := func(v any) error { return json.NewEncoder(stdout).Encode(v) }

	var pk *gemmPeak
	if *peak > 0 {
		fmt.Fprintf(stderr, "peak: %d³…\n", *peak)
		p := *peak
		ours, blas, _, err := gemmPair(be, *threads, p, p, p, 1, 1, engine.F32, false, -*rounds)
		if err != nil {
			return err
		}
		fl := 2 * float64(p) * float64(p) * float64(p)
		pk = &gemmPeak{Bench: "gemm_peak", M: p, K: p, N: p, Threads: *threads,
			OursGFLOPS: fl / ours.Seconds() / 1e9, OpenBLASGFLOPS: fl / blas.Seconds() / 1e9}
		pk.GFLOPS = max(pk.OursGFLOPS, pk.OpenBLASGFLOPS)
		if *asJSON {
			if err := emit(pk); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(stdout, "peak, %d×%d×%d on %d thread(s), best of the rounds: ours %.1f, OpenBLAS %.1f GFLOP/s (%.2f×): machine peak %.1f GFLOP/s\n",
				p, p, p, *threads, pk.OursGFLOPS, pk.OpenBLASGFLOPS, pk.OursGFLOPS/pk.OpenBLASGFLOPS, pk.GFLOPS)
		}
	}

	var bw *memBandwidth
	// The host's read rate bounds products whose weights are in host memory: ours on a GPU
	// read device memory, so their parts get no memory floor.
	if _, onCPU := be.(*engine.CPU); *bwMB > 0 && onCPU {
		fmt.Fprintf(stderr, "memory read bandwidth, %d MB…\n", *bwMB)
		rate, _, err := cgo.ReadBandwidth(*threads, *bwMB, *rounds)
		one := rate
		if err == nil && *threads > 1 {
			one, _, err = cgo.ReadBandwidth(1, *bwMB, *rounds)
		}
		if err != nil {
			return err
		}
		bw = &memBandwidth{Bench: "memory_bandwidth", MB: *bwMB, Threads: *threads, GBps: rate / 1e9, GBps1Thread: one / 1e9}
		if *asJSON {
			if err := emit(bw); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(stdout, "memory read bandwidth, %d MB streamed, best of the rounds: %.1f GB/s on %d thread(s), %.1f GB/s on 1 (%.2f×)\n",
				*bwMB, bw.GBps, *threads, bw.GBps1Thread, bw.GBps/bw.GBps1Thread)
		}
	}

	var parts []*gemmPart
	byPart := map[string]*gemmPart{}
	lastPart := ""
	for _, s := range shapes {
		key := s.Model + "/" + s.Part
		if key != lastPart && !*asJSON {
			fmt.Fprintf(stdout, "%s %s, per %s:\n", s.Model, s.Part, s.Unit)
			fmt.Fprintf(stdout, "  %-46s %5s %5s %5s %5s  %8s %8s %6s\n", "product", "M", "K", "N", "count", "ours", "OpenBLAS", "ratio")
		}
		lastPart = key
		fmt.Fprintf(stderr, "%s %s: %s %d×%d×%d…\n", s.Model, s.Part, s.Kind, s.M, s.K, s.N)
		// Products of a GFLOP or more run one per call: the call's own cost is then noise.
		per := min(*perCall, max(1, int(2e8/s.flops())))
		copies := gemmCopies(s, *inCache)
		ours, blas, dt, err := gemmPair(be, *threads, s.M, s.K, s.N, per, copies, wdt, !s.Conv, *rounds)
		if err != nil {
			return fmt.Errorf("%s %s %s: %w", s.Model, s.Part, s.Kind, err)
		}
		r := gemmRow{Bench: "gemm", gemmShape: s, DType: dtypeLabel(dt), Threads: *threads, PerCall: per, Copies: copies,
			OursUs: float64(ours.Nanoseconds()) / 1e3, OpenBLASUs: float64(blas.Nanoseconds()) / 1e3,
			OursGFLOPS: s.flops() / ours.Seconds() / 1e9, OpenBLASGFLOPS: s.flops() / blas.Seconds() / 1e9,
			Ratio: blas.Seconds() / ours.Seconds()}
		p := byPart[key]
		if p == nil {
			p = &gemmPart{Bench: "gemm_part", Model: s.Model, Part: s.Part, Unit: s.Unit}
			byPart[key] = p
			parts = append(parts, p)
		}
		p.Products += s.Count
		p.GFLOP += float64(s.Count) * s.flops() / 1e9
		p.OursMs += float64(s.Count) * r.OursUs / 1e3
		p.OpenBLASMs += float64(s.Count) * r.OpenBLASUs / 1e3
		p.WeightMB += float64(s.Count) * float64(cgo.WeightBytes(dt, int64(s.N), int64(s.K))) / 1e6
		p.int8 = p.int8 || dt == engine.Q8_0 || dt == engine.Q8_0R8
		if *asJSON {
			if err := emit(r); err != nil {
				return err
			}
			continue
		}
		kind := s.Kind
		if s.Conv {
			kind += " [conv]"
		}
		if dt != engine.F32 && dt != engine.F32P {
			kind += " " + dtypeLabel(dt)
		}
		fmt.Fprintf(stdout, "  %-46s %5d %5d %5d %5d  %8.1f %8.1f %5.2f×  GFLOP/s\n", kind, s.M, s.K, s.N, s.Count, r.OursGFLOPS, r.OpenBLASGFLOPS, r.Ratio)
	}
	if !*asJSON {
		weights := "each product reading one of count distinct weights in turn, as the model's layers do"
		if *inCache {
			weights = "every product reading the same weight, in cache"
		}
		fmt.Fprintf(stdout, "per unit of each part (Σ count × time per product; up to %d products per call, one for those of 0.2 GFLOP or more; %s; [conv]: convolutions by their im2col GEMM, timed as a Linear):\n", *perCall, weights)
	}
	for _, p := range parts {
		p.OursGFLOPS = p.GFLOP / (p.OursMs / 1e3)
		p.Ratio = p.OpenBLASMs / p.OursMs
		if pk != nil {
			p.PeakFraction = p.OursGFLOPS / pk.GFLOPS
			if !p.int8 {
				p.ComputeFloorMs = p.GFLOP / pk.GFLOPS * 1e3
			}
		}
		if bw != nil && !*inCache {
			p.MemoryFloorMs = p.WeightMB / bw.GBps
		}
		if p.ComputeFloorMs > 0 && p.MemoryFloorMs > 0 {
			p.Bound = "compute"
			if p.MemoryFloorMs > p.ComputeFloorMs {
				p.Bound = "memory"
			}
		}
		if *asJSON {
			if err := emit(p); err != nil {
				return err
			}
			continue
		}
		frac := ""
		if pk != nil {
			frac = fmt.Sprintf(", %.0f%% of peak", 100*p.PeakFraction)
		}
		fmt.Fprintf(stdout, "  %-8s %-20s %6.3f GFLOP in %3d products: ours %8.2f ms (%.1f GFLOP/s%s) vs OpenBLAS %8.2f ms (%.2f×) per %s\n",
			p.Model, p.Part, p.GFLOP, p.Products, p.OursMs, p.OursGFLOPS, frac, p.OpenBLASMs, p.Ratio, p.Unit)
		switch {
		case p.Bound != "":
			fmt.Fprintf(stdout, "    %s-bound: %.3f GFLOP at the peak take %.2f ms, %.1f MB of weights at %.1f GB/s %.2f ms; ours is %.1f× the higher floor\n",
				p.Bound, p.GFLOP, p.ComputeFloorMs, p.WeightMB, bw.GBps, p.MemoryFloorMs, p.OursMs/max(p.ComputeFloorMs, p.MemoryFloorMs))
		case p.MemoryFloorMs > 0:
			why := ""
			if p.int8 && pk != nil {
				why = " (no compute floor: int8 products are not held to the F32 peak)"
			}
			fmt.Fprintf(stdout, "    memory floor: %.1f MB of weights at %.1f GB/s take %.2f ms; ours is %.1f× it%s\n",
				p.WeightMB, bw.GBps, p.MemoryFloorMs, p.OursMs/p.MemoryFloorMs, why)
		case p.ComputeFloorMs > 0:
			fmt.Fprintf(stdout, "    compute floor: %.3f GFLOP at the peak take %.2f ms; ours is %.1f× it\n",
				p.GFLOP, p.ComputeFloorMs, p.OursMs/p.ComputeFloorMs)
		}
	}
	return nil
}

func dtypeLabel(d engine.DType) string {
	switch d {
	case engine.F16:
		return "F16"
	case engine.Q8_0:
		return "Q8_0"
	case engine.Q8_0R8:
		return "Q8_0R8"
	case engine.F32P:
		return "F32P"
	case engine.F16P:
		return "F16P"
	}
	return "F32"
}

// gemmPair times x·Wᵀ through engine programs of perCall Linear nodes (weights encoded as dt
// where the shape allows it, as the model loaders do; F32 packed into panels for a Linear
// layer's weight, plain for a convolution's) and through perCall OpenBLAS F32
// sgemms per cgo call with OpenBLAS's own threads, alternating rounds so both see the same
// machine load; the medians of rounds, per product, and the dtype our side ran. Both sides
// cycle through copies distinct weights (a model reads each layer's own weight once per
// step, mostly from memory; one copy stays in cache). rounds < 0 runs -rounds rounds and
// returns the best of each side instead (a peak: what the machine can do when nothing else
// runs on it).
func gemmPair(be engine.Backend, threads, m, k, n, perCall, copies int, dt engine.DType, linear bool, rounds int) (ours, blas time.Duration, used engine.DType, err error) {
	best := rounds < 0
	rounds = max(rounds, -rounds)
	copies = max(copies, 1)
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(i%7-3) * 0.01
	}
	used = engine.F32
	var raw []byte
	switch {
	case dt == engine.F32 && linear:
		used, raw = engine.F32P, gguf.EncodeF32(w) // as models/nn loads an F32 Linear
	case dt == engine.F16 && linear:
		used, raw = engine.F16P, gguf.EncodeF16(w) // as models/nn loads an F16 Linear
	case dt == engine.F16:
		used, raw = engine.F16, gguf.EncodeF16(w)
	case dt == engine.Q8_0 && k%32 == 0:
		if raw, err = gguf.QuantizeQ8_0(w); err != nil {
			return 0, 0, used, err
		}
		used = engine.Q8_0
		if cgo.WeightBytes(engine.Q8_0R8, int64(n), int64(k)) > 0 && engine.Accepts(be, engine.Q8_0R8) {
			used = engine.Q8_0R8 // as models/nn loads a Q8_0 Linear
		}
	}
	if !engine.Accepts(be, used) { // a GPU takes F32 where it has no shader for the encoding
		used, raw = engine.F32, nil
	}
	wbs := make([]*engine.Buffer, copies)
	defer func() {
		for _, b := range wbs {
			if b != nil {
				b.Free()
			}
		}
	}()
	for c := range wbs {
		if raw != nil {
			wbs[c], err = engine.UploadRaw(be, "w", used, raw, int64(n), int64(k))
		} else {
			wbs[c], err = engine.Upload(be, "w", w, int64(n), int64(k))
		}
		if err != nil {
			return 0, 0, used, err
		}
	}
	// Programs of perCall products each, together covering every copy in turn.
	progs := make([]engine.Program, (copies+perCall-1)/perCall)
	defer func() {
		for _, p := range progs {
			if p != nil {
				p.Close()
			}
		}
	}()
	for pi := range progs {
		g := engine.NewGraph("gemm")
		x := g.Input("x", engine.F32, int64(m), int64(k))
		for i := range perCall {
			g.Output(fmt.Sprint("y", i), g.Linear(x, g.Persistent(wbs[(pi*perCall+i)%copies]), nil))
		}
		if progs[pi], err = be.Compile(g); err != nil {
			return 0, 0, used, err
		}
		xs := progs[pi].Input("x")
		for i := range xs {
			xs[i] = float32(i%5-2) * 0.1
		}
	}
	blasRun, err := cgo.NewSgemmBench(m, n, k, copies)
	if err != nil {
		return 0, 0, used, err
	}
	defer blasRun.Free()
	// About 0.5 GFLOP per side and round (two calls at least, and every copy once), after
	// one untimed pass over the copies each.
	calls := max(2, len(progs), int(5e8/(2*float64(m)*float64(k)*float64(n)*float64(perCall))))
	for _, p := range progs {
		if err := p.Run(); err != nil {
			return 0, 0, used, err
		}
	}
	blasRun.Run(threads, len(progs), perCall)
	var a, b []time.Duration
	for range rounds {
		if threads > 1 {
			// OpenBLAS's workers spin ~130 ms after a threaded call: let them sleep first.
			time.Sleep(200 * time.Millisecond)
		}
		t0 := time.Now()
		for c := range calls {
			if err := progs[c%len(progs)].Run(); err != nil {
				return 0, 0, used, err
			}
		}
		a = append(a, time.Since(t0)/time.Duration(calls*perCall))
		b = append(b, blasRun.Run(threads, calls, perCall))
	}
	slices.Sort(a)
	slices.Sort(b)
	if best {
		return a[0], b[0], used, nil
	}
	return a[len(a)/2], b[len(b)/2], used, nil
}

// gemmCopies is how many distinct weights a shape's products cycle through: the model's own
// count of them (each layer reads its own), at most 1 GiB of F32 copies.
func gemmCopies(s gemmShape, inCache bool) int {
	if inCache {
		return 1
	}
	return max(1, min(s.Count, (1<<30)/(4*s.K*s.N)))
}

// runBenchGemv times the decode-step Linear x[1, K]·Wᵀ with W [N, K] stored as F32, F16,
// Q8_0 and Q8_0R8 (Q8_0 interleaved by 8 rows, as models load it): decode is bound by the weight bytes read, so the report gives GB/s of weights.
func runBenchGemv(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench gemv", "bench gemv [--threads N] [--k K] [--n N] [--json]", stderr)
	threads := fs.Int("threads", 2, "engine threads")
	k := fs.Int("k", 1024, "input features (a multiple of 32)")
	n := fs.Int("n", 3072, "output features")
	per := fs.Int("weights", 16, "distinct weights per program (enough to overflow the caches: a model streams them from DRAM)")
	asJSON := fs.Bool("json", false, "print one JSON object per dtype")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *per < 1 || *per > 256 {
		return errors.New("--weights must be in [1, 256]")
	}
	if *k <= 0 || *k%32 != 0 || *n <= 0 || int64(*k)*int64(*n) > 1<<28 {
		return errors.New("--k must be a positive multiple of 32 and k·n at most 2^28")
	}
	cpu, err := engine.NewCPU(*threads)
	if err != nil {
		return err
	}
	defer cpu.Close()
	w := make([]float32, *n**k)
	for i := range w {
		w[i] = float32(i%13-6) * 0.01
	}
	// Linears over distinct weights in one program, so the weights come from memory as in a
	// model rather than from cache.
	for _, dt := range []struct {
		name string
		gt   gguf.DType
		et   engine.DType
	}{{"F32", gguf.F32, engine.F32}, {"F16", gguf.F16, engine.F16}, {"F16P", gguf.F16, engine.F16P}, {"Q8_0", gguf.Q8_0, engine.Q8_0}, {"Q8_0R8", gguf.Q8_0, engine.Q8_0R8}} {
		var raw []byte
		switch dt.gt {
		case gguf.F32:
			raw = make([]byte, 4*len(w))
			for i, v := range w {
				binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
			}
		case gguf.F16:
			raw = gguf.EncodeF16(w)
		case gguf.Q8_0:
			if raw, err = gguf.QuantizeQ8_0(w); err != nil {
				return err
			}
		}
		g := engine.NewGraph("gemv")
		x := g.Input("x", engine.F32, 1, int64(*k))
		var bufs []*engine.Buffer
		for i := range *per {
			b, err := engine.NewBufferRaw(fmt.Sprint("w", i), dt.et, raw, int64(*n), int64(*k))
			if err != nil {
				return err
			}
			bufs = append(bufs, b)
			g.Output(fmt.Sprint("y", i), g.Linear(x, g.Persistent(b), nil))
		}
		prog, err := cpu.Compile(g)
		if err != nil {
			return err
		}
		perRun, err := medianRun(prog, 31)
		prog.Close()
		for _, b := range bufs {
			b.Free()
		}
		if err != nil {
			return err
		}
		us := float64(perRun.Nanoseconds()) / float64(*per) / 1e3
		gbs := float64(len(raw)) / (us * 1e3)
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(map[string]any{"bench": "gemv", "dtype": dt.name, "m": 1, "k": *k, "n": *n,
				"threads": *threads, "us": us, "weight_gb_per_s": gbs}); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(stdout, "gemv 1×%d×%d %-6s: %7.1f µs per Linear, %5.1f GB/s of weights (median of 31 runs of %d)\n", *k, *n, dt.name, us, gbs, *per)
	}
	return nil
}
