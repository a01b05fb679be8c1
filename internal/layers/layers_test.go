package layers

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/agemem/agemem/"

// TestImportsPointDown: every package's imports (not its tests') are of
// lower layers or its own folder: nothing under model/ or kernels/ imports
// an agent, AgeMem's runtime, an environment, the trainer, the server or a
// paper; no benchmark imports a system.
func TestImportsPointDown(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	n := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		from := strings.TrimPrefix(p.ImportPath, module)
		if l, _ := Of(from); l < 0 {
			t.Errorf("%s is in no layer: add its folder to layers.Order", from)
			continue
		}
		n++
		for _, imp := range p.Imports {
			to, ok := strings.CutPrefix(imp, module)
			if ok && !Allowed(from, to) {
				lf, _ := Of(from)
				lt, _ := Of(to)
				t.Errorf("%s (layer %d) imports %s (layer %d)", from, lf, to, lt)
			}
		}
	}
	if n < 40 {
		t.Fatalf("only %d packages listed", n)
	}
}

// TestAllowed on cases worked by hand, so that the rule itself cannot
// drift into allowing everything.
func TestAllowed(t *testing.T) {
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"model/sft", "model/train", true},
		{"model/engine", "memtools", false},
		{"model/train", "env", false},
		{"kernels/cuda", "model/qwen", false},
		{"bench/workbench", "papers/memtoolagent", false},
		{"papers/memtoolagent", "bench/workbench", true},
		{"bench/toolret", "bench/stabletoolbench", true},
		{"llm/native", "llm", true},
		{"llm", "llm/native", false},
		{"llm/native", "llm/ollama", true},
		{"env", "rl/rollout", false},
		{"serve", "setup", false},
		{"cmd/serve", "setup", true},
		{"memtools", "agent", false},
		{"nowhere", "model", false},
		{"embed", "model/bert", false},
		{"internal/par", "kernels", false},
	} {
		if got := Allowed(c.from, c.to); got != c.want {
			t.Errorf("Allowed(%s, %s) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}
