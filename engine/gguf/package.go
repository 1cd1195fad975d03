package gguf

import (
	"fmt"
	"io"
)

// EmbeddedFile is a sidecar file (config.json, vocab.json…) stored inside a packaged model.
type EmbeddedFile struct {
	Name string
	Data []byte
}

// WritePackaged writes tensors (with logical names, PyTorch-order shapes) in the audio.cpp
// packaging: names of 64 bytes or more are stored as _audiocpp.<index> with the logical name
// in audiocpp.tensor_names, shapes and ranks go to audiocpp.tensor_shapes/ranks, and files are
// embedded under audiocpp.embedded_files.*. kv holds the other metadata; it is not modified.
func WritePackaged(w io.Writer, kv KV, tensors []WriteTensor, files []EmbeddedFile) error {
	out := make(KV, len(kv)+8)
	for k, v := range kv {
		out[k] = v
	}
	names := make([]string, len(tensors))
	ranks := make([]int32, len(tensors))
	var shapes []int64
	phys := make([]WriteTensor, len(tensors))
	for i, t := range tensors {
		names[i] = t.Name
		ranks[i] = int32(len(t.Shape))
		for _, d := range t.Shape {
			shapes = append(shapes, int64(d))
		}
		phys[i] = t
		if len(t.Name) >= maxNameLen {
			phys[i].Name = fmt.Sprintf("_audiocpp.%d", i)
		}
	}
	set := func(k string, v any) error { return out.Set(k, v) }
	for _, e := range []error{
		set(KeyTensorNames, names), set(KeyTensorRanks, ranks), set(KeyTensorShapes, shapes),
	} {
		if e != nil {
			return e
		}
	}
	if len(files) > 0 {
		fnames := make([]string, len(files))
		offsets := make([]uint64, len(files)+1)
		var blob []byte
		for i, f := range files {
			fnames[i] = f.Name
			blob = append(blob, f.Data...)
			offsets[i+1] = uint64(len(blob))
		}
		for _, e := range []error{
			set(KeyEmbeddedNames, fnames), set(KeyEmbeddedOffsets, offsets), set(KeyEmbeddedData, blob),
		} {
			if e != nil {
				return e
			}
		}
	}
	return Write(w, out, phys)
}

// maxNameLen is ggml's GGML_MAX_NAME: a stored tensor name must be shorter.
const maxNameLen = 64
