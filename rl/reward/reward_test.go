package reward

import (
	"context"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

var paper = Weights{Task: 1.0 / 3, Context: 1.0 / 3, Memory: 1.0 / 3,
	Compression: 1.0 / 3, Preventive: 1.0 / 3, Preservation: 1.0 / 3,
	Storage: 1.0 / 3, Maintenance: 1.0 / 3, Relevance: 1.0 / 3,
	NoAnswer: -1, Rounds: -1, Overflow: -0.5, TMax: 1000}

var task = env.Task{
	Question:        "In what year was the founder of Wuzam Trading born?",
	Answer:          "1823",
	SupportingFacts: []string{"Wuzam Trading was founded by Poubais Metras.", "Poubais Metras was born in 1823."},
	Distractors:     []string{"Beakea Trading is a textile firm founded in 1914."},
}

func add(content string) memtools.Result {
	return memtools.Result{Name: memtools.ToolAdd, OK: true, Entry: &ltm.Entry{Content: content}}
}

func step(tokens int, overflow bool, rs ...memtools.Result) memtools.Step {
	return memtools.Step{PromptTokens: tokens, Overflow: overflow, Results: rs,
		Prompt: []chat.Message{{Role: stm.User, Content: task.Question}}}
}

// episode lays out steps per stage; the answer (if any) ends Stage 3.
func episode(s1, s2, s3 []memtools.Step, answer string, hasAnswer bool, ctxTokens int) env.Result {
	var r env.Result
	for i, steps := range [][]memtools.Step{s1, s2, s3} {
		r.Stages[i] = []env.Turn{{Trace: memtools.Trace{Steps: steps}}}
	}
	r.Answer, r.HasAnswer, r.ContextTokens = answer, hasAnswer, ctxTokens
	return r
}

func compute(t *testing.T, r env.Result) Breakdown {
	t.Helper()
	b, err := Compute(context.Background(), paper, task, r, Judges{Task: F1Judge{}, Storage: F1Storage{Threshold: 0.5},
		Relevance: CosineRelevance{Embedder: embed.NewHashing(256, []int{3})}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGoodEpisode(t *testing.T) {
	retrieve := memtools.Result{Name: memtools.ToolRetrieve, OK: true, Retrieved: []ltm.Scored{{Entry: ltm.Entry{Content: task.SupportingFacts[1]}}}}
	filter := memtools.Result{Name: memtools.ToolFilter, OK: true}
	b := compute(t, episode(
		[]memtools.Step{step(100, false, add(task.SupportingFacts[0])), step(120, false, add(task.SupportingFacts[1]))},
		[]memtools.Step{step(200, false, filter)},
		[]memtools.Step{step(250, false, retrieve), step(300, false)},
		"1823", true, 300))
	testkit.Near(t, "R_task", b.Task, 1, 1e-9)
	testkit.Near(t, "R_compression", b.Compression, 0.7, 1e-9) // 1 − 300/1000
	testkit.Near(t, "R_preventive", b.Preventive, 1, 1e-9)
	testkit.Near(t, "R_preservation", b.Preservation, 1, 1e-9)
	testkit.Near(t, "R_context", b.Context, (0.7+1+1)/3, 1e-9)
	testkit.Near(t, "R_storage", b.Storage, 1, 1e-9)
	testkit.Near(t, "R_maintenance", b.Maintenance, 0, 1e-9)
	if b.Relevance <= 0 || b.Relevance > 1 {
		t.Fatalf("R_relevance %g outside (0, 1]", b.Relevance)
	}
	testkit.Near(t, "R_memory", b.Memory, (1+0+b.Relevance)/3, 1e-9)
	testkit.Near(t, "R", b.Total, (1+b.Context+b.Memory)/3, 1e-9)
}

func TestMissingAnswerOverflowAndRounds(t *testing.T) {
	r := episode(nil, []memtools.Step{step(1200, true)}, []memtools.Step{step(1300, true)}, "", false, 1300)
	r.Stages[2][0].Trace.StepLimitHit = true
	b := compute(t, r)
	testkit.Near(t, "R_task without an answer", b.Task, -1, 1e-9)
	testkit.Near(t, "R_compression over budget", b.Compression, 0, 1e-9)
	testkit.Near(t, "R_preventive without a reduction", b.Preventive, 0, 1e-9)
	testkit.Near(t, "P_penalty", b.Penalty, -1.5, 1e-9)
	if !b.Overflowed || !b.RoundsOver {
		t.Fatalf("flags: %+v", b)
	}
	testkit.Near(t, "R", b.Total, (-1+b.Context+b.Memory)/3-1.5, 1e-9)
}

func TestReductionAfterOverflowIsNotPreventive(t *testing.T) {
	filter := memtools.Result{Name: memtools.ToolFilter, OK: true}
	b := compute(t, episode(nil, []memtools.Step{step(1100, true), step(900, false, filter)}, []memtools.Step{step(500, false)}, "1823", true, 500))
	testkit.Near(t, "R_preventive", b.Preventive, 0, 1e-9)
	testkit.Near(t, "P_penalty", b.Penalty, -0.5, 1e-9)
}

func TestStoredDistractorLowersStorage(t *testing.T) {
	b := compute(t, episode([]memtools.Step{step(100, false, add(task.SupportingFacts[0]), add(task.Distractors[0]))}, nil, nil, "1900", true, 100))
	testkit.Near(t, "R_storage", b.Storage, 0.5, 1e-9)
	if b.StoredTotal != 2 || b.StoredGood != 1 {
		t.Fatalf("stored %d, good %d", b.StoredTotal, b.StoredGood)
	}
	testkit.Near(t, "R_task for a wrong answer", b.Task, 0, 1e-9)
	// Adds outside Stage 1 do not count toward storage quality.
	b = compute(t, episode(nil, nil, []memtools.Step{step(100, false, add(task.Distractors[0]))}, "1823", true, 100))
	testkit.Near(t, "R_storage with nothing stored in Stage 1", b.Storage, 0, 1e-9)
}

func TestUpdateAndDeleteAreMaintenance(t *testing.T) {
	for _, name := range []string{memtools.ToolUpdate, memtools.ToolDelete} {
		b := compute(t, episode([]memtools.Step{step(100, false, memtools.Result{Name: name, OK: true})}, nil, nil, "1823", true, 100))
		testkit.Near(t, name+" R_maintenance", b.Maintenance, 1, 1e-9)
	}
	// A failed call is not maintenance.
	b := compute(t, episode([]memtools.Step{step(100, false, memtools.Result{Name: memtools.ToolDelete, OK: false})}, nil, nil, "1823", true, 100))
	testkit.Near(t, "failed delete", b.Maintenance, 0, 1e-9)
}

func TestFilteringTheQueryLosesPreservation(t *testing.T) {
	r := episode(nil, nil, []memtools.Step{step(100, false)}, "1823", true, 100)
	r.Stages[2][0].Trace.Steps[0].Prompt = []chat.Message{{Role: stm.User, Content: "In what year?"}}
	testkit.Near(t, "R_preservation", compute(t, r).Preservation, 0, 1e-9)
}

type fixedPolicy string

func (f fixedPolicy) Chat(context.Context, llm.Request) (llm.Response, error) {
	return llm.Reply(string(f)), nil
}

func TestLLMJudgeReadsTheScore(t *testing.T) {
	for reply, want := range map[string]float64{"0.85": 0.85, "Score: 1.0": 1, "I'd say .5 overall": 0.5} {
		got, err := LLMJudge{Policy: fixedPolicy(reply)}.Score(context.Background(), "q", "g", "p")
		if err != nil || got != want {
			t.Fatalf("%q: %g %v, want %g", reply, got, err, want)
		}
	}
	if _, err := (LLMJudge{Policy: fixedPolicy("no idea")}).Score(context.Background(), "q", "g", "p"); err == nil {
		t.Fatal("a reply without a number was accepted")
	}
}

// TestLLMJudgesForStorageAndRelevance: with an LLM's verdicts, a stored
// distractor the LLM approves counts as high quality and the relevance is
// the LLM's number.
func TestLLMJudgesForStorageAndRelevance(t *testing.T) {
	r := episode([]memtools.Step{step(100, false, add(task.Distractors[0]))}, nil,
		[]memtools.Step{step(100, false, memtools.Result{Name: memtools.ToolRetrieve, OK: true, Retrieved: []ltm.Scored{{Entry: ltm.Entry{Content: "x"}}}})}, "1823", true, 100)
	b, err := Compute(context.Background(), paper, task, r, Judges{Task: F1Judge{}, Storage: LLMStorage{Policy: fixedPolicy("1")},
		Relevance: LLMRelevance{Policy: fixedPolicy("0.25")}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Near(t, "R_storage by the LLM", b.Storage, 1, 1e-9)
	testkit.Near(t, "R_relevance by the LLM", b.Relevance, 0.25, 1e-9)
	if _, err := Compute(context.Background(), paper, task, r, Judges{Task: F1Judge{}, Storage: LLMStorage{Policy: fixedPolicy("maybe")},
		Relevance: LLMRelevance{Policy: fixedPolicy("0.25")}}); err == nil {
		t.Fatal("an LLM reply without a verdict was accepted")
	}
}

// TestFormatPenalty: p_format is added per reply that broke the format,
// over every stage (two in Stage 2, one in Stage 3: 3 × −0.2), beside the
// paper's penalties; at the paper's 0 such replies cost nothing.
func TestFormatPenalty(t *testing.T) {
	r := episode(nil, []memtools.Step{step(100, false)}, []memtools.Step{step(120, false)}, "1823", true, 120)
	r.Stages[1][0].Trace.FormatErrors, r.Stages[2][0].Trace.FormatErrors = 2, 1
	testkit.Near(t, "P_penalty at the paper's p_format", compute(t, r).Penalty, 0, 1e-12)
	w := paper
	w.Format = -0.2
	b, err := Compute(context.Background(), w, task, r, Judges{Task: F1Judge{}, Storage: F1Storage{Threshold: 0.5},
		Relevance: CosineRelevance{Embedder: embed.NewHashing(256, []int{3})}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Near(t, "P_penalty with p_format -0.2", b.Penalty, -0.6, 1e-12)
	c := DefaultConfig()
	c.Format = 0.1
	if err := c.Validate(); err == nil {
		t.Error("a positive p_format was accepted")
	}
}
