package fittext

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// searcher is a scripted agent for FitText's search on WorkBench: it
// describes the next gold call's tool as a pseudo-tool until it is
// retrieved, then makes the call, then answers. Its first try at a task's
// first call guesses a name it never retrieved (the hallucination DFSDT
// prunes); told by the diversity prompt that it failed there, it makes
// the right call.
type searcher struct{ gold map[string][]workbench.Action }

func (s searcher) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	query := req.Messages[1].Content
	gold := s.gold[query]
	done := 0
	for _, m := range req.Messages {
		if m.Role == "tool" {
			done++
		}
	}
	if done == len(gold) {
		return llm.Response{Message: chat.Message{ToolCalls: []chat.ToolCall{{ID: "f", Name: "Finish", Arguments: `{"return_type":"give_answer","final_answer":"Done."}`}}}}, nil
	}
	next := gold[done]
	visible := false
	for _, sp := range req.Tools {
		visible = visible || sp.Name == next.Tool
	}
	if !visible {
		t, _ := workbench.ByName(next.Tool)
		return llm.Response{Message: chat.Message{Content: Begin + " " + t.Description + " " + End}}, nil
	}
	args := map[string]string{}
	for i, k := range next.Keys {
		args[k] = next.Vals[i]
	}
	raw, _ := json.Marshal(args)
	name := next.Tool
	if last := req.Messages[len(req.Messages)-1]; done == 0 && !(last.Role == "user" && strings.Contains(last.Content, "failed")) {
		name += "_v2"
	}
	return llm.Response{Message: chat.Message{ToolCalls: []chat.ToolCall{{ID: "c", Name: name, Arguments: string(raw)}}}}, nil
}

// FitText's search plays WorkBench: the scripted agent, whose first try
// always hallucinates, is right on every query when the tree lets it try
// a state twice (width 2) and on none when it does not (width 1); with
// retrieval it starts from Finish alone and retrieves each tool it needs.
func TestSearchBenchOnWorkBench(t *testing.T) {
	ctx := context.Background()
	tasks, err := workbench.EmbeddedTasks("calendar")
	if err != nil {
		t.Fatal(err)
	}
	_, test := workbench.Split(tasks)
	var picked []workbench.Task
	gold := map[string][]workbench.Action{}
	for _, task := range test {
		if _, dup := gold[task.Query]; dup || len(task.Answer) == 0 || len(picked) == 8 {
			continue
		}
		var acts []workbench.Action
		for _, a := range task.Answer {
			act, err := workbench.ParseAction(a)
			if err != nil {
				t.Fatal(err)
			}
			acts = append(acts, act)
		}
		gold[task.Query] = acts
		// workbench.Split holds out the first query of each template; these are all
		// test queries already, so they are doubled to survive it.
		picked = append(picked, task, task)
	}
	d := workbench.Default()
	ts, err := d.New().Toolset(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := WorldKB(ctx, embed.NewHashing(512, []int{3, 4}), ts.Functions())
	if err != nil {
		t.Fatal(err)
	}
	noModel := LLMFunc(func(context.Context, string, float64) (string, error) { return "", nil }) // single-pass calls none
	r := &Retriever{Config: DefaultConfig(), KB: kb, LLM: noModel}
	for _, c := range []struct {
		retriever *Retriever
		width     int
		want      float64
	}{{r, 2, 1}, {r, 1, 0}, {nil, 2, 1}} {
		s := &Search{Model: searcher{gold}, Retriever: c.retriever, Strategy: "single", Config: DefaultSearch()}
		s.Config.Width = c.width
		res, err := WorkBench(ctx, d, picked, s, "single", 4, nil)
		if err != nil {
			t.Fatal(err)
		}
		st := res.Search
		t.Logf("retrieval %v, width %d: accuracy %.3f over %d, %+v", c.retriever != nil, c.width, res.Accuracy.Mean, res.Accuracy.N, *st)
		if res.Accuracy.Mean != c.want || res.Accuracy.N == 0 {
			t.Fatalf("retrieval %v, width %d: accuracy %v, want %v", c.retriever != nil, c.width, res.Accuracy.Mean, c.want)
		}
		if c.retriever != nil && c.want == 1 && (st.Retrievals < 1 || st.Answered != 1) {
			t.Fatalf("no retrieval: %+v", st)
		}
		if c.retriever == nil && st.Retrievals != 0 {
			t.Fatalf("plain DFSDT retrieved: %+v", st)
		}
	}
}
