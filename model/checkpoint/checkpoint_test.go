package checkpoint

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/model/optim"
)

func state(t *testing.T) State {
	o := optim.NewAdamW(optim.AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01})
	ps := []optim.Param{{Name: "a.weight", W: []float32{1, 2, 3, 4}, G: []float32{0.1, -0.2, 0.3, 0.4}, Decay: true}, {Name: "b.norm", W: []float32{1}, G: []float32{0.5}}}
	o.Step(ps, 0.01)
	o.Step(ps, 0.01)
	rng := rand.NewPCG(1, 2)
	rng.Uint64()
	blob, err := rng.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return State{Step: 2, Config: "seed: 1\n", RNG: blob,
		Params: map[string][]float32{"a.weight": ps[0].W, "b.norm": ps[1].W},
		Shapes: map[string][]int{"a.weight": {2, 2}}, Optim: o}
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := state(t)
	if err := Save(dir, s); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Step != 2 || got.Config != s.Config || got.Optim.StepN != 2 || got.Optim.Config != s.Optim.Config {
		t.Fatalf("scalars: %+v", got)
	}
	if got.Shapes["a.weight"][0] != 2 || got.Params["a.weight"][3] != s.Params["a.weight"][3] {
		t.Fatal("params changed")
	}
	for n, m := range s.Optim.M {
		for i := range m {
			if got.Optim.M[n][i] != m[i] || got.Optim.V[n][i] != s.Optim.V[n][i] {
				t.Fatal("optimizer moments changed")
			}
		}
	}
	// The restored generator continues the same stream.
	a, b := rand.NewPCG(0, 0), rand.NewPCG(0, 0)
	a.UnmarshalBinary(s.RNG)
	b.UnmarshalBinary(got.RNG)
	if a.Uint64() != b.Uint64() {
		t.Fatal("RNG state not restored")
	}
	// The restored optimiser takes the same next step as the original.
	p1 := []optim.Param{{Name: "a.weight", W: append([]float32(nil), s.Params["a.weight"]...), G: []float32{1, 1, 1, 1}, Decay: true}}
	p2 := []optim.Param{{Name: "a.weight", W: append([]float32(nil), got.Params["a.weight"]...), G: []float32{1, 1, 1, 1}, Decay: true}}
	s.Optim.Step(p1, 0.01)
	got.Optim.Step(p2, 0.01)
	for i := range p1[0].W {
		if p1[0].W[i] != p2[0].W[i] {
			t.Fatal("resumed optimiser diverges")
		}
	}
}

func TestDamageIsDetected(t *testing.T) {
	for _, c := range []struct {
		file string
		harm func(path string)
		want string
	}{
		{"params.safetensors", func(p string) { b, _ := os.ReadFile(p); b[len(b)-1] ^= 1; os.WriteFile(p, b, 0o644) }, "params.safetensors is damaged"},
		{"optimizer.safetensors", func(p string) { b, _ := os.ReadFile(p); os.WriteFile(p, b[:len(b)/2], 0o644) }, "optimizer.safetensors is damaged"},
		{"trainer_state.json", func(p string) { os.WriteFile(p, []byte("{"), 0o644) }, "trainer_state.json is damaged"},
		{"params.safetensors", func(p string) { os.Remove(p) }, "params.safetensors"},
		// A hand-edited manifest: a short checksum, a file outside the
		// checkpoint, the parameters not listed.
		{"trainer_state.json", editManifest(`"params.safetensors": "ab"`), `params.safetensors is damaged (SHA-256`},
		{"trainer_state.json", editManifest(`"../params.safetensors": "ab"`), `names "../params.safetensors"`},
		{"trainer_state.json", editManifest(``), "lists no params.safetensors"},
	} {
		dir := t.TempDir()
		Save(dir, state(t))
		c.harm(filepath.Join(dir, c.file))
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.file, err, c.want)
		}
	}
}

// editManifest replaces the manifest's "files" with files (JSON members).
func editManifest(files string) func(string) {
	return func(p string) {
		raw, _ := os.ReadFile(p)
		var m map[string]any
		json.Unmarshal(raw, &m)
		var f map[string]any
		json.Unmarshal([]byte("{"+files+"}"), &f)
		m["files"] = f
		raw, _ = json.Marshal(m)
		os.WriteFile(p, raw, 0o644)
	}
}
