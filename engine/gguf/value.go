package gguf

import (
	"fmt"
	"math"
	"sort"
)

// Value is one metadata value. Scalars are held as their Go type (uint8 … int64, float32,
// float64, bool, string); arrays as a typed slice ([]uint8 … []float64, []bool, []string) or,
// for arrays of arrays, as []Value.
type Value struct {
	typ  ValueType
	elem ValueType // element type of an array
	v    any
}

// Type is the value's GGUF type.
func (v Value) Type() ValueType { return v.typ }

// ElemType is the element type of an array value (meaningless for scalars).
func (v Value) ElemType() ValueType { return v.elem }

// Any returns the value as its Go representation (see Value).
func (v Value) Any() any { return v.v }

// Len is the number of elements of an array value, or 0 for a scalar.
func (v Value) Len() int {
	if v.typ != TypeArray {
		return 0
	}
	switch a := v.v.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float32:
		return len(a)
	case []float64:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []Value:
		return len(a)
	}
	return 0
}

func (v Value) describe() string {
	if v.typ == TypeArray {
		return "array of " + v.elem.String()
	}
	return v.typ.String()
}

// AsString returns a string value.
func (v Value) AsString() (string, bool) {
	s, ok := v.v.(string)
	return s, ok && v.typ == TypeString
}

// AsInt returns an integer value of any width as int64 (false for a uint64 above MaxInt64).
func (v Value) AsInt() (int64, bool) {
	switch x := v.v.(type) {
	case uint8:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case int16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	}
	return 0, false
}

// AsUint returns a non-negative integer value of any width as uint64.
func (v Value) AsUint() (uint64, bool) {
	if x, ok := v.v.(uint64); ok {
		return x, true
	}
	i, ok := v.AsInt()
	if !ok || i < 0 {
		return 0, false
	}
	return uint64(i), true
}

// AsFloat returns a float32 or float64 value as float64.
func (v Value) AsFloat() (float64, bool) {
	switch x := v.v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// AsBool returns a bool value.
func (v Value) AsBool() (bool, bool) {
	b, ok := v.v.(bool)
	return b, ok
}

// AsStrings returns an array of strings.
func (v Value) AsStrings() ([]string, bool) {
	s, ok := v.v.([]string)
	return s, ok
}

// AsInts returns an array of integers of any width, converted to int64.
func (v Value) AsInts() ([]int64, bool) {
	conv := func(n int, at func(int) int64) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = at(i)
		}
		return out
	}
	switch a := v.v.(type) {
	case []int64:
		return append([]int64(nil), a...), true
	case []uint8:
		return conv(len(a), func(i int) int64 { return int64(a[i]) }), true
	case []int8:
		return conv(len(a), func(i int) int64 { return int64(a[i]) }), true
	case []uint16:
		return conv(len(a), func(i int) int64 { return int64(a[i]) }), true
	case []int16:
		return conv(len(a), func(i int) int64 { return int64(a[i]) }), true
	case []uint32:
		return conv(len(a), func(i int) int64 { return int64(a[i]) }), true
	case []int32:
		return conv(len(a), func(i int) int64 { return int64(a[i]) }), true
	case []uint64:
		for _, x := range a {
			if x > math.MaxInt64 {
				return nil, false
			}
		}
		return conv(len(a), func(i int) int64 { return int64(a[i]) }), true
	}
	return nil, false
}

// AsFloats returns an array of float32 or float64 as float64.
func (v Value) AsFloats() ([]float64, bool) {
	switch a := v.v.(type) {
	case []float64:
		return append([]float64(nil), a...), true
	case []float32:
		out := make([]float64, len(a))
		for i, x := range a {
			out[i] = float64(x)
		}
		return out, true
	}
	return nil, false
}

// ValueOf builds a Value from a Go value: uint8, int8, uint16, int16, uint32, int32, uint64,
// int64, float32, float64, bool, string, a slice of any of these, []Value (an array of
// arrays; every element must be an array) or a Value. int and []int are stored as int64.
func ValueOf(x any) (Value, error) {
	switch v := x.(type) {
	case Value:
		return v, nil
	case uint8:
		return Value{typ: TypeUint8, v: v}, nil
	case int8:
		return Value{typ: TypeInt8, v: v}, nil
	case uint16:
		return Value{typ: TypeUint16, v: v}, nil
	case int16:
		return Value{typ: TypeInt16, v: v}, nil
	case uint32:
		return Value{typ: TypeUint32, v: v}, nil
	case int32:
		return Value{typ: TypeInt32, v: v}, nil
	case uint64:
		return Value{typ: TypeUint64, v: v}, nil
	case int64:
		return Value{typ: TypeInt64, v: v}, nil
	case int:
		return Value{typ: TypeInt64, v: int64(v)}, nil
	case float32:
		return Value{typ: TypeFloat32, v: v}, nil
	case float64:
		return Value{typ: TypeFloat64, v: v}, nil
	case bool:
		return Value{typ: TypeBool, v: v}, nil
	case string:
		return Value{typ: TypeString, v: v}, nil
	case []uint8:
		return arrayValue(TypeUint8, v), nil
	case []int8:
		return arrayValue(TypeInt8, v), nil
	case []uint16:
		return arrayValue(TypeUint16, v), nil
	case []int16:
		return arrayValue(TypeInt16, v), nil
	case []uint32:
		return arrayValue(TypeUint32, v), nil
	case []int32:
		return arrayValue(TypeInt32, v), nil
	case []uint64:
		return arrayValue(TypeUint64, v), nil
	case []int64:
		return arrayValue(TypeInt64, v), nil
	case []int:
		a := make([]int64, len(v))
		for i, e := range v {
			a[i] = int64(e)
		}
		return arrayValue(TypeInt64, a), nil
	case []float32:
		return arrayValue(TypeFloat32, v), nil
	case []float64:
		return arrayValue(TypeFloat64, v), nil
	case []bool:
		return arrayValue(TypeBool, v), nil
	case []string:
		return arrayValue(TypeString, v), nil
	case []Value:
		for i, e := range v {
			if e.typ != TypeArray {
				return Value{}, fmt.Errorf("gguf: array of arrays: element %d is %s", i, e.describe())
			}
		}
		return arrayValue(TypeArray, v), nil
	}
	return Value{}, fmt.Errorf("gguf: cannot store a %T as a metadata value", x)
}

func arrayValue[T any](elem ValueType, a []T) Value {
	return Value{typ: TypeArray, elem: elem, v: a}
}

// KV is a file's metadata, by key.
type KV map[string]Value

// Set stores x (see ValueOf) under key.
func (kv KV) Set(key string, x any) error {
	v, err := ValueOf(x)
	if err != nil {
		return fmt.Errorf("gguf: key %q: %w", key, err)
	}
	kv[key] = v
	return nil
}

// Has reports whether key is present.
func (kv KV) Has(key string) bool {
	_, ok := kv[key]
	return ok
}

// Keys returns the keys in sorted order.
func (kv KV) Keys() []string {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (kv KV) get(key string) (Value, error) {
	v, ok := kv[key]
	if !ok {
		return Value{}, fmt.Errorf("gguf: metadata key %q not found", key)
	}
	return v, nil
}

func typeErr(key string, v Value, want string) error {
	return fmt.Errorf("gguf: metadata key %q is %s, want %s", key, v.describe(), want)
}

// String returns the string stored under key.
func (kv KV) String(key string) (string, error) {
	v, err := kv.get(key)
	if err != nil {
		return "", err
	}
	s, ok := v.AsString()
	if !ok {
		return "", typeErr(key, v, "string")
	}
	return s, nil
}

// Int returns the integer (of any width) stored under key.
func (kv KV) Int(key string) (int64, error) {
	v, err := kv.get(key)
	if err != nil {
		return 0, err
	}
	i, ok := v.AsInt()
	if !ok {
		return 0, typeErr(key, v, "an integer that fits int64")
	}
	return i, nil
}

// Uint returns the non-negative integer (of any width) stored under key.
func (kv KV) Uint(key string) (uint64, error) {
	v, err := kv.get(key)
	if err != nil {
		return 0, err
	}
	u, ok := v.AsUint()
	if !ok {
		return 0, typeErr(key, v, "a non-negative integer")
	}
	return u, nil
}

// Float returns the float32 or float64 stored under key.
func (kv KV) Float(key string) (float64, error) {
	v, err := kv.get(key)
	if err != nil {
		return 0, err
	}
	f, ok := v.AsFloat()
	if !ok {
		return 0, typeErr(key, v, "float32 or float64")
	}
	return f, nil
}

// Bool returns the bool stored under key.
func (kv KV) Bool(key string) (bool, error) {
	v, err := kv.get(key)
	if err != nil {
		return false, err
	}
	b, ok := v.AsBool()
	if !ok {
		return false, typeErr(key, v, "bool")
	}
	return b, nil
}

// Strings returns the array of strings stored under key (shared, do not modify).
func (kv KV) Strings(key string) ([]string, error) {
	v, err := kv.get(key)
	if err != nil {
		return nil, err
	}
	s, ok := v.AsStrings()
	if !ok {
		return nil, typeErr(key, v, "array of string")
	}
	return s, nil
}

// Ints returns the array of integers (of any width) stored under key, as a new []int64.
func (kv KV) Ints(key string) ([]int64, error) {
	v, err := kv.get(key)
	if err != nil {
		return nil, err
	}
	a, ok := v.AsInts()
	if !ok {
		return nil, typeErr(key, v, "array of integers")
	}
	return a, nil
}

// Floats returns the array of float32 or float64 stored under key, as a new []float64.
func (kv KV) Floats(key string) ([]float64, error) {
	v, err := kv.get(key)
	if err != nil {
		return nil, err
	}
	a, ok := v.AsFloats()
	if !ok {
		return nil, typeErr(key, v, "array of float32 or float64")
	}
	return a, nil
}
