package memtools

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

func newRuntime() *Runtime {
	c := stm.New(nil)
	c.Append(chat.Message{Role: stm.System, Content: "sys"})
	return &Runtime{
		Store:      ltm.NewMemStore(1),
		Context:    c,
		Embedder:   embed.NewHashing(128, []int{3}),
		Summarizer: Extractive{MaxTokens: 64},
		Options:    DefaultOptions(),
	}
}

func exec(t *testing.T, rt *Runtime, name, args string) Result {
	t.Helper()
	r, err := rt.Execute(context.Background(), Call{Name: name, Arguments: json.RawMessage(args)})
	if err != nil {
		t.Fatalf("%s %s: unexpected hard error %v", name, args, err)
	}
	return r
}

func TestSchemasAreThePapers(t *testing.T) {
	s := Schemas()
	if len(s) != 6 {
		t.Fatalf("%d tools", len(s))
	}
	want := map[string][]string{
		ToolSummary:  {"span"},
		ToolFilter:   {"criteria"},
		ToolRetrieve: {"query"},
		ToolAdd:      {"content"},
		ToolUpdate:   {"memory_id", "content"},
		ToolDelete:   {"memory_id", "confirmation"},
	}
	for i, sc := range s {
		if sc.Name != ToolNames[i] {
			t.Errorf("tool %d is %s, want %s", i, sc.Name, ToolNames[i])
		}
		if strings.Join(sc.Parameters.Required, ",") != strings.Join(want[sc.Name], ",") {
			t.Errorf("%s required = %v", sc.Name, sc.Parameters.Required)
		}
	}
	if got := s[2].Parameters.Properties["top_k"]; got.Type != "integer" || got.Description != "The maximum number of memories to retrieve. Defaults to 3." {
		t.Errorf("top_k: %+v", got)
	}
	p := SystemPrompt()
	for _, must := range []string{"## Available Tools:\n[", `"name": "Delete_memory"`, "Mutual Exclusivity Rule", "Let's start!"} {
		if !strings.Contains(p, must) {
			t.Errorf("system prompt lacks %q", must)
		}
	}
	if strings.Contains(p, "{{") || strings.Contains(p, "[TOOLS]") {
		t.Error("system prompt still holds template syntax")
	}
}

func TestToolsGoodArguments(t *testing.T) {
	rt := newRuntime()
	r := exec(t, rt, ToolAdd, `{"content": "Marla Quenby was born in Oslo.", "metadata": {"type": "bio"}, "memory_type": "fact"}`)
	if !r.OK || r.Entry == nil || !ltm.ValidID(r.Entry.ID) || !strings.Contains(r.Content, r.Entry.ID) {
		t.Fatalf("add: %+v", r)
	}
	id := r.Entry.ID
	exec(t, rt, ToolAdd, `{"content": "The Asca flows through Velden."}`)
	r = exec(t, rt, ToolRetrieve, `{"query": "where was Marla Quenby born", "top_k": 1}`)
	if !r.OK || len(r.Retrieved) != 1 || r.Retrieved[0].ID != id || !strings.Contains(r.Content, "Oslo") {
		t.Fatalf("retrieve: %+v", r)
	}
	r = exec(t, rt, ToolRetrieve, `{"query": "anything"}`)
	if len(r.Retrieved) != 2 {
		t.Fatalf("default top_k 3 over 2 entries gave %d", len(r.Retrieved))
	}
	r = exec(t, rt, ToolRetrieve, `{"query": "anything", "top_k": "1", "metadata_filter": {"type": "bio"}}`)
	if len(r.Retrieved) != 1 || r.Retrieved[0].ID != id {
		t.Fatalf("string top_k with filter: %+v", r)
	}
	r = exec(t, rt, ToolUpdate, `{"memory_id": "`+id+`", "content": "Marla Quenby was born in Bergen."}`)
	if !r.OK {
		t.Fatalf("update: %+v", r)
	}
	if e, _ := rt.Store.Get(context.Background(), id); e.Content != "Marla Quenby was born in Bergen." || e.Metadata["type"] != "bio" {
		t.Fatalf("after update: %+v", e)
	}
	// Both spellings of the confirmation are accepted.
	r = exec(t, rt, ToolDelete, `{"memory_id": "`+id+`", "confirmed": true}`)
	if !r.OK {
		t.Fatalf("delete with confirmed: %+v", r)
	}
	r2 := exec(t, rt, ToolAdd, `{"content": "x y z"}`)
	r = exec(t, rt, ToolDelete, `{"memory_id": "`+r2.Entry.ID+`", "confirmation": true}`)
	if !r.OK {
		t.Fatalf("delete with confirmation: %+v", r)
	}
	if n, _ := rt.Store.Count(context.Background()); n != 1 {
		t.Fatalf("count = %d", n)
	}
}

func TestToolsBadArguments(t *testing.T) {
	rt := newRuntime()
	good := exec(t, rt, ToolAdd, `{"content": "keep me"}`)
	for _, tc := range []struct {
		name, tool, args, want string
	}{
		{"unknown tool", "Forget_everything", `{}`, "unknown tool"},
		{"missing content", ToolAdd, `{}`, `missing required argument "content"`},
		{"empty content", ToolAdd, `{"content": "  "}`, "must not be empty"},
		{"content not a string", ToolAdd, `{"content": 5}`, "must be a string"},
		{"metadata not an object", ToolAdd, `{"content": "x", "metadata": "tag"}`, "must be a JSON object"},
		{"unknown argument", ToolAdd, `{"content": "x", "importance": 9}`, `unknown argument "importance"`},
		{"update missing id", ToolUpdate, `{"content": "x"}`, `missing required argument "memory_id"`},
		{"update malformed id", ToolUpdate, `{"memory_id": "42", "content": "x"}`, "is not a memory id"},
		{"update unknown id", ToolUpdate, `{"memory_id": "mem_deadbeef", "content": "x"}`, "no memory with id"},
		{"delete unconfirmed", ToolDelete, `{"memory_id": "` + good.Entry.ID + `", "confirmation": false}`, "not deleted"},
		{"delete without confirmation", ToolDelete, `{"memory_id": "` + good.Entry.ID + `"}`, `missing required argument "confirmation"`},
		{"delete confirmation not bool", ToolDelete, `{"memory_id": "` + good.Entry.ID + `", "confirmation": "yes"}`, "must be true or false"},
		{"delete unknown id", ToolDelete, `{"memory_id": "mem_deadbeef", "confirmation": true}`, "no memory with id"},
		{"retrieve no query", ToolRetrieve, `{"top_k": 2}`, `missing required argument "query"`},
		{"retrieve top_k zero", ToolRetrieve, `{"query": "x", "top_k": 0}`, "outside"},
		{"retrieve top_k huge", ToolRetrieve, `{"query": "x", "top_k": 1000}`, "outside"},
		{"retrieve top_k fractional", ToolRetrieve, `{"query": "x", "top_k": 2.5}`, "must be an integer"},
		{"retrieve filter not object", ToolRetrieve, `{"query": "x", "metadata_filter": [1]}`, "must be a JSON object"},
		{"summary bad span", ToolSummary, `{"span": "half"}`, "must be \"all\" or a positive number"},
		{"summary nothing to do", ToolSummary, `{"span": "all"}`, "nothing to summarise"},
		{"filter no criteria", ToolFilter, `{}`, `missing required argument "criteria"`},
		{"arguments not an object", ToolAdd, `[1,2]`, "must be a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := exec(t, rt, tc.tool, tc.args)
			if r.OK || !strings.Contains(r.Error, tc.want) {
				t.Fatalf("got ok=%v error %q, want it to mention %q", r.OK, r.Error, tc.want)
			}
			var msg map[string]any
			if err := json.Unmarshal([]byte(r.Content), &msg); err != nil || msg["status"] != "error" {
				t.Fatalf("tool message is not a JSON error: %s", r.Content)
			}
		})
	}
	if n, _ := rt.Store.Count(context.Background()); n != 1 {
		t.Fatalf("bad calls changed the store: %d entries", n)
	}
}

func TestSummaryReplacesSpan(t *testing.T) {
	rt := newRuntime()
	rt.Context.Append(
		chat.Message{Role: stm.User, Content: "Hello there. Marla Quenby was born in Oslo in 1971."},
		chat.Message{Role: stm.Assistant, Content: "<think>ok</think><answer>Noted.</answer>"},
		chat.Message{Role: stm.User, Content: "The weather is nice. The Asca River flows through Velden."},
		chat.Message{Role: stm.Assistant, Content: "<think>ok</think><answer>Interesting.</answer>"},
		chat.Message{Role: stm.Assistant, Content: `<think>compress</think><tool_call>[{"name":"Summary_context","arguments":{"span":"2"}}]</tool_call>`},
	)
	before := rt.Context.Tokens()
	r := exec(t, rt, ToolSummary, `{"span": "2"}`)
	if !r.OK || r.Removed != 2 {
		t.Fatalf("span 2: %+v", r)
	}
	// system, user1, assistant1, summary, in-flight call
	if rt.Context.Len() != 5 || !strings.HasPrefix(rt.Context.At(3).Content, SummaryPrefix) {
		t.Fatalf("context after span 2: %+v", rt.Context.Messages())
	}
	if !strings.Contains(rt.Context.At(3).Content, "Asca River flows through Velden") {
		t.Fatalf("summary lost the key fact: %q", rt.Context.At(3).Content)
	}
	r = exec(t, rt, ToolSummary, `{"span": "all"}`)
	if !r.OK || r.Removed != 3 || rt.Context.Len() != 3 || rt.Context.At(0).Role != stm.System {
		t.Fatalf("span all: %+v %+v", r, rt.Context.Messages())
	}
	if rt.Context.Tokens() >= before {
		t.Errorf("summary did not shrink the context: %d -> %d", before, rt.Context.Tokens())
	}
	if !strings.Contains(rt.Context.At(1).Content, "1971") {
		t.Errorf("key items lost: %q", rt.Context.At(1).Content)
	}
	exec(t, rt, ToolSummary, `{"span": 1}`) // a bare number is accepted
}

func TestFilterRemovesSimilarMessages(t *testing.T) {
	rt := newRuntime()
	rt.Context.Append(
		chat.Message{Role: stm.User, Content: "Quantum computing uses qubits and superposition."},
		chat.Message{Role: stm.User, Content: "Marla Quenby was born in Oslo."},
		chat.Message{Role: stm.User, Content: "Quantum computing researchers build qubits."},
		chat.Message{Role: stm.Assistant, Content: `<tool_call>[{"name":"Filter_context","arguments":{"criteria":"quantum computing qubits"}}]</tool_call>`},
	)
	r := exec(t, rt, ToolFilter, `{"criteria": "quantum computing qubits"}`)
	if !r.OK || r.Removed != 2 {
		t.Fatalf("filter: %+v, context %+v", r, rt.Context.Messages())
	}
	msgs := rt.Context.Messages()
	if len(msgs) != 3 || msgs[0].Role != stm.System || msgs[1].Content != "Marla Quenby was born in Oslo." {
		t.Fatalf("after filter: %+v", msgs)
	}
	// theta is honoured: with theta = 1 only identical text goes.
	rt.Options.FilterThreshold = 1
	rt.Context.Append(chat.Message{Role: stm.User, Content: "Quantum computing uses qubits."}, chat.Message{Role: stm.Assistant, Content: "call"})
	if r := exec(t, rt, ToolFilter, `{"criteria": "quantum computing qubits"}`); r.Removed != 0 {
		t.Fatalf("theta=1 removed %d", r.Removed)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        string
		calls     int
		answer    string
		errSubstr string // "" means no errors
	}{
		{"answer", "<think>easy</think><answer>Oslo</answer>", 0, "Oslo", ""},
		{"array call", `<think>x</think><tool_call>[{"name":"Add_memory","arguments":{"content":"a"}},{"name":"Retrieve_memory","arguments":{"query":"b"}}]</tool_call>`, 2, "", ""},
		{"single object", `<think>x</think><tool_call>{"name":"Add_memory","arguments":{"content":"a"}}</tool_call>`, 1, "", ""},
		{"arguments as string", `<think>x</think><tool_call>[{"name":"Add_memory","arguments":"{\"content\":\"a\"}"}]</tool_call>`, 1, "", ""},
		{"call then think then answer", `<think>a</think><tool_call>[{"name":"Add_memory","arguments":{"content":"a"}}]</tool_call><think>b</think><answer>ok</answer>`, 1, "ok", ""},
		{"exclusivity", `<think>a</think><tool_call>[{"name":"Add_memory","arguments":{"content":"a"}}]</tool_call><answer>ok</answer>`, 1, "", "mutual exclusivity"},
		{"no think", `<answer>ok</answer>`, 0, "ok", "must start with <think>"},
		{"text outside", `Sure! <think>a</think><answer>ok</answer>`, 0, "ok", "text outside tags"},
		{"unclosed", `<think>a</think><tool_call>[{"name":"Add_memory"`, 0, "", "never closed"},
		{"bad json", `<think>a</think><tool_call>[{"name": Add_memory}]</tool_call>`, 0, "", "not valid JSON"},
		{"no name", `<think>a</think><tool_call>[{"arguments":{}}]</tool_call>`, 0, "", "no \"name\""},
		{"neither", `<think>just thinking</think>`, 0, "", "neither"},
		{"empty", ``, 0, "", "empty"},
		{"two answers", `<think>a</think><answer>1</answer><think>b</think><answer>2</answer>`, 0, "1", "only once"},
		{"nested", `<think>a <answer>x</answer></think><answer>y</answer>`, 0, "y", "nested"},
		{"stray close", `<think>a</think></answer>`, 0, "", "never opened"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Parse(tc.in)
			if len(p.Calls) != tc.calls {
				t.Errorf("calls = %d, want %d", len(p.Calls), tc.calls)
			}
			if p.Answer != tc.answer {
				t.Errorf("answer = %q, want %q", p.Answer, tc.answer)
			}
			errs := strings.Join(p.Errors, "; ")
			if (tc.errSubstr == "") != (errs == "") || !strings.Contains(errs, tc.errSubstr) {
				t.Errorf("errors = %q, want %q", errs, tc.errSubstr)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"<think>a</think><answer>b</answer>",
		`<think>x</think><tool_call>[{"name":"Add_memory","arguments":{"content":"a"}}]</tool_call>`,
		"<tool_call><think></tool_call></think>",
		`<think></think><tool_call>{"name":"x","arguments":"{"}</tool_call>`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := Parse(s)
		if !p.HasAnswer && len(p.Calls) == 0 && len(p.Errors) == 0 {
			t.Fatalf("%q: a response with no action must carry an error", s)
		}
		for _, c := range p.Calls {
			var m map[string]any
			if json.Unmarshal(c.Arguments, &m) != nil {
				t.Fatalf("%q: call arguments are not an object: %s", s, c.Arguments)
			}
		}
	})
}

// scripted replies with the given responses in turn.
type scripted struct {
	replies []string
	seen    [][]chat.Message
}

func (s *scripted) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	s.seen = append(s.seen, req.Messages)
	r := s.replies[0]
	if len(s.replies) > 1 {
		s.replies = s.replies[1:]
	}
	return llm.Reply(r), nil
}

func TestRunExecutesCallsAndStopsAtAnswer(t *testing.T) {
	rt := newRuntime()
	rt.Context.Append(chat.Message{Role: stm.User, Content: "Remember that my cat is called Tabby."})
	p := &scripted{replies: []string{
		`<think>store</think><tool_call>[{"name":"Add_memory","arguments":{"content":"The user's cat is called Tabby."}}]</tool_call>`,
		`no tags at all`,
		`<think>done</think><answer>I will remember.</answer>`,
	}}
	tr, err := Run(context.Background(), p, rt, Limits{MaxSteps: 5})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.HasAnswer || tr.Answer != "I will remember." || len(tr.Steps) != 3 || tr.FormatErrors != 1 {
		t.Fatalf("trace: answer %q steps %d format errors %d", tr.Answer, len(tr.Steps), tr.FormatErrors)
	}
	if tr.ToolCalls()[ToolAdd] != 1 {
		t.Fatalf("tool calls: %v", tr.ToolCalls())
	}
	// The second call saw the tool result; the third saw the format error.
	if last := p.seen[1][len(p.seen[1])-1]; last.Role != stm.Tool || !strings.Contains(last.Content, "success") {
		t.Fatalf("step 2 prompt ends with %+v", last)
	}
	if last := p.seen[2][len(p.seen[2])-1]; last.Role != stm.Tool || !strings.Contains(last.Content, "response format") {
		t.Fatalf("step 3 prompt ends with %+v", last)
	}
	if tr.Steps[0].PromptTokens <= 0 || len(tr.Steps[0].Prompt) != 2 {
		t.Fatalf("step record: %+v", tr.Steps[0])
	}
}

func TestRunStepLimitAndOverflow(t *testing.T) {
	rt := newRuntime()
	rt.Context.Append(chat.Message{Role: stm.User, Content: strings.Repeat("word ", 200)})
	p := &scripted{replies: []string{`<think>hmm</think><tool_call>[{"name":"Retrieve_memory","arguments":{"query":"x"}}]</tool_call>`}}
	tr, err := Run(context.Background(), p, rt, Limits{MaxSteps: 3, ContextBudget: 100})
	if err != nil {
		t.Fatal(err)
	}
	if tr.HasAnswer || !tr.StepLimitHit || len(tr.Steps) != 3 || !tr.Steps[0].Overflow {
		t.Fatalf("trace: %+v", tr)
	}
}

func TestKeyItems(t *testing.T) {
	got := strings.Join(KeyItems("The Velden Bridge opened in 1923. Marla Quenby crossed it on 4 May."), "|")
	if got != "Velden Bridge|1923|Marla Quenby|4|May" {
		t.Fatalf("key items: %s", got)
	}
}

func TestWordsTokenizer(t *testing.T) {
	if n := (stm.Words{}).Count("Hello, world! internationalization"); n != 1+1+1+1+4 { // "internationalization" is 20 letters: 4 tokens of 6
		t.Fatalf("count = %d", n)
	}
}

func TestModelSummarizerUsesThePapersPrompt(t *testing.T) {
	p := &scripted{replies: []string{"<think>short</think><answer>Marla was born in Oslo in 1971.</answer>"}}
	got, err := ModelSummarizer{Model: p}.Summarize(context.Background(), []chat.Message{
		{Role: stm.User, Content: "Marla Quenby was born in Oslo in 1971, you know."},
	})
	if err != nil || got != "Marla was born in Oslo in 1971." {
		t.Fatalf("summary %q, %v", got, err)
	}
	sys := p.seen[0][0].Content
	if !strings.HasPrefix(sys, "You are a conversation summarization assistant.") || !strings.Contains(sys, "user: Marla Quenby was born in Oslo") {
		t.Fatalf("prompt sent: %q", sys)
	}
	if _, err := (ModelSummarizer{Model: &scripted{replies: []string{"  "}}}).Summarize(context.Background(), nil); err == nil {
		t.Fatal("an empty summary must be an error, not a silent loss of context")
	}
}

// TestCompactPromptNamesEveryToolAndArgument: the compact prompt is
// generated from the same schemas, so it cannot drift from the tools.
func TestCompactPromptNamesEveryToolAndArgument(t *testing.T) {
	compact, err := SystemPromptFor(PromptCompact)
	if err != nil {
		t.Fatal(err)
	}
	paper, _ := SystemPromptFor(PromptPaper)
	if paper != SystemPrompt() || len(compact)*5 > len(paper) {
		t.Fatalf("paper prompt %d bytes, compact %d", len(paper), len(compact))
	}
	for _, want := range []string{"Add_memory(content, memory_type?, metadata?)", "Update_memory(memory_id, content, metadata?)",
		"Delete_memory(memory_id, confirmation)", "Retrieve_memory(query, metadata_filter?, top_k?)", "Summary_context(span)",
		"Filter_context(criteria)", "<think>", "<tool_call>", "<answer>"} {
		if !strings.Contains(compact, want) {
			t.Errorf("compact prompt lacks %q:\n%s", want, compact)
		}
	}
	if _, err := SystemPromptFor("verbose"); err == nil || !strings.Contains(err.Error(), `"verbose"`) {
		t.Fatalf("unknown style: %v", err)
	}
}

// TestErrorsAreDeterministic: a call with several unknown arguments gets
// the same message every time (it used to name whichever a map gave
// first, so two runs of one seed diverged).
func TestErrorsAreDeterministic(t *testing.T) {
	rt := newRuntime()
	call := Call{Name: ToolFilter, Arguments: []byte(`{"criteria": "x", "memory_type": "fact", "content": "y", "zeta": 1}`)}
	res, _ := rt.Execute(context.Background(), call)
	first := res.Content
	if !strings.Contains(first, `unknown argument \"content\"`) {
		t.Fatalf("want the first unknown argument in sorted order: %s", first)
	}
	for range 50 {
		if res, _ := rt.Execute(context.Background(), call); res.Content != first {
			got := res.Content
			t.Fatalf("the message changed: %s then %s", first, got)
		}
	}
}

// TestToolSubsets: a runtime offering a subset (tools.subset) lists only
// those tools in either prompt and refuses the others with a message the
// model reads; an unknown tool is still named as unknown. All six give the
// paper's prompt byte for byte.
func TestToolSubsets(t *testing.T) {
	if p, _ := SystemPromptWith(PromptPaper, SubsetTools(SubsetAll)); p != SystemPrompt() || !strings.Contains(p, `"name": "Filter_context"`) {
		t.Fatal("the prompt of all six tools is not the paper's")
	}
	for _, c := range []struct {
		subset     string
		has, lacks []string
	}{
		{SubsetLTM, []string{ToolAdd, ToolUpdate, ToolDelete, ToolRetrieve}, []string{ToolFilter, ToolSummary}},
		{SubsetSTM, []string{ToolFilter, ToolSummary}, []string{ToolAdd, ToolUpdate, ToolDelete, ToolRetrieve}},
	} {
		for _, style := range []string{PromptPaper, PromptCompact} {
			p, err := SystemPromptWith(style, SubsetTools(c.subset))
			if err != nil {
				t.Fatal(err)
			}
			// The paper's text keeps its own example call; its tool list is
			// the schemas section.
			if i := strings.Index(p, "## Problem-Solving"); i > 0 {
				p = p[:i]
			}
			for _, n := range c.has {
				if !strings.Contains(p, n) {
					t.Errorf("%s %s prompt lacks %s", c.subset, style, n)
				}
			}
			for _, n := range c.lacks {
				if strings.Contains(p, n) {
					t.Errorf("%s %s prompt lists %s", c.subset, style, n)
				}
			}
		}
		rt := newRuntime()
		rt.Options.Subset = c.subset
		r := exec(t, rt, c.lacks[0], `{"criteria": "x", "content": "y", "query": "q", "span": "1"}`)
		if r.OK || !strings.Contains(r.Error, "is not offered") || !strings.Contains(r.Error, c.has[0]) {
			t.Errorf("%s: %s gave %+v", c.subset, c.lacks[0], r)
		}
		if r := exec(t, rt, "Forget_everything", `{}`); r.OK || !strings.Contains(r.Error, "unknown tool") {
			t.Errorf("unknown tool: %+v", r)
		}
	}
	if err := (Options{TopK: 3, MaxTopK: 50, FilterThreshold: 0.6, Summarizer: "extractive", SummaryMaxTokens: 64, Subset: "ltm-only"}).Validate(); err == nil || !strings.Contains(err.Error(), "subset") {
		t.Fatalf("a bad subset: %v", err)
	}
}
