package setup

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad: a config file of any bytes and any --set loads with an error
// or as a config that validates. `make test` runs the seeds; `make fuzz`
// explores.
func FuzzLoad(f *testing.F) {
	tiny, err := os.ReadFile("../configs/tiny.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tiny, "rl.beta=0")
	f.Add([]byte("rl: {beta: [1,2]}\n"), "reward.w_task=2")
	f.Add([]byte("model:\n  init:\n    hidden_size: -3\n"), "model.devices=[cuda:0]")
	f.Add([]byte("a: &x [*x]\n"), "agent.max_steps=1e99")
	f.Add([]byte("rl:\n  k: 99999999999999999999\n"), "rl.k")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, raw []byte, set string) {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(p, []string{set})
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Load accepted a config Validate rejects: %v", err)
		}
	})
}
