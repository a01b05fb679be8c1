// Package config is the one typed configuration every agemem command reads.
//
// A config is YAML. Decoding is strict: an unknown or misspelt key is an
// error that names its full path (for example "tools.filter_threshhold") and
// the file and line it sits on. Each section belongs to the package that
// uses it (embed.Config is the "embed" section, memtools.Options "tools",
// and so on): the package owns its keys, defaults and checks, and this
// package composes them, adds the checks that span sections and loads
// files. Every default comes from the AgeMem paper (Appendix A and C.4) or,
// where the paper is silent, from the common choice, and is documented next
// to its key in configs/tiny.yaml.
package setup

import (
	"fmt"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/nestful"
	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/env/pretrain"
	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/llm/ollama"
	"github.com/agemem/agemem/llm/openai"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/sft"
	"github.com/agemem/agemem/model/simcse"
	"github.com/agemem/agemem/papers/fittext"
	"github.com/agemem/agemem/papers/memtool"
	"github.com/agemem/agemem/papers/memtoolagent"
	"github.com/agemem/agemem/papers/tamem"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/rl/cluster"
	"github.com/agemem/agemem/rl/reward"
	"github.com/agemem/agemem/serve"
)

// Config is the whole configuration.
type Config struct {
	// Seed makes data generation, sampling and rollouts reproducible.
	Seed int64 `yaml:"seed"`
	// Embed selects the text encoder enc(.) of Eq. 8-10 and 15.
	Embed embed.Config `yaml:"embed"`
	// Memory selects the long-term store M.
	Memory ltm.Config `yaml:"memory"`
	// Tools holds the defaults of the six memory tools (Appendix A.1).
	Tools memtools.Options `yaml:"tools"`
	// Agent bounds the agent loop.
	Agent memtools.Agent `yaml:"agent"`
	// Episode shapes the three stages of Appendix A.3.
	Episode env.Stages `yaml:"episode"`
	// Data names task files.
	Data Data `yaml:"data"`
	// Model is the policy: where it lives and the embedded default's shape.
	Model Model `yaml:"model"`
	// LoRA trains a low-rank adapter instead of every weight.
	LoRA lora.Options `yaml:"lora"`
	// Optim holds AdamW's hyperparameters, shared by SFT and RL.
	Optim optim.Config `yaml:"optim"`
	// Pretrain installs copying in a model trained from scratch.
	Pretrain pretrain.Config `yaml:"pretrain"`
	// SFT is supervised fine-tuning on chat JSONL.
	SFT sft.Config `yaml:"sft"`
	// RL is step-wise GRPO (agemem-train train).
	RL rl.Config `yaml:"rl"`
	// Cluster is how the ranks of a training run across processes talk
	// (used when a launcher starts more than one).
	Cluster cluster.Config `yaml:"cluster"`
	// Reward holds every weight of Appendix A.2.
	Reward reward.Config `yaml:"reward"`
	// Eval configures agemem-train eval.
	Eval Eval `yaml:"eval"`
	// Serve configures the HTTP server (serve).
	Serve serve.Config `yaml:"serve"`
	// Ollama is the server behind every role set to "ollama".
	Ollama ollama.Config `yaml:"ollama"`
	// OpenAI is the OpenAI-compatible server behind every role set to
	// "openai".
	OpenAI openai.Config `yaml:"openai"`
	// MCP names the MCP servers whose tools agemem-train agent offers.
	MCP agent.MCPConfig `yaml:"mcp"`
	// SimCSE trains sentence encoders (agemem-train embed train).
	SimCSE simcse.Config `yaml:"simcse"`
	// MemTool is the working set of tools (agemem-train memtool).
	MemTool memtool.Config `yaml:"memtool"`
	// FitText is tool retrieval with pseudo-tools (agemem-train tools
	// retrieve) and its agent's tree search (tools run --agent dfsdt).
	FitText fittext.Config `yaml:"fittext"`
	// MemToolAgent is a memory of past tool use (agemem-train tools run).
	MemToolAgent memtoolagent.Config `yaml:"memtoolagent"`
	// TAMem is TA-Mem on LoCoMo (agemem-train locomo run --method ta-mem).
	TAMem tamem.Config `yaml:"tamem"`
	// WorkBench is the benchmark tools run --env workbench plays.
	WorkBench workbench.Config `yaml:"workbench"`
	// Nestful is the benchmark tools run --env nestful plays.
	Nestful nestful.Config `yaml:"nestful"`
}

// Eval configures the held-out comparison.
type Eval struct {
	// Tasks is how many tasks of data.eval to play (0: all).
	Tasks int `yaml:"tasks"`
	// Out is the JSON report.
	Out string `yaml:"out"`
}

// Model locates the policy.
type Model struct {
	// Path is the Hugging Face directory training starts from (config.json,
	// tokenizer.json, tokenizer_config.json, safetensors).
	Path string `yaml:"path"`
	// Dtype is the dtype of saved full weights: f32 | bf16 (masters stay f32).
	Dtype string `yaml:"dtype"`
	// Device runs generation (rollouts, eval): auto | cpu | cuda | cuda:N.
	Device string `yaml:"device"`
	// Quantize holds the weights of generation that is not training (eval,
	// episode, generate, serve, the agents) as q8_0 (GGUF's 8-bit blocks,
	// the values Ollama's q8_0 runs: about half the bytes of bf16 a CPU
	// decode reads) or as stored (""). GRPO's rollouts keep the trained
	// weights, whose log-probabilities the update needs.
	Quantize string `yaml:"quantize"`
	// Devices run the training steps (SFT and GRPO), data-parallel: empty
	// trains on the CPU autodiff tape; [cuda:0, cuda:1] keeps a replica on
	// each GPU and all-reduces the gradients (NCCL when it loads, else
	// host memory); cpu entries are simulated devices.
	Devices []string `yaml:"devices"`
	// TrainDtype is the precision of the training matmuls on GPUs: f32, or
	// bf16 (tensor cores, f32 accumulation; the frozen base under LoRA is
	// then held in bf16; trainable weights, gradients and AdamW stay f32),
	// or q8_0 (bf16, with the base's projections held as Q8_0 blocks, a
	// quarter of f32's bytes; needs lora.enabled).
	TrainDtype string `yaml:"train_dtype"`
	// ZeroStage is how much of the training state the data-parallel
	// devices split between them, DeepSpeed's stages: 0 none; 1 the AdamW
	// moments (each device updates its share of the parameters and sends
	// them to the others); 2 also the gradients (each summed onto its
	// owner as the backward produces it) and, with train_dtype bf16, the
	// float32 master weights under bf16 working copies on every device.
	ZeroStage int `yaml:"zero_stage"`
	// OffloadReference keeps the frozen reference policy (full
	// fine-tuning at rl.beta > 0) in host memory and uploads its layers
	// one at a time for its forward: a layer on each device instead of a
	// second model.
	OffloadReference bool `yaml:"offload_reference"`
	// Init is the shape `agemem-train init-model --config` writes.
	Init ModelInit `yaml:"init"`
}

// ModelInit is a Qwen shape (config.json's names).
type ModelInit struct {
	ModelType     string  `yaml:"model_type"`
	HiddenSize    int     `yaml:"hidden_size"`
	Layers        int     `yaml:"num_hidden_layers"`
	Heads         int     `yaml:"num_attention_heads"`
	KVHeads       int     `yaml:"num_key_value_heads"`
	HeadDim       int     `yaml:"head_dim"`
	Intermediate  int     `yaml:"intermediate_size"`
	RopeTheta     float64 `yaml:"rope_theta"`
	MaxPositions  int     `yaml:"max_position_embeddings"`
	TieEmbeddings bool    `yaml:"tie_word_embeddings"`
}

// Data names task files.
type Data struct {
	// Train is a HotpotQA-format JSON file.
	Train string `yaml:"train"`
	// Eval is a HotpotQA-format JSON file of held-out tasks.
	Eval string `yaml:"eval"`
	// Val is a task file GRPO validates on (rl.val_every, rl.keep_best):
	// drawn apart from both train and eval, so choosing a checkpoint by
	// it leaves the held-out table unbiased; "" for none.
	Val string `yaml:"val"`
}

// Default returns the paper's defaults.
func Default() Config {
	return Config{
		Seed:    1,
		Embed:   embed.DefaultConfig(),
		Memory:  ltm.DefaultConfig(),
		Tools:   memtools.DefaultOptions(),
		Agent:   memtools.DefaultAgent(),
		Episode: env.DefaultStages(),
		Data:    Data{Train: "data/synth.json", Eval: "data/synth-eval.json"},
		Model: Model{Path: "runs/tiny/base", Dtype: "f32", Device: "auto", Devices: []string{}, TrainDtype: "f32", Init: ModelInit{
			ModelType: "qwen3", HiddenSize: 96, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 24,
			Intermediate: 256, RopeTheta: 10000, MaxPositions: 4096, TieEmbeddings: true}},
		LoRA:     lora.DefaultOptions(qwen.LoRATargets),
		Optim:    optim.DefaultConfig(),
		Pretrain: pretrain.DefaultConfig(),
		SFT:      sft.DefaultConfig(),
		RL:       rl.DefaultConfig(),
		Cluster:  cluster.DefaultConfig(),
		Reward:   reward.DefaultConfig(),
		Eval:     Eval{Tasks: 60, Out: "runs/tiny/eval.json"},
		Serve:    serve.DefaultConfig(),
		Ollama:   ollama.DefaultConfig(),
		OpenAI:   openai.DefaultConfig(),
		MCP:      agent.MCPConfig{Servers: []agent.MCPServer{}},
		SimCSE:   simcse.DefaultConfig(),
		MemTool:  memtool.DefaultConfig(),
		FitText:  fittext.DefaultConfig(),

		MemToolAgent: memtoolagent.DefaultConfig(),
		TAMem:        tamem.DefaultConfig(),
		WorkBench:    workbench.DefaultConfig(),
		Nestful:      nestful.DefaultConfig(),
	}
}

// Validate checks every section, then what spans sections. The error names
// each key by its full path and says what is accepted.
func (c Config) Validate() error {
	if e := c.problems(); len(e) > 0 {
		return fmt.Errorf("invalid config:\n  %s", e.Error())
	}
	return nil
}

// problems are what Validate reports, each under its key's full path.
func (c Config) problems() valid.Errors {
	var e valid.Errors
	e.Section("embed", c.Embed.Validate())
	e.Section("memory", c.Memory.Validate())
	e.Section("tools", c.Tools.Validate())
	e.Section("agent", c.Agent.Validate())
	e.Section("episode", c.Episode.Validate())
	e.Section("model", c.Model.Validate())
	e.Section("lora", c.LoRA.Validate(qwen.LoRATargets))
	e.Section("optim", c.Optim.Validate())
	e.Section("pretrain", c.Pretrain.Validate())
	e.Section("sft", c.SFT.Validate())
	e.Section("rl", c.RL.Validate())
	e.Section("cluster", c.Cluster.Validate())
	e.Section("reward", c.Reward.Validate())
	if c.Model.TrainDtype == "q8_0" && !c.LoRA.Enabled {
		e.Add("model.train_dtype", "q8_0 holds a frozen base in 8 bits, and full fine-tuning trains every weight: set lora.enabled: true, or train_dtype: bf16")
	}
	if c.RL.KeepBest && c.Data.Val == "" && c.MemTool.Train.Val == "" {
		e.Add("rl.keep_best", "needs validation tasks to choose by: set data.val (a task file drawn apart from data.train and data.eval), or memtool.train.val for memtool train")
	}
	e.AtLeast("eval.tasks", c.Eval.Tasks, 0)
	e.Section("serve", c.Serve.Validate())
	if c.Serve.State == "postgres" && c.Memory.Store != "postgres" {
		e.Add("serve.state", "postgres keeps sessions in memory.dsn's database: set memory.store: postgres (and memory.dsn), or serve.state: memory")
	}
	e.Section("ollama", c.Ollama.Validate())
	e.Section("openai", c.OpenAI.Validate())
	e.Section("mcp", c.MCP.Validate())
	e.Section("simcse", c.SimCSE.Validate())
	e.Section("memtool", c.MemTool.Validate())
	e.Section("fittext", c.FitText.Validate())
	e.Section("memtoolagent", c.MemToolAgent.Validate())
	e.Section("tamem", c.TAMem.Validate())
	e.Section("workbench", c.WorkBench.Validate())
	e.Section("nestful", c.Nestful.Validate())
	return e
}

// Validate checks the model section.
func (m Model) Validate() error {
	var e valid.Errors
	e.OneOf("dtype", m.Dtype, "f32", "bf16")
	e.OneOf("train_dtype", m.TrainDtype, "f32", "bf16", "q8_0")
	if m.ZeroStage < 0 || m.ZeroStage > 2 {
		e.Add("zero_stage", "%d: want 0 (nothing split), 1 (AdamW moments) or 2 (also gradients and f32 masters)", m.ZeroStage)
	}
	if m.Quantize != "" && m.Quantize != "q8_0" {
		e.Add("quantize", "%q: want q8_0, or \"\" for the stored type", m.Quantize)
	}
	e.Device("device", m.Device, true)
	seen := map[string]int{}
	for i, d := range m.Devices {
		key := fmt.Sprintf("devices[%d]", i)
		e.Device(key, d, false)
		if j, ok := seen[d]; ok && d != "cpu" {
			e.Add(key, "%q repeats devices[%d]: each GPU holds one replica", d, j)
		}
		seen[d] = i
	}
	mi := m.Init
	e.OneOf("init.model_type", mi.ModelType, "qwen2", "qwen3")
	e.AtLeast("init.hidden_size", mi.HiddenSize, 2)
	e.AtLeast("init.num_hidden_layers", mi.Layers, 1)
	e.AtLeast("init.num_attention_heads", mi.Heads, 1)
	e.AtLeast("init.num_key_value_heads", mi.KVHeads, 1)
	if mi.KVHeads > 0 && mi.Heads%mi.KVHeads != 0 {
		e.Add("init.num_key_value_heads", "%d does not divide num_attention_heads %d", mi.KVHeads, mi.Heads)
	}
	if mi.HeadDim < 2 || mi.HeadDim%2 != 0 {
		e.Add("init.head_dim", "%d must be even and at least 2 (rotary pairs)", mi.HeadDim)
	}
	e.AtLeast("init.intermediate_size", mi.Intermediate, 1)
	if mi.RopeTheta <= 1 {
		e.Add("init.rope_theta", "%g must be above 1", mi.RopeTheta)
	}
	e.AtLeast("init.max_position_embeddings", mi.MaxPositions, 16)
	return e.Err()
}

// SaveDtype is model.dtype as a safetensors type.
func (m Model) SaveDtype() safetensors.DType {
	if m.Dtype == "bf16" {
		return safetensors.BF16
	}
	return safetensors.F32
}

// EpisodeConfig is the three-stage episode of the episode and agent
// sections.
func (c Config) EpisodeConfig() env.EpisodeConfig {
	return env.NewEpisodeConfig(c.Episode, c.Agent, c.Tools.Offered())
}

// Generation is how generation that is not training holds the weights
// (model.quantize).
func (m Model) Generation() qwen.Options { return qwen.Options{Quantize: m.Quantize} }
