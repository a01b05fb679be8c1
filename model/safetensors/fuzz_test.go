package safetensors

import (
	"math/bits"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen: a file of any bytes opens with an error or as tensors whose
// bytes are exactly what their dtype and shape need, inside the file.
// `make test` runs the seeds; `make fuzz` explores.
func FuzzOpen(f *testing.F) {
	f.Add(handMade(`{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(handMade(`{"w":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, nil))
	f.Add(handMade(`{"w":{"dtype":"F16","shape":[3037000500,3037000500,2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(handMade(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}`, make([]byte, 8)))
	f.Add([]byte{1, 2, 3})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, raw []byte) {
		p := filepath.Join(dir, "f.safetensors")
		if err := os.WriteFile(p, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		file, err := Open(p)
		if err != nil {
			return
		}
		defer file.Close()
		for _, name := range file.Names() {
			tn, _ := file.Tensor(name)
			n := uint64(tn.DType.Size())
			for _, d := range tn.Shape {
				hi, lo := bits.Mul64(n, uint64(d))
				if hi != 0 || d < 0 {
					t.Fatalf("%q: shape %v overflows, yet the file opened", name, tn.Shape)
				}
				n = lo
			}
			if n != uint64(len(tn.Data)) {
				t.Fatalf("%q: shape %v of %s needs %d bytes, has %d", name, tn.Shape, tn.DType, n, len(tn.Data))
			}
		}
	})
}
