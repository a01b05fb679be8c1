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
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

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
type LLMStorage struct{ Policy llm.Model }

// HighQuality implements StorageJudge.
func (j LLMStorage) HighQuality(ctx context.Context, t env.Task, entry string) (bool, error) {
	p := strings.NewReplacer("[QUESTION]", t.Question, "[ANSWER]", t.Answer, "[ENTRY]", entry).Replace(StoragePrompt)
	v, err := askNumber(ctx, j.Policy, p)
	return v >= 0.5, err
}

// LLMRelevance asks a policy with RelevancePrompt.
type LLMRelevance struct{ Policy llm.Model }

// Relevance implements RelevanceJudge.
func (j LLMRelevance) Relevance(ctx context.Context, question string, mems []string) (float64, error) {
	p := strings.NewReplacer("[QUESTION]", question, "[MEMORIES]", "- "+strings.Join(mems, "\n- ")).Replace(RelevancePrompt)
	return askNumber(ctx, j.Policy, p)
}

// askNumber sends a judging prompt and reads the first number in [0, 1] of
// the reply.
func askNumber(ctx context.Context, pol llm.Model, prompt string) (float64, error) {
	out, err := pol.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: stm.User, Content: prompt}}})
	if err != nil {
		return 0, fmt.Errorf("llm judge: %w", err)
	}
	text := out.Message.Content
	m := number.FindString(text)
	if m == "" {
		return 0, fmt.Errorf("llm judge: no score in %q", text)
	}
	v, _ := strconv.ParseFloat(m, 64)
	return math.Min(1, math.Max(0, v)), nil
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

// LLMJudge asks a policy (any model behind llm.Model) with the
// paper's prompt and reads the first number of its reply.
type LLMJudge struct{ Policy llm.Model }

var number = regexp.MustCompile(`[01](?:\.\d+)?|\.\d+`)

// Score implements Judge.
func (j LLMJudge) Score(ctx context.Context, question, gold, pred string) (float64, error) {
	p := strings.NewReplacer("[QUESTION]", question, "[GROUND_TRUTH]", gold, "[AGENT_ANSWER]", pred).Replace(JudgePrompt)
	return askNumber(ctx, j.Policy, p)
}

// bestF1 is the best token F1 of an entry with any supporting fact.
func bestF1(content string, facts []string) float64 {
	best := 0.0
	for _, f := range facts {
		best = math.Max(best, env.F1(content, f))
	}
	return best
}
