package eval

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/model/bert"
	"github.com/agemem/agemem/rl/reward"
	"github.com/agemem/agemem/setup"
)

func tasks(t *testing.T, n int) []env.Task {
	t.Helper()
	var buf bytes.Buffer
	if err := env.WriteHotpot(&buf, env.NewSynth(9).Generate(n)); err != nil {
		t.Fatal(err)
	}
	var ts []env.Task
	if err := env.StreamHotpot(&buf, func(tk env.Task) error { ts = append(ts, tk); return nil }); err != nil {
		t.Fatal(err)
	}
	return ts
}

func oracleRow(t *testing.T, c setup.Config, ts []env.Task) (Row, error) {
	t.Helper()
	rows, err := Run(context.Background(), Options{Config: c, Tasks: ts, Methods: []Method{{Name: "oracle", Scripted: "oracle"}}})
	if err != nil {
		return Row{}, err
	}
	return rows[0], nil
}

// TestEvalUsesTheConfiguredEmbedder: evaluation runs the episodes on the
// embedder training uses (embed.backend), not always the hashing one: a
// missing encoder is an error naming embed.path, and a (random) encoder
// changes what Filter_context removes, so the contexts answered from differ.
func TestEvalUsesTheConfiguredEmbedder(t *testing.T) {
	ts := tasks(t, 6)
	c := setup.Default()
	hashing, err := oracleRow(t, c, ts)
	if err != nil {
		t.Fatal(err)
	}
	if hashing.J.Mean != 1 || hashing.MQ.Mean != 1 {
		t.Fatalf("the oracle scores J %v, MQ %v", hashing.J, hashing.MQ)
	}
	c.Embed.Backend, c.Embed.Path, c.Embed.Device = "encoder", filepath.Join(t.TempDir(), "missing"), "cpu"
	if _, err := oracleRow(t, c, ts); err == nil || !strings.Contains(err.Error(), "embed.path") {
		t.Fatalf("a missing encoder: %v", err)
	}
	vocab := append([]string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"},
		strings.Fields("a the is in town born was who river flows through firm founded by of and")...)
	for ch := 'a'; ch <= 'z'; ch++ {
		vocab = append(vocab, string(ch), "##"+string(ch))
	}
	c.Embed.Path = filepath.Join(t.TempDir(), "encoder")
	if err := bert.InitRandom(c.Embed.Path, bert.Config{ModelType: "bert", HiddenSize: 16, Layers: 1, Heads: 2, Intermediate: 32, MaxPositions: 512}, vocab, true, 1); err != nil {
		t.Fatal(err)
	}
	encoder, err := oracleRow(t, c, ts)
	if err != nil {
		t.Fatal(err)
	}
	if encoder.PromptTokens == hashing.PromptTokens {
		t.Fatalf("the same contexts (%.1f tokens) with the encoder as with hashing: the encoder was not used", encoder.PromptTokens)
	}
}

// fakeOllama serves /api/show and a chat that always replies reply.
func fakeOllama(t *testing.T, reply string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/show":
			json.NewEncoder(w).Encode(map[string]any{"model_info": map[string]any{}})
		case "/api/chat":
			json.NewEncoder(w).Encode(map[string]any{"model": "judge", "message": map[string]any{"role": "assistant", "content": reply}, "done": true})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestEvalUsesTheConfiguredJudge: J is the reward section's judge: the
// oracle's right answers score 1 with the F1 judge, and exactly what an
// Ollama judge says with reward.judge ollama; a policy judge is loaded
// from rl.init.
func TestEvalUsesTheConfiguredJudge(t *testing.T) {
	ts := tasks(t, 4)
	c := setup.Default()
	c.Ollama.Host = fakeOllama(t, "0.25")
	c.Reward.Judge, c.Reward.JudgeModel = "ollama", "judge"
	row, err := oracleRow(t, c, ts)
	if err != nil {
		t.Fatal(err)
	}
	if row.J.Mean != 0.25 || row.EM.Mean != 1 {
		t.Fatalf("J %v, EM %v: the Ollama judge's 0.25 was not used", row.J, row.EM)
	}
	c = setup.Default()
	c.Reward.Judge, c.RL.Init = "policy", filepath.Join(t.TempDir(), "no-policy")
	if _, err := oracleRow(t, c, ts); err == nil || !strings.Contains(err.Error(), "rl.init") {
		t.Fatalf("a policy judge without a policy: %v", err)
	}
}

func TestStatIsMeanAndStandardError(t *testing.T) {
	s := stat([]float64{1, 0, 1, 0})
	// mean 0.5, sample sd sqrt(1/3), se sqrt(1/3)/2
	if s.Mean != 0.5 || s.SE < 0.2886 || s.SE > 0.2887 {
		t.Fatalf("%+v", s)
	}
	if s := stat([]float64{0.7}); s.Mean != 0.7 || s.SE != 0 {
		t.Fatalf("one value: %+v", s)
	}
}

// TestEvalReportsProgress: a long evaluation says how far each method got
// (plain lines on the log, at least one per tenth of the tasks).
func TestEvalReportsProgress(t *testing.T) {
	var log bytes.Buffer
	ts := tasks(t, 20)
	if _, err := Run(context.Background(), Options{Config: setup.Default(), Tasks: ts, Log: &log,
		Methods: []Method{{Name: "No-Memory", Scripted: "no-memory"}}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "step 2/20 No-Memory") || !strings.Contains(log.String(), "step 20/20 No-Memory") {
		t.Fatalf("progress:\n%s", log.String())
	}
}

// TestMethodsPlayTheirToolSubset: rows of one table play with their own
// tool subsets (the component ablation): the LTM-only oracle never
// filters yet answers everything (each answer in the row), the STM-only one stores nothing and
// guesses; a bad subset is an error naming the row.
func TestMethodsPlayTheirToolSubset(t *testing.T) {
	ts := tasks(t, 6)
	rows, err := Run(context.Background(), Options{Config: setup.Default(), Tasks: ts, Methods: []Method{
		{Name: "both", Scripted: "oracle"}, {Name: "LTM-only", Scripted: "oracle", Tools: "ltm"}, {Name: "STM-only", Scripted: "oracle", Tools: "stm"}}})
	if err != nil {
		t.Fatal(err)
	}
	both, ltmOnly, stmOnly := rows[0], rows[1], rows[2]
	if both.ToolCalls["Filter_context"] == 0 || ltmOnly.ToolCalls["Filter_context"] != 0 || ltmOnly.EM.Mean != 1 {
		t.Fatalf("both %v; LTM-only %v, EM %v", both.ToolCalls, ltmOnly.ToolCalls, ltmOnly.EM)
	}
	for i, task := range ts {
		if ltmOnly.Answers[i] != task.Answer {
			t.Fatalf("task %d: the row says the answer was %q; the oracle answers %q", i, ltmOnly.Answers[i], task.Answer)
		}
	}
	if stmOnly.ToolCalls["Add_memory"] != 0 || stmOnly.ToolCalls["Filter_context"] == 0 || stmOnly.MQ.Mean != 0 || stmOnly.EM.Mean == 1 {
		t.Fatalf("STM-only %v, MQ %v, EM %v", stmOnly.ToolCalls, stmOnly.MQ, stmOnly.EM)
	}
	_, err = Run(context.Background(), Options{Config: setup.Default(), Tasks: ts, Methods: []Method{{Name: "odd", Scripted: "oracle", Tools: "rag"}}})
	if err == nil || !strings.Contains(err.Error(), "odd") || !strings.Contains(err.Error(), "subset") {
		t.Fatalf("a bad subset: %v", err)
	}
}

// TestJByAnswerForm: J splits by the gold answer's form, and says_yes is
// the share of yes/no questions answered "yes" (HotpotQA-normalised),
// worked by hand: yes/no questions answered "Yes." (gold yes: 1), "yes"
// (gold no: 0) and nothing (gold no: 0) give J 1/3 and says_yes 2/3; span
// questions answered "Paris" (gold paris: 1) and "Lyon" (gold Nice: 0)
// give 1/2.
func TestJByAnswerForm(t *testing.T) {
	out := func(gold, pred string, answered bool) env.Outcome {
		return env.Outcome{Task: env.Task{Question: "q", Answer: gold, Type: "comparison"},
			Result: env.Result{HasAnswer: answered, Answer: pred}}
	}
	outs := []env.Outcome{out("yes", "Yes.", true), out("no", "yes", true), out("no", "", false),
		out("paris", "Paris", true), out("Nice", "Lyon", true)}
	row, err := score(context.Background(), "p", outs, reward.EMJudge{}, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	yn, span := row.ByAnswer[AnswerYesNo], row.ByAnswer[AnswerSpan]
	if math.Abs(yn.Mean-1.0/3) > 1e-12 || math.Abs(span.Mean-0.5) > 1e-12 || math.Abs(row.SaysYes-2.0/3) > 1e-12 {
		t.Fatalf("J yes/no %v, J span %v, says yes %v; want 0.333, 0.5, 0.667", yn, span, row.SaysYes)
	}
	var b bytes.Buffer
	Print(&b, []Row{row})
	if !strings.Contains(b.String(), "J yes/no") || !strings.Contains(b.String(), "0.67") {
		t.Errorf("the table lacks the yes/no columns:\n%s", b.String())
	}
	// A file without yes/no questions prints no such columns.
	row, _ = score(context.Background(), "p", outs[3:], reward.EMJudge{}, 0.5)
	b.Reset()
	Print(&b, []Row{row})
	if strings.Contains(b.String(), "yes/no") || row.SaysYes != 0 {
		t.Errorf("span-only tasks: says yes %v, table:\n%s", row.SaysYes, b.String())
	}
}
