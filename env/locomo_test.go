package env

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agemem/agemem/bench/locomo"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
)

// keeper is a scripted AgeMem policy: it stores every line it is told,
// and for a question retrieves and answers with the best memory.
type keeper struct{}

func (keeper) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	last := req.Messages[len(req.Messages)-1]
	call := func(name string, args map[string]any) string {
		b, _ := json.Marshal([]map[string]any{{"name": name, "arguments": args}})
		return "<think>t</think>\n<tool_call>" + string(b) + "</tool_call>"
	}
	switch {
	case last.Role == stm.Tool && strings.Contains(last.Content, `"memories"`):
		var r struct {
			Memories []struct{ Content string } `json:"memories"`
		}
		json.Unmarshal([]byte(last.Content), &r)
		ans := "Not mentioned"
		if len(r.Memories) > 0 {
			_, ans, _ = strings.Cut(r.Memories[0].Content, ": ")
		}
		return llm.Reply("<think>t</think>\n<answer>" + ans + "</answer>"), nil
	case last.Role == stm.Tool:
		return llm.Reply("<think>t</think>\n<answer>Noted.</answer>"), nil
	case strings.HasPrefix(last.Content, "Question: "):
		q, _, _ := strings.Cut(strings.TrimPrefix(last.Content, "Question: "), "\n")
		return llm.Reply(call("Retrieve_memory", map[string]any{"query": q, "top_k": 1})), nil
	}
	var calls []map[string]any
	for _, l := range strings.Split(last.Content, "\n")[1:] {
		calls = append(calls, map[string]any{"name": "Add_memory", "arguments": map[string]any{"content": l}})
	}
	b, _ := json.Marshal(calls)
	return llm.Reply("<think>t</think>\n<tool_call>" + string(b) + "</tool_call>"), nil
}

// TestAgeMemStoresAndAnswers: the conversation goes through the memory
// runtime (every line the scripted policy is told is stored, chunk by
// chunk, session by session), and each question is answered from a
// retrieval in a fresh context.
func TestAgeMemStoresAndAnswers(t *testing.T) {
	raw, err := locomo.Synth(1, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	samples, _ := locomo.Parse(raw)
	s := samples[0]
	var store ltm.Store
	a := LoCoMo{Chunk: 4, System: "You keep memories.", Limits: memtools.Limits{MaxSteps: 3, ContextBudget: 1 << 20},
		NewRuntime: func(seed uint64) *memtools.Runtime {
			store = ltm.NewMemStore(seed)
			return &memtools.Runtime{Store: store, Context: stm.New(nil), Embedder: embed.NewHashing(256, []int{3}), Options: memtools.DefaultOptions()}
		}}
	answered := 0
	preds, err := a.Answer(context.Background(), keeper{}, s, 1, func() { answered++ })
	if err != nil {
		t.Fatal(err)
	}
	turns := 0
	for _, ses := range s.Sessions {
		turns += len(ses.Turns)
	}
	if n, _ := store.Count(context.Background()); n != turns {
		t.Fatalf("%d memories for %d turns", n, turns)
	}
	if len(preds) != len(s.QA) || answered != len(s.QA) {
		t.Fatalf("%d predictions, %d answered, %d questions", len(preds), answered, len(s.QA))
	}
	rep, _, err := locomo.Score(samples, preds)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range preds {
		if p.Prediction == "" {
			t.Fatalf("question %d unanswered", i)
		}
	}
	t.Logf("keeper on %d questions: F1 %.3f; %q for %q", len(preds), rep.Overall.Mean, preds[0].Prediction, s.QA[0].Answer)
}
