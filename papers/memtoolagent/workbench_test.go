package memtoolagent

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/workbench"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/chat"
)

// habit is a scripted agent that knows each query's gold calls but, like
// the models WorkBench studied, ends date ranges "up to today" on
// 2023-11-30 instead of the day before, unless a recalled reflection in
// its system prompt tells it otherwise.
type habit struct{ gold map[string][]string }

// critic is a scripted memory extractor: it sees the execution and names
// the end-date mistake when it is there.
type critic struct{ prompts []string }

// TestMemoryChangesWhatTheAgentDoes: on WorkBench's analytics tasks the
// scripted agent's date habit fails the queries whose range ends
// yesterday; with MemToolAgent's memory the held-out query of each
// template is played, fails, is reflected on, and the recalled reflection
// fixes the repeated template's other queries.
func TestMemoryChangesWhatTheAgentDoes(t *testing.T) {
	d := workbench.Default()
	tasks, err := workbench.EmbeddedTasks("analytics")
	if err != nil {
		t.Fatal(err)
	}
	gold := map[string][]string{}
	for _, tk := range tasks {
		gold[tk.Query] = tk.Answer
	}
	model := habit{gold}
	ctx := context.Background()
	lim := agent.Limits{MaxSteps: 4}
	off, err := WorkBench(ctx, d, tasks, WorkBenchOptions{Model: model, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	par, err := WorkBench(ctx, d, tasks, WorkBenchOptions{Model: model, Limits: lim, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range off.Runs {
		if par.Runs[i].Query != off.Runs[i].Query || strings.Join(par.Runs[i].Actions, "|") != strings.Join(off.Runs[i].Actions, "|") {
			t.Fatalf("query %d played four at a time differs: %+v vs %+v", i, par.Runs[i], off.Runs[i])
		}
	}
	c := &critic{}
	mem := &Memory{Store: ltm.NewMemStore(1), Embedder: embed.NewHashing(256, []int{3}), Count: DefaultAdaptive()}
	on, err := WorkBench(ctx, d, tasks, WorkBenchOptions{Model: model, Extractor: c, Memory: mem, Limits: lim, Parallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	memTasks, test := workbench.Split(tasks)
	if on.MemorySize != len(memTasks) || len(on.Runs) != len(test) || len(off.Runs) != len(test) || len(on.Recalled) != len(test) {
		t.Fatalf("memory %d of %d, runs %d/%d of %d", on.MemorySize, len(memTasks), len(on.Runs), len(off.Runs), len(test))
	}
	if off.Accuracy.Mean > 0.9 || on.Accuracy.Mean < off.Accuracy.Mean+0.2 {
		t.Fatalf("accuracy without memory %v, with %v", off.Accuracy, on.Accuracy)
	}
	if len(c.prompts) == 0 || !strings.Contains(c.prompts[0], "INCORRECT execution") || !strings.Contains(c.prompts[0], "analytics.create_plot") {
		t.Fatalf("extractor prompts: %d", len(c.prompts))
	}
	// The same query played with and without memory: only the recalled
	// lesson changed its calls.
	for i := range on.Runs {
		if on.Runs[i].Correct && !off.Runs[i].Correct {
			if !strings.Contains(strings.Join(off.Runs[i].Actions, " "), "2023-11-30") {
				t.Fatalf("%q was fixed by something else: %v", on.Runs[i].Query, off.Runs[i].Actions)
			}
			return
		}
	}
	t.Fatal("no query changed")
}

// offered records the tools each request offered, then answers.
type offered struct{ seen [][]string }

// TestHardPreferenceGuiding: the tools of recalled failures that no
// recalled success used leave the agent's tool set.
func TestHardPreferenceGuiding(t *testing.T) {
	rec := []Entry{
		{Feedback: 0, Actions: []string{`calendar.delete_event.func(event_id="1")`, `calendar.search_events.func(query="x")`}},
		{Feedback: 1, Actions: []string{`calendar.search_events.func(query="y")`}},
		{Feedback: 0, Actions: []string{`not an action`}},
	}
	if got := Disliked(rec); strings.Join(got, ",") != "calendar.delete_event" {
		t.Fatalf("disliked %v", got)
	}
	m := &offered{}
	if _, err := workbench.Default().Play(context.Background(), m, workbench.Task{Query: "q"}, workbench.Prompt, agent.Limits{MaxSteps: 1}, Disliked(rec)...); err != nil {
		t.Fatal(err)
	}
	if n := len(m.seen[0]); n != len(workbench.Tools)-1 || strings.Contains(strings.Join(m.seen[0], ","), "calendar.delete_event") {
		t.Fatalf("offered %v", m.seen[0])
	}
}

const lesson = "Ranges up to today end on 2023-11-29, not 2023-11-30."

func (h habit) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	if req.Messages[len(req.Messages)-1].Role == "tool" {
		return llm.Response{Message: chat.Message{Content: "Done."}}, nil
	}
	fixed := strings.Contains(req.Messages[0].Content, lesson)
	var calls []chat.ToolCall
	for _, g := range h.gold[req.Messages[len(req.Messages)-1].Content] {
		a, _ := workbench.ParseAction(g)
		var b strings.Builder
		b.WriteString("{")
		for i, k := range a.Keys {
			v := a.Vals[i]
			if !fixed && v == "2023-11-29" {
				v = "2023-11-30"
			}
			if i > 0 {
				b.WriteString(",")
			}
			kj, _ := json.Marshal(k)
			vj, _ := json.Marshal(v)
			b.WriteString(string(kj) + ":" + string(vj))
		}
		b.WriteString("}")
		calls = append(calls, chat.ToolCall{Name: a.Tool, Arguments: b.String()})
	}
	return llm.Response{Message: chat.Message{ToolCalls: calls}}, nil
}

func (c *critic) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	c.prompts = append(c.prompts, req.Messages[0].Content)
	if strings.Contains(req.Messages[0].Content, "2023-11-30") && strings.Contains(req.Messages[0].Content, "Tool call:") {
		return llm.Response{Message: chat.Message{Content: lesson}}, nil
	}
	return llm.Response{Message: chat.Message{Content: "The agent used wrong values."}}, nil
}

func (o *offered) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	var names []string
	for _, s := range req.Tools {
		names = append(names, s.Name)
	}
	o.seen = append(o.seen, names)
	return llm.Response{Message: chat.Message{Content: "Done."}}, nil
}
