package ckpt

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// A pickle is a program for Python's unpickling stack machine. This is a reader of the
// subset torch checkpoints use (protocols 2 to 5), written so that it never executes
// anything: GLOBAL and STACK_GLOBAL resolve a name through an allow-list (Resolver) to an
// inert Go value; REDUCE and NEWOBJ may only call what the allow-list returned; any other
// global, and any opcode outside the list below, is an error. Every length is checked
// against the bytes left before anything is allocated, the stack, the mark stack and the
// memo are bounded, and values are plain Go data (Dict, *List, Tuple, *Object, scalars)
// walked without recursion limits being left to chance (see maxDepth).

// Pickle values.
type (
	// Tuple is a Python tuple.
	Tuple []any
	// List is a Python list (a pointer: APPENDS mutates it after it is memoised).
	List struct{ Items []any }
	// Dict is a Python dict or OrderedDict, in insertion order. Attrs holds what BUILD set
	// on it (an OrderedDict's _metadata), which is ignored.
	Dict struct {
		Keys   []any
		Values []any
		Attrs  any
	}
	// Object is an instance of a class the allow-list accepts as a plain record, as
	// TorchScript writes its modules (__torch__.*): NEWOBJ makes it, BUILD sets its state.
	Object struct {
		Class string // "module.Name"
		Args  Tuple
		State any
	}
	// None is Python's None.
	None struct{}
	// BigInt is an integer too large for int64: its little-endian two's complement bytes
	// (legacy torch files start with such a magic number).
	BigInt []byte
	// Global is the name of a GLOBAL/STACK_GLOBAL a resolver turned into a marker (a
	// storage type, a dtype, a class); it cannot be called unless the resolver says so.
	Global struct{ Module, Name string }
)

// Get returns the value of key k (a string) in d.
func (d *Dict) Get(k string) (any, bool) {
	for i, key := range d.Keys {
		if s, ok := key.(string); ok && s == k {
			return d.Values[i], true
		}
	}
	return nil, false
}

// Callable is a global the resolver allows REDUCE to call: a pure Go function of its
// argument tuple (a tensor rebuild, a container constructor). It must not retain args.
type Callable struct {
	Name string
	Call func(args Tuple) (any, error)
}

// Class is a global NEWOBJ may instantiate (it builds an *Object record).
type Class struct{ Name string }

// Resolver maps a GLOBAL to an inert value: a *Callable, a *Class, a Global marker or any
// other value; an error refuses the global.
type Resolver func(module, name string) (any, error)

// PersistentLoader resolves a BINPERSID id (torch: a storage record).
type PersistentLoader func(pid any) (any, error)

// Limits of the unpickler. Real torch pickles are far below them.
const (
	maxStack      = 1 << 20 // values on the stack
	maxMarks      = 1 << 16 // open MARKs
	maxMemo       = 1 << 22 // memo index (BINPUT/LONG_BINPUT/MEMOIZE)
	maxString     = 1 << 28 // one string or bytes value
	maxGlobalName = 1 << 10 // a GLOBAL's module or name
	maxLongBytes  = 32      // LONG1/LONG4: longer integers are refused; past 8 bytes, BigInt
	maxDepth      = 64      // container nesting walked by Flatten and describe
)

// Pickle opcodes (Python's pickletools names).
const (
	opMARK            = '('
	opSTOP            = '.'
	opPOP             = '0'
	opPOPMARK         = '1'
	opDUP             = '2'
	opBININT          = 'J'
	opBININT1         = 'K'
	opBININT2         = 'M'
	opNONE            = 'N'
	opBINPERSID       = 'Q'
	opREDUCE          = 'R'
	opBINSTRING       = 'T'
	opSHORTBINSTRING  = 'U'
	opBINUNICODE      = 'X'
	opAPPEND          = 'a'
	opBUILD           = 'b'
	opGLOBAL          = 'c'
	opDICT            = 'd'
	opEMPTYDICT       = '}'
	opAPPENDS         = 'e'
	opBINGET          = 'h'
	opLONGBINGET      = 'j'
	opLIST            = 'l'
	opEMPTYLIST       = ']'
	opBINPUT          = 'q'
	opLONGBINPUT      = 'r'
	opSETITEM         = 's'
	opTUPLE           = 't'
	opEMPTYTUPLE      = ')'
	opSETITEMS        = 'u'
	opBINFLOAT        = 'G'
	opPROTO           = 0x80
	opNEWOBJ          = 0x81
	opTUPLE1          = 0x85
	opTUPLE2          = 0x86
	opTUPLE3          = 0x87
	opNEWTRUE         = 0x88
	opNEWFALSE        = 0x89
	opLONG1           = 0x8a
	opLONG4           = 0x8b
	opSHORTBINBYTES   = 'C'
	opBINBYTES        = 'B'
	opSHORTBINUNICODE = 0x8c
	opBINUNICODE8     = 0x8d
	opBINBYTES8       = 0x8e
	opEMPTYSET        = 0x8f
	opADDITEMS        = 0x90
	opFROZENSET       = 0x91
	opSTACKGLOBAL     = 0x93
	opMEMOIZE         = 0x94
	opFRAME           = 0x95
	opBYTEARRAY8      = 0x96
)

// unpickler runs one pickle.
type unpickler struct {
	r       *bufio.Reader
	left    int64 // bytes the source may still supply
	pos     int64 // offset of the next byte
	stack   []any
	marks   []int
	memo    map[uint32]any
	resolve Resolver
	persist PersistentLoader
}

// Unpickle runs the pickle in r (at most limit bytes) up to its STOP and returns the
// value it built and the number of bytes it read. resolve decides every GLOBAL, persist
// every BINPERSID (nil: refused).
func Unpickle(r io.Reader, limit int64, resolve Resolver, persist PersistentLoader) (any, int64, error) {
	u := &unpickler{r: bufio.NewReaderSize(io.LimitReader(r, limit), 64<<10), left: limit,
		memo: map[uint32]any{}, resolve: resolve, persist: persist}
	v, err := u.run()
	if err != nil {
		return nil, u.pos, fmt.Errorf("pickle: at byte %d: %w", u.pos, err)
	}
	return v, u.pos, nil
}

var errTruncated = errors.New("truncated (the pickle ends before STOP)")

func (u *unpickler) byte() (byte, error) {
	b, err := u.r.ReadByte()
	if err != nil {
		if err == io.EOF {
			return 0, errTruncated
		}
		return 0, err
	}
	u.pos++
	u.left--
	return b, nil
}

// bytes reads n bytes, after checking that the source can still hold them.
func (u *unpickler) bytes(n uint64, what string) ([]byte, error) {
	if n > uint64(u.left) {
		return nil, fmt.Errorf("%s of %d bytes, but only %d are left", what, n, u.left)
	}
	if n > maxString {
		return nil, fmt.Errorf("%s of %d bytes (at most %d)", what, n, maxString)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(u.r, b); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, errTruncated
		}
		return nil, err
	}
	u.pos += int64(n)
	u.left -= int64(n)
	return b, nil
}

func (u *unpickler) uint(n int) (uint64, error) {
	b, err := u.bytes(uint64(n), "integer")
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v, nil
}

// line reads a newline-terminated name (GLOBAL's operands).
func (u *unpickler) line() (string, error) {
	var sb strings.Builder
	for {
		b, err := u.byte()
		if err != nil {
			return "", err
		}
		if b == '\n' {
			return sb.String(), nil
		}
		if sb.Len() >= maxGlobalName {
			return "", fmt.Errorf("GLOBAL name longer than %d bytes", maxGlobalName)
		}
		sb.WriteByte(b)
	}
}

func (u *unpickler) push(v any) error {
	if len(u.stack) >= maxStack {
		return fmt.Errorf("stack deeper than %d values", maxStack)
	}
	u.stack = append(u.stack, v)
	return nil
}

func (u *unpickler) pop() (any, error) {
	if len(u.stack) == 0 || len(u.marks) > 0 && len(u.stack) <= u.marks[len(u.marks)-1] {
		return nil, errors.New("pop from an empty stack")
	}
	v := u.stack[len(u.stack)-1]
	u.stack = u.stack[:len(u.stack)-1]
	return v, nil
}

func (u *unpickler) top() (any, error) {
	if len(u.stack) == 0 || len(u.marks) > 0 && len(u.stack) <= u.marks[len(u.marks)-1] {
		return nil, errors.New("empty stack")
	}
	return u.stack[len(u.stack)-1], nil
}

// popMark returns the values pushed since the last MARK and removes them and the mark.
func (u *unpickler) popMark() ([]any, error) {
	if len(u.marks) == 0 {
		return nil, errors.New("no MARK to pop to")
	}
	m := u.marks[len(u.marks)-1]
	u.marks = u.marks[:len(u.marks)-1]
	items := append([]any(nil), u.stack[m:]...)
	u.stack = u.stack[:m]
	return items, nil
}

func (u *unpickler) put(idx uint64) error {
	if idx >= maxMemo {
		return fmt.Errorf("memo index %d (at most %d)", idx, maxMemo-1)
	}
	v, err := u.top()
	if err != nil {
		return err
	}
	u.memo[uint32(idx)] = v
	return nil
}

func (u *unpickler) get(idx uint64) error {
	v, ok := u.memo[uint32(idx)]
	if idx >= maxMemo || !ok {
		return fmt.Errorf("memo index %d was never stored", idx)
	}
	return u.push(v)
}

func (u *unpickler) global(module, name string) error {
	if u.resolve == nil {
		return fmt.Errorf("global %s.%s is not allowed", module, name)
	}
	v, err := u.resolve(module, name)
	if err != nil {
		return err
	}
	return u.push(v)
}

func setItems(d any, kv []any) error {
	dict, ok := d.(*Dict)
	if !ok {
		return fmt.Errorf("SETITEM(S) on %s, not a dict", describe(d))
	}
	if len(kv)%2 != 0 {
		return errors.New("SETITEMS with an odd number of values")
	}
	for i := 0; i < len(kv); i += 2 {
		dict.Keys = append(dict.Keys, kv[i])
		dict.Values = append(dict.Values, kv[i+1])
	}
	return nil
}

func appendItems(l any, items []any) error {
	list, ok := l.(*List)
	if !ok {
		return fmt.Errorf("APPEND(S) on %s, not a list", describe(l))
	}
	list.Items = append(list.Items, items...)
	return nil
}

func (u *unpickler) run() (any, error) {
	for {
		op, err := u.byte()
		if err != nil {
			return nil, err
		}
		switch op {
		case opPROTO:
			v, err := u.byte()
			if err != nil {
				return nil, err
			}
			if v < 2 || v > 5 {
				return nil, fmt.Errorf("pickle protocol %d (2 to 5 are read)", v)
			}
		case opFRAME:
			n, err := u.uint(8)
			if err != nil {
				return nil, err
			}
			if n > uint64(u.left) {
				return nil, fmt.Errorf("FRAME of %d bytes, but only %d are left", n, u.left)
			}
		case opSTOP:
			v, err := u.pop()
			if err != nil {
				return nil, err
			}
			if len(u.stack) != 0 || len(u.marks) != 0 {
				return nil, fmt.Errorf("STOP with %d values and %d marks left", len(u.stack), len(u.marks))
			}
			return v, nil
		case opMARK:
			if len(u.marks) >= maxMarks {
				return nil, fmt.Errorf("more than %d open MARKs", maxMarks)
			}
			u.marks = append(u.marks, len(u.stack))
		case opPOP:
			if len(u.marks) > 0 && u.marks[len(u.marks)-1] == len(u.stack) {
				// POP right after a MARK discards the mark (pickle's own behaviour).
				u.marks = u.marks[:len(u.marks)-1]
			} else if _, err := u.pop(); err != nil {
				return nil, err
			}
		case opPOPMARK:
			if _, err := u.popMark(); err != nil {
				return nil, err
			}
		case opDUP:
			v, err := u.top()
			if err != nil {
				return nil, err
			}
			if err := u.push(v); err != nil {
				return nil, err
			}
		case opNONE:
			err = u.push(None{})
		case opNEWTRUE:
			err = u.push(true)
		case opNEWFALSE:
			err = u.push(false)
		case opBININT:
			var v uint64
			if v, err = u.uint(4); err == nil {
				err = u.push(int64(int32(uint32(v))))
			}
		case opBININT1:
			var v uint64
			if v, err = u.uint(1); err == nil {
				err = u.push(int64(v))
			}
		case opBININT2:
			var v uint64
			if v, err = u.uint(2); err == nil {
				err = u.push(int64(v))
			}
		case opLONG1, opLONG4:
			var n uint64
			if op == opLONG1 {
				n, err = u.uint(1)
			} else {
				n, err = u.uint(4)
			}
			if err != nil {
				return nil, err
			}
			if n > maxLongBytes {
				return nil, fmt.Errorf("integer of %d bytes (at most %d)", n, maxLongBytes)
			}
			b, err := u.bytes(n, "integer")
			if err != nil {
				return nil, err
			}
			if n > 8 {
				if err := u.push(BigInt(b)); err != nil {
					return nil, err
				}
				continue
			}
			var v uint64
			for i := len(b) - 1; i >= 0; i-- {
				v = v<<8 | uint64(b[i])
			}
			if n > 0 && n < 8 && b[n-1]&0x80 != 0 { // sign-extend two's complement
				v |= ^uint64(0) << (8 * n)
			}
			err = u.push(int64(v))
		case opBINFLOAT:
			b, err := u.bytes(8, "float")
			if err != nil {
				return nil, err
			}
			err = u.push(math.Float64frombits(binary.BigEndian.Uint64(b)))
			if err != nil {
				return nil, err
			}
		case opSHORTBINUNICODE, opBINUNICODE, opBINUNICODE8, opSHORTBINSTRING, opBINSTRING:
			var n uint64
			switch op {
			case opSHORTBINUNICODE, opSHORTBINSTRING:
				n, err = u.uint(1)
			case opBINUNICODE, opBINSTRING:
				n, err = u.uint(4)
			default:
				n, err = u.uint(8)
			}
			if err != nil {
				return nil, err
			}
			b, err := u.bytes(n, "string")
			if err != nil {
				return nil, err
			}
			err = u.push(string(b))
			if err != nil {
				return nil, err
			}
		case opSHORTBINBYTES, opBINBYTES, opBINBYTES8, opBYTEARRAY8:
			var n uint64
			switch op {
			case opSHORTBINBYTES:
				n, err = u.uint(1)
			case opBINBYTES:
				n, err = u.uint(4)
			default:
				n, err = u.uint(8)
			}
			if err != nil {
				return nil, err
			}
			b, err := u.bytes(n, "bytes")
			if err != nil {
				return nil, err
			}
			err = u.push(b)
			if err != nil {
				return nil, err
			}
		case opEMPTYDICT:
			err = u.push(&Dict{})
		case opEMPTYLIST:
			err = u.push(&List{})
		case opEMPTYTUPLE:
			err = u.push(Tuple{})
		case opEMPTYSET:
			err = u.push(&List{}) // a set's members, as a list
		case opDICT:
			items, err := u.popMark()
			if err != nil {
				return nil, err
			}
			d := &Dict{}
			if err := setItems(d, items); err != nil {
				return nil, err
			}
			err = u.push(d)
			if err != nil {
				return nil, err
			}
		case opLIST:
			items, err := u.popMark()
			if err != nil {
				return nil, err
			}
			err = u.push(&List{Items: items})
			if err != nil {
				return nil, err
			}
		case opTUPLE, opFROZENSET:
			items, err := u.popMark()
			if err != nil {
				return nil, err
			}
			err = u.push(Tuple(items))
			if err != nil {
				return nil, err
			}
		case opTUPLE1, opTUPLE2, opTUPLE3:
			n := int(op-opTUPLE1) + 1
			t := make(Tuple, n)
			for i := n - 1; i >= 0; i-- {
				if t[i], err = u.pop(); err != nil {
					return nil, err
				}
			}
			err = u.push(t)
		case opSETITEM:
			v, err := u.pop()
			if err != nil {
				return nil, err
			}
			k, err := u.pop()
			if err != nil {
				return nil, err
			}
			d, err := u.top()
			if err != nil {
				return nil, err
			}
			err = setItems(d, []any{k, v})
			if err != nil {
				return nil, err
			}
		case opSETITEMS, opAPPENDS, opADDITEMS:
			items, err := u.popMark()
			if err != nil {
				return nil, err
			}
			target, err := u.top()
			if err != nil {
				return nil, err
			}
			if op == opSETITEMS {
				err = setItems(target, items)
			} else {
				err = appendItems(target, items)
			}
			if err != nil {
				return nil, err
			}
		case opAPPEND:
			v, err := u.pop()
			if err != nil {
				return nil, err
			}
			l, err := u.top()
			if err != nil {
				return nil, err
			}
			if err := appendItems(l, []any{v}); err != nil {
				return nil, err
			}
		case opBINPUT:
			var i uint64
			if i, err = u.uint(1); err == nil {
				err = u.put(i)
			}
		case opLONGBINPUT:
			var i uint64
			if i, err = u.uint(4); err == nil {
				err = u.put(i)
			}
		case opMEMOIZE:
			err = u.put(uint64(len(u.memo)))
		case opBINGET:
			var i uint64
			if i, err = u.uint(1); err == nil {
				err = u.get(i)
			}
		case opLONGBINGET:
			var i uint64
			if i, err = u.uint(4); err == nil {
				err = u.get(i)
			}
		case opGLOBAL:
			module, err := u.line()
			if err != nil {
				return nil, err
			}
			name, err := u.line()
			if err != nil {
				return nil, err
			}
			if err := u.global(module, name); err != nil {
				return nil, err
			}
		case opSTACKGLOBAL:
			n, err := u.pop()
			if err != nil {
				return nil, err
			}
			m, err := u.pop()
			if err != nil {
				return nil, err
			}
			module, ok1 := m.(string)
			name, ok2 := n.(string)
			if !ok1 || !ok2 {
				return nil, errors.New("STACK_GLOBAL needs two strings")
			}
			if len(module) > maxGlobalName || len(name) > maxGlobalName {
				return nil, fmt.Errorf("STACK_GLOBAL name longer than %d bytes", maxGlobalName)
			}
			if err := u.global(module, name); err != nil {
				return nil, err
			}
		case opREDUCE:
			a, err := u.pop()
			if err != nil {
				return nil, err
			}
			f, err := u.pop()
			if err != nil {
				return nil, err
			}
			args, ok := a.(Tuple)
			if !ok {
				return nil, fmt.Errorf("REDUCE with %s as arguments, not a tuple", describe(a))
			}
			c, ok := f.(*Callable)
			if !ok {
				return nil, fmt.Errorf("REDUCE calls %s, which is not an allowed function", describe(f))
			}
			v, err := c.Call(args)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.Name, err)
			}
			err = u.push(v)
			if err != nil {
				return nil, err
			}
		case opNEWOBJ:
			a, err := u.pop()
			if err != nil {
				return nil, err
			}
			c, err := u.pop()
			if err != nil {
				return nil, err
			}
			args, ok := a.(Tuple)
			if !ok {
				return nil, fmt.Errorf("NEWOBJ with %s as arguments, not a tuple", describe(a))
			}
			cls, ok := c.(*Class)
			if !ok {
				return nil, fmt.Errorf("NEWOBJ of %s, which is not an allowed class", describe(c))
			}
			err = u.push(&Object{Class: cls.Name, Args: args})
			if err != nil {
				return nil, err
			}
		case opBUILD:
			state, err := u.pop()
			if err != nil {
				return nil, err
			}
			obj, err := u.top()
			if err != nil {
				return nil, err
			}
			switch o := obj.(type) {
			case *Object:
				if o.State != nil {
					return nil, fmt.Errorf("BUILD twice on %s", o.Class)
				}
				o.State = state
			case *Dict:
				o.Attrs = state // OrderedDict attributes (_metadata): not needed
			case *TensorRef:
				// A tensor's extra state (hooks, requires_grad of subclasses): ignored.
			default:
				return nil, fmt.Errorf("BUILD on %s", describe(obj))
			}
		case opBINPERSID:
			pid, err := u.pop()
			if err != nil {
				return nil, err
			}
			if u.persist == nil {
				return nil, errors.New("persistent id where none is expected")
			}
			v, err := u.persist(pid)
			if err != nil {
				return nil, err
			}
			err = u.push(v)
			if err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("opcode %s is not supported", opName(op))
		}
		if err != nil {
			return nil, err
		}
	}
}

// opName spells an opcode byte for an error message.
func opName(op byte) string {
	if op >= 0x20 && op < 0x7f {
		return strconv.Quote(string(rune(op))) + fmt.Sprintf(" (0x%02x)", op)
	}
	return fmt.Sprintf("0x%02x", op)
}

// describe is a short description of a pickle value for error messages.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "nothing"
	case None:
		return "None"
	case *Callable:
		return x.Name
	case *Class:
		return "class " + x.Name
	case Global:
		return x.Module + "." + x.Name
	case *Object:
		return "an object of " + x.Class
	case *Dict:
		return "a dict"
	case *List:
		return "a list"
	case Tuple:
		return fmt.Sprintf("a tuple of %d", len(x))
	case string:
		if len(x) > 40 {
			x = x[:40] + "…"
		}
		return strconv.Quote(x)
	case *TensorRef:
		return "a tensor"
	case *storageRef:
		return "a storage"
	}
	return fmt.Sprintf("%T", v)
}
