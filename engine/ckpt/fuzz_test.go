package ckpt

import (
	"archive/zip"
	"bytes"
	"encoding/hex"
	"io"
	"os"
	"testing"
)

// readSmall reads every tensor of at most 1 MiB (hostile sizes are refused before this;
// bounded here only to keep the fuzzer fast).
func readSmall(c *Checkpoint) {
	for _, t := range c.Tensors {
		if t.Bytes() > 1<<20 {
			continue
		}
		if t.DType.IsFloat() {
			t.ReadFloat32()
		} else if rc, err := t.Open(); err == nil {
			io.Copy(io.Discard, rc)
			rc.Close()
		}
	}
}

// FuzzPickle runs arbitrary bytes as a torch pickle: straight through the unpickler with
// the torch allow-list, as the data.pkl of a zip checkpoint, and as a legacy torch.save
// file. It must return a value or an error, never panic, hang or allocate without bound.
func FuzzPickle(f *testing.F) {
	f.Add(tensorPickle(map[string]string{"a": "0", "b.c": "0"}, 2))
	f.Add((&pk{}).op(opPROTO, 2).global("os", "system").str("x").op(opTUPLE1, opREDUCE, opSTOP).b)
	f.Add([]byte{opPROTO, 2, opEMPTYLIST, opBINPUT, 0, opBINGET, 0, opAPPEND, opSTOP})
	for _, h := range pythonPickles {
		b, _ := hex.DecodeString(h)
		f.Add(b)
	}
	for _, name := range []string{"state_dict.pt", "script.pt", "traced.pt"} {
		if zr, err := zip.OpenReader("../../testdata/ckpt/formats/" + name); err == nil {
			for _, zf := range zr.File {
				if b, err := readEntry(zf, 1<<20); err == nil && bytes.HasSuffix([]byte(zf.Name), []byte(".pkl")) {
					f.Add(b)
				}
			}
			zr.Close()
		}
	}
	if b, err := os.ReadFile("../../testdata/ckpt/formats/legacy.pt"); err == nil {
		f.Add(b)
	}
	storage := make([]byte, 64)
	f.Fuzz(func(t *testing.T, data []byte) {
		persist := func(pid any) (any, error) {
			dt, key, n, err := storagePID(pid)
			if err != nil {
				return nil, err
			}
			return &storageRef{key: key, dtype: dt, numel: n, open: func(o, n int64) (io.ReadCloser, error) {
				return io.NopCloser(io.LimitReader(bytes.NewReader(storage), n)), nil
			}}, nil
		}
		if v, _, err := Unpickle(bytes.NewReader(data), int64(len(data)), torchResolver, persist); err == nil {
			if ts, err := flatten(v, ""); err == nil {
				readSmall(&Checkpoint{Tensors: ts})
			}
		}
		var z bytes.Buffer
		zw := zip.NewWriter(&z)
		for _, e := range []zipEntry{{"a/data.pkl", data}, {"a/data/0", storage}, {"a/data/1", storage[:8]}} {
			w, _ := zw.CreateHeader(&zip.FileHeader{Name: e.name, Method: zip.Store})
			w.Write(e.data)
		}
		zw.Close()
		if c, err := ParseTorch(z.Bytes()); err == nil {
			readSmall(c)
		}
		if c, err := ParseTorch(data); err == nil {
			readSmall(c)
		}
	})
}

// FuzzSafetensors parses arbitrary bytes as a safetensors file and reads its tensors.
func FuzzSafetensors(f *testing.F) {
	var b bytes.Buffer
	WriteSafetensors(&b, []STensor{F32Tensor("a", []int{2, 2}, []float32{1, 2, 3, 4}),
		{Name: "h", DType: F16, Shape: []int{1}, Data: []byte{0, 0x3c}}, {Name: "n", DType: I64, Shape: []int{}, Data: make([]byte, 8)}},
		map[string]string{"format": "pt"})
	f.Add(b.Bytes())
	f.Add([]byte("\x10\x00\x00\x00\x00\x00\x00\x00{}              "))
	f.Add(append([]byte("\x40\x00\x00\x00\x00\x00\x00\x00"), `{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,1099511627776]}}`...))
	f.Fuzz(func(t *testing.T, data []byte) {
		if c, err := ParseSafetensors(data); err == nil {
			readSmall(c)
		}
	})
}
