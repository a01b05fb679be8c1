// Package gguf writes GGUF v3 files, the format llama.cpp and Ollama load:
// a header of typed key-value metadata, a table of tensor infos, then the
// tensor data, each piece aligned to 32 bytes. Tensors are stored as F32,
// F16, BF16 or Q8_0 (blocks of 32 int8 values sharing one f16 scale).
//
// The layout follows the GGUF specification (ggml/docs/gguf.md): dimensions
// are listed innermost first, so a row-major [rows, cols] matrix is written
// with dims [cols, rows].
package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/half"
)

// Type is a tensor's ggml type.
type Type uint32

// The ggml types this writer produces (ggml.h's enum ggml_type).
const (
	F32  Type = 0
	F16  Type = 1
	Q8_0 Type = 8
	BF16 Type = 30
)

// QK8_0 is the number of values in one Q8_0 block.
const QK8_0 = 32

func (t Type) String() string {
	switch t {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case Q8_0:
		return "Q8_0"
	case BF16:
		return "BF16"
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// ParseType reads the names llama.cpp's converter accepts for --outtype.
func ParseType(s string) (Type, error) {
	switch s {
	case "f32", "F32":
		return F32, nil
	case "f16", "F16":
		return F16, nil
	case "bf16", "BF16":
		return BF16, nil
	case "q8_0", "Q8_0":
		return Q8_0, nil
	}
	return 0, fmt.Errorf("type %q is not one of f32, f16, bf16, q8_0", s)
}

// FileType is general.file_type for a file whose large tensors are t
// (llama.h's enum llama_ftype).
func (t Type) FileType() uint32 {
	switch t {
	case F16:
		return 1
	case Q8_0:
		return 7
	case BF16:
		return 32
	}
	return 0
}

// Size is the number of bytes n values of type t take.
func (t Type) Size(n int) int {
	switch t {
	case F16, BF16:
		return 2 * n
	case Q8_0:
		return n / QK8_0 * (2 + QK8_0)
	}
	return 4 * n
}

// KV is one metadata entry. Value is one of uint8, int8, uint16, int16,
// uint32, int32, uint64, int64, float32, float64, bool, string or a slice of
// one of those.
type KV struct {
	Key   string
	Value any
}

// Tensor is one tensor to write. Dims are innermost first; Data holds the
// values in row-major order of the reversed dims (as a Go or PyTorch
// tensor of shape [dims[n-1], ..., dims[0]] stores them).
//
// A tensor may give Load instead of Data: the writer calls it when the
// tensor's turn comes and drops the values after, so an export holds one
// tensor at a time, whatever the model's size.
type Tensor struct {
	Name string
	Dims []uint64
	Type Type
	Data []float32
	Load func() []float32
}

// Len is the number of values its dims give.
func (t Tensor) Len() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Alignment is general.alignment's default, which this writer uses.
const Alignment = 32

// metadata value types (gguf.md's enum gguf_metadata_value_type).
const (
	tUint8   = 0
	tInt8    = 1
	tUint16  = 2
	tInt16   = 3
	tUint32  = 4
	tInt32   = 5
	tFloat32 = 6
	tBool    = 7
	tString  = 8
	tArray   = 9
	tUint64  = 10
	tInt64   = 11
	tFloat64 = 12
)

// Write writes a GGUF v3 file. Every tensor is checked first (its data
// length against its dims, Q8_0's block size), so a bad tensor fails before
// anything is written (a Load tensor's length when it is loaded).
func Write(w io.Writer, kvs []KV, tensors []Tensor) error {
	return WriteProgress(w, kvs, tensors, nil)
}

// WriteProgress is Write calling progress (when not nil) after each
// tensor's data with how many of how many are written.
func WriteProgress(w io.Writer, kvs []KV, tensors []Tensor, progress func(done, total int)) error {
	seen := map[string]bool{}
	for _, t := range tensors {
		if seen[t.Name] {
			return fmt.Errorf("gguf: tensor %q appears twice", t.Name)
		}
		seen[t.Name] = true
		if len(t.Dims) == 0 || (t.Load == nil && t.Len() != uint64(len(t.Data))) {
			return fmt.Errorf("gguf: tensor %q has dims %v but %d values", t.Name, t.Dims, len(t.Data))
		}
		if t.Type == Q8_0 && t.Dims[0]%QK8_0 != 0 {
			return fmt.Errorf("gguf: tensor %q: Q8_0 needs the inner dimension (%d) to be a multiple of %d", t.Name, t.Dims[0], QK8_0)
		}
		switch t.Type {
		case F32, F16, BF16, Q8_0:
		default:
			return fmt.Errorf("gguf: tensor %q: %v is not a type this writer produces", t.Name, t.Type)
		}
	}
	keys := map[string]bool{}
	for _, kv := range kvs {
		if keys[kv.Key] {
			return fmt.Errorf("gguf: metadata key %q appears twice", kv.Key)
		}
		keys[kv.Key] = true
	}

	bw := bufio.NewWriterSize(w, 1<<20)
	e := &encoder{w: bw}
	e.raw([]byte("GGUF"))
	e.u32(3)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		e.str(kv.Key)
		if err := e.value(kv.Value); err != nil {
			return fmt.Errorf("gguf: metadata %q: %w", kv.Key, err)
		}
	}
	var offset uint64
	for _, t := range tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(offset)
		offset = align(offset + uint64(t.Type.Size(int(t.Len()))))
	}
	e.pad()
	for i, t := range tensors {
		if t.Load != nil {
			t.Data = t.Load()
			if uint64(len(t.Data)) != t.Len() {
				return fmt.Errorf("gguf: tensor %q has dims %v but loaded %d values", t.Name, t.Dims, len(t.Data))
			}
		}
		e.tensor(t)
		e.pad()
		if e.err != nil {
			return e.err
		}
		if progress != nil {
			progress(i+1, len(tensors))
		}
	}
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

func align(n uint64) uint64 { return (n + Alignment - 1) / Alignment * Alignment }

type encoder struct {
	w   *bufio.Writer
	n   uint64
	err error
	buf [8]byte
}

func (e *encoder) raw(b []byte) {
	if e.err != nil {
		return
	}
	var k int
	k, e.err = e.w.Write(b)
	e.n += uint64(k)
}

func (e *encoder) u8(v uint8)   { e.raw([]byte{v}) }
func (e *encoder) u16(v uint16) { binary.LittleEndian.PutUint16(e.buf[:2], v); e.raw(e.buf[:2]) }
func (e *encoder) u32(v uint32) { binary.LittleEndian.PutUint32(e.buf[:4], v); e.raw(e.buf[:4]) }
func (e *encoder) u64(v uint64) { binary.LittleEndian.PutUint64(e.buf[:8], v); e.raw(e.buf[:8]) }
func (e *encoder) str(s string) { e.u64(uint64(len(s))); e.raw([]byte(s)) }

func (e *encoder) pad() {
	if k := align(e.n) - e.n; k > 0 {
		e.raw(make([]byte, k))
	}
}

// value writes a type tag and the value.
func (e *encoder) value(v any) error {
	switch x := v.(type) {
	case []string:
		e.u32(tArray)
		e.u32(tString)
		e.u64(uint64(len(x)))
		for _, s := range x {
			e.str(s)
		}
		return nil
	case []int32:
		return array(e, tInt32, x, func(v int32) { e.u32(uint32(v)) })
	case []uint32:
		return array(e, tUint32, x, e.u32)
	case []float32:
		return array(e, tFloat32, x, func(v float32) { e.u32(math.Float32bits(v)) })
	case []bool:
		return array(e, tBool, x, func(v bool) { e.u8(b2u(v)) })
	}
	if !e.scalar(v) {
		return fmt.Errorf("unsupported value type %T", v)
	}
	return nil
}

func array[T any](e *encoder, tag uint32, xs []T, put func(T)) error {
	e.u32(tArray)
	e.u32(tag)
	e.u64(uint64(len(xs)))
	for _, x := range xs {
		put(x)
	}
	return nil
}

// scalar writes v's type tag and value; false if v is not a scalar GGUF
// knows.
func (e *encoder) scalar(v any) bool {
	switch x := v.(type) {
	case uint8:
		e.u32(tUint8)
		e.u8(x)
	case int8:
		e.u32(tInt8)
		e.u8(uint8(x))
	case uint16:
		e.u32(tUint16)
		e.u16(x)
	case int16:
		e.u32(tInt16)
		e.u16(uint16(x))
	case uint32:
		e.u32(tUint32)
		e.u32(x)
	case int32:
		e.u32(tInt32)
		e.u32(uint32(x))
	case uint64:
		e.u32(tUint64)
		e.u64(x)
	case int64:
		e.u32(tInt64)
		e.u64(uint64(x))
	case float32:
		e.u32(tFloat32)
		e.u32(math.Float32bits(x))
	case float64:
		e.u32(tFloat64)
		e.u64(math.Float64bits(x))
	case bool:
		e.u32(tBool)
		e.u8(b2u(x))
	case string:
		e.u32(tString)
		e.str(x)
	default:
		return false
	}
	return true
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// tensor writes t's data in its type.
func (e *encoder) tensor(t Tensor) {
	switch t.Type {
	case F32:
		for _, v := range t.Data {
			e.u32(math.Float32bits(v))
		}
	case F16:
		for _, v := range t.Data {
			e.u16(half.F32ToF16(v))
		}
	case BF16:
		for _, v := range t.Data {
			e.u16(half.F32ToBF16(v))
		}
	case Q8_0:
		var blk [2 + QK8_0]byte
		for i := 0; i < len(t.Data); i += QK8_0 {
			QuantizeQ8_0(blk[:], t.Data[i:i+QK8_0])
			e.raw(blk[:])
		}
	}
}

// QuantizeQ8_0 writes one block: the scale d = max|x|/127 as f16, then
// round(x/d) as int8 (kernels.QuantizeQ8Block, ggml's reference
// quantize_row_q8_0).
func QuantizeQ8_0(dst []byte, x []float32) {
	var q [QK8_0]int8
	binary.LittleEndian.PutUint16(dst, kernels.QuantizeQ8Block(q[:len(x)], x))
	for j, v := range q[:len(x)] {
		dst[2+j] = byte(v)
	}
}
