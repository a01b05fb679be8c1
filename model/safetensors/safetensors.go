// Package safetensors reads and writes the safetensors format of Hugging
// Face checkpoints: an 8-byte little-endian header length, a JSON header
// mapping each tensor name to its dtype, shape and byte range, then the
// data. Files are memory-mapped, so opening a checkpoint costs page-table
// entries, not copies; sharded checkpoints are read through
// model.safetensors.index.json.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"unsafe"

	"github.com/agemem/agemem/kernels/half"
)

// DType is a tensor element type as the header spells it.
type DType string

// The element types agemem reads and writes.
const (
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
)

// Size is the bytes per element, 0 for a type agemem does not read.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}

// Tensor is a view of one tensor's bytes inside a mapped file.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte // little-endian elements; read-only (it is the mapping)
}

// Len is the number of elements.
func (t Tensor) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Float32 converts the tensor to a new float32 slice.
func (t Tensor) Float32() []float32 {
	out := make([]float32, t.Len())
	t.Float32Into(out, 0)
	return out
}

// Float32Into converts elements lo, lo+1, ... into dst (len(dst) of them),
// so that a large tensor converts in parallel pieces.
func (t Tensor) Float32Into(dst []float32, lo int) {
	switch t.DType {
	case F32:
		b := t.Data[4*lo : 4*(lo+len(dst))]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case F16:
		b := t.Data[2*lo : 2*(lo+len(dst))]
		for i := range dst {
			dst[i] = half.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case BF16:
		b := t.Data[2*lo : 2*(lo+len(dst))]
		for i := range dst {
			dst[i] = half.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
}

type headerEntry struct {
	DType   DType    `json:"dtype"`
	Shape   []int    `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// File is one open .safetensors file.
type File struct {
	path     string
	data     []byte // the whole file, mapped
	unmap    func() error
	Metadata map[string]string
	tensors  map[string]Tensor
}

// maxHeader bounds the JSON header, as the reference implementation does,
// so a corrupt length cannot make us allocate the moon.
const maxHeader = 100 << 20

// Open maps path and checks its header: every tensor's dtype, shape and byte
// range must agree and lie inside the file. Errors name the file and the
// tensor.
func Open(path string) (*File, error) {
	data, unmap, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	f := &File{path: path, data: data, unmap: unmap, tensors: map[string]Tensor{}}
	if err := f.parse(); err != nil {
		unmap()
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	return f, nil
}

func (f *File) parse() error {
	if len(f.data) < 8 {
		return fmt.Errorf("file is %d bytes, shorter than the 8-byte header length", len(f.data))
	}
	n := binary.LittleEndian.Uint64(f.data)
	if n > maxHeader || n > uint64(len(f.data)-8) {
		return fmt.Errorf("header length %d does not fit in a file of %d bytes (truncated or not safetensors)", n, len(f.data))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(f.data[8:8+n], &raw); err != nil {
		return fmt.Errorf("header is not JSON: %w", err)
	}
	body := f.data[8+n:]
	type span struct {
		lo, hi int64
		name   string
	}
	var spans []span
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &f.Metadata); err != nil {
				return fmt.Errorf("__metadata__ must map strings to strings: %w", err)
			}
			continue
		}
		var h headerEntry
		if err := json.Unmarshal(msg, &h); err != nil {
			return fmt.Errorf("tensor %q: bad header entry: %w", name, err)
		}
		size := h.DType.Size()
		if size == 0 {
			return fmt.Errorf("tensor %q: dtype %q is not supported (F32, F16, BF16)", name, h.DType)
		}
		elems := int64(1)
		for _, d := range h.Shape {
			if d < 0 {
				return fmt.Errorf("tensor %q: negative dimension in shape %v", name, h.Shape)
			}
			// A product past the file's size cannot match its bytes; stop
			// before it wraps around to a size that would.
			if d > 0 && elems > int64(len(f.data))/int64(d) {
				return fmt.Errorf("tensor %q: shape %v holds more elements than the file has bytes", name, h.Shape)
			}
			elems *= int64(d)
		}
		lo, hi := h.Offsets[0], h.Offsets[1]
		if lo < 0 || hi < lo || hi > int64(len(body)) {
			return fmt.Errorf("tensor %q: bytes [%d, %d) lie outside the %d data bytes (truncated file?)", name, lo, hi, len(body))
		}
		if hi-lo != elems*int64(size) {
			return fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, header gives %d", name, h.Shape, h.DType, elems*int64(size), hi-lo)
		}
		f.tensors[name] = Tensor{Name: name, DType: h.DType, Shape: h.Shape, Data: body[lo:hi:hi]}
		spans = append(spans, span{lo, hi, name})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return fmt.Errorf("tensors %q and %q overlap", spans[i-1].name, spans[i].name)
		}
	}
	return nil
}

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Names lists the tensors, sorted.
func (f *File) Names() []string {
	out := make([]string, 0, len(f.tensors))
	for n := range f.tensors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Tensor returns the named tensor.
func (f *File) Tensor(name string) (Tensor, bool) {
	t, ok := f.tensors[name]
	return t, ok
}

// Close unmaps the file; tensors read from it must not be used afterwards.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	err := f.unmap()
	f.unmap, f.data, f.tensors = nil, nil, nil
	return err
}

// Write writes tensors to path, header padded to 8 bytes as the reference
// writer does, tensors in name order. Shapes must match the data length.
func Write(path string, tensors []Tensor, metadata map[string]string) error {
	sorted := append([]Tensor(nil), tensors...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range sorted {
		if t.DType.Size() == 0 {
			return fmt.Errorf("safetensors %s: tensor %q: dtype %q is not supported", path, t.Name, t.DType)
		}
		if want := t.Len() * t.DType.Size(); want != len(t.Data) {
			return fmt.Errorf("safetensors %s: tensor %q: shape %v of %s needs %d bytes, got %d", path, t.Name, t.Shape, t.DType, want, len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = headerEntry{t.DType, shape, [2]int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	hj, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hj)%8 != 0 {
		hj = append(hj, ' ')
	}
	tmp := path + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return err
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hj)))
	out.Write(lenBuf[:])
	out.Write(hj)
	for _, t := range sorted {
		if _, err := out.Write(t.Data); err != nil {
			out.Close()
			os.Remove(tmp)
			return fmt.Errorf("safetensors %s: %w", path, err)
		}
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	// Rename last: a crash leaves the old file or the new one, never half.
	return os.Rename(tmp, path)
}

// FromFloat32 encodes values as a tensor of dtype (rounding to nearest even
// for 16-bit types): F32, F16 or BF16; another dtype panics.
func FromFloat32(name string, dtype DType, shape []int, values []float32) Tensor {
	if dtype.Size() == 0 {
		// A programming error: an empty tensor would read back as zeros.
		panic(fmt.Sprintf("safetensors: tensor %q to dtype %q (F32, F16 or BF16)", name, dtype))
	}
	t := Tensor{Name: name, DType: dtype, Shape: shape, Data: make([]byte, len(values)*dtype.Size())}
	for i, v := range values {
		switch dtype {
		case F32:
			binary.LittleEndian.PutUint32(t.Data[4*i:], math.Float32bits(v))
		case F16:
			binary.LittleEndian.PutUint16(t.Data[2*i:], half.F32ToF16(v))
		case BF16:
			binary.LittleEndian.PutUint16(t.Data[2*i:], half.F32ToBF16(v))
		}
	}
	return t
}

// Uint16 returns a BF16 or F16 tensor's elements as a view of the mapped
// bytes (no copy) when they are 2-byte aligned, else as a copy. The view is
// valid until the file is closed.
func (t Tensor) Uint16() []uint16 {
	n := len(t.Data) / 2
	if n == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(&t.Data[0]))%2 == 0 && littleEndian {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&t.Data[0])), n)
	}
	out := make([]uint16, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(t.Data[2*i:])
	}
	return out
}

// littleEndian is true on hosts whose memory order matches the file's.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()
