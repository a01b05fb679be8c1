package setup

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte(body), 0o644)
	return p
}

// TestShippedConfigsLoad: every file in configs/ loads and validates, and
// the GPU recipe plays the episodes the tiny one does (its policy is
// trained from scratch on the same compact prompt).
func TestShippedConfigsLoad(t *testing.T) {
	files, err := filepath.Glob("../configs/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("configs/: %v, %v", files, err)
	}
	for _, f := range files {
		cfg, err := Load(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if filepath.Base(f) == "gpu.yaml" {
			tiny, _ := Load("../configs/tiny.yaml", nil)
			if cfg.Agent != tiny.Agent || cfg.Episode != tiny.Episode {
				t.Fatalf("configs/gpu.yaml plays other episodes than configs/tiny.yaml: agent %+v, episode %+v", cfg.Agent, cfg.Episode)
			}
		}
	}
}

// TestShippedDefaultsMatchCode keeps configs/tiny.yaml, where the defaults
// are documented, equal to Default() but for the keys the embedded tiny
// model changes (their comments name the defaults).
func TestShippedDefaultsMatchCode(t *testing.T) {
	cfg, err := Load("../configs/tiny.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Agent.SystemPrompt != "compact" {
		t.Fatalf("configs/tiny.yaml: agent.system_prompt %q, the tiny model is trained with compact", cfg.Agent.SystemPrompt)
	}
	if cfg.Agent.ResponseBudget != 256 {
		t.Fatalf("configs/tiny.yaml: agent.response_budget %d, the tiny model's replies fit 256", cfg.Agent.ResponseBudget)
	}
	cfg.Agent.SystemPrompt = Default().Agent.SystemPrompt
	cfg.Agent.ResponseBudget = Default().Agent.ResponseBudget
	if !reflect.DeepEqual(cfg, Default()) {
		t.Fatalf("configs/tiny.yaml drifted from Default():\n%s\nvs\n%s", cfg.YAML(), Default().YAML())
	}
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		sets       []string
		want       []string
	}{
		{"misspelt key", "tools:\n  filter_threshhold: 0.5\n", nil, []string{":2:", "unknown key tools.filter_threshhold", "did you mean filter_threshold"}},
		{"unknown section", "tool:\n  x: 1\n", nil, []string{"unknown key tool", "did you mean tools"}},
		{"wrong type", "agent:\n  max_steps: many\n", nil, []string{":2:", "agent.max_steps", `"many"`}},
		{"out of range", "tools:\n  filter_threshold: 1.5\n", nil, []string{"tools.filter_threshold", "outside (0, 1]"}},
		{"bad enum", "memory:\n  store: mysql\n", nil, []string{"memory.store", `"mysql" is not one of sqlite, postgres, memory`}},
		{"postgres without dsn", "memory:\n  store: postgres\n", nil, []string{"memory.dsn", "is empty"}},
		{"password in dsn", "memory:\n  store: postgres\n  dsn: postgres://agemem:hunter2@db/agemem\n", nil, []string{"memory.dsn", "PGPASSWORD"}},
		{"password in dsn pairs", "memory:\n  store: postgres\n  dsn: host=db password=hunter2\n", nil, []string{"memory.dsn", "PGPASSWORD"}},
		{"bad hnsw m", "memory:\n  hnsw:\n    m: 1\n", nil, []string{"memory.hnsw.m", "[2, 100]"}},
		{"bad build memory", "memory:\n  hnsw:\n    build_memory: lots\n", nil, []string{"memory.hnsw.build_memory", "lots"}},
		{"section not a mapping", "agent: 5\n", nil, []string{"agent must be a mapping"}},
		{"list element", "embed:\n  char_ngrams: [3, 12]\n", nil, []string{"embed.char_ngrams[1]"}},
		{"bad yaml", "agent: [\n", nil, []string{"c.yaml"}},
		{"bad set key", "", []string{"agent.max_stepz=3"}, []string{"unknown key agent.max_stepz"}},
		{"set without value", "", []string{"agent.max_steps"}, []string{"want key.path=value"}},
		{"set into scalar", "", []string{"seed.x=1"}, []string{"--set", "seed must be a single int64 value"}},
		{"set of the wrong type", "rl:\n  lr: 1e-4\n", []string{"rl.lr=abc"}, []string{`config --set: rl.lr: "abc" is not a valid float64`}},
		{"set of a list element", "", []string{"embed.char_ngrams=[3, x]"}, []string{`config --set: embed.char_ngrams[1]: "x"`}},
		{"short key", "serve:\n  keys:\n    - {key: abc, namespace: a}\n", nil, []string{"serve.keys[0].key", "at least 8"}},
		{"key without namespace", "serve:\n  keys:\n    - {key: abcdefgh12}\n", nil, []string{"serve.keys[0].namespace"}},
		{"repeated key", "serve:\n  keys:\n    - {key: abcdefgh12, namespace: a}\n    - {key: abcdefgh12, namespace: b}\n", nil, []string{"serve.keys[1].key", "repeats"}},
		{"bad duration", "serve:\n  request_timeout: soon\n", nil, []string{":2:", "serve.request_timeout", "duration"}},
		{"zero duration", "serve:\n  session_ttl: 0s\n", nil, []string{"serve.session_ttl", "positive"}},
		{"negative kv budget", "serve:\n  kv_budget: -16\n", nil, []string{"serve.kv_budget", "-16"}},
		{"bad device", "model:\n  device: gpu\n", nil, []string{"model.device", `"gpu" is not auto, cpu, cuda or cuda:N`}},
		{"bad quantize", "model:\n  quantize: q4_0\n", nil, []string{"model.quantize", `"q4_0": want q8_0`}},
		{"bad zero stage", "model:\n  zero_stage: 3\n", nil, []string{"model.zero_stage", "3: want 0"}},
		{"removed shard_optimizer", "model:\n  shard_optimizer: true\n", nil, []string{"unknown key model.shard_optimizer", "replaced by model.zero_stage: 1"}},
		{"bad memtool weight", "memtool:\n  train:\n    w_removal: -1\n", nil, []string{"memtool.train.w_removal", "at least 0"}},
		{"heads not divisible", "model:\n  init:\n    num_key_value_heads: 3\n", nil, []string{"model.init.num_key_value_heads", "does not divide"}},
		{"unknown lora module", "lora:\n  target_modules: [q_proj, lm_head]\n", nil, []string{"lora.target_modules[1]", `"lm_head"`}},
		{"bad aggregation", "rl:\n  aggregation: sum\n", nil, []string{"rl.aggregation", `"sum"`}},
		{"positive penalty", "reward:\n  p_overflow: 0.5\n", nil, []string{"reward.p_overflow", "a penalty"}},
		{"negative kv budget", "rl:\n  kv_budget: -1\n", nil, []string{"rl.kv_budget"}},
		{"clip out of range", "rl:\n  clip: 1.5\n", nil, []string{"rl.clip", "outside (0, 1)"}},
		{"sft loss_on", "sft:\n  loss_on: every\n", nil, []string{"sft.loss_on"}},
		{"ollama embedder without model", "embed:\n  backend: ollama\n", nil, []string{"embed.model", "nomic-embed-text"}},
		{"ollama judge without model", "reward:\n  relevance_judge: ollama\n", nil, []string{"reward.judge_model"}},
		{"ollama summarizer without model", "tools:\n  summarizer: ollama\n", nil, []string{"tools.summarizer_model"}},
		{"ollama serve without model", "serve:\n  backend: ollama\n  policy: \"\"\n", nil, []string{"serve.policy", "Ollama model"}},
		{"ollama serve with adapter", "serve:\n  backend: ollama\n  adapter: a\n", nil, []string{"serve.adapter"}},
		{"ollama format", "ollama:\n  format: json\n", nil, []string{"ollama.format", `"json" is not one of raw, tools`}},
		{"ollama think", "ollama:\n  think: maybe\n", nil, []string{"ollama.think"}},
		{"encoder without path", "embed:\n  backend: encoder\n", nil, []string{"embed.path"}},
		{"bad pooling", "embed:\n  pooling: max\n", nil, []string{"embed.pooling", "cls, cls_mlp, mean"}},
		{"mcp server without name", "mcp:\n  servers:\n    - {command: [npx, x]}\n", nil, []string{"mcp.servers[0].name", "is required"}},
		{"mcp command and url", "mcp:\n  servers:\n    - {name: a, command: [x], url: \"http://h/mcp\"}\n", nil, []string{"mcp.servers[0]", "both a command and a url"}},
		{"mcp neither", "mcp:\n  servers:\n    - {name: a}\n", nil, []string{"mcp.servers[0]", "needs a command"}},
		{"mcp bad url", "mcp:\n  servers:\n    - {name: a, url: \"ftp://h\"}\n", nil, []string{"mcp.servers[0].url", "not an http(s) URL"}},
		{"mcp repeated name", "mcp:\n  servers:\n    - {name: a, url: \"http://h/mcp\"}\n    - {name: a, command: [x]}\n", nil, []string{"mcp.servers[1].name", `"a" names two servers`}},
		{"mcp headers on command", "mcp:\n  servers:\n    - {name: a, command: [x], headers: {A: b}}\n", nil, []string{"mcp.servers[0].headers"}},
		{"mcp header not a string", "mcp:\n  servers:\n    - {name: a, url: \"http://h/mcp\", headers: {A: [1]}}\n", nil, []string{"mcp.servers[0].headers.A must be a single string value"}},
		{"mcp unknown key", "mcp:\n  servers:\n    - {name: a, comand: [x]}\n", nil, []string{"mcp.servers[0].comand", "did you mean command"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(write(t, tc.body), tc.sets)
			if err == nil {
				t.Fatal("no error")
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error %q shows the password", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestOverridesAndPartialFiles(t *testing.T) {
	p := write(t, "agent:\n  max_steps: 6\n")
	cfg, err := Load(p, []string{"tools.filter_threshold=0.75", "embed.char_ngrams=[2,3,5]", "memory.store=memory", "agent.max_steps=7"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Agent.MaxSteps != 7 || cfg.Tools.FilterThreshold != 0.75 || !reflect.DeepEqual(cfg.Embed.CharNgrams, []int{2, 3, 5}) || cfg.Memory.Store != "memory" {
		t.Fatalf("overrides not applied: %+v", cfg)
	}
	// Keys the file does not name keep their defaults.
	if cfg.Agent.ContextBudget != 8192 || cfg.Tools.TopK != 3 {
		t.Fatalf("defaults lost: %+v", cfg)
	}
	cfg, err = Load("", []string{"seed=42"})
	if err != nil || cfg.Seed != 42 {
		t.Fatalf("defaults + set: %v %d", err, cfg.Seed)
	}
}
