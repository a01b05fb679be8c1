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
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
)

// Weights are every coefficient of Eq. 16-26 (config section "reward").
type Weights struct {
	Task, Context, Memory                 float64 // w, 1/3 each
	Compression, Preventive, Preservation float64 // α of Eq. 18, 1/3 each
	Storage, Maintenance, Relevance       float64 // β of Eq. 22, 1/3 each
	NoAnswer, Rounds, Overflow            float64 // P_no-answer −1, P_rounds −1, P_overflow −0.5
	TMax                                  int     // T_max of Eq. 19 and 26, 8192
}

// Judges are the evaluators the paper runs with an LLM.
type Judges struct {
	Task      Judge          // S_judge of Eq. 17
	Storage   StorageJudge   // high-quality entries of Eq. 23
	Relevance RelevanceJudge // S_LLM(R, q) of Eq. 25
}

// StorageJudge decides whether a stored entry is high quality for a task.
type StorageJudge interface {
	HighQuality(ctx context.Context, t env.Task, entry string) (bool, error)
}

// RelevanceJudge scores retrieved memories against a question in [0, 1].
type RelevanceJudge interface {
	Relevance(ctx context.Context, question string, mems []string) (float64, error)
}

// F1Storage counts an entry as high quality when its token F1 with some
// supporting fact reaches Threshold (0.5 by default).
type F1Storage struct{ Threshold float64 }

// HighQuality implements StorageJudge.
func (s F1Storage) HighQuality(_ context.Context, t env.Task, entry string) (bool, error) {
	return bestF1(entry, t.SupportingFacts) >= s.Threshold, nil
}

// CosineRelevance is the mean cosine, clipped to [0, 1], of the question's
// embedding with each memory's.
type CosineRelevance struct{ Embedder embed.Embedder }

// Relevance implements RelevanceJudge.
func (c CosineRelevance) Relevance(ctx context.Context, question string, mems []string) (float64, error) {
	vecs, err := c.Embedder.Embed(ctx, append([]string{question}, mems...))
	if err != nil {
		return 0, fmt.Errorf("relevance: %w", err)
	}
	var s float64
	for _, v := range vecs[1:] {
		s += math.Max(0, embed.Cosine(vecs[0], v))
	}
	return s / float64(len(mems)), nil
}

// StoragePrompt asks an LLM whether one stored entry is worth keeping for
// the task (Eq. 23: "identified as high-quality based on an LLM's analysis
// of the input query and its expected answer").
const StoragePrompt = `You are an expert judge of an agent's long-term memory.
Question: [QUESTION]
Expected answer: [ANSWER]
Stored memory entry: [ENTRY]
Does this entry hold information that helps answer the question? Respond with only 1 (yes) or 0 (no).`

// RelevancePrompt asks an LLM for S_LLM(R, q) of Eq. 25.
const RelevancePrompt = `You are an expert judge of retrieval quality.
Question: [QUESTION]
Retrieved memories:
[MEMORIES]
How relevant are the retrieved memories to the question, on a scale of 0.0 to 1.0? Respond with only a number between 0.0 and 1.0 (e.g., "0.85").`

// LLMStorage asks a policy with StoragePrompt.
type LLMStorage struct{ Policy memtools.Policy }

// HighQuality implements StorageJudge.
func (j LLMStorage) HighQuality(ctx context.Context, t env.Task, entry string) (bool, error) {
	p := strings.NewReplacer("[QUESTION]", t.Question, "[ANSWER]", t.Answer, "[ENTRY]", entry).Replace(StoragePrompt)
	v, err := askNumber(ctx, j.Policy, p)
	return v >= 0.5, err
}

// LLMRelevance asks a policy with RelevancePrompt.
type LLMRelevance struct{ Policy memtools.Policy }

// Relevance implements RelevanceJudge.
func (j LLMRelevance) Relevance(ctx context.Context, question string, mems []string) (float64, error) {
	p := strings.NewReplacer("[QUESTION]", question, "[MEMORIES]", "- "+strings.Join(mems, "\n- ")).Replace(RelevancePrompt)
	return askNumber(ctx, j.Policy, p)
}

// askNumber sends a judging prompt and reads the first number in [0, 1] of
// the reply.
func askNumber(ctx context.Context, pol memtools.Policy, prompt string) (float64, error) {
	out, err := pol.Complete(ctx, []stm.Message{{Role: stm.User, Content: prompt}})
	if err != nil {
		return 0, fmt.Errorf("llm judge: %w", err)
	}
	m := number.FindString(out.Text)
	if m == "" {
		return 0, fmt.Errorf("llm judge: no score in %q", out.Text)
	}
	v, _ := strconv.ParseFloat(m, 64)
	return math.Min(1, math.Max(0, v)), nil
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

// Judge scores an answer against the ground truth in [0, 1].
type Judge interface {
	Score(ctx context.Context, question, gold, pred string) (float64, error)
}

// F1Judge is HotpotQA's normalised token F1 (the default).
type F1Judge struct{}

// Score implements Judge.
func (F1Judge) Score(_ context.Context, _, gold, pred string) (float64, error) {
	return env.F1(pred, gold), nil
}

// EMJudge is HotpotQA's normalised exact match.
type EMJudge struct{}

// Score implements Judge.
func (EMJudge) Score(_ context.Context, _, gold, pred string) (float64, error) {
	return env.ExactMatch(pred, gold), nil
}

// JudgePrompt is the answer-correctness prompt of Appendix C.2.
const JudgePrompt = `You are an expert judge evaluating the correctness of answers to questions. Given the following information:
- Question: [QUESTION]
- Ground-truth Answer: [GROUND_TRUTH]
- Agent's Answer: [AGENT_ANSWER]
Please evaluate the generated answer on a scale of 0.0 to 1.0:
- 1.0: Perfect match or equivalent correct answer
- 0.8-0.9: Mostly correct with minor differences
- 0.6-0.7: Partially correct or close approximation
- 0.4-0.5: Some correct elements but significant errors
- 0.2-0.3: Mostly incorrect with few correct elements
- 0.0-0.1: Completely incorrect or irrelevant
Respond with only a number between 0.0 and 1.0 (e.g., "0.85").`

// LLMJudge asks a policy (any model behind memtools.Policy) with the
// paper's prompt and reads the first number of its reply.
type LLMJudge struct{ Policy memtools.Policy }

var number = regexp.MustCompile(`[01](?:\.\d+)?|\.\d+`)

// Score implements Judge.
func (j LLMJudge) Score(ctx context.Context, question, gold, pred string) (float64, error) {
	p := strings.NewReplacer("[QUESTION]", question, "[GROUND_TRUTH]", gold, "[AGENT_ANSWER]", pred).Replace(JudgePrompt)
	return askNumber(ctx, j.Policy, p)
}

// Compute scores one played episode of task t.
func Compute(ctx context.Context, w Weights, t env.Task, r env.Result, j Judges) (Breakdown, error) {
	var b Breakdown
	// R_task, Eq. 17.
	if r.HasAnswer {
		s, err := j.Task.Score(ctx, t.Question, t.Answer, r.Answer)
		if err != nil {
			return b, err
		}
		b.Task = s
	} else {
		b.Task = w.NoAnswer
	}
	// Walk the episode's steps in order for the context and penalty terms.
	reduced, overflowBeforeReduction := false, false
	var lastPrompt []stm.Message
	var retrieved []string
	for stage, turns := range r.Stages {
		for _, turn := range turns {
			if turn.Trace.StepLimitHit {
				b.RoundsOver = true
			}
			for _, s := range turn.Trace.Steps {
				if s.Overflow || s.PromptTokens > w.TMax {
					b.Overflowed = true
					if !reduced {
						overflowBeforeReduction = true
					}
				}
				lastPrompt = s.Prompt
				for _, res := range s.Results {
					if !res.OK {
						continue
					}
					switch res.Name {
					case memtools.ToolSummary, memtools.ToolFilter:
						reduced = true
					case memtools.ToolUpdate, memtools.ToolDelete:
						b.Maintenance = 1 // Eq. 24
					case memtools.ToolAdd:
						if stage == 0 && res.Entry != nil {
							b.StoredTotal++
							good, err := j.Storage.HighQuality(ctx, t, res.Entry.Content)
							if err != nil {
								return b, err
							}
							if good {
								b.StoredGood++
							}
						}
					case memtools.ToolRetrieve:
						if stage == 2 {
							for _, m := range res.Retrieved {
								retrieved = append(retrieved, m.Content)
							}
						}
					}
				}
			}
		}
	}
	// R_context, Eq. 18-21.
	b.Compression = math.Max(0, 1-float64(r.ContextTokens)/float64(w.TMax))
	if reduced && !overflowBeforeReduction {
		b.Preventive = 1
	}
	b.Preservation = preserved(memtools.KeyItems(t.Question), lastPrompt)
	b.Context = w.Compression*b.Compression + w.Preventive*b.Preventive + w.Preservation*b.Preservation
	// R_memory, Eq. 22-25.
	b.Storage = float64(b.StoredGood) / math.Max(1, float64(b.StoredTotal))
	if len(retrieved) > 0 {
		rel, err := j.Relevance.Relevance(ctx, t.Question, retrieved)
		if err != nil {
			return b, err
		}
		b.Relevance = rel
	}
	b.Memory = w.Storage*b.Storage + w.Maintenance*b.Maintenance + w.Relevance*b.Relevance
	// Penalties, Eq. 26.
	if b.RoundsOver {
		b.Penalty += w.Rounds
	}
	if b.Overflowed {
		b.Penalty += w.Overflow
	}
	b.Total = w.Task*b.Task + w.Context*b.Context + w.Memory*b.Memory + b.Penalty
	return b, nil
}

// bestF1 is the best token F1 of an entry with any supporting fact.
func bestF1(content string, facts []string) float64 {
	best := 0.0
	for _, f := range facts {
		best = math.Max(best, env.F1(content, f))
	}
	return best
}

// preserved is 1 when every key item of the query is still in the context
// the answer was generated from (Eq. 21), directly or in a summary.
func preserved(items []string, ctxMsgs []stm.Message) float64 {
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
