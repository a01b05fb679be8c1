// Package deploy holds the launch recipes of agemem-train's runs across
// machines (Slurm, Kubernetes, vLLM engines) and this test, which checks
// them without a cluster: the shell scripts parse (bash -n), every
// #SBATCH line is an sbatch option, every vLLM flag is one vLLM's
// `vllm serve` documents, every Kubernetes object decodes strictly into
// its Go API type (k8s.io/api, Kubeflow's PyTorchJob: an unknown or
// misspelt field fails, as the API server's strict field validation
// does), every agemem config in them loads (an unknown key fails), and
// the pieces agree: the trainer's rl.engines are the engines' Services,
// the Secret and ConfigMaps it names exist. Its own module keeps the
// Kubernetes API types out of agemem's.
//
// The manifests are decoded with the Go types rather than validated with
// kubeconform, whose JSON schemas cannot be fetched on the machines that
// build this and are generated from these same Go types upstream; a
// PyTorchJob (a CRD) would need its CRD's schema besides.
package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/agemem/agemem/setup"
)

// bashParses runs bash -n on a script.
func bashParses(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command("bash", "-n", path).CombinedOutput(); err != nil {
		t.Fatalf("bash -n %s: %v\n%s", path, err, out)
	}
}

// sbatchOptions are the long options of sbatch(1) a batch script may set.
var sbatchOptions = []string{"account", "array", "chdir", "constraint", "cpus-per-gpu", "cpus-per-task", "dependency", "error",
	"exclusive", "export", "gpus", "gpus-per-node", "gpus-per-task", "gres", "job-name", "mail-type", "mail-user", "mem",
	"mem-per-cpu", "mem-per-gpu", "nodelist", "nodes", "ntasks", "ntasks-per-node", "output", "partition", "qos",
	"requeue", "reservation", "signal", "time", "wait-all-nodes"}

// TestSlurmRecipe: the batch script parses, its #SBATCH lines are sbatch
// options with values, it gives Slurm's task variables a rendezvous host,
// and every --set it passes is an agemem config key with a valid value.
func TestSlurmRecipe(t *testing.T) {
	path := filepath.Join("slurm", "agemem-train.sbatch")
	bashParses(t, path)
	raw, _ := os.ReadFile(path)
	opt := regexp.MustCompile(`^#SBATCH --([a-z-]+)(?:=(\S+))?$`)
	n := 0
	for i, l := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(l, "#SBATCH") {
			continue
		}
		m := opt.FindStringSubmatch(l)
		if m == nil || !slices.Contains(sbatchOptions, m[1]) {
			t.Fatalf("%s:%d: %q is not an sbatch option line (#SBATCH --option=value)", path, i+1, l)
		}
		if m[2] == "" && m[1] != "exclusive" && m[1] != "requeue" {
			t.Fatalf("%s:%d: --%s needs a value", path, i+1, m[1])
		}
		n++
	}
	if n == 0 {
		t.Fatal("no #SBATCH lines")
	}
	for _, want := range []string{"export MASTER_ADDR", "export MASTER_PORT", "srun ", "agemem-train train"} {
		if !strings.Contains(string(raw), want) {
			t.Fatalf("%s lacks %q: Slurm ranks need a rendezvous host and port", path, want)
		}
	}
	sets := regexp.MustCompile(`--set '?([a-z_.]+=[^' \\]+)'?`).FindAllStringSubmatch(string(raw), -1)
	var kv []string
	for _, s := range sets {
		kv = append(kv, s[1])
	}
	cfg := regexp.MustCompile(`--config (\S+)`).FindStringSubmatch(string(raw))
	if cfg == nil {
		t.Fatal("no --config")
	}
	c, err := setup.Load(filepath.Join("..", cfg[1]), kv)
	if err != nil {
		t.Fatalf("%s's config and --set flags: %v", path, err)
	}
	if len(c.RL.Engines) == 0 || !c.LoRA.Enabled || c.RL.AdapterDir == "" {
		t.Fatalf("the recipe runs rollouts on engines with LoRA adapters published to a shared directory: %+v", c.RL)
	}
}

// vllmFlags are `vllm serve` flags (vLLM's engine and server arguments).
var vllmFlags = []string{"host", "port", "served-model-name", "enable-lora", "max-lora-rank", "max-loras", "max-cpu-loras",
	"lora-dtype", "enable-prefix-caching", "gpu-memory-utilization", "max-model-len", "seed", "dtype", "api-key",
	"tensor-parallel-size", "max-num-seqs", "max-num-batched-tokens", "return-tokens-as-token-ids", "generation-config"}

// TestVLLMRecipe: the engine script parses, turns runtime LoRA loading on,
// and passes only vllm serve's flags, LoRA among them.
func TestVLLMRecipe(t *testing.T) {
	path := filepath.Join("vllm", "engine.sh")
	bashParses(t, path)
	raw, _ := os.ReadFile(path)
	s := string(raw)
	if !strings.Contains(s, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") || !strings.Contains(s, "vllm serve") {
		t.Fatal("the engine must run vllm serve with VLLM_ALLOW_RUNTIME_LORA_UPDATING (the load_lora_adapter endpoint)")
	}
	flags := regexp.MustCompile(`\s--([a-z-]+)`).FindAllStringSubmatch(s[strings.Index(s, "vllm serve"):], -1)
	seen := map[string]bool{}
	for _, f := range flags {
		if !slices.Contains(vllmFlags, f[1]) {
			t.Fatalf("--%s is not a vllm serve flag", f[1])
		}
		seen[f[1]] = true
	}
	if !seen["enable-lora"] || !seen["max-lora-rank"] {
		t.Fatal("an engine for rl.engines needs --enable-lora and a --max-lora-rank at least the trainer's lora.r")
	}
}

// object is a manifest's document: its kind and raw YAML.
type object struct {
	Kind, Name string
	raw        []byte
}

func objects(t *testing.T, path string) []object {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	for i, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(raw), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
		out = append(out, object{meta.Kind, meta.Metadata.Name, []byte(doc)})
	}
	return out
}

// strict decodes o into its API type; an unknown field is an error.
func strict(t *testing.T, path string, o object) any {
	t.Helper()
	var v any
	switch o.Kind {
	case "ConfigMap":
		v = &corev1.ConfigMap{}
	case "Secret":
		v = &corev1.Secret{}
	case "Service":
		v = &corev1.Service{}
	case "Deployment":
		v = &appsv1.Deployment{}
	case "PyTorchJob":
		v = &kubeflowv1.PyTorchJob{}
	default:
		t.Fatalf("%s: %s %s: a kind the test does not know", path, o.Kind, o.Name)
	}
	if err := yaml.UnmarshalStrict(o.raw, v); err != nil {
		t.Fatalf("%s: %s %s: %v", path, o.Kind, o.Name, err)
	}
	return v
}

// loadConfig loads an agemem config held in a ConfigMap.
func loadConfig(t *testing.T, where, text string) setup.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte(text), 0o644)
	c, err := setup.Load(p, nil)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return c
}

// TestKubernetesRecipes: every object decodes strictly; the agemem configs
// load; the trainer's rl.engines are the engines' Services and ports, its
// engine key and ConfigMaps exist, the PyTorchJob's containers are named
// and ported as the training operator requires, and every engine runs
// serve with runtime adapters on.
func TestKubernetesRecipes(t *testing.T) {
	all := map[string]any{}
	var serveCfg, trainCfg setup.Config
	for _, f := range []string{"serve-engines.yaml", "trainer-pytorchjob.yaml"} {
		path := filepath.Join("kubernetes", f)
		for _, o := range objects(t, path) {
			v := strict(t, path, o)
			all[o.Kind+"/"+o.Name] = v
			if cm, ok := v.(*corev1.ConfigMap); ok {
				for k, text := range cm.Data {
					c := loadConfig(t, fmt.Sprintf("%s: ConfigMap %s, %s", path, o.Name, k), text)
					if k == "serve.yaml" {
						serveCfg = c
					} else {
						trainCfg = c
					}
				}
			}
		}
	}
	engines := 0
	for key, v := range all {
		d, ok := v.(*appsv1.Deployment)
		if !ok {
			continue
		}
		engines++
		c := d.Spec.Template.Spec.Containers[0]
		if c.Command[0] != "serve" || !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "VLLM_ALLOW_RUNTIME_LORA_UPDATING" && e.Value == "true" }) {
			t.Fatalf("%s: an engine runs serve with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true", key)
		}
		if _, ok := all["Service/"+d.Name]; !ok {
			t.Fatalf("%s has no Service of its name", key)
		}
		for _, vol := range d.Spec.Template.Spec.Volumes {
			if vol.ConfigMap != nil && all["ConfigMap/"+vol.ConfigMap.Name] == nil {
				t.Fatalf("%s mounts ConfigMap %s, which no recipe defines", key, vol.ConfigMap.Name)
			}
		}
	}
	if engines < 2 || serveCfg.Serve.Addr != "0.0.0.0:8000" {
		t.Fatalf("%d engine Deployments; serve.addr %q", engines, serveCfg.Serve.Addr)
	}
	if len(trainCfg.RL.Engines) != engines || !trainCfg.LoRA.Enabled {
		t.Fatalf("the trainer lists %d engines (lora %v), the recipes deploy %d", len(trainCfg.RL.Engines), trainCfg.LoRA.Enabled, engines)
	}
	for _, u := range trainCfg.RL.Engines {
		m := regexp.MustCompile(`^http://([a-z0-9-]+):(\d+)/v1$`).FindStringSubmatch(u)
		svc, _ := all["Service/"+m[1]].(*corev1.Service)
		if m == nil || svc == nil || fmt.Sprint(svc.Spec.Ports[0].Port) != m[2] {
			t.Fatalf("rl.engines %s is not one of the engines' Services", u)
		}
	}
	job := all["PyTorchJob/agemem-grpo"].(*kubeflowv1.PyTorchJob)
	if job.Spec.NprocPerNode == nil || *job.Spec.NprocPerNode != "1" {
		t.Fatal("nprocPerNode must be 1: a rank per pod, WORLD_SIZE the pods")
	}
	for role, spec := range job.Spec.PyTorchReplicaSpecs {
		c := spec.Template.Spec.Containers[0]
		if c.Name != "pytorch" || !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "pytorchjob-port" }) {
			t.Fatalf("%s: the training operator wants the container pytorch with the port pytorchjob-port", role)
		}
		if !slices.Equal(c.Command[:2], []string{"agemem-train", "train"}) {
			t.Fatalf("%s runs %v", role, c.Command)
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == trainCfg.RL.EngineKeyEnv && e.ValueFrom != nil && all["Secret/"+e.ValueFrom.SecretKeyRef.Name] != nil
		}) {
			t.Fatalf("%s: rl.engine_key_env %s is not set from the engines' Secret", role, trainCfg.RL.EngineKeyEnv)
		}
		for _, vol := range spec.Template.Spec.Volumes {
			if vol.ConfigMap != nil && all["ConfigMap/"+vol.ConfigMap.Name] == nil {
				t.Fatalf("%s mounts ConfigMap %s, which no recipe defines", role, vol.ConfigMap.Name)
			}
		}
	}
	// A misspelt field fails: the check is not a formality.
	bad := bytes.Replace(objects(t, filepath.Join("kubernetes", "trainer-pytorchjob.yaml"))[1].raw, []byte("restartPolicy"), []byte("restartPolicyy"), 1)
	if err := yaml.UnmarshalStrict(bad, &kubeflowv1.PyTorchJob{}); err == nil || !strings.Contains(err.Error(), "restartPolicyy") {
		t.Fatalf("a misspelt field decoded: %v", err)
	}
}
