package lora

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/agemem/agemem/model/safetensors"
)

// Merge folds the adapter in adapterDir into the model in baseDir and writes
// a full Hugging Face directory to outDir: every weight the adapter touches
// becomes W + (alpha/r)·B·A (in the base's dtype), the others are copied, and
// config.json and the tokenizer files come along.
func Merge(baseDir, adapterDir, outDir string) error {
	a, err := Load(adapterDir)
	if err != nil {
		return err
	}
	base, err := safetensors.OpenDir(baseDir)
	if err != nil {
		return err
	}
	defer base.Close()
	delta := map[string]Module{}
	for _, m := range a.Modules {
		delta[m.Name+".weight"] = m
	}
	var out []safetensors.Tensor
	for _, name := range base.Names() {
		t, _ := base.Tensor(name)
		m, ok := delta[name]
		if !ok {
			out = append(out, safetensors.Tensor{Name: name, DType: t.DType, Shape: t.Shape, Data: append([]byte(nil), t.Data...)})
			continue
		}
		if len(t.Shape) != 2 || t.Shape[0] != m.B.Rows || t.Shape[1] != m.A.Cols {
			return fmt.Errorf("adapter module %s is [%d, %d] but base tensor %q has shape %v", m.Name, m.B.Rows, m.A.Cols, name, t.Shape)
		}
		w := t.Float32()
		for i, d := range a.Delta(m) {
			w[i] += d
		}
		out = append(out, safetensors.FromFloat32(name, t.DType, t.Shape, w))
		delete(delta, name)
	}
	for name := range delta {
		return fmt.Errorf("adapter module %s has no weight %q in %s", delta[name].Name, name, baseDir)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	if err := safetensors.Write(filepath.Join(outDir, "model.safetensors"), out, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	return CopyFiles(baseDir, outDir, "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
}

// CopyFiles copies the named files of a model directory that exist (the
// tokenizer and configs that travel with weights) from src to dst.
func CopyFiles(src, dst string, names ...string) error {
	for _, f := range names {
		if err := copyFile(filepath.Join(src, f), filepath.Join(dst, f)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
