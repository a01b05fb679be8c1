package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// handMade builds a file byte by byte from the spec, independently of Write.
func handMade(header string, data []byte) []byte {
	out := make([]byte, 8)
	binary.LittleEndian.PutUint64(out, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

func TestReadsASpecFile(t *testing.T) {
	data := make([]byte, 0, 16)
	for _, v := range []float32{1, -2.5} {
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
	}
	data = binary.LittleEndian.AppendUint16(data, 0x3f80) // bf16 1.0
	data = binary.LittleEndian.AppendUint16(data, 0xc000) // bf16 -2
	data = binary.LittleEndian.AppendUint16(data, 0x3c00) // f16 1.0
	p := filepath.Join(t.TempDir(), "a.safetensors")
	os.WriteFile(p, handMade(`{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},"h":{"dtype":"F16","shape":[],"data_offsets":[12,14]}}`, data), 0o644)
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata["format"] != "pt" || strings.Join(f.Names(), ",") != "b,h,w" {
		t.Fatalf("metadata %v names %v", f.Metadata, f.Names())
	}
	for name, want := range map[string][]float32{"w": {1, -2.5}, "b": {1, -2}, "h": {1}} {
		tn, _ := f.Tensor(name)
		got := tn.Float32()
		if len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	vals := []float32{0, 1, -1, 0.1, 3.14159, -65504, 1e-3, 42}
	p := filepath.Join(t.TempDir(), "m.safetensors")
	err := Write(p, []Tensor{
		FromFloat32("z.f32", F32, []int{2, 4}, vals),
		FromFloat32("a.bf16", BF16, []int{8}, vals),
		FromFloat32("m.f16", F16, []int{4, 2}, vals),
	}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
		t.Errorf("header length %d is not 8-aligned", n)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+binary.LittleEndian.Uint64(raw)], &hdr); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range []struct {
		name string
		tol  float64
	}{{"z.f32", 0}, {"a.bf16", 1.0 / 128}, {"m.f16", 1.0 / 1024}} {
		tn, ok := f.Tensor(c.name)
		if !ok {
			t.Fatalf("%s missing", c.name)
		}
		for i, v := range tn.Float32() {
			if d := math.Abs(float64(v - vals[i])); d > c.tol*math.Max(1, math.Abs(float64(vals[i]))) {
				t.Errorf("%s[%d] = %g, want %g", c.name, i, v, vals[i])
			}
		}
	}
	if err := Write(p, []Tensor{{Name: "bad", DType: F32, Shape: []int{3}, Data: make([]byte, 8)}}, nil); err == nil {
		t.Error("Write must refuse a shape that does not match the data")
	}
	if _, err := Open(p); err != nil {
		t.Errorf("a refused Write damaged the old file: %v", err)
	}
}

func TestCorruptFilesNameFileAndTensor(t *testing.T) {
	dir := t.TempDir()
	good := handMade(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8))
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"empty", nil, "shorter than the 8-byte header"},
		{"truncated data", good[:len(good)-3], `tensor "w": bytes [0, 8) lie outside`},
		{"huge header length", append(binary.LittleEndian.AppendUint64(nil, 1<<40), good[8:]...), "does not fit"},
		{"header not json", handMade(`{"w":`, nil), "header is not JSON"},
		{"size mismatch", handMade(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8)), `tensor "w": shape [3] of F32 needs 12 bytes`},
		{"unsupported dtype", handMade(`{"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, make([]byte, 8)), `tensor "w": dtype "I64"`},
		{"overlap", handMade(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), "overlap"},
		{"bad entry", handMade(`{"w":{"dtype":"F32","shape":"x","data_offsets":[0,8]}}`, make([]byte, 8)), `tensor "w": bad header entry`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".safetensors")
			os.WriteFile(p, c.body, 0o644)
			_, err := Open(p)
			if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %s and %q", err, p, c.want)
			}
		})
	}
}

func TestShardedDirectory(t *testing.T) {
	dir := t.TempDir()
	Write(filepath.Join(dir, "model-00001-of-00002.safetensors"), []Tensor{FromFloat32("a", F32, []int{1}, []float32{1})}, nil)
	Write(filepath.Join(dir, "model-00002-of-00002.safetensors"), []Tensor{FromFloat32("b", BF16, []int{2}, []float32{2, 3})}, nil)
	idx := `{"metadata":{"total_size":8},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}`
	os.WriteFile(filepath.Join(dir, IndexFile), []byte(idx), 0o644)
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := d.Tensor("b"); !ok || b.Float32()[1] != 3 || strings.Join(d.Names(), ",") != "a,b" {
		t.Fatalf("sharded read: %v %v", ok, d.Names())
	}
	d.Close()
	os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"weight_map":{"c":"model-00001-of-00002.safetensors"}}`), 0o644)
	if _, err := OpenDir(dir); err == nil || !strings.Contains(err.Error(), `tensor "c" is listed in shard`) {
		t.Fatalf("index naming a missing tensor: %v", err)
	}
	os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"weight_map":{"a":"../x.safetensors"}}`), 0o644)
	if _, err := OpenDir(dir); err == nil {
		t.Fatal("a shard outside the directory must be refused")
	}
	single := t.TempDir()
	Write(filepath.Join(single, "model.safetensors"), []Tensor{FromFloat32("x", F16, []int{1}, []float32{0.5})}, nil)
	if d, err := OpenDir(single); err != nil || len(d.Names()) != 1 {
		t.Fatalf("single-file dir: %v", err)
	}
}
