package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	ollamatemplate "github.com/ollama/ollama/template"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/rl/reward"
)

var conv = []chat.Message{
	{Role: stm.System, Content: "You manage your own memory."},
	{Role: stm.User, Content: "Marla Quenby was born in Oslo."},
	{Role: stm.Assistant, Content: `<think>store it</think><tool_call>[{"name": "Add_memory", "arguments": {"content": "Marla Quenby was born in Oslo."}}]</tool_call>`},
	{Role: stm.Tool, Name: "Add_memory", Content: `{"status": "success"}`},
	{Role: stm.User, Content: "Where was Marla born?"},
}

func client(t *testing.T, url string) *Client {
	t.Helper()
	c, err := New(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Raw generation: the prompt is exactly what the native engine renders,
// sampling and context options pass through, Ollama is told not to
// truncate, and the <tool_call> text comes back untouched, streamed or not.
func TestRawPolicyKeepsTheAgeMemFormat(t *testing.T) {
	f, srv := newFake(t, "agemem-policy")
	want := `<think>I stored it earlier.</think><tool_call>[{"name": "Retrieve_memory", "arguments": {"query": "Marla Quenby birthplace", "top_k": 3}}]</tool_call>`
	for _, streamed := range []bool{false, true} {
		f.push(reply{chunks: []string{want[:20], want[20:77], want[77:]}})
		var sofar []string
		p := &Model{Client: client(t, srv.URL), Name: "agemem-policy", Raw: true, Template: chat.Qwen3,
			NumCtx: 4096, Sampling: llm.Sampling{Temperature: 0.7, TopP: 0.9, MaxTokens: 256, Seed: 42}, KeepAlive: 10 * time.Minute}
		req := llm.Request{Messages: conv}
		if streamed {
			req.OnText = func(text func() string) { sofar = append(sofar, text()) }
		}
		c, err := p.Chat(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if c.Message.Content != want || c.FinishReason != "stop" || c.PromptTokens == 0 || c.CompletionTokens != 4 {
			t.Fatalf("streamed %v: %+v", streamed, c)
		}
		parsed := memtools.Parse(c.Message.Content)
		if len(parsed.Errors) > 0 || len(parsed.Calls) != 1 || parsed.Calls[0].Name != "Retrieve_memory" {
			t.Fatalf("parsed %+v", parsed)
		}
		sent := f.generates[len(f.generates)-1]
		qm := make([]chat.Message, len(conv))
		for i, m := range conv {
			qm[i] = chat.Message{Role: m.Role, Content: m.Content}
		}
		prompt, _ := chat.Render(qm, chat.Options{Template: chat.Qwen3, AddGenerationPrompt: true})
		if !sent.Raw || sent.Prompt != prompt {
			t.Fatalf("raw %v, prompt\n%s\nwant\n%s", sent.Raw, sent.Prompt, prompt)
		}
		if sent.Truncate == nil || *sent.Truncate || sent.KeepAlive == nil || sent.KeepAlive.Duration != 10*time.Minute {
			t.Errorf("truncate %v keep_alive %v", sent.Truncate, sent.KeepAlive)
		}
		o := sent.Options
		if o["num_ctx"] != 4096.0 || o["temperature"] != 0.7 || o["top_p"] != 0.9 || o["num_predict"] != 256.0 || o["seed"] != 42.0 {
			t.Errorf("options %v", o)
		}
		if stops, _ := o["stop"].([]any); len(stops) != 2 || stops[0] != "<|im_end|>" {
			t.Errorf("stop %v", o["stop"])
		}
		if streamed {
			if len(sofar) != 3 || sofar[2] != want || !strings.HasPrefix(want, sofar[0]) || !strings.HasPrefix(want, sofar[1]) {
				t.Errorf("stream callbacks %q", sofar)
			}
		} else if sent.Stream == nil || *sent.Stream {
			t.Errorf("a non-streaming call asked for a stream")
		}
	}
	// A thinking model's parser lifts the reasoning out of the raw text:
	// it is put back as the <think> block the model wrote; a response cut
	// by num_predict says "length".
	f.push(reply{thinking: "Marla was born in Oslo.", chunks: []string{"<answer>Oslo</answer>"}, reason: "length"})
	p := &Model{Client: client(t, srv.URL), Name: "agemem-policy", Raw: true}
	c, err := p.Chat(context.Background(), llm.Request{Messages: conv})
	if err != nil {
		t.Fatal(err)
	}
	if c.Message.Content != "<think>\nMarla was born in Oslo.\n</think>\n\n<answer>Oslo</answer>" || c.FinishReason != "length" {
		t.Fatalf("%q %s", c.Message.Content, c.FinishReason)
	}
	if pr := memtools.Parse(c.Message.Content); !pr.HasAnswer || pr.Answer != "Oslo" || len(pr.Errors) > 0 {
		t.Fatalf("parsed %+v", pr)
	}
}

// Tools: Ollama's parsed tool calls come back as one AgeMem <tool_call>
// block with names and arguments in order, its thinking as <think>; the
// request carries the six tools and the tool results with their names.
func TestToolsPolicyMapsOllamaToolCallsBack(t *testing.T) {
	f, srv := newFake(t, "qwen3:4b")
	think := true
	for _, streamed := range []bool{false, true} {
		f.push(reply{thinking: "I should store this and look for related facts.", calls: []api.ToolCall{
			toolCall("Add_memory", "content", "Marla Quenby was born in Oslo.", "metadata", map[string]any{"source": "user"}),
			toolCall("Retrieve_memory", "query", "Oslo", "top_k", 2),
		}})
		p := memtools.FunctionCalling{Model: &Model{Client: client(t, srv.URL), Name: "qwen3:4b", Think: &think}}
		req := llm.Request{Messages: conv}
		if streamed {
			req.OnText = func(func() string) {}
		}
		c, err := p.Chat(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		want := `<think>I should store this and look for related facts.</think><tool_call>[{"name":"Add_memory","arguments":{"content":"Marla Quenby was born in Oslo.","metadata":{"source":"user"}}},{"name":"Retrieve_memory","arguments":{"query":"Oslo","top_k":2}}]</tool_call>`
		if c.Message.Content != want {
			t.Fatalf("streamed %v:\n%s\nwant\n%s", streamed, c.Message.Content, want)
		}
		pr := memtools.Parse(c.Message.Content)
		if len(pr.Errors) > 0 || len(pr.Calls) != 2 || pr.Calls[0].Name != "Add_memory" || pr.Calls[1].Name != "Retrieve_memory" {
			t.Fatalf("parsed %+v", pr)
		}
		sent := f.chats[len(f.chats)-1]
		var names []string
		for _, tool := range sent.Tools {
			names = append(names, tool.Function.Name)
		}
		if !slices.Equal(names, memtools.ToolNames) {
			t.Errorf("tools %v, want %v", names, memtools.ToolNames)
		}
		if sent.Think == nil || sent.Think.Value != true {
			t.Errorf("think %v", sent.Think)
		}
		// The history's AgeMem call goes as a structured call that the
		// tool result answers by id.
		if a := sent.Messages[2]; len(sent.Messages) != len(conv) || a.Content != "<think>store it</think>" || len(a.ToolCalls) != 1 ||
			a.ToolCalls[0].Function.Name != "Add_memory" || sent.Messages[3].Role != "tool" || sent.Messages[3].ToolName != "Add_memory" ||
			sent.Messages[3].ToolCallID != a.ToolCalls[0].ID {
			t.Errorf("messages %+v", sent.Messages)
		}
	}
	// A plain reply becomes the answer; one already in the AgeMem format
	// is kept as written.
	f.push(reply{chunks: []string{"She was born ", "in Oslo."}},
		reply{chunks: []string{"<think>known</think><answer>Oslo</answer>"}})
	p := memtools.FunctionCalling{Model: &Model{Client: client(t, srv.URL), Name: "qwen3:4b"}}
	for _, want := range []string{"<think></think><answer>She was born in Oslo.</answer>", "<think>known</think><answer>Oslo</answer>"} {
		c, err := p.Chat(context.Background(), llm.Request{Messages: conv})
		if err != nil || c.Message.Content != want {
			t.Fatalf("%q (%v), want %q", c.Message.Content, err, want)
		}
	}
}

// The whole AgeMem loop runs on an Ollama model: its Add_memory call is
// executed against the store, the tool result goes back to it, and its
// answer ends the turn.
func TestAgeMemLoopOnOllama(t *testing.T) {
	f, srv := newFake(t, "qwen3:4b")
	f.push(reply{thinking: "Store the fact.", calls: []api.ToolCall{toolCall("Add_memory", "content", "The user's cat is called Tabby.")}},
		reply{chunks: []string{"I will remember that."}})
	ctxt := stm.New(nil)
	ctxt.Append(chat.Message{Role: stm.System, Content: memtools.SystemPrompt()}, chat.Message{Role: stm.User, Content: "Remember that my cat is called Tabby."})
	store := ltm.NewMemStore(1)
	rt := &memtools.Runtime{Store: store, Context: ctxt, Embedder: embed.NewHashing(64, []int{3}),
		Summarizer: memtools.Extractive{MaxTokens: 64}, Options: memtools.DefaultOptions()}
	p := memtools.FunctionCalling{Model: &Model{Client: client(t, srv.URL), Name: "qwen3:4b"}}
	tr, err := memtools.Run(context.Background(), p, rt, memtools.Limits{MaxSteps: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.HasAnswer || tr.Answer != "I will remember that." || tr.ToolCalls()[memtools.ToolAdd] != 1 {
		t.Fatalf("trace: %+v", tr)
	}
	all, _ := store.List(context.Background())
	if len(all) != 1 || all[0].Content != "The user's cat is called Tabby." {
		t.Fatalf("store: %+v", all)
	}
	second := f.chats[1].Messages
	if last := second[len(second)-1]; last.Role != "tool" || !strings.Contains(last.Content, "success") {
		t.Fatalf("the second call did not see the tool result: %+v", last)
	}
}

// The judge and the summariser run on an Ollama chat model.
func TestJudgeAndSummariserOnOllama(t *testing.T) {
	f, srv := newFake(t, "qwen3:4b")
	f.push(reply{chunks: []string{"0.8"}}, reply{chunks: []string{"Marla Quenby was born in Oslo in 1971."}})
	p := &Model{Client: client(t, srv.URL), Name: "qwen3:4b"}
	s, err := reward.LLMJudge{Policy: p}.Score(context.Background(), "Where was Marla born?", "Oslo", "In Oslo")
	if err != nil || s != 0.8 {
		t.Fatalf("judge: %v %v", s, err)
	}
	if sys := f.chats[0].Messages; !strings.Contains(sys[len(sys)-1].Content+sys[0].Content, "In Oslo") || len(f.chats[0].Tools) != 0 {
		t.Errorf("judge request %+v", f.chats[0])
	}
	sum, err := memtools.ModelSummarizer{Model: p}.Summarize(context.Background(), conv[1:3])
	if err != nil || sum != "Marla Quenby was born in Oslo in 1971." {
		t.Fatalf("summary %q %v", sum, err)
	}
	if o := f.chats[1].Options; o["temperature"] != 0.0 {
		t.Errorf("temperature not passed: %v", o)
	}
}

// Failures name the host and say what to do.
func TestErrorsSayWhatToDo(t *testing.T) {
	f, srv := newFake(t, "qwen3:4b")
	ctx := context.Background()

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	p := &Model{Client: client(t, dead), Name: "qwen3:4b", Raw: true}
	_, err := p.Chat(ctx, llm.Request{Messages: conv})
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "http://"+dead) || !strings.Contains(err.Error(), "OLLAMA_HOST") {
		t.Errorf("unreachable: %v", err)
	}
	if _, err := client(t, dead).Ping(ctx); !errors.Is(err, ErrUnreachable) {
		t.Errorf("ping: %v", err)
	}

	for _, raw := range []bool{true, false} {
		p = &Model{Client: client(t, srv.URL), Name: "qwen3:14b", Raw: raw}
		_, err = p.Chat(ctx, llm.Request{Messages: conv})
		if !errors.Is(err, ErrModelNotFound) || !strings.Contains(err.Error(), "ollama pull qwen3:14b") || !strings.Contains(err.Error(), srv.URL) {
			t.Errorf("raw %v, model not pulled: %v", raw, err)
		}
	}
	if err := client(t, srv.URL).HasModel(ctx, "llama9"); !errors.Is(err, ErrModelNotFound) {
		t.Errorf("HasModel: %v", err)
	}
	if err := client(t, srv.URL).HasModel(ctx, "qwen3:4b"); err != nil {
		t.Errorf("HasModel: %v", err)
	}

	f.ctxLimit = 100
	p = &Model{Client: client(t, srv.URL), Name: "qwen3:4b", Raw: true, NumCtx: 64}
	_, err = p.Chat(ctx, llm.Request{Messages: conv})
	if !errors.Is(err, ErrContextTooLong) || !strings.Contains(err.Error(), "num_ctx 64") || !strings.Contains(err.Error(), "ollama.num_ctx") {
		t.Errorf("context: %v", err)
	}
	f.ctxLimit = 1 << 20

	f.cutStream = true
	f.push(reply{chunks: []string{"<think>"}})
	p = &Model{Client: client(t, srv.URL), Name: "qwen3:4b", Raw: true}
	if _, err = p.Chat(ctx, llm.Request{Messages: conv, OnText: func(func() string) {}}); !errors.Is(err, ErrResponseInvalid) {
		t.Errorf("cut stream: %v", err)
	}
	f.cutStream = false

	if _, err := New("http://[::1", nil); err == nil {
		t.Error("a malformed host was accepted")
	}
}

// The embedder learns the dimension from the model, batches, normalises,
// and refuses truncation and missing models.
func TestEmbedder(t *testing.T) {
	f, srv := newFake(t, "nomic-embed-text")
	ctx := context.Background()
	e, err := NewEmbedder(ctx, client(t, srv.URL), "nomic-embed-text", 0)
	if err != nil {
		t.Fatal(err)
	}
	if e.Dim() != 8 {
		t.Fatalf("dim %d", e.Dim())
	}
	e.Batch = 2
	texts := []string{"Marla was born in Oslo", "Oslo is in Norway", "cats", "the user's cat is Tabby", "Tabby the cat"}
	vs, err := e.Embed(ctx, texts)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 5 || len(f.embeds) != 1+3 {
		t.Fatalf("%d vectors in %d requests", len(vs), len(f.embeds))
	}
	for i, v := range vs {
		var n float64
		for _, x := range v {
			n += float64(x) * float64(x)
		}
		raw := vector(texts[i], 8)
		if math.Abs(n-1) > 1e-5 || (raw[1] != 0 && math.Abs(float64(v[1]/v[0]-raw[1]/raw[0])) > 1e-5) {
			t.Errorf("vector %d: norm² %g", i, n)
		}
	}
	if f.embeds[1].Truncate == nil || *f.embeds[1].Truncate {
		t.Error("embed requests must not truncate")
	}
	f.ctxLimit = 10
	if _, err := e.Embed(ctx, []string{"a text longer than ten"}); !errors.Is(err, ErrContextTooLong) {
		t.Errorf("long text: %v", err)
	}
	if _, err := NewEmbedder(ctx, client(t, srv.URL), "mxbai-embed-large", 0); !errors.Is(err, ErrModelNotFound) || !strings.Contains(err.Error(), "ollama pull mxbai-embed-large") {
		t.Errorf("missing model: %v", err)
	}
	var _ embed.Embedder = e
}

// Publishing uploads the GGUF as a blob under its digest and creates the
// model with the template, stop sequences and system prompt; the template,
// executed by Ollama's own template package, renders the Qwen prompt the
// native engine renders.
func TestPublishAndTemplate(t *testing.T) {
	f, srv := newFake(t)
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, []byte("GGUF\x03\x00\x00\x00 not really a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	var statuses []string
	err := client(t, srv.URL).Publish(context.Background(), path, "agemem-tiny", PublishOptions{
		System: "You manage your own memory.", Parameters: map[string]any{"temperature": 0.6},
		Progress: func(s string) { statuses = append(statuses, s) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.creates) != 1 || statuses[len(statuses)-1] != "success" {
		t.Fatalf("creates %d, statuses %v", len(f.creates), statuses)
	}
	cr := f.creates[0]
	digest := cr.Files["model.gguf"]
	if cr.Model != "agemem-tiny" || string(f.blobs[digest]) != "GGUF\x03\x00\x00\x00 not really a model" || cr.Template != Template || cr.System != "You manage your own memory." {
		t.Fatalf("create request %+v", cr)
	}
	if stops, _ := cr.Parameters["stop"].([]any); len(stops) != 2 || cr.Parameters["temperature"] != 0.6 {
		t.Fatalf("parameters %v", cr.Parameters)
	}
	if err := client(t, srv.URL).Publish(context.Background(), filepath.Join(t.TempDir(), "missing.gguf"), "x", PublishOptions{}); err == nil {
		t.Error("publishing a missing file succeeded")
	}

	tmpl, err := ollamatemplate.Parse(Template)
	if err != nil {
		t.Fatal(err)
	}
	for _, msgs := range [][]chat.Message{
		conv,
		{{Role: stm.User, Content: "Hi"}},
		append(slices.Clone(conv[:3]), chat.Message{Role: stm.Tool, Content: "first"}, chat.Message{Role: stm.Tool, Content: "second"}),
	} {
		var am []api.Message
		qm := make([]chat.Message, len(msgs))
		for i, m := range msgs {
			// Ollama keeps a thinking model's reasoning apart from its
			// reply, as its parser splits it.
			content, thinking := m.Content, ""
			if before, after, ok := strings.Cut(m.Content, "</think>"); ok {
				thinking = strings.Trim(strings.TrimPrefix(strings.TrimSpace(before), "<think>"), "\n")
				content = strings.TrimLeft(after, "\n")
			}
			am = append(am, api.Message{Role: m.Role, Content: content, Thinking: thinking})
			qm[i] = chat.Message{Role: m.Role, Content: m.Content}
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, ollamatemplate.Values{Messages: am}); err != nil {
			t.Fatal(err)
		}
		want, _ := chat.Render(qm, chat.Options{Template: chat.Qwen3, AddGenerationPrompt: true})
		if b.String() != want {
			t.Errorf("Ollama renders\n%q\nthe engine renders\n%q", b.String(), want)
		}
	}
}

// TestQwen25TemplateAndDetection: the Qwen2.5 form of the Ollama template
// renders, in Ollama's own template engine, exactly what the native engine
// renders with Qwen2.5's chat template (a default system message when none
// is given, reasoning kept, tool results grouped); a model published from
// here names its family through its template, and one from elsewhere falls
// back to its architecture.
func TestQwen25TemplateAndDetection(t *testing.T) {
	tmpl, err := ollamatemplate.Parse(Qwen25Template)
	if err != nil {
		t.Fatal(err)
	}
	for _, msgs := range [][]chat.Message{
		conv,
		{{Role: stm.User, Content: "Hi"}},
		append(slices.Clone(conv[:3]), chat.Message{Role: stm.Tool, Content: "first"}, chat.Message{Role: stm.Tool, Content: "second"}),
		append(slices.Clone(conv), chat.Message{Role: stm.Assistant, Content: "<think>kept</think>\n<answer>x</answer>"}, chat.Message{Role: stm.User, Content: "again"}),
	} {
		var am []api.Message
		qm := make([]chat.Message, len(msgs))
		for i, m := range msgs {
			am = append(am, api.Message{Role: m.Role, Content: m.Content})
			qm[i] = chat.Message{Role: m.Role, Content: m.Content}
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, ollamatemplate.Values{Messages: am}); err != nil {
			t.Fatal(err)
		}
		want, _ := chat.Render(qm, chat.Options{Template: chat.Qwen25, AddGenerationPrompt: true})
		if b.String() != want {
			t.Errorf("Ollama renders\n%q\nthe engine renders\n%q", b.String(), want)
		}
	}
	f, srv := newFake(t, "qwen2.5:7b", "ours-25", "ours-3")
	c := client(t, srv.URL)
	path := filepath.Join(t.TempDir(), "m.gguf")
	os.WriteFile(path, []byte("GGUF"), 0o644)
	for name, fam := range map[string]chat.Template{"ours-25": chat.Qwen25, "ours-3": chat.Qwen3} {
		if err := c.Publish(context.Background(), path, name, PublishOptions{Chat: fam}); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Describe(context.Background(), name); err != nil || got.Template != fam {
			t.Errorf("%s: %v %v, want %v", name, got, err, fam)
		}
	}
	f.arch = "qwen2"
	if got, _ := c.Describe(context.Background(), "qwen2.5:7b"); got.Template != chat.Qwen25 {
		t.Errorf("a qwen2 model from elsewhere: %v", got)
	}
	if _, err := c.Describe(context.Background(), "missing"); !errors.Is(err, ErrModelNotFound) {
		t.Errorf("a missing model: %v", err)
	}
	// num_ctx: the budgets, capped at the model's context length unless
	// ollama.num_ctx says otherwise.
	f.ctxLen = 4096
	a := memtools.DefaultAgent()
	if p, err := DefaultConfig().Described(context.Background(), c, "qwen2.5:7b", true, a.ContextBudget, a.ResponseBudget); err != nil || p.NumCtx != 4096 || p.Template != chat.Qwen25 {
		t.Errorf("policy %+v %v", p, err)
	}
	cfg := DefaultConfig()
	cfg.NumCtx = 9000
	if p, _ := cfg.Described(context.Background(), c, "qwen2.5:7b", true, a.ContextBudget, a.ResponseBudget); p.NumCtx != 9000 {
		t.Errorf("an explicit num_ctx: %d", p.NumCtx)
	}
}

// TestTemplatesOfferTools: a model published from here supports Ollama's
// native tools. With tools, both Ollama templates render in Ollama's own
// engine what the native engine renders with the same tools and calls,
// but for the JSON of the tool definitions and arguments, which Ollama
// writes compactly where transformers puts a space after ',' and ':'.
func TestTemplatesOfferTools(t *testing.T) {
	def := `{"type": "function", "function": {"name": "Retrieve_memory", "description": "Retrieves memories.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}`
	var tool api.Tool
	if err := json.Unmarshal([]byte(def), &tool); err != nil {
		t.Fatal(err)
	}
	args := `{"query": "Marla born", "top_k": 2}`
	var call api.ToolCall
	call.Function.Name = "Retrieve_memory"
	if err := json.Unmarshal([]byte(args), &call.Function.Arguments); err != nil {
		t.Fatal(err)
	}
	tc := chat.ToolCall{Name: "Retrieve_memory", Arguments: args}
	ollamaDef, _ := json.Marshal(tool)
	ollamaArgs, _ := json.Marshal(&call.Function.Arguments)
	pyDef, _ := chat.PyJSON([]byte(def))
	pyArgs, _ := chat.PyJSON([]byte(args))
	for _, c := range []struct {
		text string
		fam  chat.Template
	}{{Template, chat.Qwen3}, {Qwen25Template, chat.Qwen25}} {
		tmpl, err := ollamatemplate.Parse(c.text)
		if err != nil {
			t.Fatal(err)
		}
		for _, withSystem := range []bool{true, false} {
			am := []api.Message{{Role: "user", Content: "Where was Marla born?"},
				{Role: "assistant", ToolCalls: []api.ToolCall{call}}, {Role: "tool", Content: `{"memories": []}`},
				{Role: "assistant", Content: "Let me look again.", ToolCalls: []api.ToolCall{call, call}}, {Role: "tool", Content: "a"}, {Role: "tool", Content: "b"}}
			qm := []chat.Message{{Role: "user", Content: am[0].Content}, {Role: "assistant", ToolCalls: []chat.ToolCall{tc}}, {Role: "tool", Content: am[2].Content},
				{Role: "assistant", Content: am[3].Content, ToolCalls: []chat.ToolCall{tc, tc}}, {Role: "tool", Content: "a"}, {Role: "tool", Content: "b"}}
			if withSystem {
				am = append([]api.Message{{Role: "system", Content: "You manage your own memory."}}, am...)
				qm = append([]chat.Message{{Role: "system", Content: "You manage your own memory."}}, qm...)
			}
			var b strings.Builder
			if err := tmpl.Execute(&b, ollamatemplate.Values{Messages: am, Tools: api.Tools{tool}}); err != nil {
				t.Fatal(err)
			}
			want, err := chat.Render(qm, chat.Options{Template: c.fam, Tools: []json.RawMessage{json.RawMessage(def)}, AddGenerationPrompt: true})
			if err != nil {
				t.Fatal(err)
			}
			if got := b.String(); !strings.Contains(got, "<tools>\n"+string(ollamaDef)+"\n</tools>") || strings.Count(got, `"arguments": {"query"`) != 3 {
				t.Fatalf("%v: the tools or the three calls are missing:\n%s", c.fam, got)
			}
			want = strings.ReplaceAll(strings.ReplaceAll(want, pyDef, string(ollamaDef)), pyArgs, string(ollamaArgs))
			if b.String() != want {
				t.Errorf("%v, system %v: Ollama renders\n%q\nthe engine renders\n%q", c.fam, withSystem, b.String(), want)
			}
		}
	}
}
