package ckpt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
)

// STensor is one tensor for WriteSafetensors: raw little-endian bytes of DType.
type STensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// F32Tensor makes an STensor of float32 values.
func F32Tensor(name string, shape []int, data []float32) STensor {
	b := make([]byte, 4*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return STensor{Name: name, DType: F32, Shape: shape, Data: b}
}

// WriteSafetensors writes a safetensors file with the tensors in the given order (the
// header lists them in that order too) and optional __metadata__.
func WriteSafetensors(w io.Writer, tensors []STensor, metadata map[string]string) error {
	var head bytes.Buffer
	head.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			head.WriteByte(',')
		}
		first = false
	}
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		sep()
		head.WriteString(`"__metadata__":{`)
		for i, k := range keys {
			if i > 0 {
				head.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			vb, _ := json.Marshal(metadata[k])
			head.Write(kb)
			head.WriteByte(':')
			head.Write(vb)
		}
		head.WriteByte('}')
	}
	var off int64
	for _, t := range tensors {
		var dt string
		for k, v := range safetensorsDTypes {
			if v == t.DType {
				dt = k
			}
		}
		if dt == "" {
			return fmt.Errorf("ckpt: write safetensors: %s: dtype %s", t.Name, t.DType)
		}
		n := int64(1)
		for _, d := range t.Shape {
			n *= int64(d)
		}
		if n*int64(t.DType.Size()) != int64(len(t.Data)) {
			return fmt.Errorf("ckpt: write safetensors: %s: %d bytes for shape %v of %s", t.Name, len(t.Data), t.Shape, t.DType)
		}
		sep()
		nb, _ := json.Marshal(t.Name)
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		sb, _ := json.Marshal(shape)
		fmt.Fprintf(&head, `%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, nb, dt, sb, off, off+int64(len(t.Data)))
		off += int64(len(t.Data))
	}
	head.WriteByte('}')
	for head.Len()%8 != 0 {
		head.WriteByte(' ')
	}
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(head.Len()))
	if _, err := w.Write(l[:]); err != nil {
		return err
	}
	if _, err := w.Write(head.Bytes()); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}
