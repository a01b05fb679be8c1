package fittext

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// SearchConfig is the "dfsdt" part of the fittext section: ToolLLM's
// depth-first search-based decision tree (DFSDT) as FitText runs its agent
// (Algorithm 2; the paper gives none of these numbers, the defaults are
// ToolBench's).
type SearchConfig struct {
	Width      int `yaml:"width"`       // W: children a node may try (ToolBench's tree_beam_size: 2)
	MaxDepth   int `yaml:"max_depth"`   // model turns on one path (single_chain_max_step: 12)
	MaxQueries int `yaml:"max_queries"` // the agent's model calls per query (max_query_count: 200)
	// Retrieval are the strategies a benchmark run retrieves the model's
	// pseudo-tools with, a run each (WorkBenchRuns); "none" is a run with
	// every function visible from the start (plain DFSDT).
	Retrieval []string `yaml:"retrieval"`
}

// DefaultSearch is ToolBench's DFSDT setting. The search ends at its
// first answer (ToolBench's answer count, S_max, of 1).
func DefaultSearch() SearchConfig {
	return SearchConfig{Width: 2, MaxDepth: 12, MaxQueries: 200, Retrieval: []string{"memetic"}}
}

func (c SearchConfig) validate(e *valid.Errors) {
	e.AtLeast("dfsdt.width", c.Width, 1)
	e.AtLeast("dfsdt.max_depth", c.MaxDepth, 1)
	e.AtLeast("dfsdt.max_queries", c.MaxQueries, 1)
}

// validateRetrieval checks the strategies of a benchmark run, which a
// Search does not read.
func (c SearchConfig) validateRetrieval(e *valid.Errors) {
	if len(c.Retrieval) == 0 {
		e.Add("dfsdt.retrieval", "[]: want none or a strategy, or several")
	}
	for i, r := range c.Retrieval {
		key := fmt.Sprintf("dfsdt.retrieval[%d]", i)
		if r != "none" && (CheckStrategy(r) != nil || r == "query") {
			// The query strategy retrieves with the user's query, which a
			// search that retrieves for its pseudo-tools does not have.
			e.Add(key, "%q: want none or a strategy that reads pseudo-tools (%s)", r, strings.Join(Strategies[1:], ", "))
		}
		if slices.Index(c.Retrieval, r) < i {
			e.Add(key, "%q is named twice", r)
		}
	}
}

// World is where the agent's calls run: Functions are every function it has,
// Execute runs one call (false: the call failed, the result says why).
// A search opens a fresh world for each expansion and replays the path's
// calls into it first, so a tool with side effects sees the state of its
// own branch only (agent.Toolset is one).
type World interface {
	Functions() []chat.Function
	Execute(ctx context.Context, c chat.ToolCall) (string, bool, error)
}

// Finish is ToolBench's function that ends a path: with an answer, or
// giving up (the branch is then abandoned).
var Finish = chat.Function{Name: "Finish",
	Description: "Call this function at the end of your attempt: with return_type give_answer and the final answer once you have done the task, or with give_up_and_restart when you cannot go on from the current state. Only the final answer is shown to the user, so it must be complete.",
	Parameters:  json.RawMessage(`{"type":"object","properties":{"return_type":{"type":"string","enum":["give_answer","give_up_and_restart"]},"final_answer":{"type":"string","description":"the answer to give the user (with give_answer)"}},"required":["return_type"]}`)}

// Protocol is the Dynamic Retrieval Protocol that opens the agent's system
// prompt when it starts with Finish alone (App. E).
const Protocol = `You should use functions to help handle the user's request.
1. Dynamic function retrieval: the only function available at the start is "Finish". To call any other function, first retrieve it from a function corpus.
2. Retrieval: to retrieve a function, describe the function you need in detail between ` + Begin + ` and ` + End + `. If you need several functions, describe each in its own block. Then stop and wait: the functions found are added to those you can call.
3. Completion: you must always call "Finish" at the end, with a final answer that is complete on its own.`

// Search is FitText's agent (Algorithm 2): a DFSDT over the model's turns
// in which the pseudo-tools the model writes are retrieved with a FitText
// strategy and join the functions it may call. Nil Retriever: no
// retrieval, every function of the world visible from the start (plain
// DFSDT).
type Search struct {
	Model     llm.Model
	Retriever *Retriever
	Strategy  string // the FitText strategy run on the model's pseudo-tools
	Config    SearchConfig
}

// Outcome is one query's search.
type Outcome struct {
	Answered bool   `json:"answered"`
	Answer   string `json:"answer,omitempty"`
	// Path is the answer path's calls, in order (Finish left out).
	Path []chat.ToolCall `json:"path,omitempty"`
	// Messages is the answer path's conversation.
	Messages []chat.Message `json:"-"`
	// Queries are the agent's model calls; StrategyCalls the retrieval
	// strategies' (the analysis, refinements, judges).
	Queries       int `json:"queries"`
	StrategyCalls int `json:"strategy_calls"`
	// PromptTokens and CompletionTokens are the agent's calls' (as the
	// model reported them).
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// Retrievals ran a strategy; Duplicates were pseudo-tools Eq. 9 found
	// in the memory, whose remembered tools were reused instead.
	Retrievals int `json:"retrievals"`
	Duplicates int `json:"duplicates"`
	// Nodes are the children generated; Pruned those abandoned (a
	// hallucinated function, a failing call, giving up, the depth limit).
	Nodes  int `json:"nodes"`
	Pruned int `json:"pruned"`
	// ContextFull are states abandoned because their conversation
	// outgrew the model's context (llm.ErrContextFull).
	ContextFull int `json:"context_full,omitempty"`
	// Functions are those the answer path could call at its end.
	Functions []string `json:"functions,omitempty"`
}

// node is a state of the tree: the conversation so far, the functions
// visible (F(n)) and the world calls that led to it.
type node struct {
	msgs  []chat.Message
	funcs []string
	path  []chat.ToolCall
	depth int
	tried []string // what the children generated so far did, for the diversity prompt
}

type search struct {
	s     *Search
	query string
	open  func() (World, error)
	specs map[string]chat.Function
	byKB  map[string]string // a knowledge-base name → the world's function
	mem   Probes
	out   Outcome
}

// WorldKB indexes a world's functions for the search's retrieval, each
// under its function name (agent.FunctionName: WorkBench's
// calendar.delete_event is calendar_delete_event), which the search maps
// back to the world's.
func WorldKB(ctx context.Context, emb embed.Embedder, specs []chat.Function) (*agent.Catalog, error) {
	tools := make([]agent.CatalogTool, len(specs))
	for i, sp := range specs {
		sp.Name = agent.FunctionName(sp.Name)
		tools[i] = agent.CatalogTool{Function: sp}
	}
	return agent.NewCatalog(ctx, emb, tools)
}

// Run searches for an answer to query, system (the task's prompt) opening
// the conversation, in worlds from open.
func (s *Search) Run(ctx context.Context, system, query string, open func() (World, error)) (Outcome, error) {
	var e valid.Errors
	s.Config.validate(&e)
	if err := e.Err(); err != nil {
		return Outcome{}, fmt.Errorf("fittext: %w", err)
	}
	if s.Retriever != nil {
		if err := CheckStrategy(s.Strategy); err != nil || s.Strategy == "query" {
			return Outcome{}, fmt.Errorf("fittext: the search retrieves with a strategy that reads pseudo-tools, not %q", s.Strategy)
		}
	}
	w, err := open()
	if err != nil {
		return Outcome{}, err
	}
	x := &search{s: s, query: query, open: open, specs: map[string]chat.Function{Finish.Name: Finish}, byKB: map[string]string{}}
	root := &node{funcs: []string{Finish.Name}}
	for _, sp := range w.Functions() {
		x.specs[sp.Name] = sp
		if kb := agent.FunctionName(sp.Name); x.byKB[kb] == "" {
			x.byKB[kb] = sp.Name
		}
		if s.Retriever == nil {
			root.funcs = append(root.funcs, sp.Name)
		}
	}
	if s.Retriever != nil {
		system = Protocol + "\n\n" + system
	}
	root.msgs = []chat.Message{{Role: "system", Content: system}, {Role: "user", Content: query}}
	if err := x.dfs(ctx, root); err != nil {
		return x.out, err
	}
	return x.out, nil
}

func (x *search) done() bool {
	return x.out.Answered || x.out.Queries >= x.s.Config.MaxQueries
}

// dfs expands n: up to Width children, each generated by the model (told
// from the second on what its siblings did, so that it tries something
// else) and explored depth first unless it answered or was pruned.
func (x *search) dfs(ctx context.Context, n *node) error {
	for range x.s.Config.Width {
		if x.done() {
			return nil
		}
		msgs := n.msgs
		if len(n.tried) > 0 {
			msgs = append(slices.Clip(msgs), chat.Message{Role: "user", Content: diversityPrompt(n.tried)})
		}
		specs := make([]chat.Function, len(n.funcs))
		for i, f := range n.funcs {
			specs[i] = x.specs[f]
		}
		reply, err := x.s.Model.Chat(ctx, llm.Request{Messages: msgs, Tools: specs})
		x.out.Queries++
		if errors.Is(err, llm.ErrContextFull) {
			// The state outgrew the model: no child of it (each with the
			// diversity prompt added) would fit either.
			x.out.ContextFull++
			return nil
		}
		if err != nil {
			return fmt.Errorf("fittext: the agent: %w", err)
		}
		x.out.PromptTokens += reply.PromptTokens
		x.out.CompletionTokens += reply.CompletionTokens
		x.out.Nodes++
		o := reply.Message
		o.Role = "assistant"
		c := &node{msgs: append(slices.Clip(n.msgs), o), funcs: n.funcs, path: n.path, depth: n.depth + 1}
		blocks := ParseBlocks(o.Content)
		if len(blocks) > 0 && x.s.Retriever != nil {
			if c.funcs, err = x.retrieve(ctx, blocks, n.funcs); err != nil {
				return err
			}
		}
		kind, answer, err := x.exec(ctx, c, o.ToolCalls)
		if err != nil {
			return err
		}
		n.tried = append(n.tried, summary(o, blocks))
		if kind == acted && len(o.ToolCalls) == 0 && len(blocks) == 0 {
			// Neither a call nor a pseudo-tool: the reply is the answer.
			kind, answer = answered, o.Content
		}
		switch {
		case kind == answered:
			x.out.Answered, x.out.Answer, x.out.Path, x.out.Messages, x.out.Functions = true, answer, c.path, c.msgs, c.funcs
			return nil
		case kind == pruned || c.depth >= x.s.Config.MaxDepth:
			x.out.Pruned++
		default:
			if err := x.dfs(ctx, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// retrieve runs the strategy on the pseudo-tools that are not duplicates
// of remembered ones (Eq. 9) and adds what they and the duplicates'
// remembered retrievals found to funcs.
func (x *search) retrieve(ctx context.Context, blocks, funcs []string) ([]string, error) {
	out := slices.Clone(funcs)
	add := func(kbNames ...string) { // tools the world lacks are left out
		for _, k := range kbNames {
			if n := x.byKB[k]; n != "" && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	var fresh []string
	for _, b := range blocks {
		if e, dup := x.mem.Duplicate(b); dup {
			x.out.Duplicates++
			add(e.Tools...)
			continue
		}
		fresh = append(fresh, b)
	}
	if len(fresh) == 0 {
		return out, nil
	}
	res, err := x.s.Retriever.Expand(ctx, x.s.Strategy, x.query, fresh, &x.mem)
	x.out.StrategyCalls += res.Calls
	if err != nil {
		return nil, err
	}
	x.out.Retrievals++
	add(names(res.Ranking)...)
	return out, nil
}

type turnKind int

const (
	acted    turnKind = iota // the calls went through (or there were none)
	answered                 // Finish with give_answer
	pruned                   // a hallucinated function, a failing call, giving up
)

// exec runs a child's calls in a world where its parent's path has been
// replayed, appending each result to its conversation and each call that
// went through to its path.
func (x *search) exec(ctx context.Context, c *node, calls []chat.ToolCall) (turnKind, string, error) {
	if len(calls) == 0 {
		return acted, "", nil
	}
	var w World
	world := func() (World, error) {
		if w != nil {
			return w, nil
		}
		var err error
		if w, err = x.open(); err != nil {
			return nil, err
		}
		for _, p := range c.path {
			if _, ok, err := w.Execute(ctx, p); err != nil || !ok {
				return nil, fmt.Errorf("fittext: replaying %s(%s) gave another result than on its branch: the world is not deterministic (%v)", p.Name, p.Arguments, err)
			}
		}
		return w, nil
	}
	path := slices.Clip(c.path)
	defer func() { c.path = path }()
	for _, call := range calls {
		result, kind := "", acted
		switch {
		case call.Name == Finish.Name:
			var args struct {
				ReturnType  string `json:"return_type"`
				FinalAnswer string `json:"final_answer"`
			}
			err := json.Unmarshal([]byte(call.Arguments), &args)
			switch {
			case err == nil && args.ReturnType == "give_answer":
				c.msgs = append(c.msgs, toolMessage(call, "ok"))
				return answered, args.FinalAnswer, nil
			case err == nil && args.ReturnType == "give_up_and_restart":
				result, kind = "restarting", pruned
			default:
				result, kind = `Finish needs {"return_type": "give_answer" or "give_up_and_restart", "final_answer": ...}`, pruned
			}
		case call.Invalid != "":
			result, kind = call.Invalid, pruned
		case !slices.Contains(c.funcs, call.Name):
			result, kind = fmt.Sprintf("no function %q is available: retrieve it first", call.Name), pruned
		default:
			w, err := world()
			if err != nil {
				return 0, "", err
			}
			out, ok, err := w.Execute(ctx, call)
			if err != nil {
				return 0, "", err
			}
			result = out
			if ok {
				path = append(path, call)
			} else {
				kind = pruned
			}
		}
		c.msgs = append(c.msgs, toolMessage(call, result))
		if kind == pruned {
			return pruned, "", nil
		}
	}
	return acted, "", nil
}

func toolMessage(c chat.ToolCall, result string) chat.Message {
	return chat.Message{Role: "tool", ToolCallID: c.ID, Name: c.Name, Content: result}
}

// summary is what a child did, as the diversity prompt lists it.
func summary(o chat.Message, blocks []string) string {
	var parts []string
	for _, b := range blocks {
		parts = append(parts, "asked for a function: "+b)
	}
	for _, c := range o.ToolCalls {
		parts = append(parts, fmt.Sprintf("called %s(%s)", c.Name, c.Arguments))
	}
	if len(parts) == 0 {
		parts = append(parts, "answered: "+strings.TrimSpace(o.Content))
	}
	return strings.Join(parts, "; ")
}

// diversityPrompt tells the model, at a state it has left before, what it
// did there, so that it tries something else (ToolLLM's diversity prompt).
func diversityPrompt(tried []string) string {
	var b strings.Builder
	b.WriteString("You have been in this state before, and every attempt from it failed. What you did here before:\n")
	for i, t := range tried {
		fmt.Fprintf(&b, "%d. %s\n", i+1, t)
	}
	b.WriteString("Think about the current state and those attempts, then do something different from all of them.")
	return b.String()
}
