package ckpt

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// fixtures is testdata/ckpt at the repository root (written by tools/ckptgen/gen.py).
func fixtures(t testing.TB, elems ...string) string {
	t.Helper()
	p := filepath.Join(append([]string{"..", "..", "testdata", "ckpt"}, elems...)...)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("fixture missing (regenerate with tools/ckptgen/gen.py): %v", err)
	}
	return p
}

type expectedTensor struct {
	Name   string    `json:"name"`
	DType  string    `json:"dtype"`
	Shape  []int     `json:"shape"`
	Values []float64 `json:"values"`
}

var torchDTypes = map[string]DType{"float32": F32, "float16": F16, "bfloat16": BF16, "int64": I64}

// Files torch itself wrote (torch.save zip and legacy, torch.jit.script and trace) read
// back to the names, dtypes, shapes and values torch reports for them.
func TestTorchFixtures(t *testing.T) {
	raw, err := os.ReadFile(fixtures(t, "formats", "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string][]expectedTensor
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	formats := map[string]string{"state_dict.pt": "torch", "legacy.pt": "torch-legacy", "script.pt": "torchscript", "traced.pt": "torchscript"}
	for file, tensors := range want {
		c, err := Open(fixtures(t, "formats", file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if c.Format != formats[file] {
			t.Errorf("%s: format %s, want %s", file, c.Format, formats[file])
		}
		for _, w := range tensors {
			got, ok := c.Tensor(w.Name)
			if !ok {
				t.Errorf("%s: no tensor %s (have %v)", file, w.Name, c.Names())
				continue
			}
			if got.DType != torchDTypes[w.DType] || !slices.Equal(got.Shape, w.Shape) {
				t.Errorf("%s: %s is %v %v, want %s %v", file, w.Name, got.DType, got.Shape, w.DType, w.Shape)
			}
			if w.Values == nil {
				if _, err := got.ReadFloat32(); err == nil || !strings.Contains(err.Error(), "I64") {
					t.Errorf("%s: %s: reading an int64 tensor as floats: %v", file, w.Name, err)
				}
				continue
			}
			vals, err := got.ReadFloat32()
			if err != nil {
				t.Errorf("%s: %s: %v", file, w.Name, err)
				continue
			}
			for i, v := range vals {
				if float64(v) != w.Values[i] {
					t.Errorf("%s: %s[%d] = %v, want %v", file, w.Name, i, v, w.Values[i])
					break
				}
			}
		}
		if strings.HasPrefix(file, "traced") {
			if _, ok := c.Tensor("__constants__.0"); !ok {
				t.Errorf("%s: the traced constant is not listed: %v", file, c.Names())
			}
		}
		c.Close()
	}
	c, err := Open(fixtures(t, "formats", "noncontig.pt"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Tensors[0].ReadFloat32(); err == nil || !strings.Contains(err.Error(), "not contiguous") {
		t.Errorf("non-contiguous tensor: %v", err)
	}
}

// ---- safetensors ----

func stBytes(t testing.TB, ts []STensor, md map[string]string) []byte {
	var b bytes.Buffer
	if err := WriteSafetensors(&b, ts, md); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestSafetensorsRoundTrip(t *testing.T) {
	f16 := STensor{Name: "h", DType: F16, Shape: []int{2}, Data: []byte{0x00, 0x3c, 0x00, 0xc0}} // 1, -2
	bf := STensor{Name: "b", DType: BF16, Shape: []int{1}, Data: []byte{0x80, 0x3f}}             // 1
	i64 := STensor{Name: "n", DType: I64, Shape: []int{}, Data: make([]byte, 8)}
	ts := []STensor{F32Tensor("z.last", []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}), f16, bf, i64,
		F32Tensor("a.first", []int{0}, nil)}
	c, err := ParseSafetensors(stBytes(t, ts, map[string]string{"format": "pt"}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Names(), []string{"z.last", "h", "b", "n", "a.first"}) {
		t.Errorf("order %v: the header's order must be kept", c.Names())
	}
	if c.Metadata["format"] != "pt" {
		t.Errorf("metadata %v", c.Metadata)
	}
	for name, want := range map[string][]float32{"z.last": {1, 2, 3, 4, 5, 6}, "h": {1, -2}, "b": {1}, "a.first": {}} {
		tt, _ := c.Tensor(name)
		got, err := tt.ReadFloat32()
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v %v, want %v", name, got, err, want)
		}
	}
	n, _ := c.Tensor("n")
	if _, err := n.ReadFloat32(); err == nil {
		t.Error("I64 read as floats")
	}
}

// Hostile or corrupt headers fail with a message naming the problem; nothing large is
// allocated.
func TestSafetensorsHostile(t *testing.T) {
	good := stBytes(t, []STensor{F32Tensor("w", []int{2}, []float32{1, 2})}, nil)
	header := func(h string) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
		return append(append(b, h...), make([]byte, 8)...)
	}
	huge := binary.LittleEndian.AppendUint64(nil, 1<<40)
	cases := map[string]struct {
		data []byte
		want string
	}{
		"header length 1 TB": {huge, "header of 1099511627776 bytes"},
		"tensor claiming 1 TB": {header(`{"w":{"dtype":"F32","shape":[262144,1048576],"data_offsets":[0,1099511627776]}}`),
			"past the end of the data"},
		"offsets and shape disagree": {header(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`), "needs 12 bytes"},
		"negative dim":               {header(`{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`), "negative dimension"},
		"overflowing shape": {header(`{"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}`),
			"too many elements"},
		"reversed offsets": {header(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}`), "bad data_offsets"},
		"duplicate":        {header(`{"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[],"data_offsets":[4,8]}}`), "listed twice"},
		"not json":         {header(`[1,2]`), "not a JSON object"},
		"truncated":        {good[:len(good)-4], "past the end"},
		"short":            {[]byte{1, 2}, "too short"},
	}
	for name, c := range cases {
		_, err := ParseSafetensors(c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.want)
		}
	}
}

func TestSafetensorsSharded(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("m-1.safetensors", stBytes(t, []STensor{F32Tensor("a", []int{1}, []float32{1}), F32Tensor("b", []int{1}, []float32{2})}, nil))
	write("m-2.safetensors", stBytes(t, []STensor{F32Tensor("c", []int{1}, []float32{3})}, nil))
	write("model.safetensors.index.json", []byte(`{"metadata":{"total_size":12},"weight_map":{"c":"m-2.safetensors","a":"m-1.safetensors","b":"m-1.safetensors"}}`))
	c, err := Open(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Names(), []string{"c", "a", "b"}) || c.Format != "safetensors-sharded" {
		t.Errorf("%s %v", c.Format, c.Names())
	}
	b, _ := c.Tensor("b")
	if v, err := b.ReadFloat32(); err != nil || v[0] != 2 {
		t.Errorf("b = %v %v", v, err)
	}
	c.Close()
	for body, want := range map[string]string{
		`{"weight_map":{"a":"m-2.safetensors"}}`:      `"a" is not in its shard`,
		`{"weight_map":{"a":"../m-1.safetensors"}}`:   "not a file next to the index",
		`{"weight_map":{"a":"/etc/m-1.safetensors"}}`: "not a file next to the index",
		`{"weight_map":{"x":"missing.safetensors"}}`:  "no such file",
		`{"nothing":1}`: "not a safetensors index",
	} {
		write("bad.index.json", []byte(body))
		_, err := Open(filepath.Join(dir, "bad.index.json"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

// ---- pickles ----

// pk assembles a pickle.
type pk struct{ b []byte }

func (p *pk) op(ops ...byte) *pk { p.b = append(p.b, ops...); return p }
func (p *pk) str(s string) *pk {
	p.b = append(p.b, opBINUNICODE)
	p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	p.b = append(p.b, s...)
	return p
}
func (p *pk) int(v int) *pk {
	p.b = append(p.b, opBININT)
	p.b = binary.LittleEndian.AppendUint32(p.b, uint32(int32(v)))
	return p
}
func (p *pk) global(m, n string) *pk {
	p.b = append(p.b, opGLOBAL)
	p.b = append(p.b, m+"\n"+n+"\n"...)
	return p
}

// tensorPickle is {name: tensor} for each name, all tensors F32 of n elements in storage key.
func tensorPickle(entries map[string]string, n int) []byte {
	p := (&pk{}).op(opPROTO, 2, opEMPTYDICT, opMARK)
	for name, key := range entries {
		p.str(name).global("torch._utils", "_rebuild_tensor_v2").op(opMARK)
		p.op(opMARK).str("storage").global("torch", "FloatStorage").str(key).str("cpu").int(n).op(opTUPLE, opBINPERSID)
		p.int(0).int(n).op(opTUPLE1).int(1).op(opTUPLE1, opNEWFALSE)
		p.global("collections", "OrderedDict").op(opEMPTYTUPLE, opREDUCE, opTUPLE, opREDUCE)
	}
	return p.op(opSETITEMS, opSTOP).b
}

type zipEntry struct {
	name string
	data []byte
}

func zipOf(t testing.TB, entries ...zipEntry) []byte {
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for _, e := range entries {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: e.name, Method: zip.Store})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(e.data)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func f32Bytes(vals ...float32) []byte {
	b := make([]byte, 0, 4*len(vals))
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// A zip written here (not by torch) with the layout torch uses reads back; the checks on
// it are the ones hostile files hit.
func TestTorchZipBuiltHere(t *testing.T) {
	data := zipOf(t, zipEntry{"arch/data.pkl", tensorPickle(map[string]string{"w": "0"}, 3)},
		zipEntry{"arch/data/0", f32Bytes(1, 2, 3)}, zipEntry{"arch/version", []byte("3\n")})
	c, err := ParseTorch(data)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := c.Tensor("w")
	if v, err := w.ReadFloat32(); err != nil || !slices.Equal(v, []float32{1, 2, 3}) {
		t.Errorf("w = %v %v", v, err)
	}
}

// Hostile torch files fail with an error naming the problem (the global and the archive
// entry, the path, the storage), never a panic.
func TestTorchHostile(t *testing.T) {
	evil := (&pk{}).op(opPROTO, 2).global("os", "system").str("echo pwned").op(opTUPLE1, opREDUCE, opSTOP).b
	evilStack := (&pk{}).op(opPROTO, 4).str("builtins").str("eval").op(opSTACKGLOBAL).str("1").op(opTUPLE1, opREDUCE, opSTOP).b
	deep := (&pk{}).op(opPROTO, 2)
	for range 200 {
		deep.op(opEMPTYLIST)
	}
	for range 199 {
		deep.op(opAPPEND)
	}
	deep.op(opSTOP)
	cycle := (&pk{}).op(opPROTO, 2, opEMPTYLIST, opBINPUT, 0, opBINGET, 0, opAPPEND, opSTOP).b
	hugeMemo := (&pk{}).op(opPROTO, 2, opNONE, opLONGBINPUT, 0xff, 0xff, 0xff, 0x7f, opSTOP).b
	hugeString := (&pk{}).op(opPROTO, 4, opBINUNICODE8, 0, 0, 0, 0, 0, 0, 0, 0x10).b
	store := func(pkl []byte, more ...zipEntry) []byte {
		return zipOf(t, append([]zipEntry{{"a/data.pkl", pkl}}, more...)...)
	}
	ok := tensorPickle(map[string]string{"w": "0"}, 3)
	cases := map[string]struct {
		data []byte
		want []string
	}{
		"os.system global":    {store(evil), []string{"os.system is not allowed", "a/data.pkl"}},
		"builtins.eval":       {store(evilStack), []string{"builtins.eval is not allowed"}},
		"zip slip":            {zipOf(t, zipEntry{"a/data.pkl", ok}, zipEntry{"a/data/0", f32Bytes(1, 2, 3)}, zipEntry{"../x", []byte("x")}), []string{`"../x"`, "refused"}},
		"absolute entry":      {zipOf(t, zipEntry{"/etc/passwd", nil}, zipEntry{"a/data.pkl", ok}), []string{`"/etc/passwd"`}},
		"truncated storage":   {store(ok, zipEntry{"a/data/0", f32Bytes(1, 2)}), []string{"storage 0 claims 12 bytes", "holds 8", "truncated storage"}},
		"missing storage":     {store(ok), []string{"no archive entry a/data/0"}},
		"deep nesting":        {store(deep.b), []string{"nested deeper than"}},
		"huge memo index":     {store(hugeMemo), []string{"memo index 2147483647"}},
		"huge string":         {store(hugeString), []string{"string of 1152921504606846976 bytes"}},
		"unknown opcode":      {store([]byte{opPROTO, 2, 'i', 'x', '\n'}), []string{"opcode", "not supported"}},
		"truncated pickle":    {store(ok[:len(ok)/2], zipEntry{"a/data/0", f32Bytes(1, 2, 3)}), []string{"truncated"}},
		"no data.pkl":         {zipOf(t, zipEntry{"a/b", nil}), []string{"without PREFIX/data.pkl"}},
		"not a checkpoint":    {[]byte("hello world"), []string{"not a PyTorch checkpoint"}},
		"pickle protocol 0/1": {store([]byte{opPROTO, 1, opNONE, opSTOP}), []string{"protocol 1"}},
	}
	// A tensor whose shape runs past its storage.
	big := bytes.Replace(ok, []byte{opBININT, 3, 0, 0, 0, opTUPLE1}, []byte{opBININT, 4, 0, 0, 0, opTUPLE1}, 1)
	cases["tensor beyond its storage"] = struct {
		data []byte
		want []string
	}{store(big, zipEntry{"a/data/0", f32Bytes(1, 2, 3)}), []string{"reaches element 3 of storage 0, which holds 3"}}
	// A list holding itself is walked once, not forever.
	if c, err := ParseTorch(store(cycle)); err != nil || len(c.Tensors) != 0 {
		t.Errorf("self-referencing list: %v", err)
	}
	for name, c := range cases {
		_, err := ParseTorch(c.data)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to mention %q", name, err, w)
			}
		}
	}
}

// The storage bytes of a deflated entry are read through the decompressor.
func TestTorchZipDeflated(t *testing.T) {
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for _, e := range []zipEntry{{"x/data.pkl", tensorPickle(map[string]string{"w": "0"}, 3)}, {"x/data/0", f32Bytes(4, 5, 6)}} {
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: e.name, Method: zip.Deflate})
		w.Write(e.data)
	}
	zw.Close()
	c, err := ParseTorch(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	w, _ := c.Tensor("w")
	if v, err := w.ReadFloat32(); err != nil || !slices.Equal(v, []float32{4, 5, 6}) {
		t.Errorf("%v %v", v, err)
	}
}

// pythonPickles are Python's pickle.dumps of one OrderedDict (every scalar and container
// kind, a shared list) at protocols 2, 4 and 5.
var pythonPickles = map[int]string{
	2: "800263636f6c6c656374696f6e730a4f726465726564446963740a7100295271012858010000006171024b0158030000006e656771034afbffffff580300000062696771048a0600000000000158060000006e656762696771058a060000000000ff5801000000667106473ff80000000000005801000000737107580600000068c3a96c6c6f71085801000000627109635f636f646563730a656e636f64650a710a58020000007879710b58060000006c6174696e31710c86710d52710e58010000006c710f5d7110284b015d7111284b024b0365655801000000747112284b014b024b034b0474711358010000006e71144e580200000074667115888986711658030000007365747117635f5f6275696c74696e5f5f0a7365740a71185d71194b076185711a52711b58010000006b711c4d2c0158010000006d711d4a701101005805000000616761696e711e6810752e",
	4: "800495cc000000000000008c0b636f6c6c656374696f6e73948c0b4f72646572656444696374949394295294288c0161944b018c036e6567944afbffffff8c03626967948a060000000000018c066e6567626967948a060000000000ff8c016694473ff80000000000008c0173948c0668c3a96c6c6f948c01629443027879948c016c945d94284b015d94284b024b0365658c017494284b014b024b034b0474948c016e944e8c02746694888986948c03736574948f94284b07908c016b944d2c018c016d944a701101008c05616761696e94680e752e",
	5: "800595cc000000000000008c0b636f6c6c656374696f6e73948c0b4f72646572656444696374949394295294288c0161944b018c036e6567944afbffffff8c03626967948a060000000000018c066e6567626967948a060000000000ff8c016694473ff80000000000008c0173948c0668c3a96c6c6f948c01629443027879948c016c945d94284b015d94284b024b0365658c017494284b014b024b034b0474948c016e944e8c02746694888986948c03736574948f94284b07908c016b944d2c018c016d944a701101008c05616761696e94680e752e",
}

// Python's own pickles (protocols 2, 4 and 5 of an OrderedDict of every scalar and
// container kind, with a shared reference) read back to the same values.
func TestUnpicklePython(t *testing.T) {
	for proto, hexed := range pythonPickles {
		data, _ := hex.DecodeString(hexed)
		v, n, err := Unpickle(bytes.NewReader(data), int64(len(data)), torchResolver, nil)
		if err != nil {
			t.Fatalf("protocol %d: %v", proto, err)
		}
		if n != int64(len(data)) {
			t.Errorf("protocol %d: read %d of %d bytes", proto, n, len(data))
		}
		d, ok := v.(*Dict)
		if !ok {
			t.Fatalf("protocol %d: %s", proto, describe(v))
		}
		get := func(k string) any { x, _ := d.Get(k); return x }
		l, _ := get("l").(*List)
		inner, _ := l.Items[1].(*List)
		set, _ := get("set").(*List)
		if get("a") != int64(1) || get("neg") != int64(-5) || get("big") != int64(1<<40) || get("negbig") != int64(-1<<40) ||
			get("f") != 1.5 || get("s") != "héllo" || string(get("b").([]byte)) != "xy" || len(l.Items) != 2 || l.Items[0] != int64(1) ||
			len(inner.Items) != 2 || !reflect.DeepEqual(get("t"), Tuple{int64(1), int64(2), int64(3), int64(4)}) || get("n") != (None{}) ||
			!reflect.DeepEqual(get("tf"), Tuple{true, false}) || len(set.Items) != 1 || set.Items[0] != int64(7) ||
			get("k") != int64(300) || get("m") != int64(70000) || get("again") != any(l) {
			t.Errorf("protocol %d: values %v", proto, d.Values)
		}
		if !reflect.DeepEqual(d.Keys[:3], []any{"a", "neg", "big"}) {
			t.Errorf("protocol %d: key order %v", proto, d.Keys)
		}
	}
}
