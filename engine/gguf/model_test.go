package gguf

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func openGoldenModel(t *testing.T, family string) *Model {
	t.Helper()
	m, err := OpenModel(goldenFile(t, family, "model.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// checkAllTensors loads every tensor of m and checks the data length against the shape.
func checkAllTensors(t *testing.T, m *Model) {
	t.Helper()
	for _, mt := range m.Tensors() {
		data, shape, err := m.Get(mt.Name)
		if err != nil {
			t.Errorf("%s: %v", mt.Name, err)
			continue
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		if len(data) != n || !reflect.DeepEqual(shape, mt.Shape) {
			t.Errorf("%s: %d values, shape %v (listed %v)", mt.Name, len(data), shape, mt.Shape)
		}
		// The logical shape is the stored ggml dims reversed, up to trailing 1s ggml may drop.
		if want := mt.Info.Shape(); !sameUpToLeadingOnes(shape, want) {
			t.Errorf("%s: logical shape %v does not match stored dims %v", mt.Name, shape, mt.Info.Dims)
		}
	}
}

func sameUpToLeadingOnes(a, b []int) bool {
	trim := func(s []int) []int {
		for len(s) > 0 && s[0] == 1 {
			s = s[1:]
		}
		return s
	}
	return reflect.DeepEqual(trim(a), trim(b))
}

func wantShape(t *testing.T, m *Model, name string, shape ...int) {
	t.Helper()
	mt, ok := m.Tensor(name)
	if !ok {
		t.Errorf("tensor %q missing", m.Prefix()+name)
		return
	}
	if !reflect.DeepEqual(mt.Shape, shape) {
		t.Errorf("%s: shape %v, want %v", m.Prefix()+name, mt.Shape, shape)
	}
}

func TestGoldenMeanVC2Model(t *testing.T) {
	m := openGoldenModel(t, "meanvc2")
	if m.Len() != 494 {
		t.Errorf("%d tensors, want 494", m.Len())
	}
	ns := m.Namespaces()
	if want := []string{"asr", "speaker_ecapa", "speaker_wavlm", "vc", "vocos"}; !reflect.DeepEqual(ns, want) {
		t.Errorf("namespaces %q, want %q", ns, want)
	}
	total := 0
	for _, n := range ns {
		total += m.Sub(n).Len()
	}
	if total != m.Len() {
		t.Errorf("namespaces hold %d tensors, want %d", total, m.Len())
	}
	checkAllTensors(t, m)

	vc := m.Sub("vc")
	wantShape(t, vc, "input_embed.proj.weight", 64, 144)
	wantShape(t, vc, "rotary_embed.inv_freq", 16)
	wantShape(t, vc, "gtm.k_prior", 32, 32)
	wantShape(t, vc, "gtm.mlp_k.2.weight", 1024, 32)
	wantShape(t, vc, "transformer_blocks.0.attn.to_q.weight", 64, 64)
	if vc.Has("cache_embed.weight") {
		t.Error("cache_embed should be absent")
	}
	wl := m.Sub("speaker_wavlm")
	wantShape(t, wl, "encoder.pos_conv.0.weight_g", 1, 1, 128)
	wantShape(t, wl, "encoder.pos_conv.0.weight_v", 32, 2, 128)
	wantShape(t, wl, "encoder.layers.0.self_attn.grep_a", 1, 2, 1, 1)
	// Names of 64 bytes or more are stored as _audiocpp.<index>.
	long := "encoder.layers.0.self_attn.relative_attention_bias.weight"
	wantShape(t, wl, long, 320, 2)
	if mt, _ := wl.Tensor(long); mt == nil || !strings.HasPrefix(mt.Info.Name, PhysicalPrefix) || mt.FullName != "speaker_wavlm/"+long {
		t.Errorf("%s: %+v", long, mt)
	}
	asr := m.Sub("asr")
	wantShape(t, asr, "encoder.encoders.0.conv_module.streaming_conv.depthwise_conv.weight", 32, 1, 9)
	wantShape(t, asr, "encoder.embed.conv.0.weight", 32, 1, 3, 3)
	physical := 0
	for _, mt := range m.Tensors() {
		if strings.HasPrefix(mt.Info.Name, PhysicalPrefix) {
			physical++
			if len(mt.FullName) < 64 {
				t.Errorf("%s (%d bytes) stored as %s", mt.FullName, len(mt.FullName), mt.Info.Name)
			}
		} else if mt.Info.Name != mt.FullName {
			t.Errorf("%s stored as %s", mt.FullName, mt.Info.Name)
		}
	}
	t.Logf("meanvc2: %d tensors, %d stored under %s<index>", m.Len(), physical, PhysicalPrefix)

	// The same tensor by full name and through the view.
	a, sa, err := m.Get("vc/gtm.k_prior")
	if err != nil {
		t.Fatal(err)
	}
	b, sb, err := vc.Get("gtm.k_prior")
	if err != nil || !reflect.DeepEqual(a, b) || !reflect.DeepEqual(sa, sb) {
		t.Errorf("view and full name disagree: %v", err)
	}
	if _, _, err := vc.Get("nope"); err == nil || !strings.Contains(err.Error(), `"vc/nope" not found`) {
		t.Errorf("missing tensor error: %v", err)
	}

	if got := m.EmbeddedFiles(); !reflect.DeepEqual(got, []string{"config.json"}) {
		t.Errorf("embedded files %q", got)
	}
	cfg := embeddedJSON(t, m, "config.json")
	for _, sec := range []string{"vc", "runtime", "asr", "vocos", "speaker_wavlm", "speaker_ecapa"} {
		if _, ok := cfg[sec]; !ok {
			t.Errorf("config.json lacks section %q", sec)
		}
	}
	// Views share the file's embedded files.
	if _, ok := vc.EmbeddedFile("config.json"); !ok {
		t.Error("view lost the embedded files")
	}
}

func embeddedJSON(t *testing.T, m *Model, name string) map[string]any {
	t.Helper()
	b, ok := m.EmbeddedFile(name)
	if !ok {
		t.Fatalf("embedded file %q missing (have %q)", name, m.EmbeddedFiles())
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// TestGoldenMioCodecModel compares every tensor with the list in MANIFEST.md §7.
func TestGoldenMioCodecModel(t *testing.T) {
	m := openGoldenModel(t, "miocodec")
	if ns := m.Namespaces(); !reflect.DeepEqual(ns, []string{"wavlm_weights", "weights"}) {
		t.Errorf("namespaces %q", ns)
	}
	checkAllTensors(t, m)

	manifest, err := os.ReadFile(goldenFile(t, "miocodec", "MANIFEST.md"))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^((?:weights|wavlm_weights)/\S+) \[([0-9, ]+)\]$`)
	listed := 0
	sc := bufio.NewScanner(bytes.NewReader(manifest))
	for sc.Scan() {
		g := line.FindStringSubmatch(sc.Text())
		if g == nil {
			continue
		}
		var shape []int
		for _, f := range strings.Split(g[2], ",") {
			d, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				t.Fatal(err)
			}
			shape = append(shape, d)
		}
		wantShape(t, m, g[1], shape...)
		listed++
	}
	if listed != m.Len() || listed != 236 {
		t.Errorf("MANIFEST lists %d tensors, the file has %d", listed, m.Len())
	}
	w := m.Sub("weights")
	wantShape(t, w, "wave_upsampler.upsample_layers.0.parametrizations.weight.original1", 128, 64, 9)
	wantShape(t, m.Sub("wavlm_weights"), "encoder.layers.0.self_attn.relative_attention_bias.weight", 320, 2)

	if got := m.EmbeddedFiles(); !reflect.DeepEqual(got, []string{"config.yaml", "wavlm-base-plus-mlx/config.json"}) {
		t.Errorf("embedded files %q", got)
	}
	y, _ := m.EmbeddedFile("config.yaml")
	if !bytes.HasPrefix(y, []byte("# MioCodec")) || len(y) != 2322 {
		t.Errorf("config.yaml: %d bytes starting %q", len(y), y[:min(len(y), 20)])
	}
	embeddedJSON(t, m, "wavlm-base-plus-mlx/config.json")
}

func TestGoldenMioTTSModel(t *testing.T) {
	m := openGoldenModel(t, "miotts")
	if ns := m.Namespaces(); !reflect.DeepEqual(ns, []string{""}) {
		t.Errorf("namespaces %q, want only the root", ns)
	}
	if m.Sub("").Len() != 24 || m.Len() != 24 {
		t.Errorf("%d tensors (root view %d), want 24", m.Len(), m.Sub("").Len())
	}
	checkAllTensors(t, m)
	wantShape(t, m, "model.embed_tokens.weight", 13568, 64)
	for i := 0; i < 2; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		wantShape(t, m, p+"self_attn.q_proj.weight", 64, 64)
		wantShape(t, m, p+"self_attn.k_proj.weight", 32, 64)
		wantShape(t, m, p+"self_attn.v_proj.weight", 32, 64)
		wantShape(t, m, p+"self_attn.q_norm.weight", 16)
		wantShape(t, m, p+"mlp.gate_proj.weight", 128, 64)
		wantShape(t, m, p+"mlp.down_proj.weight", 64, 128)
	}
	wantShape(t, m, "model.norm.weight", 64)

	sizes := map[string]int{"config.json": 699, "generation_config.json": 176, "tokenizer_config.json": 2258991,
		"vocab.json": 9825, "merges.txt": 5235}
	names := m.EmbeddedFiles()
	if len(names) != len(sizes) {
		t.Errorf("embedded files %q", names)
	}
	for n, size := range sizes {
		b, ok := m.EmbeddedFile(n)
		if !ok || len(b) != size {
			t.Errorf("%s: %d bytes (present %v), want %d", n, len(b), ok, size)
		}
		if strings.HasSuffix(n, ".json") {
			embeddedJSON(t, m, n)
		}
	}
	cfg := embeddedJSON(t, m, "config.json")
	if cfg["model_type"] != "qwen3" {
		t.Errorf("config.json model_type %v", cfg["model_type"])
	}
	if _, ok := m.EmbeddedFile("tokenizer.json"); ok {
		t.Error("tokenizer.json should be absent")
	}
	// Embedded files outlive the mapping.
	vocab, _ := m.EmbeddedFile("vocab.json")
	m.Close()
	var v map[string]any
	if err := json.Unmarshal(vocab, &v); err != nil || len(v) == 0 {
		t.Errorf("vocab.json after Close: %v", err)
	}
}

// audiocppKV builds the packaging metadata for tensors given by logical name and shape.
func audiocppKV(t testing.TB, names []string, shapes [][]int) KV {
	kv := KV{}
	var ranks []int32
	var dims []int64
	for _, s := range shapes {
		ranks = append(ranks, int32(len(s)))
		for _, d := range s {
			dims = append(dims, int64(d))
		}
	}
	for k, v := range map[string]any{KeyTensorNames: names, KeyTensorRanks: ranks, KeyTensorShapes: dims} {
		if err := kv.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	return kv
}

func TestModelSynthetic(t *testing.T) {
	long := "enc/" + strings.Repeat("x", 70) + ".weight"
	names := []string{"enc/a.weight", long, "enc/scalar", "dec/sub/b", "root.bias", "enc/trailing"}
	shapes := [][]int{{2, 3}, {4}, {}, {2}, {3}, {5, 1}}
	kv := audiocppKV(t, names, shapes)
	files := map[string]string{"config.json": `{"dim": 4}`, "dir/vocab.txt": "a\nb\n", "empty": ""}
	var blob []byte
	offs := []uint64{0}
	var fnames []string
	for _, n := range []string{"config.json", "dir/vocab.txt", "empty"} {
		blob = append(blob, files[n]...)
		offs = append(offs, uint64(len(blob)))
		fnames = append(fnames, n)
	}
	_ = kv.Set(KeyEmbeddedNames, fnames)
	_ = kv.Set(KeyEmbeddedOffsets, offs)
	_ = kv.Set(KeyEmbeddedData, blob)
	ramp := func(n int) []float32 {
		d := make([]float32, n)
		for i := range d {
			d[i] = float32(i + 1)
		}
		return d
	}
	ts := []WriteTensor{
		{Name: "enc/a.weight", Shape: []int{2, 3}, Type: F16, Data: ramp(6)},
		{Name: PhysicalPrefix + "1", Shape: []int{4}, Data: ramp(4)},
		{Name: "enc/scalar", Shape: []int{1}, Data: []float32{7}}, // rank 0 is stored as [1]
		{Name: "dec/sub/b", Shape: []int{2}, Data: ramp(2)},
		{Name: "root.bias", Shape: []int{3}, Data: ramp(3)},
		{Name: "enc/trailing", Shape: []int{5}, Data: ramp(5)}, // ggml drops the trailing 1
	}
	var buf bytes.Buffer
	if err := Write(&buf, kv, ts); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewModel(f)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.Names(), names) {
		t.Errorf("names %q", m.Names())
	}
	if got := m.Namespaces(); !reflect.DeepEqual(got, []string{"", "dec", "enc"}) {
		t.Errorf("namespaces %q", got)
	}
	enc := m.Sub("enc")
	if got := enc.Names(); !reflect.DeepEqual(got, []string{"a.weight", long[4:], "scalar", "trailing"}) {
		t.Errorf("enc names %q", got)
	}
	if d, s, err := enc.Get(long[4:]); err != nil || !reflect.DeepEqual(s, []int{4}) || d[3] != 4 {
		t.Errorf("long name: %v %v %v", d, s, err)
	}
	if d, s, err := enc.Get("scalar"); err != nil || len(s) != 0 || s == nil || !reflect.DeepEqual(d, []float32{7}) {
		t.Errorf("scalar: %v %#v %v", d, s, err)
	}
	if _, s, err := enc.Get("trailing"); err != nil || !reflect.DeepEqual(s, []int{5, 1}) {
		t.Errorf("trailing: %v %v", s, err)
	}
	if d, s, err := enc.Get("a.weight"); err != nil || !reflect.DeepEqual(s, []int{2, 3}) || !reflect.DeepEqual(d, ramp(6)) {
		t.Errorf("a.weight: %v %v %v", d, s, err)
	}
	// Returned shapes are copies.
	_, s, _ := enc.Get("a.weight")
	s[0] = 99
	if mt, _ := enc.Tensor("a.weight"); mt.Shape[0] != 2 {
		t.Error("Get returned the model's own shape slice")
	}
	dec := m.Sub("dec")
	if dec.Prefix() != "dec/" || !reflect.DeepEqual(dec.Namespaces(), []string{"sub"}) || !dec.Sub("sub").Has("b") {
		t.Errorf("nested namespace: %q %q", dec.Prefix(), dec.Namespaces())
	}
	if _, _, err := dec.Sub("sub").Get("c"); err == nil || !strings.Contains(err.Error(), `"dec/sub/c"`) {
		t.Errorf("nested missing: %v", err)
	}
	root := m.Sub("")
	if !reflect.DeepEqual(root.Names(), []string{"root.bias"}) {
		t.Errorf("root view %q", root.Names())
	}
	if m.Sub("nope").Len() != 0 {
		t.Error("unknown namespace should be empty")
	}
	if !reflect.DeepEqual(m.EmbeddedFiles(), fnames) {
		t.Errorf("embedded %q", m.EmbeddedFiles())
	}
	for n, want := range files {
		if b, ok := enc.EmbeddedFile(n); !ok || string(b) != want {
			t.Errorf("embedded %s = %q %v", n, b, ok)
		}
	}
	if _, ok := m.EmbeddedFile("nope"); ok {
		t.Error("found a missing embedded file")
	}
}

// TestModelPlain: without the audiocpp keys, stored names and reversed dims are used.
func TestModelPlain(t *testing.T) {
	f, err := Parse(writeSample(t))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewModel(f)
	if err != nil {
		t.Fatal(err)
	}
	if m.Len() != len(f.Tensors) || len(m.EmbeddedFiles()) != 0 {
		t.Fatalf("%d tensors, %d embedded", m.Len(), len(m.EmbeddedFiles()))
	}
	if _, s, err := m.Get("mat"); err != nil || !reflect.DeepEqual(s, []int{3, 4}) {
		t.Errorf("mat: %v %v", s, err)
	}
	if _, _, err := m.Get("q4"); err == nil || !strings.Contains(err.Error(), "Q4_0 not supported") {
		t.Errorf("unsupported dtype: %v", err)
	}
	if !reflect.DeepEqual(m.Namespaces(), []string{""}) {
		t.Errorf("namespaces %q", m.Namespaces())
	}
}

func TestModelHostile(t *testing.T) {
	two := []WriteTensor{
		{Name: "a", Shape: []int{2, 3}, Data: make([]float32, 6)},
		{Name: "b", Shape: []int{4}, Data: make([]float32, 4)},
	}
	set := func(kv KV, k string, v any) KV {
		if err := kv.Set(k, v); err != nil {
			t.Fatal(err)
		}
		return kv
	}
	base := func() KV { return audiocppKV(t, []string{"a", "b"}, [][]int{{2, 3}, {4}}) }
	withEmb := func(names []string, offs []uint64, data []byte) KV {
		kv := base()
		set(kv, KeyEmbeddedNames, names)
		set(kv, KeyEmbeddedOffsets, offs)
		return set(kv, KeyEmbeddedData, data)
	}
	cases := []struct {
		name string
		kv   KV
		ts   []WriteTensor
		want string
	}{
		{"names count", set(base(), KeyTensorNames, []string{"a"}), two, "1 names for 2 tensors"},
		{"names type", set(base(), KeyTensorNames, []int32{1, 2}), two, "want array of string"},
		{"empty name", set(base(), KeyTensorNames, []string{"a", ""}), two, "is empty"},
		{"name mismatch", set(base(), KeyTensorNames, []string{"a", "c"}), two, `stored as "b" but`},
		{"duplicate logical", set(base(), KeyTensorNames, []string{"a", "a"}), []WriteTensor{two[0], {Name: "_audiocpp.1", Shape: []int{4}, Data: make([]float32, 4)}}, "used by tensors 0 and 1"},
		{"wrong physical index", base(), []WriteTensor{two[0], {Name: "_audiocpp.0", Shape: []int{4}, Data: make([]float32, 4)}}, "want _audiocpp.1"},
		{"bad physical index", base(), []WriteTensor{two[0], {Name: "_audiocpp.x", Shape: []int{4}, Data: make([]float32, 4)}}, "want _audiocpp.1"},
		{"ranks without shapes", func() KV { kv := base(); delete(kv, KeyTensorShapes); return kv }(), two, "must be given together"},
		{"ranks count", set(base(), KeyTensorRanks, []int32{2}), two, "1 ranks for 2 tensors"},
		{"negative rank", set(base(), KeyTensorRanks, []int32{-1, 1}), two, "is -1"},
		{"huge rank", set(base(), KeyTensorRanks, []int32{1 << 30, 1}), two, "want 0..16"},
		{"shapes short", set(base(), KeyTensorShapes, []int64{2, 3}), two, "ends at tensor 1"},
		{"shapes long", set(base(), KeyTensorShapes, []int64{2, 3, 4, 5}), two, "4 dims, the ranks add up to 3"},
		{"negative dim", set(base(), KeyTensorShapes, []int64{-2, -3, 4}), two, "out of range"},
		{"overflow", set(base(), KeyTensorShapes, []int64{1 << 62, 1 << 62, 4}), two, "overflows"},
		{"element count", set(base(), KeyTensorShapes, []int64{3, 3, 4}), two, "has 9 elements"},
		{"shapes type", set(base(), KeyTensorShapes, []float32{2, 3, 4}), two, "want array of integers"},
		{"emb partial", set(base(), KeyEmbeddedNames, []string{"x"}), two, "must be given together"},
		{"emb count", withEmb([]string{"x"}, []uint64{0}, []byte{}), two, "1 entries for 1 files, want 2"},
		{"emb end", withEmb([]string{"x"}, []uint64{0, 5}, []byte{1, 2}), two, "want 0 to 2"},
		{"emb start", withEmb([]string{"x"}, []uint64{1, 2}, []byte{1, 2}), two, "want 0 to 2"},
		{"emb decreasing", withEmb([]string{"x", "y"}, []uint64{0, 3, 2}, []byte{1, 2}), two, "not an ordered range"},
		{"emb beyond", withEmb([]string{"x", "y"}, []uint64{0, 1 << 40, 2}, []byte{1, 2}), two, "not an ordered range"},
		{"emb backwards", withEmb([]string{"x", "y", "z"}, []uint64{0, 2, 1, 2}, []byte{1, 2}), two, "not an ordered range"},
		{"emb huge", withEmb([]string{"x", "y"}, []uint64{0, 1 << 63, 2}, []byte{1, 2}), two, "want array of integers"},
		{"emb dup", withEmb([]string{"x", "x"}, []uint64{0, 1, 2}, []byte{1, 2}), two, "appears twice"},
		{"emb noname", withEmb([]string{""}, []uint64{0, 2}, []byte{1, 2}), two, "no name"},
		{"emb empty data", withEmb([]string{"x"}, []uint64{0, 2}, nil), two, "want 0 to 0"},
		{"emb data string", set(withEmb([]string{"x"}, []uint64{0, 2}, []byte{1, 2}), KeyEmbeddedData, "ab"), two, "want array of uint8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := Write(&buf, c.kv, c.ts); err != nil {
				t.Fatal(err)
			}
			f, err := Parse(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			_, err = NewModel(f)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "gguf: ") {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

func TestOpenModelErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := OpenModel(filepath.Join(dir, "missing.gguf")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing: %v", err)
	}
	var buf bytes.Buffer
	kv := audiocppKV(t, []string{"a"}, [][]int{{3}})
	if err := Write(&buf, kv, []WriteTensor{{Name: "a", Shape: []int{2}, Data: make([]float32, 2)}}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "bad.gguf")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenModel(p); err == nil || !strings.Contains(err.Error(), "bad.gguf") || !strings.Contains(err.Error(), "has 3 elements") {
		t.Errorf("bad metadata: %v", err)
	}
}

func TestGetInt32(t *testing.T) {
	var buf bytes.Buffer
	ids := []byte{1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff}
	if err := Write(&buf, KV{}, []WriteTensor{
		{Name: "ids", Shape: []int{2}, Type: I32, Raw: ids},
		{Name: "x", Shape: []int{2}, Data: []float32{1, 2}},
	}); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewModel(f)
	if err != nil {
		t.Fatal(err)
	}
	v, shape, err := m.GetInt32("ids")
	if err != nil || len(v) != 2 || v[0] != 1 || v[1] != -2 || shape[0] != 2 {
		t.Fatalf("GetInt32: %v %v %v", v, shape, err)
	}
	if _, _, err := m.GetInt32("x"); err == nil {
		t.Fatal("an F32 tensor read as I32")
	}
	if _, _, err := m.GetInt32("nope"); err == nil {
		t.Fatal("a missing tensor read")
	}
}
