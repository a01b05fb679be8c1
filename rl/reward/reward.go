// Package reward is AgeMem's composite trajectory reward (Appendix A.2):
//
//	R(τ) = w_task·R_task + w_context·R_context + w_memory·R_memory + P_penalty   (Eq. 16)
//
// computed from a played episode (env.Result) and its task. Every component
// is returned, so a run can log them per rollout. The judges the paper runs
// with an LLM (task score, storage quality, relevance) default to
// deterministic stand-ins (HotpotQA's F1, token-F1 matching of supporting
// facts, embedding cosine); Judge lets an LLM take the task score.
package reward

import (
	"context"
	"math"
	"strings"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/chat"
)

// Weights are every coefficient of Eq. 16-26.
type Weights struct {
	Task    float64 `yaml:"w_task"`    // w_task, 1/3 (Eq. 16)
	Context float64 `yaml:"w_context"` // w_context, 1/3
	Memory  float64 `yaml:"w_memory"`  // w_memory, 1/3
	// α of Eq. 18, 1/3 each.
	Compression  float64 `yaml:"alpha_compression"`
	Preventive   float64 `yaml:"alpha_preventive"`
	Preservation float64 `yaml:"alpha_preservation"`
	// β of Eq. 22, 1/3 each.
	Storage     float64 `yaml:"beta_storage"`
	Maintenance float64 `yaml:"beta_maintenance"`
	Relevance   float64 `yaml:"beta_relevance"`
	// Penalties (Eq. 17, 26): no answer −1, too many rounds −1, context
	// overflow −0.5.
	NoAnswer float64 `yaml:"p_no_answer"`
	Rounds   float64 `yaml:"p_rounds"`
	Overflow float64 `yaml:"p_overflow"`
	// Format is added once per reply that broke the format (a tool call
	// that does not parse; the agent answered it with a format message):
	// not in the paper (0), the format term of R1-style rewards.
	Format float64 `yaml:"p_format"`
	// TMax is T_max of Eq. 19 and 26, 8192.
	TMax int `yaml:"t_max"`
}

// Config is the reward and its judges (config section "reward").
type Config struct {
	Weights `yaml:",inline"`
	// Judge scores answers (Eq. 17): f1 | em (HotpotQA normalised) |
	// policy (the Appendix C.2 prompt sent to the starting policy) |
	// ollama (sent to JudgeModel).
	Judge      string `yaml:"judge"`
	JudgeModel string `yaml:"judge_model"`
	// StorageJudge decides Eq. 23's high-quality entries: f1 (token F1 at
	// least StorageF1Threshold with a supporting fact) | policy | ollama.
	StorageJudge       string  `yaml:"storage_judge"`
	StorageF1Threshold float64 `yaml:"storage_f1"`
	// RelevanceJudge is S_LLM of Eq. 25: cosine | policy | ollama.
	RelevanceJudge string `yaml:"relevance_judge"`
}

// DefaultConfig is the paper's weights with deterministic judges.
func DefaultConfig() Config {
	third := 1.0 / 3
	return Config{Weights: Weights{Task: third, Context: third, Memory: third,
		Compression: third, Preventive: third, Preservation: third,
		Storage: third, Maintenance: third, Relevance: third,
		NoAnswer: -1, Rounds: -1, Overflow: -0.5, TMax: 8192},
		Judge: "f1", StorageJudge: "f1", StorageF1Threshold: 0.5, RelevanceJudge: "cosine"}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	w := c.Weights
	for _, kv := range []struct {
		key string
		v   float64
	}{{"w_task", w.Task}, {"w_context", w.Context}, {"w_memory", w.Memory},
		{"alpha_compression", w.Compression}, {"alpha_preventive", w.Preventive}, {"alpha_preservation", w.Preservation},
		{"beta_storage", w.Storage}, {"beta_maintenance", w.Maintenance}, {"beta_relevance", w.Relevance}} {
		e.NotNegative(kv.key, kv.v)
	}
	for _, kv := range []struct {
		key string
		v   float64
	}{{"p_no_answer", w.NoAnswer}, {"p_rounds", w.Rounds}, {"p_overflow", w.Overflow}, {"p_format", w.Format}} {
		if kv.v > 0 {
			e.Add(kv.key, "%g is a penalty: zero or negative", kv.v)
		}
	}
	e.AtLeast("t_max", w.TMax, 1)
	e.OneOf("judge", c.Judge, "f1", "em", "policy", "ollama", "openai")
	e.OneOf("storage_judge", c.StorageJudge, "f1", "policy", "ollama", "openai")
	e.OneOf("relevance_judge", c.RelevanceJudge, "cosine", "policy", "ollama", "openai")
	if (c.Uses("ollama") || c.Uses("openai")) && c.JudgeModel == "" {
		e.Add("judge_model", "must name a model when a judge is ollama or openai")
	}
	if c.StorageF1Threshold <= 0 || c.StorageF1Threshold > 1 {
		e.Add("storage_f1", "%g is outside (0, 1]", c.StorageF1Threshold)
	}
	return e.Err()
}

// Uses reports whether some judge is backend (ollama, openai, policy).
func (c Config) Uses(backend string) bool {
	return c.Judge == backend || c.StorageJudge == backend || c.RelevanceJudge == backend
}

// Breakdown is a reward and its parts.
type Breakdown struct {
	Total float64 `json:"reward"`

	Task    float64 `json:"r_task"`
	Context float64 `json:"r_context"`
	Memory  float64 `json:"r_memory"`
	Penalty float64 `json:"p_penalty"`

	Compression  float64 `json:"r_compression"`
	Preventive   float64 `json:"r_preventive"`
	Preservation float64 `json:"r_preservation"`
	Storage      float64 `json:"r_storage"`
	Maintenance  float64 `json:"r_maintenance"`
	Relevance    float64 `json:"r_relevance"`

	Overflowed  bool `json:"overflow"`
	RoundsOver  bool `json:"rounds_exceeded"`
	StoredTotal int  `json:"stored"`
	StoredGood  int  `json:"stored_high_quality"`
}

// Compute scores one played episode of task t: what happened (Observe),
// what the judges make of it (Ask), then the equations.
func Compute(ctx context.Context, w Weights, t env.Task, r env.Result, j Judges) (Breakdown, error) {
	o := Observe(r, w.TMax)
	v, err := Ask(ctx, j, t, o)
	if err != nil {
		return Breakdown{}, err
	}
	b := Breakdown{Overflowed: o.Overflowed, RoundsOver: o.RoundsOver, StoredTotal: len(o.Stored), StoredGood: v.StoredGood}
	b.Task = taskReward(w, o, v)
	b.Context, b.Compression, b.Preventive, b.Preservation = contextReward(w, o, t)
	b.Memory, b.Storage, b.Maintenance, b.Relevance = memoryReward(w, o, v)
	b.Penalty = penalty(w, o)
	b.Total = w.Task*b.Task + w.Context*b.Context + w.Memory*b.Memory + b.Penalty // Eq. 16
	return b, nil
}

// taskReward is R_task, Eq. 17: the judge's score of the answer, or
// P_no-answer when there is none.
func taskReward(w Weights, o Observation, v Verdicts) float64 {
	if !o.Answered {
		return w.NoAnswer
	}
	return v.Task
}

// contextReward is R_context, Eq. 18-21: α-weighted compression
// (1 − T_used/T_max, Eq. 19), preventive reduction (a Summary or Filter
// before any overflow, Eq. 20) and preservation (every key item of the
// query still in the answering context, Eq. 21).
func contextReward(w Weights, o Observation, t env.Task) (total, compression, preventive, preservation float64) {
	compression = math.Max(0, 1-float64(o.ContextTokens)/float64(w.TMax))
	if o.Reduced && !o.OverflowBeforeReduction {
		preventive = 1
	}
	preservation = preserved(memtools.KeyItems(t.Question), o.FinalPrompt)
	total = w.Compression*compression + w.Preventive*preventive + w.Preservation*preservation
	return
}

// memoryReward is R_memory, Eq. 22-25: β-weighted storage quality (the
// share of Stage 1 entries judged high quality, Eq. 23), maintenance (an
// Update or Delete, Eq. 24) and the relevance of Stage 3's retrievals to
// the question (Eq. 25).
func memoryReward(w Weights, o Observation, v Verdicts) (total, storage, maintenance, relevance float64) {
	storage = float64(v.StoredGood) / math.Max(1, float64(len(o.Stored)))
	if o.Maintained {
		maintenance = 1
	}
	relevance = v.Relevance
	total = w.Storage*storage + w.Maintenance*maintenance + w.Relevance*relevance
	return
}

// penalty is P_penalty, Eq. 26: P_rounds when a turn ran out of steps,
// P_overflow when a prompt exceeded T_max; and p_format per malformed
// reply.
func penalty(w Weights, o Observation) float64 {
	p := w.Format * float64(o.FormatErrors)
	if o.RoundsOver {
		p += w.Rounds
	}
	if o.Overflowed {
		p += w.Overflow
	}
	return p
}

// preserved is 1 when every key item of the query is still in the context
// the answer was generated from (Eq. 21), directly or in a summary.
func preserved(items []string, ctxMsgs []chat.Message) float64 {
	var all strings.Builder
	for _, m := range ctxMsgs {
		all.WriteString(strings.ToLower(m.Content))
		all.WriteByte('\n')
	}
	text := all.String()
	for _, it := range items {
		if !strings.Contains(text, strings.ToLower(it)) {
			return 0
		}
	}
	return 1
}
