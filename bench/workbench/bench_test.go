package workbench

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/papers/memtoolagent"
)

// habit is a scripted agent that knows each query's gold calls but, like
// the models WorkBench studied, ends date ranges "up to today" on
// 2023-11-30 instead of the day before, unless a recalled reflection in
// its system prompt tells it otherwise.
type habit struct{ gold map[string][]string }

const lesson = "Ranges up to today end on 2023-11-29, not 2023-11-30."

func (h habit) Chat(_ context.Context, msgs []agent.Message, _ []agent.Spec) (agent.Reply, error) {
	if msgs[len(msgs)-1].Role == "tool" {
		return agent.Reply{Message: agent.Message{Content: "Done."}}, nil
	}
	fixed := strings.Contains(msgs[0].Content, lesson)
	var calls []agent.ToolCall
	for _, g := range h.gold[msgs[len(msgs)-1].Content] {
		a, _ := ParseAction(g)
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
		calls = append(calls, agent.ToolCall{Name: a.Tool, Arguments: b.String()})
	}
	return agent.Reply{Message: agent.Message{ToolCalls: calls}}, nil
}

// critic is a scripted memory extractor: it sees the execution and names
// the end-date mistake when it is there.
type critic struct{ prompts []string }

func (c *critic) Chat(_ context.Context, msgs []agent.Message, _ []agent.Spec) (agent.Reply, error) {
	c.prompts = append(c.prompts, msgs[0].Content)
	if strings.Contains(msgs[0].Content, "2023-11-30") && strings.Contains(msgs[0].Content, "Tool call:") {
		return agent.Reply{Message: agent.Message{Content: lesson}}, nil
	}
	return agent.Reply{Message: agent.Message{Content: "The agent used wrong values."}}, nil
}

// TestMemoryChangesWhatTheAgentDoes: on WorkBench's analytics tasks the
// scripted agent's date habit fails the queries whose range ends
// yesterday; with MemToolAgent's memory the held-out query of each
// template is played, fails, is reflected on, and the recalled reflection
// fixes the repeated template's other queries.
func TestMemoryChangesWhatTheAgentDoes(t *testing.T) {
	d := Default()
	tasks, err := LoadTasks(filepath.Join("data", "analytics_queries_and_answers.csv"))
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
	off, err := d.Bench(ctx, tasks, BenchOptions{Model: model, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	par, err := d.Bench(ctx, tasks, BenchOptions{Model: model, Limits: lim, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range off.Runs {
		if par.Runs[i].Query != off.Runs[i].Query || strings.Join(par.Runs[i].Actions, "|") != strings.Join(off.Runs[i].Actions, "|") {
			t.Fatalf("query %d played four at a time differs: %+v vs %+v", i, par.Runs[i], off.Runs[i])
		}
	}
	c := &critic{}
	mem := &memtoolagent.Memory{Store: ltm.NewMemory(1), Embedder: embed.NewHashing(256, []int{3}), Count: memtoolagent.DefaultAdaptive()}
	on, err := d.Bench(ctx, tasks, BenchOptions{Model: model, Extractor: c, Memory: mem, Limits: lim, Parallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	memTasks, test := Split(tasks)
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

// TestToolsetRecordsActions: calls through the agent loop's tools run in
// the sandbox and are recorded as WorkBench writes them, arguments in the
// model's order, values as Python's str() shows them; schema violations
// reach the model, not the sandbox.
func TestToolsetRecordsActions(t *testing.T) {
	s := Default().New()
	var got []string
	ts, err := s.Toolset(nil, func(a Action) { got = append(got, a.String()) })
	if err != nil {
		t.Fatal(err)
	}
	if len(ts.Specs()) != len(Tools) {
		t.Fatalf("%d tools", len(ts.Specs()))
	}
	ctx := context.Background()
	out, ok, err := ts.Execute(ctx, agent.ToolCall{Name: "calendar.delete_event", Arguments: `{"event_id":"00000013"}`})
	if err != nil || !ok || out != "Event deleted successfully." {
		t.Fatalf("%q %v %v", out, ok, err)
	}
	out, ok, _ = ts.Execute(ctx, agent.ToolCall{Name: "calendar.create_event", Arguments: `{"duration":60}`})
	if ok || !strings.Contains(out, "schema") {
		t.Fatalf("a number where a string is expected: %q", out)
	}
	ts.Execute(ctx, agent.ToolCall{Name: "email.send_email", Arguments: `{"subject":"Hi","recipient":"a@b.com","body":"x"}`})
	want := []string{`calendar.delete_event.func(event_id="00000013")`, `email.send_email.func(subject="Hi", recipient="a@b.com", body="x")`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("recorded %q", got)
	}
}

// offered records the tools each request offered, then answers.
type offered struct{ seen [][]string }

func (o *offered) Chat(_ context.Context, _ []agent.Message, specs []agent.Spec) (agent.Reply, error) {
	var names []string
	for _, s := range specs {
		names = append(names, s.Name)
	}
	o.seen = append(o.seen, names)
	return agent.Reply{Message: agent.Message{Content: "Done."}}, nil
}

// TestHardPreferenceGuiding: the tools of recalled failures that no
// recalled success used leave the agent's tool set.
func TestHardPreferenceGuiding(t *testing.T) {
	rec := []memtoolagent.Entry{
		{Feedback: 0, Actions: []string{`calendar.delete_event.func(event_id="1")`, `calendar.search_events.func(query="x")`}},
		{Feedback: 1, Actions: []string{`calendar.search_events.func(query="y")`}},
		{Feedback: 0, Actions: []string{`not an action`}},
	}
	if got := Disliked(rec); strings.Join(got, ",") != "calendar.delete_event" {
		t.Fatalf("disliked %v", got)
	}
	m := &offered{}
	if _, err := Default().Play(context.Background(), m, Task{Query: "q"}, Prompt, agent.Limits{MaxSteps: 1}, Disliked(rec)...); err != nil {
		t.Fatal(err)
	}
	if n := len(m.seen[0]); n != len(Tools)-1 || strings.Contains(strings.Join(m.seen[0], ","), "calendar.delete_event") {
		t.Fatalf("offered %v", m.seen[0])
	}
}
