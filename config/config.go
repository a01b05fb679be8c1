// Package config is the one typed configuration every agemem command reads.
//
// A config is YAML. Decoding is strict: an unknown or misspelt key is an
// error that names its full path (for example "tools.filter_threshhold") and
// the file and line it sits on. Every default comes from the AgeMem paper
// (Appendix A and C.4) or, where the paper is silent, from the common choice,
// and is documented next to its key in configs/tiny.yaml.
package config

import (
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is the whole configuration. Sections are added as the toolkit grows;
// each section validates itself.
type Config struct {
	// Seed makes data generation, sampling and rollouts reproducible.
	Seed int64 `yaml:"seed"`
	// Embed selects the text encoder enc(.) of Eq. 8-10 and 15.
	Embed Embed `yaml:"embed"`
	// Memory selects the long-term store M.
	Memory Memory `yaml:"memory"`
	// Tools holds the defaults of the six memory tools (Appendix A.1).
	Tools Tools `yaml:"tools"`
	// Agent bounds the agent loop.
	Agent Agent `yaml:"agent"`
	// Episode shapes the three stages of Appendix A.3.
	Episode Episode `yaml:"episode"`
	// Data names task files.
	Data Data `yaml:"data"`
	// Model is the policy: where it lives and the embedded default's shape.
	Model Model `yaml:"model"`
	// LoRA trains a low-rank adapter instead of every weight.
	LoRA LoRA `yaml:"lora"`
	// Optim holds AdamW's hyperparameters, shared by SFT and RL.
	Optim Optim `yaml:"optim"`
	// SFT is supervised fine-tuning on chat JSONL.
	SFT SFT `yaml:"sft"`
	// RL is step-wise GRPO (agemem-train train).
	RL RL `yaml:"rl"`
	// Reward holds every weight of Appendix A.2.
	Reward Reward `yaml:"reward"`
	// Eval configures agemem-train eval.
	Eval Eval `yaml:"eval"`
	// Serve configures the HTTP server (serve).
	Serve Serve `yaml:"serve"`
	// Ollama is the server behind every role set to "ollama".
	Ollama Ollama `yaml:"ollama"`
	// SimCSE trains sentence encoders (agemem-train embed train).
	SimCSE SimCSE `yaml:"simcse"`
}

// SimCSE configures contrastive training of a sentence encoder.
type SimCSE struct {
	// Init is the encoder training starts from (agemem-train embed init
	// writes a random one; any BERT checkpoint directory works).
	Init string `yaml:"init"`
	// Data is one sentence per line (unsup) or anchor, entailment and
	// contradiction separated by tabs per line (sup).
	Data string `yaml:"data"`
	Mode string `yaml:"mode"`
	// Steps optimiser steps of Batch examples.
	Steps int `yaml:"steps"`
	Batch int `yaml:"batch"`
	// LR is the peak learning rate after WarmupSteps of linear warmup.
	LR          float64 `yaml:"lr"`
	WarmupSteps int     `yaml:"warmup_steps"`
	// Temperature is τ of InfoNCE; Dropout the hidden dropout and
	// AttnDropout the dropout on attention probabilities that together
	// make the unsupervised positive pairs (BERT's 0.1 and 0.1).
	Temperature float64 `yaml:"temperature"`
	Dropout     float64 `yaml:"dropout"`
	AttnDropout float64 `yaml:"attn_dropout"`
	// Pooling is what the loss sees: cls_mlp (SimCSE's), cls or mean.
	Pooling string `yaml:"pooling"`
	// SaveEvery and EvalEvery are in steps (0: only at the end).
	SaveEvery int `yaml:"save_every"`
	EvalEvery int `yaml:"eval_every"`
	// STS is an STS-B-format TSV and Tasks a HotpotQA-format file the run
	// is evaluated on (Spearman, supporting-fact recall@RecallK).
	STS     string `yaml:"sts"`
	Tasks   string `yaml:"tasks"`
	RecallK int    `yaml:"recall_k"`
	// Out receives checkpoints, metrics.jsonl, loss.png, eval.png and
	// encoder/.
	Out string `yaml:"out"`
}

// Ollama configures the connection to an Ollama server and how the policy
// talks to it.
type Ollama struct {
	// Host is the server ("" reads OLLAMA_HOST, then 127.0.0.1:11434).
	Host string `yaml:"host"`
	// Format is how a policy model is driven: raw (prompts rendered here
	// with the Qwen template, raw generation: for policies trained here) or
	// tools (Ollama's chat API with the memory tools as native tools, the
	// calls mapped back to the AgeMem format: for models such as qwen3:4b).
	Format string `yaml:"format"`
	// NumCtx is the context Ollama allocates (0: agent.context_budget +
	// agent.response_budget, so every prompt the budget allows fits).
	NumCtx int `yaml:"num_ctx"`
	// KeepAlive keeps a model loaded between requests.
	KeepAlive time.Duration `yaml:"keep_alive"`
	// Think asks a thinking model to think in tools format: default, on, off.
	Think string `yaml:"think"`
}

// Serve configures the server.
type Serve struct {
	// Addr is the listen address.
	Addr string `yaml:"addr"`
	// Backend runs the policy: native (the built-in engine, continuous
	// batching) or ollama (the model named by Policy on the ollama server).
	Backend string `yaml:"backend"`
	// Policy is the model served: with backend native a directory (a
	// Hugging Face directory, the output of sft or train, or a PEFT adapter
	// directory; Adapter optionally names a LoRA adapter applied on top),
	// with backend ollama an Ollama model name.
	Policy  string `yaml:"policy"`
	Adapter string `yaml:"adapter"`
	// ModelName is the model id of /v1/models; requests must name it.
	ModelName string `yaml:"model_name"`
	// Keys map API keys to namespaces; KeysEnv names an environment variable
	// with more ("key=namespace,key2=namespace2"; namespace * is an admin).
	// With no key at all the server is open and uses memory.namespace.
	Keys    []APIKey `yaml:"keys"`
	KeysEnv string   `yaml:"keys_env"`
	// MaxBatch sequences decode in the same step (continuous batching); 1
	// decodes one at a time.
	MaxBatch int `yaml:"max_batch"`
	// MaxConcurrent agent loops run at once; MaxQueue more wait; beyond
	// that a request gets 429.
	MaxConcurrent int `yaml:"max_concurrent"`
	MaxQueue      int `yaml:"max_queue"`
	// Request limits: body bytes, messages, prompt tokens of one policy call
	// (0: agent.context_budget), max_tokens a request may ask for (0:
	// agent.response_budget).
	MaxBodyBytes    int64 `yaml:"max_body_bytes"`
	MaxMessages     int   `yaml:"max_messages"`
	MaxPromptTokens int   `yaml:"max_prompt_tokens"`
	MaxTokens       int   `yaml:"max_tokens"`
	// Temperature and TopP when a request gives none.
	Temperature float64 `yaml:"temperature"`
	TopP        float64 `yaml:"top_p"`
	// RequestTimeout bounds one request; ShutdownTimeout bounds the wait for
	// requests in flight on SIGINT/SIGTERM.
	RequestTimeout  time.Duration `yaml:"request_timeout"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// Sessions keep short-term contexts for SessionTTL after their last
	// request, at most MaxSessions (least recently used go first).
	SessionTTL  time.Duration `yaml:"session_ttl"`
	MaxSessions int           `yaml:"max_sessions"`
	// LogFormat is json or text (structured logs on stderr).
	LogFormat string `yaml:"log_format"`
}

// APIKey maps a key to the namespace it reads and writes; an admin key
// may name any namespace.
type APIKey struct {
	Key       string `yaml:"key"`
	Namespace string `yaml:"namespace"`
	Admin     bool   `yaml:"admin"`
}

// RL configures step-wise GRPO.
type RL struct {
	// Init is the policy GRPO starts from (a Hugging Face directory, the SFT
	// output); it is also the frozen reference π_ref (with LoRA: its base).
	Init string `yaml:"init"`
	// K rollouts per task form a group; BatchTasks tasks make a step.
	K          int `yaml:"k"`
	BatchTasks int `yaml:"batch_tasks"`
	Steps      int `yaml:"steps"`
	// LR, schedule and warmup as in sft.
	LR          float64 `yaml:"lr"`
	Schedule    string  `yaml:"schedule"`
	WarmupSteps int     `yaml:"warmup_steps"`
	MinLRRatio  float64 `yaml:"min_lr_ratio"`
	// Clip is PPO's ε; Beta the KL weight β (Eq. 6); Eps the ε of Eq. 5.
	Clip float64 `yaml:"clip"`
	Beta float64 `yaml:"beta"`
	Eps  float64 `yaml:"eps"`
	// Aggregation is token-mean or seq-mean-token-mean.
	Aggregation string `yaml:"aggregation"`
	// Epochs over each step's experiences, in Minibatches optimiser steps.
	Epochs      int `yaml:"epochs"`
	Minibatches int `yaml:"minibatches"`
	// BatchTokens bounds one forward/backward micro-batch.
	BatchTokens int `yaml:"batch_tokens"`
	// Temperature and TopP of rollout sampling.
	Temperature float64 `yaml:"temperature"`
	TopP        float64 `yaml:"top_p"`
	SaveEvery   int     `yaml:"save_every"`
	Recompute   bool    `yaml:"recompute"`
	Out         string  `yaml:"out"`
}

// Reward holds the coefficients of Eq. 16-26.
type Reward struct {
	WTask              float64 `yaml:"w_task"`
	WContext           float64 `yaml:"w_context"`
	WMemory            float64 `yaml:"w_memory"`
	AlphaCompression   float64 `yaml:"alpha_compression"`
	AlphaPreventive    float64 `yaml:"alpha_preventive"`
	AlphaPreservation  float64 `yaml:"alpha_preservation"`
	BetaStorage        float64 `yaml:"beta_storage"`
	BetaMaintenance    float64 `yaml:"beta_maintenance"`
	BetaRelevance      float64 `yaml:"beta_relevance"`
	PNoAnswer          float64 `yaml:"p_no_answer"`
	PRounds            float64 `yaml:"p_rounds"`
	POverflow          float64 `yaml:"p_overflow"`
	TMax               int     `yaml:"t_max"`
	Judge              string  `yaml:"judge"`
	JudgeModel         string  `yaml:"judge_model"`
	StorageJudge       string  `yaml:"storage_judge"`
	StorageF1Threshold float64 `yaml:"storage_f1"`
	RelevanceJudge     string  `yaml:"relevance_judge"`
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
	// Devices run the training steps (SFT and GRPO), data-parallel: empty
	// trains on the CPU autodiff tape; [cuda:0, cuda:1] keeps a replica on
	// each GPU and all-reduces the gradients (NCCL when it loads, else
	// host memory); cpu entries are simulated devices.
	Devices []string `yaml:"devices"`
	// TrainDtype is the precision of the training matmuls on GPUs: f32, or
	// bf16 (tensor cores, f32 accumulation; weights, gradients and AdamW
	// stay f32).
	TrainDtype string `yaml:"train_dtype"`
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

// LoRA configures the adapter (PEFT's names).
type LoRA struct {
	Enabled       bool     `yaml:"enabled"`
	R             int      `yaml:"r"`
	Alpha         float64  `yaml:"alpha"`
	Dropout       float64  `yaml:"dropout"`
	TargetModules []string `yaml:"target_modules"`
}

// Optim configures AdamW and clipping.
type Optim struct {
	Beta1       float64 `yaml:"beta1"`
	Beta2       float64 `yaml:"beta2"`
	Eps         float64 `yaml:"eps"`
	WeightDecay float64 `yaml:"weight_decay"`
	ClipNorm    float64 `yaml:"clip_norm"`
}

// SFT configures supervised fine-tuning.
type SFT struct {
	// Data is chat JSONL: one {"messages": [...]} per line.
	Data string `yaml:"data"`
	// EvalFraction of the records is held out for the eval loss.
	EvalFraction float64 `yaml:"eval_fraction"`
	// Steps is the number of optimiser steps.
	Steps int `yaml:"steps"`
	// BatchTokens bounds the tokens of one micro-batch.
	BatchTokens int `yaml:"batch_tokens"`
	// GradAccum micro-batches make one optimiser step.
	GradAccum int `yaml:"grad_accum"`
	// LR is the peak learning rate; Schedule is constant | cosine after
	// WarmupSteps of linear warmup; cosine decays to MinLRRatio·LR.
	LR          float64 `yaml:"lr"`
	Schedule    string  `yaml:"schedule"`
	WarmupSteps int     `yaml:"warmup_steps"`
	MinLRRatio  float64 `yaml:"min_lr_ratio"`
	// LossOn is "last" (the final assistant message of each record: one
	// policy call, as `data sft` writes) or "all" (every assistant message).
	LossOn string `yaml:"loss_on"`
	// EvalEvery and SaveEvery are in optimiser steps (0: only at the end).
	EvalEvery int `yaml:"eval_every"`
	SaveEvery int `yaml:"save_every"`
	// Recompute trades a second forward per layer for activation memory.
	Recompute bool `yaml:"recompute"`
	// Out receives checkpoints, metrics.jsonl, loss.png and the final policy.
	Out string `yaml:"out"`
}

// Embed configures the embedder.
type Embed struct {
	// Backend is "hashing" (deterministic feature hashing, no weights),
	// "encoder" (the BERT-family encoder in Path) or "ollama" (Model on the
	// ollama server). Dim is the hashing dimension; the others have their
	// model's.
	Backend string `yaml:"backend"`
	// Model is the Ollama embedding model (backend ollama).
	Model string `yaml:"model"`
	// Path is the encoder's Hugging Face directory (backend encoder), the
	// output of agemem-train embed train or a BERT checkpoint.
	Path string `yaml:"path"`
	// Pooling is the encoder's sentence vector: cls | cls_mlp | mean.
	Pooling string `yaml:"pooling"`
	// BatchTokens bounds the tokens of one encoder batch.
	BatchTokens int `yaml:"batch_tokens"`
	// Device runs the encoder's batches and the cosine top-k of large
	// memory indexes (at least embed.DeviceMinFloats): auto | cpu | cuda |
	// cuda:N.
	Device string `yaml:"device"`
	// Dim is the embedding dimension.
	Dim int `yaml:"dim"`
	// CharNgrams are the character n-gram lengths hashed besides words.
	CharNgrams []int `yaml:"char_ngrams"`
}

// Memory configures the long-term store.
type Memory struct {
	// Store is "sqlite" (durable, one namespace per user) or "memory".
	Store string `yaml:"store"`
	// Path is the SQLite file.
	Path string `yaml:"path"`
	// Namespace is the namespace commands use when none is given.
	Namespace string `yaml:"namespace"`
	// Sync is SQLite's synchronous mode: "normal" survives a killed process,
	// "full" also survives power loss at the cost of one fsync per write.
	Sync string `yaml:"sync"`
}

// Tools configures the memory tools.
type Tools struct {
	// RetrieveTopK is Retrieve_memory's top_k when the model gives none.
	RetrieveTopK int `yaml:"retrieve_top_k"`
	// MaxTopK caps top_k a model may ask for.
	MaxTopK int `yaml:"max_top_k"`
	// FilterThreshold is theta of Eq. 15.
	FilterThreshold float64 `yaml:"filter_threshold"`
	// Summarizer is "extractive" (deterministic), "policy" (the paper's
	// summarisation prompt sent to the configured policy) or "ollama" (the
	// same prompt sent to SummarizerModel on the ollama server).
	Summarizer      string `yaml:"summarizer"`
	SummarizerModel string `yaml:"summarizer_model"`
	// SummaryMaxTokens bounds an extractive summary.
	SummaryMaxTokens int `yaml:"summary_max_tokens"`
}

// Agent bounds one agent loop.
type Agent struct {
	// MaxSteps is the number of policy calls allowed for one user turn.
	MaxSteps int `yaml:"max_steps"`
	// ContextBudget is T_max, the context budget in tokens (C.4).
	ContextBudget int `yaml:"context_budget"`
	// ResponseBudget is the maximum response length in tokens (C.4).
	ResponseBudget int `yaml:"response_budget"`
	// SystemPrompt is "paper" (Appendix A.1) or "compact" (the same tools
	// and format in a tenth of the tokens, for tiny CPU-trained models).
	SystemPrompt string `yaml:"system_prompt"`
}

// Episode shapes the three-stage episode.
type Episode struct {
	// Stage1MaxTurns bounds the user turns that feed I_q.
	Stage1MaxTurns int `yaml:"stage1_max_turns"`
	// Stage2MaxTurns bounds the distractor turns.
	Stage2MaxTurns int `yaml:"stage2_max_turns"`
	// AutoRetrieveK is k of the automatic retrieval of Algorithm 3, line 4.
	AutoRetrieveK int `yaml:"auto_retrieve_k"`
}

// Data names task files.
type Data struct {
	// Train is a HotpotQA-format JSON file.
	Train string `yaml:"train"`
	// Eval is a HotpotQA-format JSON file of held-out tasks.
	Eval string `yaml:"eval"`
}

// Default returns the paper's defaults.
func Default() Config {
	return Config{
		Seed:   1,
		Embed:  Embed{Backend: "hashing", Dim: 384, CharNgrams: []int{3, 4}, Pooling: "mean", BatchTokens: 8192, Device: "auto"},
		Memory: Memory{Store: "sqlite", Path: "data/memory.db", Namespace: "default", Sync: "normal"},
		Tools: Tools{
			RetrieveTopK:     3,
			MaxTopK:          50,
			FilterThreshold:  0.6,
			Summarizer:       "extractive",
			SummaryMaxTokens: 256,
		},
		Agent:   Agent{MaxSteps: 4, ContextBudget: 8192, ResponseBudget: 2048, SystemPrompt: "paper"},
		Episode: Episode{Stage1MaxTurns: 16, Stage2MaxTurns: 8, AutoRetrieveK: 3},
		Data:    Data{Train: "data/synth.json", Eval: "data/synth-eval.json"},
		Model: Model{Path: "runs/tiny/base", Dtype: "f32", Device: "auto", Devices: []string{}, TrainDtype: "f32", Init: ModelInit{
			ModelType: "qwen3", HiddenSize: 96, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 24,
			Intermediate: 256, RopeTheta: 10000, MaxPositions: 4096, TieEmbeddings: true}},
		LoRA: LoRA{R: 8, Alpha: 16, Dropout: 0.05,
			TargetModules: []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
		Optim: Optim{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, ClipNorm: 1},
		SFT: SFT{Data: "data/sft.jsonl", EvalFraction: 0.05, Steps: 300, BatchTokens: 4096, GradAccum: 1,
			LR: 1e-2, Schedule: "cosine", WarmupSteps: 10, MinLRRatio: 0.1, LossOn: "last",
			EvalEvery: 50, SaveEvery: 100, Out: "runs/tiny/sft"},
		RL: RL{Init: "runs/tiny/sft/policy", K: 8, BatchTasks: 2, Steps: 6, LR: 1e-4, Schedule: "constant", MinLRRatio: 0.1,
			Clip: 0.2, Beta: 0.1, Eps: 1e-6, Aggregation: "token-mean", Epochs: 1, Minibatches: 1, BatchTokens: 4096,
			Temperature: 1, TopP: 1, SaveEvery: 10, Out: "runs/tiny/rl"},
		Reward: Reward{WTask: 1.0 / 3, WContext: 1.0 / 3, WMemory: 1.0 / 3,
			AlphaCompression: 1.0 / 3, AlphaPreventive: 1.0 / 3, AlphaPreservation: 1.0 / 3,
			BetaStorage: 1.0 / 3, BetaMaintenance: 1.0 / 3, BetaRelevance: 1.0 / 3,
			PNoAnswer: -1, PRounds: -1, POverflow: -0.5, TMax: 8192, Judge: "f1", StorageJudge: "f1", StorageF1Threshold: 0.5, RelevanceJudge: "cosine"},
		Eval: Eval{Tasks: 60, Out: "runs/tiny/eval.json"},
		SimCSE: SimCSE{Init: "runs/tiny/encoder", Data: "data/simcse/corpus.txt", Mode: "unsup", Steps: 1000, Batch: 64, LR: 5e-4,
			WarmupSteps: 20, Temperature: 0.05, Dropout: 0.1, AttnDropout: 0.1, Pooling: "mean", SaveEvery: 500, EvalEvery: 200,
			STS: "data/simcse/sts-dev.tsv", Tasks: "data/simcse/tasks-eval.json", RecallK: 3, Out: "runs/tiny/simcse"},
		Ollama: Ollama{Format: "raw", KeepAlive: 5 * time.Minute, Think: "default"},
		Serve: Serve{Addr: "127.0.0.1:8080", Backend: "native", Policy: "runs/tiny/rl/policy", ModelName: "agemem", KeysEnv: "AGEMEM_API_KEYS",
			MaxBatch: 16, MaxConcurrent: 64, MaxQueue: 256, MaxBodyBytes: 1 << 20, MaxMessages: 256,
			Temperature: 1, TopP: 1, RequestTimeout: 5 * time.Minute, ShutdownTimeout: 30 * time.Second,
			SessionTTL: time.Hour, MaxSessions: 10000, LogFormat: "json"},
	}
}

// Validate checks every key against its accepted range. The error names the
// key path and what is accepted.
func (c Config) Validate() error {
	var errs []string
	bad := func(key string, format string, args ...any) {
		errs = append(errs, key+": "+fmt.Sprintf(format, args...))
	}
	oneOf := func(key, v string, ok ...string) {
		for _, o := range ok {
			if v == o {
				return
			}
		}
		bad(key, "%q is not one of %s", v, strings.Join(ok, ", "))
	}
	atLeast := func(key string, v, min int) {
		if v < min {
			bad(key, "%d is below the minimum %d", v, min)
		}
	}
	oneOf("embed.backend", c.Embed.Backend, "hashing", "encoder", "ollama")
	if c.Embed.Backend == "encoder" && c.Embed.Path == "" {
		bad("embed.path", "must name the encoder directory when embed.backend is encoder")
	}
	oneOf("embed.pooling", c.Embed.Pooling, "cls", "cls_mlp", "mean")
	atLeast("embed.batch_tokens", c.Embed.BatchTokens, 16)
	if c.Embed.Backend == "ollama" && c.Embed.Model == "" {
		bad("embed.model", "must name an Ollama embedding model (for example nomic-embed-text) when embed.backend is ollama")
	}
	if c.Embed.Dim < 8 || c.Embed.Dim > 65536 {
		bad("embed.dim", "%d is outside [8, 65536]", c.Embed.Dim)
	}
	for i, n := range c.Embed.CharNgrams {
		if n < 1 || n > 8 {
			bad(fmt.Sprintf("embed.char_ngrams[%d]", i), "%d is outside [1, 8]", n)
		}
	}
	oneOf("memory.store", c.Memory.Store, "sqlite", "memory")
	if c.Memory.Store == "sqlite" && c.Memory.Path == "" {
		bad("memory.path", "must name a file when memory.store is sqlite")
	}
	if c.Memory.Namespace == "" {
		bad("memory.namespace", "must not be empty")
	}
	oneOf("memory.sync", c.Memory.Sync, "normal", "full")
	atLeast("tools.retrieve_top_k", c.Tools.RetrieveTopK, 1)
	atLeast("tools.max_top_k", c.Tools.MaxTopK, c.Tools.RetrieveTopK)
	if c.Tools.FilterThreshold <= 0 || c.Tools.FilterThreshold > 1 {
		bad("tools.filter_threshold", "%g is outside (0, 1]", c.Tools.FilterThreshold)
	}
	oneOf("tools.summarizer", c.Tools.Summarizer, "extractive", "policy", "ollama")
	if c.Tools.Summarizer == "ollama" && c.Tools.SummarizerModel == "" {
		bad("tools.summarizer_model", "must name an Ollama model when tools.summarizer is ollama")
	}
	atLeast("tools.summary_max_tokens", c.Tools.SummaryMaxTokens, 8)
	atLeast("agent.max_steps", c.Agent.MaxSteps, 1)
	atLeast("agent.context_budget", c.Agent.ContextBudget, 64)
	atLeast("agent.response_budget", c.Agent.ResponseBudget, 1)
	oneOf("agent.system_prompt", c.Agent.SystemPrompt, "paper", "compact")
	atLeast("episode.stage1_max_turns", c.Episode.Stage1MaxTurns, 1)
	atLeast("episode.stage2_max_turns", c.Episode.Stage2MaxTurns, 0)
	atLeast("episode.auto_retrieve_k", c.Episode.AutoRetrieveK, 0)
	oneOf("model.dtype", c.Model.Dtype, "f32", "bf16")
	oneOf("model.train_dtype", c.Model.TrainDtype, "f32", "bf16")
	for _, kv := range [][2]string{{"model.device", c.Model.Device}, {"embed.device", c.Embed.Device}} {
		if d := kv[1]; d != "auto" && d != "cpu" && d != "cuda" && !strings.HasPrefix(d, "cuda:") {
			bad(kv[0], "%q is not auto, cpu, cuda or cuda:N", d)
		}
	}
	for i, d := range c.Model.Devices {
		if d != "cpu" && d != "cuda" && !strings.HasPrefix(d, "cuda:") {
			bad(fmt.Sprintf("model.devices[%d]", i), "%q is not cpu, cuda or cuda:N", d)
		}
	}
	mi := c.Model.Init
	oneOf("model.init.model_type", mi.ModelType, "qwen2", "qwen3")
	atLeast("model.init.hidden_size", mi.HiddenSize, 2)
	atLeast("model.init.num_hidden_layers", mi.Layers, 1)
	atLeast("model.init.num_attention_heads", mi.Heads, 1)
	atLeast("model.init.num_key_value_heads", mi.KVHeads, 1)
	if mi.KVHeads > 0 && mi.Heads%mi.KVHeads != 0 {
		bad("model.init.num_key_value_heads", "%d does not divide num_attention_heads %d", mi.KVHeads, mi.Heads)
	}
	if mi.HeadDim < 2 || mi.HeadDim%2 != 0 {
		bad("model.init.head_dim", "%d must be even and at least 2 (rotary pairs)", mi.HeadDim)
	}
	atLeast("model.init.intermediate_size", mi.Intermediate, 1)
	if mi.RopeTheta <= 1 {
		bad("model.init.rope_theta", "%g must be above 1", mi.RopeTheta)
	}
	atLeast("model.init.max_position_embeddings", mi.MaxPositions, 16)
	atLeast("lora.r", c.LoRA.R, 1)
	if c.LoRA.Alpha <= 0 {
		bad("lora.alpha", "%g must be positive", c.LoRA.Alpha)
	}
	if c.LoRA.Dropout < 0 || c.LoRA.Dropout >= 1 {
		bad("lora.dropout", "%g is outside [0, 1)", c.LoRA.Dropout)
	}
	if len(c.LoRA.TargetModules) == 0 {
		bad("lora.target_modules", "must name at least one module")
	}
	for i, m := range c.LoRA.TargetModules {
		oneOf(fmt.Sprintf("lora.target_modules[%d]", i), m, "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
	}
	for key, v := range map[string]float64{"optim.beta1": c.Optim.Beta1, "optim.beta2": c.Optim.Beta2} {
		if v < 0 || v >= 1 {
			bad(key, "%g is outside [0, 1)", v)
		}
	}
	if c.Optim.Eps <= 0 {
		bad("optim.eps", "%g must be positive", c.Optim.Eps)
	}
	if c.Optim.WeightDecay < 0 {
		bad("optim.weight_decay", "%g must not be negative", c.Optim.WeightDecay)
	}
	if c.Optim.ClipNorm < 0 {
		bad("optim.clip_norm", "%g must not be negative (0 turns clipping off)", c.Optim.ClipNorm)
	}
	if c.SFT.EvalFraction < 0 || c.SFT.EvalFraction >= 1 {
		bad("sft.eval_fraction", "%g is outside [0, 1)", c.SFT.EvalFraction)
	}
	atLeast("sft.steps", c.SFT.Steps, 1)
	atLeast("sft.batch_tokens", c.SFT.BatchTokens, 16)
	atLeast("sft.grad_accum", c.SFT.GradAccum, 1)
	if c.SFT.LR <= 0 {
		bad("sft.lr", "%g must be positive", c.SFT.LR)
	}
	oneOf("sft.schedule", c.SFT.Schedule, "constant", "cosine")
	atLeast("sft.warmup_steps", c.SFT.WarmupSteps, 0)
	if c.SFT.MinLRRatio < 0 || c.SFT.MinLRRatio > 1 {
		bad("sft.min_lr_ratio", "%g is outside [0, 1]", c.SFT.MinLRRatio)
	}
	oneOf("sft.loss_on", c.SFT.LossOn, "last", "all")
	atLeast("sft.eval_every", c.SFT.EvalEvery, 0)
	atLeast("sft.save_every", c.SFT.SaveEvery, 0)
	r := c.RL
	atLeast("rl.k", r.K, 1)
	atLeast("rl.batch_tasks", r.BatchTasks, 1)
	atLeast("rl.steps", r.Steps, 1)
	if r.LR <= 0 {
		bad("rl.lr", "%g must be positive", r.LR)
	}
	oneOf("rl.schedule", r.Schedule, "constant", "cosine")
	atLeast("rl.warmup_steps", r.WarmupSteps, 0)
	if r.MinLRRatio < 0 || r.MinLRRatio > 1 {
		bad("rl.min_lr_ratio", "%g is outside [0, 1]", r.MinLRRatio)
	}
	if r.Clip <= 0 || r.Clip >= 1 {
		bad("rl.clip", "%g is outside (0, 1)", r.Clip)
	}
	if r.Beta < 0 {
		bad("rl.beta", "%g must not be negative", r.Beta)
	}
	if r.Eps <= 0 {
		bad("rl.eps", "%g must be positive", r.Eps)
	}
	oneOf("rl.aggregation", r.Aggregation, "token-mean", "seq-mean-token-mean")
	atLeast("rl.epochs", r.Epochs, 1)
	atLeast("rl.minibatches", r.Minibatches, 1)
	atLeast("rl.batch_tokens", r.BatchTokens, 16)
	if r.Temperature < 0 {
		bad("rl.temperature", "%g must not be negative", r.Temperature)
	}
	if r.TopP <= 0 || r.TopP > 1 {
		bad("rl.top_p", "%g is outside (0, 1]", r.TopP)
	}
	atLeast("rl.save_every", r.SaveEvery, 0)
	w := c.Reward
	for key, v := range map[string]float64{"reward.w_task": w.WTask, "reward.w_context": w.WContext, "reward.w_memory": w.WMemory,
		"reward.alpha_compression": w.AlphaCompression, "reward.alpha_preventive": w.AlphaPreventive, "reward.alpha_preservation": w.AlphaPreservation,
		"reward.beta_storage": w.BetaStorage, "reward.beta_maintenance": w.BetaMaintenance, "reward.beta_relevance": w.BetaRelevance} {
		if v < 0 {
			bad(key, "%g must not be negative", v)
		}
	}
	for key, v := range map[string]float64{"reward.p_no_answer": w.PNoAnswer, "reward.p_rounds": w.PRounds, "reward.p_overflow": w.POverflow} {
		if v > 0 {
			bad(key, "%g is a penalty: zero or negative", v)
		}
	}
	atLeast("reward.t_max", w.TMax, 1)
	oneOf("reward.judge", w.Judge, "f1", "em", "policy", "ollama")
	oneOf("reward.storage_judge", w.StorageJudge, "f1", "policy", "ollama")
	oneOf("reward.relevance_judge", w.RelevanceJudge, "cosine", "policy", "ollama")
	if (w.Judge == "ollama" || w.StorageJudge == "ollama" || w.RelevanceJudge == "ollama") && w.JudgeModel == "" {
		bad("reward.judge_model", "must name an Ollama model when a judge is ollama")
	}
	sc := c.SimCSE
	oneOf("simcse.mode", sc.Mode, "unsup", "sup")
	atLeast("simcse.steps", sc.Steps, 1)
	atLeast("simcse.batch", sc.Batch, 2)
	if sc.LR <= 0 {
		bad("simcse.lr", "%g must be positive", sc.LR)
	}
	atLeast("simcse.warmup_steps", sc.WarmupSteps, 0)
	if sc.Temperature <= 0 {
		bad("simcse.temperature", "%g must be positive", sc.Temperature)
	}
	if sc.Dropout < 0 || sc.Dropout >= 1 {
		bad("simcse.dropout", "%g is outside [0, 1)", sc.Dropout)
	}
	if sc.AttnDropout < 0 || sc.AttnDropout >= 1 {
		bad("simcse.attn_dropout", "%g is outside [0, 1)", sc.AttnDropout)
	}
	oneOf("simcse.pooling", sc.Pooling, "cls", "cls_mlp", "mean")
	atLeast("simcse.save_every", sc.SaveEvery, 0)
	atLeast("simcse.eval_every", sc.EvalEvery, 0)
	atLeast("simcse.recall_k", sc.RecallK, 1)
	oneOf("ollama.format", c.Ollama.Format, "raw", "tools")
	oneOf("ollama.think", c.Ollama.Think, "default", "on", "off")
	atLeast("ollama.num_ctx", c.Ollama.NumCtx, 0)
	if c.Ollama.KeepAlive < 0 {
		bad("ollama.keep_alive", "%v must not be negative", c.Ollama.KeepAlive)
	}
	if w.StorageF1Threshold <= 0 || w.StorageF1Threshold > 1 {
		bad("reward.storage_f1", "%g is outside (0, 1]", w.StorageF1Threshold)
	}
	atLeast("eval.tasks", c.Eval.Tasks, 0)
	sv := c.Serve
	if sv.Addr == "" {
		bad("serve.addr", "must not be empty (host:port)")
	}
	oneOf("serve.backend", sv.Backend, "native", "ollama")
	if sv.Backend == "ollama" && sv.Policy == "" {
		bad("serve.policy", "must name the Ollama model when serve.backend is ollama")
	}
	if sv.Backend == "ollama" && sv.Adapter != "" {
		bad("serve.adapter", "applies to the native backend; export a merged model to Ollama instead")
	}
	if sv.ModelName == "" {
		bad("serve.model_name", "must not be empty")
	}
	seen := map[string]bool{}
	for i, k := range sv.Keys {
		key := fmt.Sprintf("serve.keys[%d]", i)
		if len(k.Key) < 8 {
			bad(key+".key", "must be at least 8 characters")
		}
		if seen[k.Key] {
			bad(key+".key", "repeats an earlier key")
		}
		seen[k.Key] = true
		if k.Namespace == "" && !k.Admin {
			bad(key+".namespace", "must name the key's namespace (or set admin: true)")
		}
	}
	atLeast("serve.max_batch", sv.MaxBatch, 1)
	atLeast("serve.max_concurrent", sv.MaxConcurrent, 1)
	atLeast("serve.max_queue", sv.MaxQueue, 0)
	if sv.MaxBodyBytes < 1024 {
		bad("serve.max_body_bytes", "%d is below the minimum 1024", sv.MaxBodyBytes)
	}
	atLeast("serve.max_messages", sv.MaxMessages, 1)
	atLeast("serve.max_prompt_tokens", sv.MaxPromptTokens, 0)
	atLeast("serve.max_tokens", sv.MaxTokens, 0)
	if sv.Temperature < 0 {
		bad("serve.temperature", "%g must not be negative", sv.Temperature)
	}
	if sv.TopP <= 0 || sv.TopP > 1 {
		bad("serve.top_p", "%g is outside (0, 1]", sv.TopP)
	}
	for _, d := range []struct {
		key string
		d   time.Duration
	}{{"serve.request_timeout", sv.RequestTimeout}, {"serve.shutdown_timeout", sv.ShutdownTimeout}, {"serve.session_ttl", sv.SessionTTL}} {
		if d.d <= 0 {
			bad(d.key, "%s must be positive (a duration such as 30s or 5m)", d.d)
		}
	}
	atLeast("serve.max_sessions", sv.MaxSessions, 1)
	oneOf("serve.log_format", sv.LogFormat, "json", "text")
	if len(errs) > 0 {
		return fmt.Errorf("invalid config:\n  %s", strings.Join(errs, "\n  "))
	}
	return nil
}

// Load reads path (empty for the defaults alone), applies the overrides
// ("key.path=value", as given to --set) and validates the result.
func Load(path string, overrides []string) (Config, error) {
	var root yaml.Node
	name := path
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := yaml.Unmarshal(raw, &root); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", path, err)
		}
	} else {
		name = "defaults"
	}
	doc := documentMapping(&root)
	for _, o := range overrides {
		if err := applySet(doc, o); err != nil {
			return Config{}, err
		}
	}
	cfg := Default()
	if err := checkKeys(doc, reflect.TypeOf(cfg), "", name); err != nil {
		return Config{}, err
	}
	// checkKeys accepted every key and value above, so a plain decode is safe.
	if err := doc.Decode(&cfg); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	return cfg, nil
}

// documentMapping returns the top-level mapping of a parsed document,
// creating one for an empty document.
func documentMapping(root *yaml.Node) *yaml.Node {
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		return root.Content[0]
	}
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	*root = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{m}}
	return m
}

// checkKeys walks the YAML mapping beside the Go type and reports the first
// key that has no field, with its full path and the keys that are accepted.
func checkKeys(n *yaml.Node, t reflect.Type, prefix, file string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
				return nil
			}
			return fmt.Errorf("config %s: %s must be a mapping", where(file, n), keyName(prefix))
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := k.Value
			if prefix != "" {
				path = prefix + "." + k.Value
			}
			f, ok := fields[k.Value]
			if !ok {
				names := make([]string, 0, len(fields))
				for name := range fields {
					names = append(names, name)
				}
				sort.Strings(names)
				msg := fmt.Sprintf("config %s: unknown key %s", where(file, k), path)
				if s := closest(k.Value, names); s != "" {
					msg += fmt.Sprintf(" (did you mean %s?)", s)
				}
				return fmt.Errorf("%s; accepted keys here: %s", msg, strings.Join(names, ", "))
			}
			if err := checkKeys(v, f.Type, path, file); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return fmt.Errorf("config %s: %s must be a list", where(file, n), keyName(prefix))
		}
		for i, e := range n.Content {
			if err := checkKeys(e, t.Elem(), fmt.Sprintf("%s[%d]", prefix, i), file); err != nil {
				return err
			}
		}
	default:
		// A leaf: decode it alone so a type error names its key.
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("config %s: %s must be a single %s value", where(file, n), keyName(prefix), t.Kind())
		}
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			kind := t.Kind().String()
			if t == reflect.TypeFor[time.Duration]() {
				kind = "duration (such as 30s, 5m or 1h)"
			}
			return fmt.Errorf("config %s: %s: %q is not a valid %s", where(file, n), keyName(prefix), n.Value, kind)
		}
	}
	return nil
}

// where names a node's place: file:line, or --set for a node an override made.
func where(file string, n *yaml.Node) string {
	if n.Line == 0 {
		return "--set"
	}
	return fmt.Sprintf("%s:%d", file, n.Line)
}

func keyName(p string) string {
	if p == "" {
		return "the document"
	}
	return p
}

func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		out[tag] = f
	}
	return out
}

// closest returns the accepted key nearest to k by edit distance, if close.
func closest(k string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(k, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// applySet applies one "a.b.c=value" override to the document. The value is
// parsed as YAML, so "--set embed.char_ngrams=[3,5]" works.
func applySet(doc *yaml.Node, kv string) error {
	key, val, ok := strings.Cut(kv, "=")
	if !ok || key == "" {
		return fmt.Errorf("--set %q: want key.path=value", kv)
	}
	var v yaml.Node
	if err := yaml.Unmarshal([]byte(val), &v); err != nil {
		return fmt.Errorf("--set %s: value %q: %w", key, val, err)
	}
	var value *yaml.Node
	if len(v.Content) == 1 {
		value = v.Content[0]
	} else {
		value = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: val}
	}
	parts := strings.Split(key, ".")
	n := doc
	for i, p := range parts {
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("--set %s: %s is not a mapping", key, strings.Join(parts[:i], "."))
		}
		var next *yaml.Node
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == p {
				next = n.Content[j+1]
				if i == len(parts)-1 {
					n.Content[j+1] = value
				}
				break
			}
		}
		if i == len(parts)-1 {
			if next == nil {
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: p}, value)
			}
			return nil
		}
		if next == nil {
			next = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: p}, next)
		}
		n = next
	}
	return nil
}

// YAML renders the config, for `agemem-train config`.
func (c Config) YAML() string {
	out, err := yaml.Marshal(c)
	if err != nil {
		return err.Error()
	}
	return string(out)
}
