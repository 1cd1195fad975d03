// Package gguf reads and writes GGUF files (versions 2 and 3), the container the inference
// engine loads weights, configs and tokenizers from.
//
// Layout of a GGUF file (all integers little-endian):
//
//	magic "GGUF" | version u32 | tensor count u64 | metadata count u64
//	metadata:    key string | value type u32 | value
//	tensor info: name string | n_dims u32 | dims u64[n_dims] | ggml type u32 | offset u64
//	padding to the alignment (general.alignment, default 32)
//	tensor data; each tensor's offset is relative to the start of this section
//
// A string is a u64 byte length followed by the bytes; an array is an element type u32, a
// u64 count and the elements. Tensor dims are stored in ggml order, innermost (fastest
// varying) first, which is the reverse of the PyTorch shape.
//
// Tensor data is dequantised to float32 on load (Dequantize, File.Float32): F32, F16, BF16,
// Q8_0 and Q4_K, bit-exact with ggml's reference dequantisers. Model is the view used to
// load weights: logical names, PyTorch-order shapes, namespaces and embedded files in the
// packaging of the audio.cpp model files (falling back to plain GGUF names and shapes).
//
// The parser treats its input as hostile: every count, length, dimension and offset is
// checked against the size of the file before anything is allocated, so a corrupt or
// malicious file produces an error, never a panic or a huge allocation.
package gguf

import "fmt"

// ValueType is the type tag of a metadata value.
type ValueType uint32

// Metadata value types, as numbered by the GGUF specification.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{
	TypeUint8: "uint8", TypeInt8: "int8", TypeUint16: "uint16", TypeInt16: "int16",
	TypeUint32: "uint32", TypeInt32: "int32", TypeFloat32: "float32", TypeBool: "bool",
	TypeString: "string", TypeArray: "array", TypeUint64: "uint64", TypeInt64: "int64",
	TypeFloat64: "float64",
}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("ValueType(%d)", uint32(t))
}

// valid reports whether t is a known value type.
func (t ValueType) valid() bool { return t <= TypeFloat64 }

// fixedSize is the encoded size of a scalar of type t, or 0 for strings and arrays.
func (t ValueType) fixedSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize is the smallest possible encoding of a value of type t.
func (t ValueType) minSize() int {
	switch t {
	case TypeString:
		return 8 // length
	case TypeArray:
		return 12 // element type + count
	}
	return t.fixedSize()
}

// DType is a ggml tensor element type.
type DType uint32

// ggml tensor types, as numbered by ggml (gaps are types that were removed from the format).
const (
	F32     DType = 0
	F16     DType = 1
	Q4_0    DType = 2
	Q4_1    DType = 3
	Q5_0    DType = 6
	Q5_1    DType = 7
	Q8_0    DType = 8
	Q8_1    DType = 9
	Q2_K    DType = 10
	Q3_K    DType = 11
	Q4_K    DType = 12
	Q5_K    DType = 13
	Q6_K    DType = 14
	Q8_K    DType = 15
	IQ2_XXS DType = 16
	IQ2_XS  DType = 17
	IQ3_XXS DType = 18
	IQ1_S   DType = 19
	IQ4_NL  DType = 20
	IQ3_S   DType = 21
	IQ2_S   DType = 22
	IQ4_XS  DType = 23
	I8      DType = 24
	I16     DType = 25
	I32     DType = 26
	I64     DType = 27
	F64     DType = 28
	IQ1_M   DType = 29
	BF16    DType = 30
	TQ1_0   DType = 34
	TQ2_0   DType = 35
	MXFP4   DType = 39
)

type dtypeInfo struct {
	name      string
	blockSize uint64 // elements per block
	blockLen  uint64 // bytes per block
}

// dtypes lists the layout of every known type: a row of n elements (n a multiple of the
// block size) takes n/blockSize*blockLen bytes.
var dtypes = map[DType]dtypeInfo{
	F32:     {"F32", 1, 4},
	F16:     {"F16", 1, 2},
	Q4_0:    {"Q4_0", 32, 18},
	Q4_1:    {"Q4_1", 32, 20},
	Q5_0:    {"Q5_0", 32, 22},
	Q5_1:    {"Q5_1", 32, 24},
	Q8_0:    {"Q8_0", 32, 34},
	Q8_1:    {"Q8_1", 32, 36},
	Q2_K:    {"Q2_K", 256, 84},
	Q3_K:    {"Q3_K", 256, 110},
	Q4_K:    {"Q4_K", 256, 144},
	Q5_K:    {"Q5_K", 256, 176},
	Q6_K:    {"Q6_K", 256, 210},
	Q8_K:    {"Q8_K", 256, 292},
	IQ2_XXS: {"IQ2_XXS", 256, 66},
	IQ2_XS:  {"IQ2_XS", 256, 74},
	IQ3_XXS: {"IQ3_XXS", 256, 98},
	IQ1_S:   {"IQ1_S", 256, 50},
	IQ4_NL:  {"IQ4_NL", 32, 18},
	IQ3_S:   {"IQ3_S", 256, 110},
	IQ2_S:   {"IQ2_S", 256, 82},
	IQ4_XS:  {"IQ4_XS", 256, 136},
	I8:      {"I8", 1, 1},
	I16:     {"I16", 1, 2},
	I32:     {"I32", 1, 4},
	I64:     {"I64", 1, 8},
	F64:     {"F64", 1, 8},
	IQ1_M:   {"IQ1_M", 256, 56},
	BF16:    {"BF16", 1, 2},
	TQ1_0:   {"TQ1_0", 256, 54},
	TQ2_0:   {"TQ2_0", 256, 66},
	MXFP4:   {"MXFP4", 32, 17},
}

func (d DType) String() string {
	if info, ok := dtypes[d]; ok {
		return info.name
	}
	return fmt.Sprintf("DType(%d)", uint32(d))
}

// BlockSize is the number of elements in one quantisation block (1 for plain types), or 0
// for an unknown type.
func (d DType) BlockSize() int { return int(dtypes[d].blockSize) }

// BlockBytes is the encoded size in bytes of one block, or 0 for an unknown type.
func (d DType) BlockBytes() int { return int(dtypes[d].blockLen) }
