package native

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/qwentest"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
)

func qwen3Tokenizer(t *testing.T) *tokenizer.Tokenizer { return qwentest.Tokenizer(t) }

func randomQwen3(t *testing.T, tok *tokenizer.Tokenizer, dtype safetensors.DType) *qwen.Model {
	return qwentest.Model(t, tok, dtype)
}

// TestNativePolicyRunsTheAgentLoop drives the memtools loop with a random
// tiny Qwen3 carrying the real tokenizer: the loop must survive whatever the
// model emits, and the response must carry ids and log-probs that agree
// with a rescoring.
func TestNativePolicyRunsTheAgentLoop(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.BF16)
	p := New(m, tok, chat.Qwen3, Options{Sampling: llm.Sampling{Temperature: 1, Seed: 3, MaxTokens: 24}})
	defer p.Close()
	c := stm.New(tok)
	c.Append(chat.Message{Role: stm.System, Content: memtools.SystemPrompt()}, chat.Message{Role: stm.User, Content: "My cat is called Tabby."})
	rt := &memtools.Runtime{Store: ltm.NewMemStore(1), Context: c, Embedder: embed.NewHashing(64, nil), Summarizer: memtools.Extractive{}, Options: memtools.DefaultOptions()}
	tr, err := memtools.Run(context.Background(), p, rt, memtools.Limits{MaxSteps: 2, ContextBudget: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Steps) != 2 || tr.FormatErrors != 2 {
		t.Fatalf("a random model should break the format twice: %d steps, %d format errors", len(tr.Steps), tr.FormatErrors)
	}
	comp := tr.Steps[0].Response
	if len(comp.ResponseIDs) == 0 || len(comp.LogProbs) != len(comp.ResponseIDs) || comp.PromptTokens != len(comp.PromptIDs) {
		t.Fatalf("response record: %+v", comp)
	}
	// The prompt is the rendered chat template, ending in the generation prompt.
	if !strings.HasSuffix(tok.Decode(comp.PromptIDs, false), "<|im_start|>assistant\n") {
		t.Fatal("prompt does not end with the generation prompt")
	}
	score, err := m.Score(comp.PromptIDs, comp.ResponseIDs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range score {
		if d := score[i] - comp.LogProbs[i]; d > 1e-3 || d < -1e-3 {
			t.Fatalf("token %d: logprob %g vs rescored %g", i, comp.LogProbs[i], score[i])
		}
	}
	// Batched responses to different conversations.
	outs, err := p.ChatBatch(context.Background(), []llm.Request{{Messages: c.Messages()}, {Messages: c.Messages()[:2]}})
	if err != nil || len(outs) != 2 {
		t.Fatalf("batch: %v", err)
	}
}

// TestChatRendersToolsAndSurvives: a request with functions is rendered
// with the template's tools section (the prompt is exactly chat.Render's
// with the tool definitions) and the function-calling loop survives
// whatever a random model writes.
func TestChatRendersToolsAndSurvives(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	p := New(m, tok, chat.Qwen3, Options{Sampling: llm.Sampling{Temperature: 1, Seed: 3, MaxTokens: 16}})
	defer p.Close()
	rt := &memtools.Runtime{Store: ltm.NewMemStore(1), Context: stm.New(tok), Embedder: embed.NewHashing(64, nil), Options: memtools.DefaultOptions()}
	ts, err := agent.NewToolset(agent.MemoryTools(rt)...)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []chat.Message{{Role: "user", Content: "Remember: my cat is Tabby."}}
	tr, err := agent.Run(context.Background(), p, ts, msgs, agent.Limits{MaxSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	var tools []json.RawMessage
	for _, s := range ts.Functions() {
		raw, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]any{"name": s.Name, "description": s.Description, "parameters": s.Parameters}})
		tools = append(tools, raw)
	}
	want, _ := chat.Render([]chat.Message{{Role: "user", Content: msgs[0].Content}}, chat.Options{Template: p.Template(), Tools: tools, AddGenerationPrompt: true})
	if !strings.Contains(want, "<tools>") || tr.Steps[0].Reply.PromptTokens != len(tok.Encode(want)) {
		t.Fatalf("first prompt of %d tokens, the rendering with tools has %d", tr.Steps[0].Reply.PromptTokens, len(tok.Encode(want)))
	}
}

// TestToolsRenderAsTheirInlineText: a request with functions and earlier
// calls gets the prompt that the same conversation inlined as text
// (chat.InlineTools: the tools section in the system message, calls as
// <tool_call> blocks, which is what SFT data holds) gets without them,
// and the same reply, its <tool_call> blocks parsed into calls.
func TestToolsRenderAsTheirInlineText(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	p := New(m, tok, chat.Qwen3, Options{Sampling: llm.Sampling{MaxTokens: 12}})
	defer p.Close()
	fns := []chat.Function{{Name: "lookup", Description: "Looks a word up.", Parameters: json.RawMessage(`{"type":"object","properties":{"word":{"type":"string"}},"required":["word"]}`)}}
	msgs := []chat.Message{{Role: "system", Content: "You look words up."}, {Role: "user", Content: "What is a tabby?"},
		{Role: "assistant", Content: "Let me see.", ToolCalls: []chat.ToolCall{{ID: "c1", Name: "lookup", Arguments: `{"word": "tabby"}`}, {ID: "c2", Name: "lookup", Arguments: `{"word": broken`}}},
		{Role: "tool", Content: "a striped cat", ToolCallID: "c1", Name: "lookup"}, {Role: "tool", Content: "error: not JSON", ToolCallID: "c2", Name: "lookup"}}
	defs, _ := chat.Definitions(fns)
	for _, n := range []int{2, len(msgs)} {
		want, err := p.Chat(context.Background(), llm.Request{Messages: msgs[:n], Tools: fns})
		if err != nil {
			t.Fatal(err)
		}
		inline, err := chat.InlineTools(msgs[:n], chat.Options{Template: chat.Qwen3, Tools: defs})
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Chat(context.Background(), llm.Request{Messages: inline})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.PromptIDs, want.PromptIDs) || !reflect.DeepEqual(chat.ReplyMessage(got.Message.Content), want.Message) {
			t.Fatalf("%d messages: inlined %d prompt tokens, %+v; with functions %d, %+v", n, got.PromptTokens, got.Message, want.PromptTokens, want.Message)
		}
	}
}

// TestKVBudgetPagesConversations: under a KV budget the conversations'
// caches are paged blocks of a pool that size; conversations wait for
// blocks, and those the pool runs short for mid-decode are recomputed;
// every conversation still samples exactly what it samples in one
// unbounded batch (tokens and log-probabilities), and the pool's peak stays
// under what the unbounded batch holds.
func TestKVBudgetPagesConversations(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	var reqs []llm.Request
	samp := llm.Sampling{Temperature: 1, Seed: 9, MaxTokens: 24}
	for i, q := range []string{"Hi.", "What is the capital of France?", "Name a colour.", "Count to three.", "Say yes."} {
		s := samp
		s.Stream = uint64(i)
		reqs = append(reqs, llm.Request{Messages: []chat.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: q}}, Sampling: &s})
	}
	all := New(m, tok, chat.Qwen3, Options{})
	defer all.Close()
	want, err := all.ChatBatch(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	held, longest := 0, 0 // blocks the unbounded batch's sequences fill; the longest's positions
	for _, w := range want {
		held += (w.PromptTokens + w.CompletionTokens + engine.KVBlock - 1) / engine.KVBlock
		longest = max(longest, w.PromptTokens+samp.MaxTokens)
	}
	preempted := 0
	// The smallest pool that holds the longest conversation, and a roomier one.
	for _, budget := range []int{longest, longest + 120} {
		paged := New(m, tok, chat.Qwen3, Options{Engine: engine.Options{KVBudget: budget, PrefixBudget: -1}})
		got, err := paged.ChatBatch(context.Background(), reqs)
		kv := paged.Batching().KV()
		paged.Close()
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i].Message.Content != want[i].Message.Content || !slices.Equal(got[i].LogProbs, want[i].LogProbs) {
				t.Errorf("budget %d, conversation %d: %q under the budget, %q in one batch", budget, i, got[i].Message.Content, want[i].Message.Content)
			}
		}
		t.Logf("budget %d: pool %d blocks, peak %d (unbounded %d), %d preempted", budget, kv.Blocks, kv.Peak, held, kv.Preempted)
		if kv.Peak > kv.Blocks || kv.Peak >= held {
			t.Errorf("budget %d: peak %d blocks of a pool of %d; the unbounded batch fills %d", budget, kv.Peak, kv.Blocks, held)
		}
		preempted += kv.Preempted
	}
	if preempted == 0 {
		t.Error("no sequence was preempted: the test does not reach recomputation")
	}
}

// TestConcurrentCallsBatch: agents that call the engine at once decode in
// shared steps, and each gets the reply it gets alone (its sample seeded
// by its prompt, not by its batch).
func TestConcurrentCallsBatch(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	var batched atomic.Bool
	p := New(m, tok, chat.Qwen3, Options{Sampling: llm.Sampling{Temperature: 1, Seed: 3, MaxTokens: 12},
		Engine: engine.Options{MaxBatch: 4, OnStep: func(seqs, _ int) {
			if seqs > 1 {
				batched.Store(true)
			}
		}}})
	defer p.Close()
	prompts := []string{"Hi.", "Name a colour.", "Count to three.", "What is memory?"}
	fn := chat.Function{Name: "note", Description: "Keeps a note.", Parameters: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)}
	ask := func(q string) string {
		r, err := p.Chat(context.Background(), llm.Request{Messages: []chat.Message{{Role: "user", Content: q}}, Tools: []chat.Function{fn}})
		if err != nil {
			t.Error(err)
		}
		return r.Message.Content
	}
	alone := make([]string, len(prompts))
	for i, q := range prompts {
		alone[i] = ask(q)
	}
	batched.Store(false)
	together := make([]string, len(prompts))
	var wg sync.WaitGroup
	for i, q := range prompts {
		wg.Go(func() { together[i] = ask(q) })
	}
	wg.Wait()
	if !batched.Load() {
		t.Fatal("the concurrent calls never shared a decoding step")
	}
	if !reflect.DeepEqual(alone, together) {
		t.Fatalf("alone %q\ntogether %q", alone, together)
	}
}
