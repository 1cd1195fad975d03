package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/voxpipe/voxpipe/engine/ckpt"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/engine/ggufpack"
)

// The checkpoint writers of mkmodel --originals: safetensors, torch.save zips and TorchScript
// archives, streamed (the header or pickle from the shapes alone, then each tensor's bytes
// as they are drawn). engine/ckpt reads them back; the layouts are torch's own (see
// engine/ckpt/torch.go), without the TorchScript code a real archive also carries.

// origDrawFunc draws a tensor's values (as stored) into emit, in order.
type origDrawFunc func(t origTensor, emit func([]float32) error) error

// origEncoder turns drawn values into a checkpoint's bytes.
type origEncoder struct {
	dt  gguf.DType
	buf []byte
}

func newOrigEncoder(dt ckpt.DType) (*origEncoder, error) {
	switch dt {
	case ckpt.F32:
		return &origEncoder{dt: gguf.F32}, nil
	case ckpt.F16:
		return &origEncoder{dt: gguf.F16}, nil
	case ckpt.BF16:
		return &origEncoder{dt: gguf.BF16}, nil
	}
	return nil, fmt.Errorf("checkpoint dtype %s (f32, f16 or bf16)", dt)
}

// to writes values to w; n counts the bytes.
func (e *origEncoder) to(w io.Writer, n *int64) func([]float32) error {
	return func(v []float32) error {
		var err error
		if e.buf, err = ggufpack.Encode(e.buf[:0], v, e.dt); err != nil {
			return err
		}
		m, err := w.Write(e.buf)
		*n += int64(m)
		return err
	}
}

// origCreate creates path through a buffered writer; done flushes and closes it.
func origCreate(path string) (*bufio.Writer, func() error, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, err
	}
	w := bufio.NewWriterSize(f, 4<<20)
	return w, func() error {
		if err := w.Flush(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}, nil
}

// writeOrigSafetensors writes a safetensors file: the header (tensors in order, with
// __metadata__ {"format": "pt"} as transformers writes it), then each tensor drawn in turn.
func writeOrigSafetensors(path string, ts []origTensor, dt ckpt.DType, draw origDrawFunc) (int64, error) {
	enc, err := newOrigEncoder(dt)
	if err != nil {
		return 0, err
	}
	var head bytes.Buffer
	head.WriteString(`{"__metadata__":{"format":"pt"}`)
	var off int64
	for _, t := range ts {
		name, _ := json.Marshal(t.name)
		shape, _ := json.Marshal(origShape(t))
		size := origBytes(t.spec, dt)
		fmt.Fprintf(&head, `,%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, name, dt, shape, off, off+size)
		off += size
	}
	head.WriteByte('}')
	for head.Len()%8 != 0 {
		head.WriteByte(' ')
	}
	w, done, err := origCreate(path)
	if err != nil {
		return 0, err
	}
	n := int64(8 + head.Len())
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(head.Len()))
	w.Write(l[:])
	w.Write(head.Bytes())
	for _, t := range ts {
		before := n
		if err := draw(t, enc.to(w, &n)); err != nil {
			done()
			return n, fmt.Errorf("%s: %w", t.name, err)
		}
		if n-before != origBytes(t.spec, dt) {
			done()
			return n, fmt.Errorf("%s: %d bytes written, %d expected", t.name, n-before, origBytes(t.spec, dt))
		}
	}
	return n, done()
}

// writeOrigTorch writes a torch zip archive: data.pkl and one storage per tensor under
// data/. A torch.save file pickles {"model": OrderedDict(name → tensor)} (the speaker
// checkpoint's form); a TorchScript archive (script) pickles the module tree as __torch__
// objects whose attributes are their parameters, buffers and submodules, with an empty
// constants.pkl and a code/ entry.
func writeOrigTorch(path string, script bool, ts []origTensor, dt ckpt.DType, draw origDrawFunc) (int64, error) {
	enc, err := newOrigEncoder(dt)
	if err != nil {
		return 0, err
	}
	storage := map[ckpt.DType]string{ckpt.F32: "FloatStorage", ckpt.F16: "HalfStorage", ckpt.BF16: "BFloat16Storage"}[dt]
	prefix := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	var p pickler
	p.proto()
	tensor := func(i int, t origTensor) {
		shape := origShape(t)
		numel := int64(1)
		stride := make([]int64, len(shape))
		for j := len(shape) - 1; j >= 0; j-- {
			stride[j] = numel
			numel *= int64(shape[j])
		}
		p.global("torch._utils", "_rebuild_tensor_v2")
		p.mark()
		p.mark()
		p.str("storage")
		p.global("torch", storage)
		p.str(strconv.Itoa(i))
		p.str("cpu")
		p.int(numel)
		p.op(opTupleP)
		p.op(opBinPersidP)
		p.int(0)
		p.mark()
		for _, d := range shape {
			p.int(int64(d))
		}
		p.op(opTupleP)
		p.mark()
		for _, s := range stride {
			p.int(s)
		}
		p.op(opTupleP)
		p.op(opNewFalseP)
		p.global("collections", "OrderedDict")
		p.op(opEmptyTupleP)
		p.op(opReduceP)
		p.op(opTupleP)
		p.op(opReduceP)
	}
	if script {
		// The module tree, children in first-seen order.
		type node struct {
			keys   []string
			kids   map[string]*node
			tensor map[string]int
		}
		newNode := func() *node { return &node{kids: map[string]*node{}, tensor: map[string]int{}} }
		root := newNode()
		for i, t := range ts {
			parts := strings.Split(t.name, ".")
			n := root
			for _, part := range parts[:len(parts)-1] {
				k, ok := n.kids[part]
				if !ok {
					if _, clash := n.tensor[part]; clash {
						return 0, fmt.Errorf("%s: %s is a tensor and a module", t.name, part)
					}
					k = newNode()
					n.kids[part] = k
					n.keys = append(n.keys, part)
				}
				n = k
			}
			leaf := parts[len(parts)-1]
			if _, clash := n.kids[leaf]; clash {
				return 0, fmt.Errorf("%s: %s is a tensor and a module", t.name, leaf)
			}
			n.tensor[leaf] = i
			n.keys = append(n.keys, leaf)
		}
		var emit func(n *node)
		emit = func(n *node) {
			p.global("__torch__", "Module")
			p.op(opEmptyTupleP)
			p.op(opNewObjP)
			p.op(opEmptyDictP)
			p.mark()
			p.str("training")
			p.op(opNewFalseP)
			for _, k := range n.keys {
				p.str(k)
				if i, ok := n.tensor[k]; ok {
					tensor(i, ts[i])
				} else {
					emit(n.kids[k])
				}
			}
			p.op(opSetItemsP)
			p.op(opBuildP)
		}
		emit(root)
	} else {
		p.op(opEmptyDictP)
		p.str("model")
		p.global("collections", "OrderedDict")
		p.op(opEmptyTupleP)
		p.op(opReduceP)
		for b := 0; b < len(ts); b += 1000 { // pickle batches SETITEMS by 1000
			p.mark()
			for i := b; i < min(b+1000, len(ts)); i++ {
				p.str(ts[i].name)
				tensor(i, ts[i])
			}
			p.op(opSetItemsP)
		}
		p.op(opSetItemP)
	}
	p.op(opStopP)

	w, done, err := origCreate(path)
	if err != nil {
		return 0, err
	}
	cw := &origCounter{w: w}
	zw := zip.NewWriter(cw)
	entry := func(name string, data []byte) error {
		e, err := zw.CreateHeader(&zip.FileHeader{Name: prefix + "/" + name, Method: zip.Store})
		if err != nil {
			return err
		}
		_, err = e.Write(data)
		return err
	}
	fail := func(err error) (int64, error) {
		done()
		return cw.n, err
	}
	if err := entry("data.pkl", p.b); err != nil {
		return fail(err)
	}
	if script {
		var c pickler
		c.proto()
		c.op(opEmptyTupleP)
		c.op(opStopP)
		if err := entry("constants.pkl", c.b); err != nil {
			return fail(err)
		}
		if err := entry("code/__torch__.py", []byte("# random-weight originals written by voxpipe mkmodel --originals: parameters only\n")); err != nil {
			return fail(err)
		}
	}
	if err := entry("byteorder", []byte("little")); err != nil {
		return fail(err)
	}
	for i, t := range ts {
		e, err := zw.CreateHeader(&zip.FileHeader{Name: prefix + "/data/" + strconv.Itoa(i), Method: zip.Store})
		if err != nil {
			return fail(err)
		}
		var n int64
		if err := draw(t, enc.to(e, &n)); err != nil {
			return fail(fmt.Errorf("%s: %w", t.name, err))
		}
		if n != origBytes(t.spec, dt) {
			return fail(fmt.Errorf("%s: %d bytes written, %d expected", t.name, n, origBytes(t.spec, dt)))
		}
	}
	if err := entry("version", []byte("3\n")); err != nil {
		return fail(err)
	}
	if err := zw.Close(); err != nil {
		return fail(err)
	}
	return cw.n, done()
}

// origCounter counts the bytes written through it.
type origCounter struct {
	w io.Writer
	n int64
}

func (c *origCounter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// Pickle opcodes the writer uses (protocol 2).
const (
	opProtoP      = 0x80
	opStopP       = '.'
	opMarkP       = '('
	opTupleP      = 't'
	opEmptyTupleP = ')'
	opEmptyDictP  = '}'
	opSetItemP    = 's'
	opSetItemsP   = 'u'
	opGlobalP     = 'c'
	opReduceP     = 'R'
	opNewObjP     = 0x81
	opBuildP      = 'b'
	opBinPersidP  = 'Q'
	opNewFalseP   = 0x89
	opBinIntP     = 'J'
	opBinInt1P    = 'K'
	opBinInt2P    = 'M'
	opLong1P      = 0x8a
	opBinUniP     = 'X'
)

// pickler writes a protocol-2 pickle.
type pickler struct{ b []byte }

func (p *pickler) op(o byte) { p.b = append(p.b, o) }
func (p *pickler) proto()    { p.b = append(p.b, opProtoP, 2) }
func (p *pickler) mark()     { p.op(opMarkP) }

func (p *pickler) global(module, name string) {
	p.op(opGlobalP)
	p.b = append(p.b, module...)
	p.b = append(p.b, '\n')
	p.b = append(p.b, name...)
	p.b = append(p.b, '\n')
}

func (p *pickler) str(s string) {
	p.op(opBinUniP)
	p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	p.b = append(p.b, s...)
}

func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v < 1<<8:
		p.b = append(p.b, opBinInt1P, byte(v))
	case v >= 0 && v < 1<<16:
		p.op(opBinInt2P)
		p.b = binary.LittleEndian.AppendUint16(p.b, uint16(v))
	case v >= -1<<31 && v < 1<<31:
		p.op(opBinIntP)
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(int32(v)))
	default:
		p.b = append(p.b, opLong1P, 8)
		p.b = binary.LittleEndian.AppendUint64(p.b, uint64(v))
	}
}
