package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/testkit"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
)

func qwen3Tokenizer(t *testing.T) *tokenizer.Tokenizer {
	p := testkit.QwenTokenizer(t)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("run `make deps`: %v", err)
	}
	tok, err := tokenizer.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestNativePolicyRunsTheAgentLoop drives the memtools loop with a random
// tiny Qwen3 carrying the real tokenizer: the loop must survive whatever the
// model emits, and the completion must carry ids and log-probs that agree
// with a rescoring.
func TestNativePolicyRunsTheAgentLoop(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.BF16)
	p := NewGenerator(m, tok, Sampling{Temperature: 1, Seed: 3, MaxTokens: 24})
	c := stm.New(tok)
	c.Append(stm.Message{Role: stm.System, Content: memtools.SystemPrompt()}, stm.Message{Role: stm.User, Content: "My cat is called Tabby."})
	rt := &memtools.Runtime{Store: ltm.NewMemory(1), Context: c, Embedder: embed.NewHashing(64, nil), Summarizer: memtools.Extractive{}, Options: memtools.DefaultOptions()}
	tr, err := memtools.Run(context.Background(), p, rt, memtools.Limits{MaxSteps: 2, ContextBudget: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Steps) != 2 || tr.FormatErrors != 2 {
		t.Fatalf("a random model should break the format twice: %d steps, %d format errors", len(tr.Steps), tr.FormatErrors)
	}
	comp := tr.Steps[0].Completion
	if len(comp.ResponseIDs) == 0 || len(comp.LogProbs) != len(comp.ResponseIDs) || comp.PromptTokens != len(comp.PromptIDs) {
		t.Fatalf("completion record: %+v", comp)
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
	// Batched completions of different conversations.
	outs, err := p.CompleteBatch(context.Background(), [][]stm.Message{c.Messages(), c.Messages()[:2]})
	if err != nil || len(outs) != 2 {
		t.Fatalf("batch: %v", err)
	}
}

// TestChatModelRendersToolsAndSurvives: the native engine as an
// agent.Model renders the tools into its template's tools section (the
// prompt is exactly chat.Render's with the tool definitions) and the
// function-calling loop survives whatever a random model writes.
func TestChatModelRendersToolsAndSurvives(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	p := NewGenerator(m, tok, Sampling{Temperature: 1, Seed: 3, MaxTokens: 16})
	rt := &memtools.Runtime{Store: ltm.NewMemory(1), Context: stm.New(tok), Embedder: embed.NewHashing(64, nil), Options: memtools.DefaultOptions()}
	ts, err := agent.NewToolset(agent.MemoryTools(rt)...)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []agent.Message{{Role: "user", Content: "Remember: my cat is Tabby."}}
	tr, err := agent.Run(context.Background(), ChatModel{Generator: p}, ts, msgs, agent.Limits{MaxSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	var tools []json.RawMessage
	for _, s := range ts.Specs() {
		raw, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]any{"name": s.Name, "description": s.Description, "parameters": s.Parameters}})
		tools = append(tools, raw)
	}
	want, _ := chat.Render([]chat.Message{{Role: "user", Content: msgs[0].Content}}, chat.Options{Template: p.Template, Tools: tools, AddGenerationPrompt: true})
	if !strings.Contains(want, "<tools>") || tr.Steps[0].Reply.PromptTokens != len(tok.Encode(want)) {
		t.Fatalf("first prompt of %d tokens, the rendering with tools has %d", tr.Steps[0].Reply.PromptTokens, len(tok.Encode(want)))
	}
}

// TestPolicyModelSeesTheNativePrompt: a policy that takes plain messages
// (as GRPO's rollouts do), wrapped in agent.PolicyModel, gets the prompt a
// native tool-calling request renders, tools and earlier calls included,
// and replies what the native ChatModel replies.
func TestPolicyModelSeesTheNativePrompt(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	p := NewGenerator(m, tok, Sampling{MaxTokens: 12})
	specs := []agent.Spec{{Name: "lookup", Description: "Looks a word up.", Parameters: json.RawMessage(`{"type":"object","properties":{"word":{"type":"string"}},"required":["word"]}`)}}
	msgs := []agent.Message{{Role: "system", Content: "You look words up."}, {Role: "user", Content: "What is a tabby?"},
		{Role: "assistant", Content: "Let me see.", ToolCalls: []agent.ToolCall{{ID: "c1", Name: "lookup", Arguments: `{"word": "tabby"}`}, {ID: "c2", Name: "lookup", Arguments: `{"word": broken`}}},
		{Role: "tool", Content: "a striped cat", ToolCallID: "c1", Name: "lookup"}, {Role: "tool", Content: "error: not JSON", ToolCallID: "c2", Name: "lookup"}}
	for _, n := range []int{2, len(msgs)} {
		want, err := ChatModel{Generator: p}.Chat(context.Background(), msgs[:n], specs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := agent.PolicyModel{Policy: p, Template: p.Template}.Chat(context.Background(), msgs[:n], specs)
		if err != nil {
			t.Fatal(err)
		}
		if got.PromptTokens != want.PromptTokens || !reflect.DeepEqual(got.Message, want.Message) {
			t.Fatalf("%d messages: through the policy %d prompt tokens, %+v; natively %d, %+v", n, got.PromptTokens, got.Message, want.PromptTokens, want.Message)
		}
	}
}

// randomQwen3 is a random tiny Qwen3 carrying tok's vocabulary.
func randomQwen3(t *testing.T, tok *tokenizer.Tokenizer, dtype safetensors.DType) *qwen.Model {
	t.Helper()
	cfg := qwen.Presets["tiny-qwen3"]
	cfg.VocabSize = tok.VocabSize()
	dir := filepath.Join(t.TempDir(), "m")
	if err := qwen.InitRandom(dir, cfg, dtype, 5); err != nil {
		t.Fatal(err)
	}
	m, err := qwen.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKVBudgetPagesConversations: under a KV budget a batch's caches are
// paged blocks of a pool that size; conversations wait for blocks, and
// those the pool runs short for mid-decode are recomputed; every
// conversation still samples exactly what it samples in one unbounded
// batch (tokens and log-probabilities), and the pool's peak stays under
// what the unbounded batch holds.
func TestKVBudgetPagesConversations(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	var convs [][]stm.Message
	for _, q := range []string{"Hi.", "What is the capital of France?", "Name a colour.", "Count to three.", "Say yes."} {
		convs = append(convs, []stm.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: q}})
	}
	samp := Sampling{Temperature: 1, Seed: 9, MaxTokens: 24}
	all := NewGenerator(m, tok, samp)
	want, err := all.CompleteBatch(context.Background(), convs)
	if err != nil {
		t.Fatal(err)
	}
	held := 0 // blocks the unbounded batch's sequences fill
	for _, w := range want {
		held += (w.PromptTokens + w.CompletionTokens + KVBlock - 1) / KVBlock
	}
	preempted := 0
	for _, budget := range []int{1, 120} { // 1: the smallest pool, one sequence at a time
		paged := NewGenerator(m, tok, samp)
		paged.KVBudget = budget
		got, err := paged.CompleteBatch(context.Background(), convs)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i].Text != want[i].Text || !slices.Equal(got[i].LogProbs, want[i].LogProbs) {
				t.Errorf("budget %d, conversation %d: %q under the budget, %q in one batch", budget, i, got[i].Text, want[i].Text)
			}
		}
		kv := paged.KV()
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

// TestChatModelOnSchedulerBatchesAgents: agents that call a ChatModel on
// a scheduler at once decode in shared steps, and each gets the reply it
// gets alone (its sample seeded by its prompt, not by its batch).
func TestChatModelOnSchedulerBatchesAgents(t *testing.T) {
	tok := qwen3Tokenizer(t)
	m := randomQwen3(t, tok, safetensors.F32)
	p := NewGenerator(m, tok, Sampling{Temperature: 1, Seed: 3, MaxTokens: 12})
	var batched atomic.Bool
	sc := NewScheduler(m, tok, SchedulerOptions{MaxBatch: 4, OnStep: func(seqs, _ int) {
		if seqs > 1 {
			batched.Store(true)
		}
	}})
	defer sc.Close()
	cm := ChatModel{Generator: p, Scheduler: sc}
	prompts := []string{"Hi.", "Name a colour.", "Count to three.", "What is memory?"}
	spec := agent.Spec{Name: "note", Description: "Keeps a note.", Parameters: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)}
	alone := make([]string, len(prompts))
	for i, q := range prompts {
		r, err := cm.Chat(context.Background(), []agent.Message{{Role: "user", Content: q}}, []agent.Spec{spec})
		if err != nil {
			t.Fatal(err)
		}
		alone[i] = r.Message.Content
	}
	batched.Store(false)
	together := make([]string, len(prompts))
	var wg sync.WaitGroup
	for i, q := range prompts {
		wg.Go(func() {
			r, err := cm.Chat(context.Background(), []agent.Message{{Role: "user", Content: q}}, []agent.Spec{spec})
			if err != nil {
				t.Error(err)
			}
			together[i] = r.Message.Content
		})
	}
	wg.Wait()
	if !batched.Load() {
		t.Fatal("the concurrent calls never shared a decoding step")
	}
	if !reflect.DeepEqual(alone, together) {
		t.Fatalf("alone %q\ntogether %q", alone, together)
	}
}
