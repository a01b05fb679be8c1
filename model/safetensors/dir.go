package safetensors

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// IndexFile names the shard index of a sharded checkpoint.
const IndexFile = "model.safetensors.index.json"

// Dir is a checkpoint directory: model.safetensors, or the shards that
// model.safetensors.index.json lists.
type Dir struct {
	files  []*File
	byName map[string]*File
}

// OpenDir opens the weights of a Hugging Face model directory.
func OpenDir(dir string) (*Dir, error) {
	d := &Dir{byName: map[string]*File{}}
	idxPath := filepath.Join(dir, IndexFile)
	raw, err := os.ReadFile(idxPath)
	if os.IsNotExist(err) {
		f, err := Open(filepath.Join(dir, "model.safetensors"))
		if err != nil {
			return nil, err
		}
		d.files = []*File{f}
		for _, n := range f.Names() {
			d.byName[n] = f
		}
		return d, nil
	}
	if err != nil {
		return nil, err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w", idxPath, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: weight_map is empty", idxPath)
	}
	shards := map[string]*File{}
	names := make([]string, 0, len(idx.WeightMap))
	for n := range idx.WeightMap {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		shard := idx.WeightMap[name]
		if filepath.Base(shard) != shard {
			d.Close()
			return nil, fmt.Errorf("%s: tensor %q: shard %q must be a file name in the directory", idxPath, name, shard)
		}
		f, ok := shards[shard]
		if !ok {
			if f, err = Open(filepath.Join(dir, shard)); err != nil {
				d.Close()
				return nil, err
			}
			shards[shard] = f
			d.files = append(d.files, f)
		}
		if _, ok := f.Tensor(name); !ok {
			d.Close()
			return nil, fmt.Errorf("%s: tensor %q is listed in shard %s, which does not hold it", idxPath, name, shard)
		}
		d.byName[name] = f
	}
	return d, nil
}

// Tensor returns the named tensor from whichever shard holds it.
func (d *Dir) Tensor(name string) (Tensor, bool) {
	f, ok := d.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return f.Tensor(name)
}

// Names lists every tensor, sorted.
func (d *Dir) Names() []string {
	out := make([]string, 0, len(d.byName))
	for n := range d.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Close unmaps every shard.
func (d *Dir) Close() error {
	var first error
	for _, f := range d.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
