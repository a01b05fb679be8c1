package fittext

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// bank is a world with state: a balance that deposits raise and
// withdrawals past it fail.
type bank struct{ balance int }

var bankSpecs = []chat.Function{
	{Name: "deposit", Description: "Deposit money into the bank account.", Parameters: json.RawMessage(`{"type":"object","properties":{"amount":{"type":"string"}}}`)},
	{Name: "withdraw", Description: "Withdraw cash from the bank account.", Parameters: json.RawMessage(`{"type":"object","properties":{"amount":{"type":"string"}}}`)},
	{Name: "balance", Description: "Read the balance of the bank account.", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
}

func (b *bank) Functions() []chat.Function { return bankSpecs }

func (b *bank) Execute(_ context.Context, c chat.ToolCall) (string, bool, error) {
	var args struct{ Amount string }
	json.Unmarshal([]byte(c.Arguments), &args)
	n, _ := strconv.Atoi(args.Amount)
	switch c.Name {
	case "deposit":
		b.balance += n
		return fmt.Sprintf("deposited %d", n), true, nil
	case "withdraw":
		if n > b.balance {
			return "insufficient funds", false, nil
		}
		b.balance -= n
		return fmt.Sprintf("withdrew %d", n), true, nil
	case "balance":
		return fmt.Sprint(b.balance), true, nil
	}
	return "no such tool", false, nil
}

// script replies in the search's depth-first order and records what each
// call saw.
type script struct {
	replies []chat.Message
	seen    []seenCall
}

type seenCall struct {
	msgs  []chat.Message
	specs []string
}

func (s *script) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	var names []string
	for _, sp := range req.Tools {
		names = append(names, sp.Name)
	}
	s.seen = append(s.seen, seenCall{slices.Clone(req.Messages), names})
	if len(s.seen) > len(s.replies) {
		return llm.Response{}, fmt.Errorf("call %d is past the script", len(s.seen))
	}
	return llm.Response{Message: s.replies[len(s.seen)-1]}, nil
}

type chatFunc func(context.Context, []chat.Message, []chat.Function) (llm.Response, error)

func (f chatFunc) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	return f(ctx, req.Messages, req.Tools)
}

func call(name, args string) chat.Message {
	return chat.Message{ToolCalls: []chat.ToolCall{{ID: name, Name: name, Arguments: args}}}
}

func bankRetriever(t *testing.T) *Retriever {
	t.Helper()
	tools := []agent.CatalogTool{{Function: chat.Function{Name: "send_email", Description: "Send an email to a recipient."}},
		{Function: chat.Function{Name: "book_flight", Description: "Book a flight between two cities."}}}
	for _, sp := range bankSpecs {
		tools = append(tools, agent.CatalogTool{Function: sp})
	}
	kb, err := agent.NewCatalog(context.Background(), embed.NewHashing(512, []int{3, 4}), tools)
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.K = 1 // each pseudo-tool brings its one best match
	noModel := LLMFunc(func(context.Context, string, float64) (string, error) {
		return "", fmt.Errorf("single-pass calls no model")
	})
	return &Retriever{Config: c, KB: kb, LLM: noModel}
}

func openBank() (World, error) { return &bank{}, nil }

// The search on a hand-scripted tree: pseudo-tools retrieved into the
// functions, a hallucinated call and giving up pruned, the diversity
// prompt at a state left before, and each branch in its own world: the
// deposit of the abandoned branch does not reach the balance read on its
// sibling.
func TestSearchExploresTheTree(t *testing.T) {
	main := []chat.Message{
		{Content: wrap("deposit money into the bank account") + wrap("read the balance of the bank account")}, // root → c1
		call("deposit", `{"amount":"100"}`),                     // c1 → c2
		call("withdraw", `{"amount":"500"}`),                    // c2: not retrieved: pruned
		call("Finish", `{"return_type":"give_up_and_restart"}`), // c2 again: pruned
		call("balance", `{}`),                                   // c1 again, told it deposited → c3
		call("Finish", `{"return_type":"give_answer","final_answer":"0"}`),
	}
	m := &script{replies: main}
	s := &Search{Model: m, Retriever: bankRetriever(t), Strategy: "single", Config: DefaultSearch()}
	out, err := s.Run(context.Background(), "You run a bank account.", "What is my balance?", openBank)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Answered || out.Answer != "0" || len(out.Path) != 1 || out.Path[0].Name != "balance" {
		t.Fatalf("outcome %+v", out)
	}
	if out.Queries != 6 || out.Nodes != 6 || out.Pruned != 2 || out.Retrievals != 1 || out.Duplicates != 0 {
		t.Fatalf("counts %+v", out)
	}
	if got := m.seen[0].specs; fmt.Sprint(got) != "[Finish]" || !strings.HasPrefix(m.seen[0].msgs[0].Content, Protocol) {
		t.Fatalf("the root sees %v", got)
	}
	if got := m.seen[1].specs; fmt.Sprint(got) != "[Finish deposit balance]" {
		t.Fatalf("after retrieval the agent sees %v", got)
	}
	last := m.seen[4].msgs[len(m.seen[4].msgs)-1]
	if last.Role != "user" || !strings.Contains(last.Content, `called deposit({"amount":"100"})`) {
		t.Fatalf("the second try at c1 was not told of the first: %+v", last)
	}
	if strings.Contains(m.seen[1].msgs[len(m.seen[1].msgs)-1].Content, "before") {
		t.Fatal("a first try was given the diversity prompt")
	}
	var read string
	for _, msg := range out.Messages {
		if msg.Role == "tool" && msg.Name == "balance" {
			read = msg.Content
		}
	}
	if read != "0" {
		t.Fatalf("the balance on the sibling branch read %q: the abandoned deposit leaked", read)
	}

	// Width 1: no state is tried twice, so the hallucination ends it.
	m = &script{replies: main}
	s = &Search{Model: m, Retriever: bankRetriever(t), Strategy: "single", Config: SearchConfig{Width: 1, MaxDepth: 12, MaxQueries: 200}}
	if out, err = s.Run(context.Background(), "", "What is my balance?", openBank); err != nil || out.Answered || out.Queries != 3 {
		t.Fatalf("width 1: %v %+v", err, out)
	}
	// The query budget ends the search.
	m = &script{replies: main}
	s = &Search{Model: m, Retriever: bankRetriever(t), Strategy: "single", Config: SearchConfig{Width: 2, MaxDepth: 12, MaxQueries: 4}}
	if out, err = s.Run(context.Background(), "", "What is my balance?", openBank); err != nil || out.Answered || out.Queries != 4 {
		t.Fatalf("4 queries: %v %+v", err, out)
	}
	// Depth 2: c2 and c3 are at the limit, so both are pruned unexpanded,
	// and the root's second try (here an answer with no call) ends it.
	m = &script{replies: []chat.Message{main[0], main[1], main[4], main[5]}}
	s = &Search{Model: m, Retriever: bankRetriever(t), Strategy: "single", Config: SearchConfig{Width: 2, MaxDepth: 2, MaxQueries: 200}}
	if out, err = s.Run(context.Background(), "", "What is my balance?", openBank); err != nil || !out.Answered || out.Pruned != 2 || out.Queries != 4 || len(out.Path) != 0 {
		t.Fatalf("depth 2: %v %+v", err, out)
	}
}

// A pseudo-tool the memory already holds (Eq. 9: difflib ratio ≥ 0.82)
// is not retrieved again; its remembered tools are reused. Without a
// retriever every function is visible from the start and the protocol
// is not in the prompt.
func TestSearchDuplicatesAndPlainDFSDT(t *testing.T) {
	m := &script{replies: []chat.Message{
		{Content: wrap("deposit money into the bank account")},
		call("Finish", `{"return_type":"give_up_and_restart"}`),
		call("Finish", `{"return_type":"give_up_and_restart"}`),
		{Content: wrap("deposit money into the bank account now")},
		call("deposit", `{"amount":"5"}`),
		call("Finish", `{"return_type":"give_answer","final_answer":"done"}`),
	}}
	s := &Search{Model: m, Retriever: bankRetriever(t), Strategy: "single", Config: DefaultSearch()}
	out, err := s.Run(context.Background(), "", "Deposit 5.", openBank)
	if err != nil || !out.Answered || out.Retrievals != 1 || out.Duplicates != 1 || fmt.Sprint(m.seen[4].specs) != "[Finish deposit]" {
		t.Fatalf("%v %+v; the fifth call saw %v", err, out, m.seen[4].specs)
	}
	// Malformed and unknown calls prune; a plain reply answers.
	m = &script{replies: []chat.Message{
		call("Finish", `{"return_type": 3}`),
		{ToolCalls: []chat.ToolCall{{ID: "x", Name: "deposit", Invalid: "not JSON"}}},
	}}
	s = &Search{Model: m, Config: DefaultSearch()}
	if out, err = s.Run(context.Background(), "sys", "Deposit 5.", openBank); err != nil || out.Answered || out.Pruned != 2 {
		t.Fatalf("bad calls: %v %+v", err, out)
	}
	if fmt.Sprint(m.seen[0].specs) != "[Finish deposit withdraw balance]" || m.seen[0].msgs[0].Content != "sys" {
		t.Fatalf("plain DFSDT: %v %q", m.seen[0].specs, m.seen[0].msgs[0].Content)
	}
	m = &script{replies: []chat.Message{{Content: "Your balance is 0."}}}
	s.Model = m
	if out, err = s.Run(context.Background(), "sys", "Balance?", openBank); err != nil || !out.Answered || out.Answer != "Your balance is 0." {
		t.Fatalf("a plain reply: %v %+v", err, out)
	}
	// A state whose conversation outgrows the model is abandoned, not
	// the search: its sibling state goes on.
	full := &script{replies: []chat.Message{
		{Content: wrap("deposit money into the bank account")},
		call("deposit", `{"amount":"5"}`),
	}}
	calls := 0
	s = &Search{Model: chatFunc(func(ctx context.Context, msgs []chat.Message, specs []chat.Function) (llm.Response, error) {
		calls++
		if calls == 3 { // the state after the deposit
			return llm.Response{}, fmt.Errorf("prompt too long: %w", llm.ErrContextFull)
		}
		if calls == 4 { // back at the state before it, told of the deposit
			return llm.Response{Message: chat.Message{Content: "Deposited."}}, nil
		}
		return full.Chat(ctx, llm.Request{Messages: msgs, Tools: specs})
	}), Retriever: bankRetriever(t), Strategy: "single", Config: DefaultSearch()}
	if out, err = s.Run(context.Background(), "", "Deposit 5.", openBank); err != nil || !out.Answered || out.ContextFull != 1 || out.Answer != "Deposited." {
		t.Fatalf("context full: %v %+v", err, out)
	}
	// Bad settings are named.
	s.Config.Width = 0
	if _, err := s.Run(context.Background(), "", "q", openBank); err == nil || !strings.Contains(err.Error(), "dfsdt.width") {
		t.Fatalf("width 0: %v", err)
	}
	s = &Search{Model: m, Retriever: bankRetriever(t), Strategy: "query", Config: DefaultSearch()}
	if _, err := s.Run(context.Background(), "", "q", openBank); err == nil {
		t.Fatal("the query strategy reads no pseudo-tools, yet was accepted")
	}
}
