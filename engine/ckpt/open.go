package ckpt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Open opens a checkpoint of any supported format, recognised by its content: a zip
// archive is a torch.save or TorchScript file, a pickle a legacy torch.save file, a JSON
// document a sharded safetensors index, anything whose first 8 bytes are a plausible
// header length followed by '{' a safetensors file.
func Open(path string) (*Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.IsDir() {
		f.Close()
		return nil, fmt.Errorf("ckpt: %s is a folder, not a checkpoint file", path)
	}
	var head [16]byte
	n, err := io.ReadFull(f, head[:])
	f.Close()
	if err != nil && err != io.ErrUnexpectedEOF {
		return nil, fmt.Errorf("ckpt: %s: %w", path, err)
	}
	h := head[:n]
	switch {
	case bytes.HasPrefix(h, []byte("PK\x03\x04")), len(h) >= 2 && h[0] == 0x80 && h[1] >= 2 && h[1] <= 5:
		return OpenTorch(path)
	case strings.HasSuffix(path, ".json") || len(bytes.TrimLeft(h, " \t\r\n")) > 0 && bytes.TrimLeft(h, " \t\r\n")[0] == '{':
		return OpenSafetensorsIndex(path)
	case len(h) >= 9 && h[8] == '{' && binary.LittleEndian.Uint64(h) < maxSafetensorsHeader:
		return OpenSafetensors(path)
	}
	return nil, fmt.Errorf("ckpt: %s: not a checkpoint this reader knows (safetensors, safetensors index, torch zip, TorchScript, legacy torch.save)", path)
}

// openFile opens path and reads it as a checkpoint with read; the checkpoint keeps the file
// open (tensors are read from it later) until it is closed.
func openFile(path string, read func(r io.ReaderAt, size int64, label string) (*Checkpoint, error)) (*Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	adviseSequential(f)
	c, err := read(f, st.Size(), filepath.Base(path))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ckpt: %s: %w", path, err)
	}
	c.Path = path
	c.closers = append(c.closers, f)
	return c, nil
}
