package meanvc2

import (
	"slices"
	"testing"
)

func TestConfigEmbedded(t *testing.T) {
	_, m := goldenModel(t)
	c, err := ConfigFromModel(m)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dim != 64 || c.Depth != 4 || c.Heads != 2 || c.DimHead != 32 || c.BNDim != 32 || c.SpkDim != 32 ||
		c.MelDim != 80 || c.ChunkSize != 12 || c.BlockSize != 4 || c.TVTAttnDim != 128 || c.TVTHeads != 4 ||
		c.GTMSlots != 32 || c.GTMHidden != 32 || c.FF != 128 || c.OffsetReset != 4000 || c.Runtime.VCChunkFrames != 16 {
		t.Fatalf("config %+v does not have the tiny golden model's values", c)
	}
	if !slices.Equal(c.PastChunks, []int{2, 2, 1, 1}) || !slices.Equal(c.FutureChunks, []int{1, 0, 0, 0}) {
		t.Fatalf("t_p %v / t_f %v, want [2 2 1 1] / [1 0 0 0]", c.PastChunks, c.FutureChunks)
	}
	for l, want := range []int{36, 36, 24, 24} {
		if got := c.CacheFrames(l); got != want {
			t.Errorf("layer %d cache %d frames, want %d", l, got, want)
		}
	}
	if len(c.Timesteps) != 2 || c.Timesteps[0] != [2]float64{1, 0.5} || c.Timesteps[1] != [2]float64{0.5, 0} {
		t.Errorf("schedule %v", c.Timesteps)
	}
	for _, sec := range []string{"asr", "vocos", "speaker_wavlm", "speaker_ecapa"} {
		if len(c.Sections[sec]) == 0 {
			t.Errorf("section %s not kept", sec)
		}
	}
}

func TestParseConfigRejects(t *testing.T) {
	for _, js := range []string{
		`{`,
		`{"vc": {"model": {"chunk_size": 4, "block_size": 8}}}`,
		`{"vc": {"fixed_in_code": {"ff_activation": "relu"}}}`,
		`{"vc": {"fixed_in_code": {"kv_cache_frames": [30, 36, 24, 24]}}}`,
		`{"vc": {"fixed_in_code": {"tvt_attn_dim": 130}}}`,
	} {
		if _, err := ParseConfig([]byte(js)); err == nil {
			t.Errorf("ParseConfig(%s) accepted", js)
		}
	}
	// vc.model alone (the published config_120ms_40ms.json keys) keeps the fixed constants.
	c, err := ParseConfig([]byte(`{"vc": {"model": {"dim": 512, "depth": 4, "heads": 2, "ff_mult": 2, "bn_dim": 256, "chunk_size": 12, "block_size": 4}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.DimHead != 64 || c.FF != 1024 || c.TVTAttnDim != 128 || !slices.Equal(c.PastChunks, []int{2, 2, 1, 1}) {
		t.Errorf("published config parsed as %+v", c)
	}
}

// The tiny config's tensor table is exactly the golden model's vc/ namespace.
func TestTensorsMatchGoldenModel(t *testing.T) {
	_, m := goldenModel(t)
	d, err := LoadDiTFromModel(m, cpu(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	vc := m.Sub("vc")
	specs := d.Config.Tensors()
	if len(specs) != vc.Len() {
		t.Errorf("%d tensors in the table, %d in the file", len(specs), vc.Len())
	}
	for _, s := range specs {
		mt, ok := vc.Tensor(s.Name)
		if !ok {
			t.Errorf("%s not in the file", s.Name)
			continue
		}
		if !slices.Equal(mt.Shape, s.Shape) {
			t.Errorf("%s: table %v, file %v", s.Name, s.Shape, mt.Shape)
		}
	}
}

// The published model's parameter count (MeanVC2 report: 17,707,216) follows from the table.
func TestRealTensors(t *testing.T) {
	var params int
	shapes := map[string][]int{}
	for _, s := range RealTensors() {
		shapes[s.Name] = s.Shape
		if s.Name == "rotary_embed.inv_freq" {
			continue // a buffer, not a parameter
		}
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		params += n
	}
	if params != 17707216 {
		t.Errorf("%d parameters, want 17707216", params)
	}
	for name, want := range map[string][]int{
		"gtm.mlp_k.2.weight":                           {8192, 256},
		"input_embed.proj.weight":                      {512, 592},
		"transformer_blocks.3.attn_norm.linear.weight": {3072, 512},
		"temporal_timbre.out_proj.weight":              {256, 128},
		"rotary_embed.inv_freq":                        {32},
	} {
		if !slices.Equal(shapes[name], want) {
			t.Errorf("%s: %v, want %v", name, shapes[name], want)
		}
	}
}
