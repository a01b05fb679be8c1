// Package checkpoint saves and restores training state: the trainable
// parameters, the AdamW moments, the random-generator state, the step and
// the config. Tensors are safetensors files; trainer_state.json lists every
// file with its SHA-256, so a damaged or truncated checkpoint is detected
// and named on load instead of silently resuming from garbage.
package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/safetensors"
)

// State is what a checkpoint holds.
type State struct {
	Step   int
	Config string // the effective config, YAML
	RNG    []byte // the trainer's random-generator state (e.g. PCG MarshalBinary)
	Params map[string][]float32
	Shapes map[string][]int
	Optim  *optim.AdamW // may be nil
}

type manifest struct {
	Version   int               `json:"version"`
	Step      int               `json:"step"`
	Config    string            `json:"config"`
	RNG       string            `json:"rng"` // hex
	OptStep   int               `json:"optimizer_step"`
	OptConfig optim.AdamWConfig `json:"optimizer_config"`
	Files     map[string]string `json:"files"` // name -> sha256
}

const stateFile = "trainer_state.json"

// Save writes the state to dir (created if needed). Files are written to a
// temporary name and renamed, and the manifest goes last, so a crash leaves
// either the old checkpoint or the new one.
func Save(dir string, s State) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	m := manifest{Version: 1, Step: s.Step, Config: s.Config, RNG: hex.EncodeToString(s.RNG), Files: map[string]string{}}
	var params []safetensors.Tensor
	for _, name := range sortedKeys(s.Params) {
		params = append(params, safetensors.FromFloat32(name, safetensors.F32, shapeOf(s, name), s.Params[name]))
	}
	if err := writeTensors(dir, "params.safetensors", params, m.Files); err != nil {
		return err
	}
	if s.Optim != nil {
		m.OptStep, m.OptConfig = s.Optim.StepN, s.Optim.Config
		var ts []safetensors.Tensor
		for _, name := range sortedKeys(s.Optim.M) {
			ts = append(ts,
				safetensors.FromFloat32("m/"+name, safetensors.F32, []int{len(s.Optim.M[name])}, s.Optim.M[name]),
				safetensors.FromFloat32("v/"+name, safetensors.F32, []int{len(s.Optim.V[name])}, s.Optim.V[name]))
		}
		if err := writeTensors(dir, "optimizer.safetensors", ts, m.Files); err != nil {
			return err
		}
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, stateFile))
}

func shapeOf(s State, name string) []int {
	if sh, ok := s.Shapes[name]; ok {
		return sh
	}
	return []int{len(s.Params[name])}
}

func writeTensors(dir, file string, ts []safetensors.Tensor, sums map[string]string) error {
	path := filepath.Join(dir, file)
	if err := safetensors.Write(path, ts, nil); err != nil {
		return err
	}
	sum, err := fileSum(path)
	if err != nil {
		return err
	}
	sums[file] = sum
	return nil
}

// Load reads a checkpoint, verifying every file's checksum first.
func Load(dir string) (State, error) {
	raw, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return State{}, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return State{}, fmt.Errorf("checkpoint %s: %s is damaged: %w", dir, stateFile, jsonerr.Explain(err))
	}
	if m.Version != 1 {
		return State{}, fmt.Errorf("checkpoint %s: version %d is not supported", dir, m.Version)
	}
	for _, file := range sortedKeys(m.Files) {
		if file != filepath.Base(file) || file == "." || file == ".." {
			return State{}, fmt.Errorf("checkpoint %s: %s names %q, not a file of the checkpoint", dir, stateFile, file)
		}
		sum, err := fileSum(filepath.Join(dir, file))
		if err != nil {
			return State{}, fmt.Errorf("checkpoint %s: %w", dir, err)
		}
		if want := m.Files[file]; sum != want {
			return State{}, fmt.Errorf("checkpoint %s: %s is damaged (SHA-256 %s…, the manifest says %.12q)", dir, file, sum[:12], want)
		}
	}
	if _, ok := m.Files["params.safetensors"]; !ok {
		return State{}, fmt.Errorf("checkpoint %s: %s lists no params.safetensors", dir, stateFile)
	}
	s := State{Step: m.Step, Config: m.Config, Params: map[string][]float32{}, Shapes: map[string][]int{}}
	if s.RNG, err = hex.DecodeString(m.RNG); err != nil {
		return State{}, fmt.Errorf("checkpoint %s: rng: %w", dir, err)
	}
	pf, err := safetensors.Open(filepath.Join(dir, "params.safetensors"))
	if err != nil {
		return State{}, err
	}
	for _, n := range pf.Names() {
		t, _ := pf.Tensor(n)
		s.Params[n], s.Shapes[n] = t.Float32(), t.Shape
	}
	pf.Close()
	if _, ok := m.Files["optimizer.safetensors"]; ok {
		of, err := safetensors.Open(filepath.Join(dir, "optimizer.safetensors"))
		if err != nil {
			return State{}, err
		}
		o := optim.NewAdamW(m.OptConfig)
		o.StepN = m.OptStep
		for _, n := range of.Names() {
			t, _ := of.Tensor(n)
			switch {
			case len(n) > 2 && n[:2] == "m/":
				o.M[n[2:]] = t.Float32()
			case len(n) > 2 && n[:2] == "v/":
				o.V[n[2:]] = t.Float32()
			default:
				of.Close()
				return State{}, fmt.Errorf("checkpoint %s: optimizer tensor %q is neither m/ nor v/", dir, n)
			}
		}
		of.Close()
		s.Optim = o
	}
	return s, nil
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
