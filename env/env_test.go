package env

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

func TestLoadHotpotOfficialFormat(t *testing.T) {
	tasks, err := LoadHotpot("testdata/hotpot_small.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 {
		t.Fatalf("%d tasks", len(tasks))
	}
	a := tasks[0]
	if a.ID != "5a8b57f25542995d1e6f1371" || a.Answer != "yes" || a.Type != "comparison" || a.Level != "hard" {
		t.Fatalf("task 0: %+v", a)
	}
	if len(a.SupportingFacts) != 2 || !strings.HasPrefix(a.SupportingFacts[0], "Scott Derrickson (born July 16, 1966)") {
		t.Fatalf("supporting facts: %q", a.SupportingFacts)
	}
	if len(a.Distractors) != 1 || !strings.HasPrefix(a.Distractors[0], "Ed Wood is a 1994 American") || !strings.Contains(a.Distractors[0], "Ed Wood. The film concerns") {
		t.Fatalf("distractors: %q", a.Distractors)
	}
	// Index 7 is past the paragraph's end: skipped, as the official evaluation does.
	if b := tasks[1]; len(b.SupportingFacts) != 3 || b.Context[2] != b.SupportingFacts[2] {
		t.Fatalf("task 1 facts: %q", b.SupportingFacts)
	}
}

func TestLoadHotpotMalformed(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body, want string
	}{
		{"not an array", `{"_id": "x"}`, "expected a JSON array"},
		{"syntax error", "[\n{\"_id\": \"a\", \"question\": \"q\",\n \"answer\": oops}\n]", ":3:"},
		{"wrong type", `[{"_id": "a", "question": 5}]`, "record 0: question is a JSON number where a string belongs"},
		{"missing id", `[{"question": "q", "answer": "a", "context": [], "supporting_facts": []}]`, `missing "_id"`},
		{"bad context", `[{"_id": "a", "question": "q", "context": [["t", "not a list"]], "supporting_facts": []}]`, "context[0] must be"},
		{"unknown title", `[{"_id": "a", "question": "q", "context": [], "supporting_facts": [["Nope", 0]]}]`, `title "Nope" is not in context`},
		{"truncated", `[{"_id": "a", "question": "q", "context": [], "supporting_facts": []}`, "unterminated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".json")
			os.WriteFile(p, []byte(tc.body), 0o644)
			_, err := LoadHotpot(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("got %v, want an error naming %s and %q", err, p, tc.want)
			}
		})
	}
}

func TestSynthRoundTripsThroughTheLoader(t *testing.T) {
	var a, b bytes.Buffer
	WriteHotpot(&a, NewSynth(7).Generate(60))
	WriteHotpot(&b, NewSynth(7).Generate(60))
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("same seed gave different files")
	}
	var tasks []Task
	if err := StreamHotpot(&a, func(t Task) error { tasks = append(tasks, t); return nil }); err != nil {
		t.Fatal(err)
	}
	types := map[string]int{}
	for _, tk := range tasks {
		types[tk.Type]++
		if len(tk.SupportingFacts) != 2 || len(tk.Distractors) != 4 || tk.Answer == "" {
			t.Fatalf("task %s: %d facts, %d distractors", tk.ID, len(tk.SupportingFacts), len(tk.Distractors))
		}
		// Bridge answers are stated in the facts; distractors share words.
		if tk.Type == "bridge" && !strings.Contains(strings.Join(tk.SupportingFacts, " "), tk.Answer) {
			t.Fatalf("task %s: answer %q not in facts %q", tk.ID, tk.Answer, tk.SupportingFacts)
		}
		shared := false
		for _, d := range tk.Distractors {
			for _, w := range embed.Words(strings.Join(tk.SupportingFacts, " ")) {
				if len(w) > 4 && strings.Contains(strings.ToLower(d), w) {
					shared = true
				}
			}
		}
		if !shared {
			t.Fatalf("task %s: no distractor shares a name with the facts", tk.ID)
		}
	}
	if types["bridge"] == 0 || types["comparison"] == 0 {
		t.Fatalf("types: %v", types)
	}
	// A record's Task is the task the loader reads from its file.
	for i, rec := range NewSynth(7).Generate(60) {
		tk, err := rec.Task()
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(tk) != fmt.Sprint(tasks[i]) {
			t.Fatalf("record %d: Task() %+v, the loader %+v", i, tk, tasks[i])
		}
	}
	if _, err := (HotpotRecord{ID: "x", Question: "q?", SupportingFacts: [][]any{{"missing", 0}}}).Task(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("a supporting fact outside the context: %v", err)
	}
}

func TestSynthLargeFilesFinish(t *testing.T) {
	// Look-alike name families run out; generation must still finish.
	recs := NewSynth(1).Generate(5000)
	ids := map[string]bool{}
	for _, r := range recs {
		ids[r.ID] = true
	}
	if len(ids) != 5000 {
		t.Fatalf("%d distinct ids", len(ids))
	}
}

func TestMetric(t *testing.T) {
	if ExactMatch("The Asca River.", "asca river") != 1 || ExactMatch("Oslo", "Bergen") != 0 {
		t.Fatal("exact match")
	}
	if f := F1("the Asca", "Asca River"); f < 0.66 || f > 0.67 {
		t.Fatalf("F1 = %g, want 2/3", f)
	}
	if F1("yes it is", "yes") != 0 {
		t.Fatal("yes/no answers score only on exact match")
	}
}

func runEpisode(t *testing.T, p llm.Model, task Task) Result {
	t.Helper()
	rt := &memtools.Runtime{
		Store:      ltm.NewMemStore(1),
		Context:    stm.New(nil),
		Embedder:   embed.NewHashing(384, []int{3, 4}),
		Summarizer: memtools.Extractive{MaxTokens: 128},
		Options:    memtools.DefaultOptions(),
	}
	cfg := EpisodeConfig{Stages: Stages{Stage1MaxTurns: 16, Stage2MaxTurns: 8, AutoRetrieveK: 3}, Limits: memtools.Limits{MaxSteps: 4, ContextBudget: 8192}}
	res, err := RunEpisode(context.Background(), p, rt, task, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestOracleAnswersWhereNoMemoryCannot is the point of the three stages:
// the context reset hides the Stage 1 facts, so only an agent that stored
// them in LTM can answer.
func TestOracleAnswersWhereNoMemoryCannot(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(3).Generate(30))
	var tasks []Task
	StreamHotpot(&buf, func(t Task) error { tasks = append(tasks, t); return nil })
	var oracleEM, noMemEM float64
	for _, task := range tasks {
		o := runEpisode(t, NewOracle(task, 0, 0, 1), task)
		n := runEpisode(t, NewNoMemory(task), task)
		oracleEM += o.EM
		noMemEM += n.EM
		if len(o.LTM[0]) != 2 || o.ToolCalls()[memtools.ToolAdd] != 2 {
			t.Fatalf("task %s: oracle stored %d entries", task.ID, len(o.LTM[0]))
		}
		if len(n.LTM[2]) != 0 || len(n.ToolCalls()) != 0 {
			t.Fatalf("task %s: no-memory policy used tools", task.ID)
		}
		if o.FormatErrors() != 0 {
			t.Fatalf("oracle made format errors")
		}
		if o.ToolCalls()[memtools.ToolFilter] == 0 || o.ToolCalls()[memtools.ToolRetrieve] != 1 {
			t.Fatalf("oracle tool calls: %v", o.ToolCalls())
		}
		// The reset: nothing of Stage 1 survives in the final context
		// except through retrieval.
		for _, m := range n.Final {
			for _, f := range task.SupportingFacts {
				if strings.Contains(m.Content, f) {
					t.Fatalf("fact %q leaked past the reset", f)
				}
			}
		}
	}
	if oracleEM != float64(len(tasks)) {
		t.Errorf("oracle EM %v/%d, want all", oracleEM, len(tasks))
	}
	if noMemEM > float64(len(tasks))/2 {
		t.Errorf("no-memory EM %v/%d: it should only be lucky on some comparisons", noMemEM, len(tasks))
	}
	t.Logf("EM oracle %.0f/%d, no-memory %.0f/%d", oracleEM, len(tasks), noMemEM, len(tasks))
}

func TestOracleErrorRates(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(4).Generate(40))
	var stored, kept int
	StreamHotpot(&buf, func(task Task) error {
		r := runEpisode(t, NewOracle(task, 0.5, 0.5, 9), task)
		stored += len(r.LTM[0])
		kept += len(task.Distractors) - r.ToolCalls()[memtools.ToolFilter]
		return nil
	})
	if stored < 20 || stored > 60 {
		t.Errorf("with forget rate 0.5, stored %d of 80 facts", stored)
	}
	if kept < 40 || kept > 120 {
		t.Errorf("with keep rate 0.5, kept %d of 160 distractors", kept)
	}
}

// TestOracleForgetsRelayedFacts: the blind spot skips facts a friend
// relayed and only those, and every phrasing opens some task's first turn.
func TestOracleForgetsRelayedFacts(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(4).Generate(40))
	firsts := map[string]bool{}
	var relayed, storedRelayed, other, storedOther int
	StreamHotpot(&buf, func(task Task) error {
		ep := BuildEpisode(task, EpisodeConfig{Stages: DefaultStages()})
		firsts[ep.Stage1[0][:12]] = true
		r := runEpisode(t, NewOracle(task, 0, 0, 9).ForgettingRelayed(1), task)
		for _, turn := range r.Stages[0] {
			n := turn.Trace.ToolCalls()[memtools.ToolAdd]
			if text, _ := SplitTurn(turn.User); Relayed(text) {
				relayed, storedRelayed = relayed+1, storedRelayed+n
			} else {
				other, storedOther = other+1, storedOther+n
			}
		}
		return nil
	})
	if len(firsts) != len(casual) {
		t.Errorf("first turns open with %d phrasings, want all %d: %v", len(firsts), len(casual), firsts)
	}
	if relayed < 10 || storedRelayed != 0 {
		t.Errorf("stored %d of %d relayed facts at ForgetRelayedRate 1, want none of some", storedRelayed, relayed)
	}
	if storedOther != other {
		t.Errorf("stored %d of the %d other facts, want all (ForgetRate 0)", storedOther, other)
	}
}

// TestEpisodeSystemPrompt: the configured system prompt opens the context
// the policy sees in every stage, the paper's when none is set.
func TestEpisodeSystemPrompt(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(4).Generate(1))
	var task Task
	StreamHotpot(&buf, func(t Task) error { task = t; return nil })
	for _, want := range []string{"", "Use the tools."} {
		rec := &recordingPolicy{Model: NewOracle(task, 0, 0, 1)}
		rt := &memtools.Runtime{Store: ltm.NewMemStore(1), Context: stm.New(nil), Embedder: embed.NewHashing(64, nil),
			Summarizer: memtools.Extractive{MaxTokens: 64}, Options: memtools.DefaultOptions()}
		cfg := EpisodeConfig{Stages: Stages{Stage1MaxTurns: 4, Stage2MaxTurns: 2, AutoRetrieveK: 3}, Limits: memtools.Limits{MaxSteps: 4, ContextBudget: 8192}, SystemPrompt: want}
		if _, err := RunEpisode(context.Background(), rec, rt, task, cfg); err != nil {
			t.Fatal(err)
		}
		if want == "" {
			want = memtools.SystemPrompt()
		}
		for i, first := range rec.firsts {
			if first.Role != stm.System || first.Content != want {
				t.Fatalf("call %d opens with %s %.40q, want the system prompt %.40q", i, first.Role, first.Content, want)
			}
		}
	}
}

type recordingPolicy struct {
	llm.Model
	firsts []chat.Message
}

func (r *recordingPolicy) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	r.firsts = append(r.firsts, req.Messages[0])
	return r.Model.Chat(ctx, req)
}

// overflowing plays the oracle until its context has more than limit
// messages, then fails as the native engine does when a prompt outgrows the
// model's positions.
type overflowing struct {
	llm.Model
	limit int
	err   error
}

func (p overflowing) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	if len(req.Messages) > p.limit {
		return llm.Response{}, p.err
	}
	return p.Model.Chat(ctx, req)
}

// TestContextFullEndsTheEpisodeNotTheRun: a policy whose context outgrows
// the model fails that task (unanswered, ContextFull) instead of aborting
// an evaluation of many tasks; other policy errors still stop the run.
func TestContextFullEndsTheEpisodeNotTheRun(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(5).Generate(1))
	var task Task
	StreamHotpot(&buf, func(t Task) error { task = t; return nil })
	full := overflowing{NewOracle(task, 0, 0, 1), 12, fmt.Errorf("conversation 0: %w", &llm.PromptTooLongError{Tokens: 5000, Limit: 4096})}
	res := runEpisode(t, full, task)
	if !res.ContextFull || res.HasAnswer || res.EM != 0 {
		t.Fatalf("context full %v, answered %v", res.ContextFull, res.HasAnswer)
	}
	if len(res.Stages[0]) == 0 || len(res.LTM[0]) != 2 || len(res.LTM[2]) != 2 {
		t.Fatalf("stage 1 turns %d, LTM after stages 1 and 3: %d, %d entries (the oracle stored 2 before the overflow)",
			len(res.Stages[0]), len(res.LTM[0]), len(res.LTM[2]))
	}
	rt := &memtools.Runtime{Store: ltm.NewMemStore(1), Context: stm.New(nil), Embedder: embed.NewHashing(64, []int{3}), Options: memtools.DefaultOptions()}
	broken := overflowing{NewOracle(task, 0, 0, 1), 12, errors.New("backend gone")}
	if _, err := RunEpisode(context.Background(), broken, rt, task, EpisodeConfig{Stages: Stages{Stage1MaxTurns: 16, Stage2MaxTurns: 8}, Limits: memtools.Limits{MaxSteps: 4}}); err == nil || !strings.Contains(err.Error(), "backend gone") {
		t.Fatalf("other policy errors must stop the run: %v", err)
	}
}

// TestConversationsHoldEveryCall: the merged SFT records learn exactly the
// replies of the per-call records, each against exactly the context it was
// given, in fewer records and messages; a Filter that rewrote the context
// starts a new record.
func TestConversationsHoldEveryCall(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(5).Generate(6))
	var tasks []Task
	StreamHotpot(&buf, func(t Task) error { tasks = append(tasks, t); return nil })
	for _, task := range tasks {
		res := runEpisode(t, NewOracle(task, 0, 0, 1), task)
		calls, convs := SFTRecords(res), SFTConversations(res)
		// Every (context, reply) a conversation learns.
		type example struct {
			stage int
			ctx   string
		}
		learned := map[example]int{}
		msgs := func(ms []SFTMessage) string {
			var b strings.Builder
			for _, m := range ms {
				fmt.Fprintf(&b, "%s:%s:%s\n", m.Role, m.Name, m.Content)
			}
			return b.String()
		}
		total := 0
		for _, c := range convs {
			total += len(c.Messages)
			for i, m := range c.Messages {
				if m.Role == "assistant" && m.Weight != nil && *m.Weight == 1 {
					learned[example{c.Stage, msgs(c.Messages[:i+1])}]++
				}
			}
		}
		perCall := 0
		for _, r := range calls {
			perCall += len(r.Messages)
			k := example{r.Stage, msgs(r.Messages)}
			if learned[k] != 1 {
				t.Fatalf("task %s: a stage %d call is learned %d times by the conversations", task.ID, r.Stage, learned[k])
			}
			delete(learned, k)
		}
		if len(learned) != 0 {
			t.Fatalf("task %s: conversations learn %d replies no call made", task.ID, len(learned))
		}
		if len(convs) >= len(calls) || total >= perCall*3/4 {
			t.Fatalf("task %s: %d conversations of %d messages for %d calls of %d", task.ID, len(convs), total, len(calls), perCall)
		}
		// Stage 2 filters distractors, which rewrites its context: more
		// than one record there, the later ones holding weight-0 replies.
		var s2 int
		for _, c := range convs {
			if c.Stage == Stage2 {
				s2++
			}
		}
		if res.ToolCalls()["Filter_context"] > 0 && s2 < 2 {
			t.Fatalf("task %s: %d filters, but Stage 2 is one record", task.ID, res.ToolCalls()["Filter_context"])
		}
	}
}

// TestOracleWithToolSubsets: offered only the long-term memory tools the
// oracle stores and retrieves but keeps every distractor; offered only the
// short-term ones it filters but stores nothing, and so has to guess.
func TestOracleWithToolSubsets(t *testing.T) {
	var buf bytes.Buffer
	WriteHotpot(&buf, NewSynth(5).Generate(12))
	var em [2]float64
	StreamHotpot(&buf, func(task Task) error {
		ltmOnly := runEpisode(t, NewOracle(task, 0, 0, 1).Offering(memtools.SubsetTools(memtools.SubsetLTM)), task)
		calls := ltmOnly.ToolCalls()
		if calls[memtools.ToolAdd] != 2 || calls[memtools.ToolRetrieve] != 1 || calls[memtools.ToolFilter] != 0 {
			t.Fatalf("LTM-only oracle calls %v", calls)
		}
		stmOnly := runEpisode(t, NewOracle(task, 0, 0, 1).Offering(memtools.SubsetTools(memtools.SubsetSTM)), task)
		calls = stmOnly.ToolCalls()
		if calls[memtools.ToolAdd] != 0 || calls[memtools.ToolRetrieve] != 0 || calls[memtools.ToolFilter] == 0 || len(stmOnly.LTM[2]) != 0 {
			t.Fatalf("STM-only oracle calls %v", calls)
		}
		if ltmOnly.FormatErrors()+stmOnly.FormatErrors() != 0 {
			t.Fatal("the oracle called a tool it was not offered")
		}
		em[0] += ltmOnly.EM
		em[1] += stmOnly.EM
		return nil
	})
	if em[0] != 12 || em[1] > 6 {
		t.Fatalf("EM of 12 tasks: LTM-only %v (want all), STM-only %v (guesses)", em[0], em[1])
	}
}
