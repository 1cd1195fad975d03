package miocodec

import (
	"bytes"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

func TestConfigEmbedded(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := configOf(m)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.LocalSSLLayers, []int{1, 2}) || !slices.Equal(c.GlobalSSLLayers, []int{1, 2}) ||
		c.SampleRate != 44100 || c.NFFT != 392 || c.Hop != 98 || c.WaveUpsample != 2 || c.ResNetGroups != 32 ||
		!slices.Equal(c.UpsamplerFactors, []int{3, 3}) || !slices.Equal(c.UpsamplerKernels, []int{9, 9}) ||
		!slices.Equal(c.Levels, []int{8, 8, 8, 5, 5}) || c.DownsampleFactor != 2 || !c.NormalizeSSL {
		t.Errorf("tiny config: %+v", c)
	}
	if p, d, l := c.WavePrenet, c.WaveDecoder, c.LocalEncoder; p.Heads != 2 || p.HalfWindow != 32 || p.Layers != 2 ||
		d.Heads != 2 || d.HalfWindow != 32 || d.CondDim != 128 || !d.AdaLNZero || l.HalfWindow != 62 || l.Layers != 2 {
		t.Errorf("tiny transformers: prenet %+v decoder %+v local %+v", p, d, l)
	}
	if c.SamplesPerToken() != 1764 || c.Codebook() != 12800 {
		t.Errorf("samples per token %d, codebook %d", c.SamplesPerToken(), c.Codebook())
	}
}

func TestConfigReal(t *testing.T) {
	c, err := ParseConfig(RealConfigYAML())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.LocalSSLLayers, []int{6, 9}) || c.WaveDecoderDim != 512 || c.WavePrenet.Heads != 12 ||
		c.WavePrenet.Layers != 6 || c.WaveDecoder.Layers != 8 || c.WaveDecoder.Heads != 8 || c.LocalEncoder.Window != 125 {
		t.Errorf("real config: %+v", c)
	}
	if _, err := ParseConfig([]byte("model: {init_args: {config: {n_fft: 391}}}")); err == nil {
		t.Errorf("odd n_fft: no error")
	}
}

// TestConfigTables checks the real tensor table against the golden file's layout (same
// names up to layer counts) and the published parameter count.
func TestConfigTables(t *testing.T) {
	real := map[string][]int{}
	total := 0
	for _, s := range RealTensors() {
		if _, dup := real[s.Name]; dup {
			t.Errorf("%s listed twice", s.Name)
		}
		real[s.Name] = s.Shape
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		total += n
	}
	// 132,016,399 = the modules MioCodec instantiates for inference (miotts.md §2.1).
	if total != 132016399 {
		t.Errorf("real tensors hold %d parameters, want 132016399", total)
	}
	r := paritytest.Open(t, "miocodec")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	w := m.Sub("weights")
	for _, mt := range w.Tensors() {
		s, ok := real[mt.Name]
		if !ok {
			t.Errorf("golden tensor %s is not in RealTensors", mt.Name)
		} else if len(s) != len(mt.Shape) {
			t.Errorf("%s: real rank %d, golden %d", mt.Name, len(s), len(mt.Shape))
		}
	}
	for name := range real {
		if strings.Contains(name, "layers.1.") && !w.Has(name) && !strings.Contains(name, "upsample_layers") {
			t.Errorf("real tensor %s has no golden counterpart", name)
		}
	}
}

// TestDecodeRealSize times the decoder at the real size on random weights (opt-in:
// VOXPIPE_MIOCODEC_REALSIZE=1; it needs ~1.5 GB of memory).
func TestDecodeRealSize(t *testing.T) {
	if os.Getenv("VOXPIPE_MIOCODEC_REALSIZE") == "" {
		t.Skip("set VOXPIPE_MIOCODEC_REALSIZE=1 to time the real-size decoder")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var ts []gguf.WriteTensor
	for _, s := range RealTensors() {
		if strings.HasPrefix(s.Name, "local_encoder") || strings.HasPrefix(s.Name, "global_encoder") {
			continue
		}
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		data := make([]float32, n)
		fan := s.Shape[len(s.Shape)-1]
		if len(s.Shape) > 1 {
			fan = n / s.Shape[0]
		}
		sc := float32(1 / float64(fan))
		for i := range data {
			data[i] = (rng.Float32()*2 - 1) * sc * 1.7
		}
		ts = append(ts, gguf.WriteTensor{Name: "weights/" + s.Name, Shape: s.Shape, Data: data})
	}
	var buf bytes.Buffer
	if err := gguf.WritePackaged(&buf, gguf.KV{}, ts, []gguf.EmbeddedFile{{Name: "config.yaml", Data: RealConfigYAML()}}); err != nil {
		t.Fatal(err)
	}
	ts = nil
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	m, err := gguf.NewModel(f)
	if err != nil {
		t.Fatal(err)
	}
	be, err := engine.NewCPU(testThreads())
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	d, err := LoadDecoder(m, be)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tokens := make([]int32, 100)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(12800))
	}
	global := make([]float32, 128)
	for i := range global {
		global[i] = rng.Float32()*2 - 1
	}
	for run := range 3 {
		start := time.Now()
		wave, err := d.Decode(tokens, global)
		if err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		t.Logf("run %d: 100 tokens (%.1f s of audio) in %v: RTF %.4f (%d threads)", run, float64(len(wave))/44100, el,
			el.Seconds()/(float64(len(wave))/44100), testThreads())
	}
	for run := range 4 {
		s, err := d.NewStream(global, StreamOptions{Stats: StatsMode(run % 2)})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var first time.Duration
		n := 0
		for i := range tokens {
			out, err := s.Push(tokens[i : i+1])
			if err != nil {
				t.Fatal(err)
			}
			if len(out) > 0 && first == 0 {
				first = time.Since(start)
			}
			n += len(out)
		}
		out, err := s.Flush()
		if err != nil {
			t.Fatal(err)
		}
		n += len(out)
		el := time.Since(start)
		t.Logf("stream run %d (stats mode %d, core %d, context %d): %d samples in %v (RTF %.3f), first audio %v into the run",
			run, s.Options().Stats, s.Options().Core, s.Options().LeftContext, n, el, el.Seconds()/(float64(n)/44100), first)
	}
}

// TestConfigBindErrors: a missing or misshapen decoder tensor is reported by name at load;
// unknown tensors are ignored.
func TestConfigBindErrors(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cfg, _ := m.EmbeddedFile("config.yaml")
	build := func(edit func(name string, shape []int, data []float32) (string, []int, []float32)) *gguf.Model {
		var ts []gguf.WriteTensor
		for _, mt := range m.Tensors() {
			data, shape, err := m.Get(mt.Name)
			if err != nil {
				t.Fatal(err)
			}
			name, shape, data := edit(mt.Name, shape, data)
			if name != "" {
				ts = append(ts, gguf.WriteTensor{Name: name, Shape: shape, Data: data})
			}
		}
		ts = append(ts, gguf.WriteTensor{Name: "weights/conv_upsample.weight", Shape: []int{2}, Data: []float32{1, 2}})
		var buf bytes.Buffer
		if err := gguf.WritePackaged(&buf, gguf.KV{}, ts, []gguf.EmbeddedFile{{Name: "config.yaml", Data: cfg}}); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		mm, err := gguf.NewModel(f)
		if err != nil {
			t.Fatal(err)
		}
		return mm
	}
	be, err := engine.NewCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	same := func(n string, s []int, d []float32) (string, []int, []float32) { return n, s, d }
	d, err := LoadDecoder(build(same), be)
	if err != nil {
		t.Fatalf("with an unknown conv_upsample tensor: %v", err)
	}
	d.Close()
	const gone = "weights/wave_decoder.layers.1.feed_forward.w2.weight"
	const bent = "weights/wave_upsampler.resnet_blocks.1.conv1.weight"
	_, err = LoadDecoder(build(func(n string, s []int, d []float32) (string, []int, []float32) {
		switch n {
		case gone:
			return "", nil, nil
		case bent:
			return n, []int{s[0], s[1] * s[2]}, d
		}
		return n, s, d
	}), be)
	if err == nil || !strings.Contains(err.Error(), gone) || !strings.Contains(err.Error(), bent) {
		t.Errorf("missing %s and misshapen %s: got %v", gone, bent, err)
	}
}
