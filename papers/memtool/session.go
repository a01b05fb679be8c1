package memtool

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Executor runs a domain tool of the working set (an MCP server, a
// simulator). An error is reported to the model as the call's result.
type Executor func(ctx context.Context, t agent.CatalogTool, args json.RawMessage) (string, error)

// Conversation is one conversation of many user queries: its messages and its
// working set T persist from query to query (the session driver of the
// paper, A.3.4). The working set starts empty.
type Conversation struct {
	Config Config
	// Agent answers the user. Controller makes the prune, search and
	// summary calls (Workflow and Hybrid; summaries in every mode); nil
	// uses Agent. The paper suggests a cheaper model there.
	Agent, Controller llm.Model
	KB                *agent.Catalog
	Exec              Executor
	// Now gives {current_date} when Config.Date is empty.
	Now func() time.Time

	msgs    []chat.Message      // the dialogue, without the system message
	summary string              // SUMMARIZEHISTORY's summary of dropped turns
	set     []agent.CatalogTool // T, the domain tools loaded, in the order added
}

// TurnResult is one user query's record: what the working set did and
// what the agent called and answered.
type TurnResult struct {
	Query string `json:"query"`
	// Added and Removed are A_t and R_t by name; Count is |T| (domain
	// tools) after the turn and Peak its largest value during it.
	Added   []string `json:"added"`
	Removed []string `json:"removed"`
	Count   int      `json:"count"`
	Peak    int      `json:"peak"`
	// Called are the domain tools that ran (once each, in order).
	Called []string `json:"called"`
	// LimitHits counts searches refused or cut because T would pass L.
	LimitHits int `json:"limit_hits"`
	// Calls are the agent's tool calls; FormatErrors those that never
	// reached a tool (not parsed, an unknown or removed tool, arguments
	// outside its schema).
	Calls        int    `json:"calls"`
	FormatErrors int    `json:"format_errors"`
	Answer       string `json:"answer"`
	HasAnswer    bool   `json:"has_answer"`
	// Error is why the turn failed (the model's call failed), if it did.
	Error string `json:"error,omitempty"`
	// Trace is the agent's run (the prune and search calls are not in it).
	Trace agent.Trace `json:"trace"`
}

// Set is the working set's tool names, in the order added.
func (s *Conversation) Set() []string {
	out := make([]string, len(s.set))
	for i, t := range s.set {
		out[i] = t.Name
	}
	return out
}

func (s *Conversation) controller() llm.Model {
	if s.Controller != nil {
		return s.Controller
	}
	return s.Agent
}

// meta is how many meta-tools the agent carries in the session's mode.
func (s *Conversation) meta() int {
	switch s.Config.Mode {
	case Autonomous:
		return 2
	case Hybrid:
		return 1
	}
	return 0
}

// room is how many domain tools fit under L beside the meta-tools.
func (s *Conversation) room() int { return s.Config.Limit - s.meta() }

func (s *Conversation) vars() map[string]string {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	return promptVars(s.Config, len(s.set)+s.meta(), now)
}

// turn collects a TurnResult while the turn runs.
type turn struct {
	res           TurnResult
	added, remove map[string]bool
	ran           int // calls that reached a tool's function
}

func (t *turn) add(names ...string) {
	for _, n := range names {
		if t.remove[n] { // removed and added again in one turn: neither
			delete(t.remove, n)
			t.res.Removed = slices.DeleteFunc(t.res.Removed, func(x string) bool { return x == n })
			continue
		}
		t.added[n] = true
		t.res.Added = append(t.res.Added, n)
	}
}

func (t *turn) drop(names ...string) {
	for _, n := range names {
		if t.added[n] {
			delete(t.added, n)
			t.res.Added = slices.DeleteFunc(t.res.Added, func(x string) bool { return x == n })
			continue
		}
		t.remove[n] = true
		t.res.Removed = append(t.res.Removed, n)
	}
}

// Turn runs one user query through the session's mode.
func (s *Conversation) Turn(ctx context.Context, query string) (TurnResult, error) {
	if err := s.Config.Validate(); err != nil {
		return TurnResult{}, err
	}
	t := &turn{res: TurnResult{Query: query}, added: map[string]bool{}, remove: map[string]bool{}}
	if err := s.manageHistory(ctx); err != nil {
		return t.res, err
	}
	t.res.Peak = len(s.set)
	ts, err := agent.NewToolset()
	if err != nil {
		return t.res, err
	}
	switch s.Config.Mode {
	case Workflow:
		if err := s.prune(ctx, t, query); err != nil {
			return t.res, err
		}
		keywords, err := s.askList(ctx, searchPrompt, humanMessage(s.describeSet(), query), "search_tools", "keywords",
			"Search keywords, one for each tool to find; an empty list when the loaded tools suffice.")
		if err != nil {
			return t.res, fmt.Errorf("memtool: LLM_search: %w", err)
		}
		if _, _, err := s.search(ctx, t, keywords, query); err != nil {
			return t.res, err
		}
	case Hybrid:
		if err := s.prune(ctx, t, query); err != nil {
			return t.res, err
		}
		ts.Add(s.searchTool(t, query, ts))
	case Autonomous:
		ts.Add(s.searchTool(t, query, ts))
		ts.Add(s.removeTool(t, ts))
	}
	for _, tool := range slices.Clone(s.set) {
		s.offer(ts, tool, t)
	}
	// The agent sees its tools by name, the order an MCP server lists
	// them in, so a policy reads the same list here and through Gateway.
	ts.SortByName()
	var system string
	if s.Config.Mode == Autonomous {
		system = render(autonomousTemplate(s.Config), s.vars())
	} else {
		v := s.vars()
		v["search"] = ""
		if s.Config.Mode == Hybrid {
			v["search"] = hybridSearchLine
		}
		system = render(agentPrompt, v)
	}
	if s.summary != "" {
		system += "\n\nSummary of the earlier conversation:\n" + s.summary
	}
	msgs := append([]chat.Message{{Role: "system", Content: system}}, s.msgs...)
	msgs = append(msgs, chat.Message{Role: "user", Content: query})
	tr, err := agent.Run(ctx, s.Agent, ts, msgs, agent.Limits{MaxSteps: s.Config.MaxSteps})
	t.res.Trace = tr
	for _, st := range tr.Steps {
		t.res.Calls += len(st.Results)
	}
	t.res.FormatErrors = t.res.Calls - t.ran
	s.msgs = slices.Clone(tr.Messages[1:])
	t.res.Answer, t.res.HasAnswer = tr.Answer, tr.HasAnswer
	t.res.Count = len(s.set)
	return t.res, err
}

// describeSet lists the working set for the prune and search prompts:
// each name verbatim, with its description.
func (s *Conversation) describeSet() []string {
	out := make([]string, len(s.set))
	for i, t := range s.set {
		out[i] = t.Name + ": " + oneLine(t.Description, 160)
	}
	return out
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// prune is LLM_prune: the controller names tools to remove.
func (s *Conversation) prune(ctx context.Context, t *turn, query string) error {
	if len(s.set) == 0 {
		return nil
	}
	names, err := s.askList(ctx, prunePrompt, humanMessage(s.describeSet(), query), "remove_tools", "tool_names",
		"Names of the existing tools to remove, verbatim; an empty list to keep them all.")
	if err != nil {
		return fmt.Errorf("memtool: LLM_prune: %w", err)
	}
	t.drop(s.removeNames(names)...)
	return nil
}

// removeNames removes the named domain tools that are loaded; it returns
// the names removed (meta-tools and unknown names are ignored: "otherwise
// the removal will not work").
func (s *Conversation) removeNames(names []string) []string {
	var gone []string
	s.set = slices.DeleteFunc(s.set, func(t agent.CatalogTool) bool {
		if slices.Contains(names, t.Name) {
			gone = append(gone, t.Name)
			return true
		}
		return false
	})
	return gone
}

// search is VectorSearch and T ← T ∪ S, within L. Over L, Workflow and
// Hybrid prune again (the prune loop of Algorithms 2 and 3); a prune that
// removes nothing, or Autonomous mode (the agent is told "Hit L limit,
// remove tools."), leaves out the new tools that do not fit. It returns
// the tools added and an error message for the model ("" when all fit).
func (s *Conversation) search(ctx context.Context, t *turn, keywords []string, query string) ([]string, string, error) {
	found, err := s.KB.Search(ctx, keywords, s.Config.TopK)
	if err != nil {
		return nil, "", err
	}
	var fresh []agent.CatalogTool
	for _, f := range found {
		if !slices.ContainsFunc(s.set, func(x agent.CatalogTool) bool { return x.Name == f.Name }) {
			fresh = append(fresh, f)
		}
	}
	var msg string
	if len(s.set)+len(fresh) > s.room() {
		t.res.LimitHits++
		if s.Config.Mode == Autonomous {
			// Rolled back: the paper leaves it open, and an API call with
			// more than L tools would fail.
			return nil, limitHit, nil
		}
		s.set = append(s.set, fresh...) // over L until the prune loop ends
		t.res.Peak = max(t.res.Peak, len(s.set))
		for len(s.set) > s.room() {
			picked, err := s.askList(ctx, prunePrompt, humanMessage(s.describeSet(), query), "remove_tools", "tool_names",
				"Names of the existing tools to remove, verbatim.")
			if err != nil {
				return nil, "", fmt.Errorf("memtool: LLM_prune over the limit: %w", err)
			}
			gone := s.removeNames(picked)
			if len(gone) == 0 {
				break
			}
			for _, g := range gone { // a fresh tool pruned at once was never added
				if i := slices.IndexFunc(fresh, func(x agent.CatalogTool) bool { return x.Name == g }); i >= 0 {
					fresh = slices.Delete(fresh, i, i+1)
				} else {
					t.drop(g)
				}
			}
		}
		if over := len(s.set) - s.room(); over > 0 {
			// "T > L" with nothing left to prune: the newest additions go.
			cut := fresh[max(len(fresh)-over, 0):]
			s.removeNames(names(cut))
			fresh = fresh[:len(fresh)-len(cut)]
			msg = fmt.Sprintf("Hit L limit: %d found tools were not added.", len(cut))
		}
	} else {
		s.set = append(s.set, fresh...)
	}
	added := names(fresh)
	t.add(added...)
	t.res.Peak = max(t.res.Peak, len(s.set))
	return added, msg, nil
}

func names(ts []agent.CatalogTool) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name
	}
	return out
}

// searchTool is SYS_SEARCH_TOOLS; the tools it finds join ts for the
// agent's next call.
func (s *Conversation) searchTool(t *turn, query string, ts *agent.Toolset) agent.Tool {
	return agent.Tool{Function: searchSpec(),
		Call: func(ctx context.Context, args json.RawMessage) (string, error) {
			t.ran++
			var a struct{ Keywords []string }
			if err := json.Unmarshal(args, &a); err != nil {
				return "", jsonerr.Explain(err) // the model reads it: say which argument, not Go's types
			}
			before := s.Set()
			added, msg, err := s.search(ctx, t, a.Keywords, query)
			if err != nil {
				return "", err
			}
			for _, n := range before { // a Hybrid prune over the limit
				if !slices.Contains(s.Set(), n) {
					ts.Remove(n)
				}
			}
			var refused []string
			for _, n := range added {
				tool, _ := s.KB.Get(n)
				if err := s.offer(ts, tool, t); err != nil {
					refused = append(refused, err.Error())
				}
			}
			added = slices.DeleteFunc(added, func(n string) bool { return !slices.Contains(s.Set(), n) })
			ts.SortByName()
			if len(refused) > 0 {
				msg = strings.TrimPrefix(msg+". "+strings.Join(refused, "; "), ". ")
			}
			if msg != "" && len(added) == 0 {
				return "", fmt.Errorf("%s", msg)
			}
			out := addedText(added)
			if msg != "" {
				out += ". " + msg
			}
			return out, nil
		}}
}

// removeTool is SYS_REMOVE_TOOLS (Autonomous mode); it never removes
// itself or SYS_SEARCH_TOOLS.
func (s *Conversation) removeTool(t *turn, ts *agent.Toolset) agent.Tool {
	return agent.Tool{Function: removeSpec(),
		Call: func(ctx context.Context, args json.RawMessage) (string, error) {
			t.ran++
			var a struct {
				ToolNames []string `json:"tool_names"`
			}
			if err := json.Unmarshal(args, &a); err != nil {
				return "", jsonerr.Explain(err) // the model reads it: say which argument, not Go's types
			}
			gone := s.removeNames(a.ToolNames)
			t.drop(gone...)
			ts.Remove(gone...)
			return removedText(gone, a.ToolNames), nil
		}}
}

// offer puts a working-set tool before the agent. A tool whose schema the
// toolset cannot read leaves the working set, as it could never be called
// (it stays in the knowledge base); the error says which and why.
func (s *Conversation) offer(ts *agent.Toolset, tool agent.CatalogTool, t *turn) error {
	if err := ts.Add(s.domainTool(tool, t)); err != nil {
		s.removeNames([]string{tool.Name})
		t.drop(tool.Name)
		return err
	}
	return nil
}

// domainTool is a working-set tool as the agent calls it; its runs are
// recorded.
func (s *Conversation) domainTool(tool agent.CatalogTool, t *turn) agent.Tool {
	return agent.Tool{Function: tool.Function, Call: func(ctx context.Context, args json.RawMessage) (string, error) {
		t.ran++
		out, err := s.Exec(ctx, tool, args)
		if err == nil && !slices.Contains(t.res.Called, tool.Name) {
			t.res.Called = append(t.res.Called, tool.Name)
		}
		return out, err
	}}
}

var fence = regexp.MustCompile("(?s)```(?:json)?\\s*(.*?)```")

// askList makes a controller call that answers with a list of strings:
// a call of the one tool it is offered, or (a model without tool calls)
// a JSON list, an object holding one, or one item per line.
func (s *Conversation) askList(ctx context.Context, system, human, tool, arg, desc string) ([]string, error) {
	spec := chat.Function{Name: tool, Description: desc, Parameters: listSchema(arg, desc)}
	r, err := s.controller().Chat(ctx, llm.Request{Messages: []chat.Message{{Role: "system", Content: system}, {Role: "user", Content: human}}, Tools: []chat.Function{spec}})
	if err != nil {
		return nil, err
	}
	for _, c := range r.Message.ToolCalls {
		if c.Name != tool {
			continue
		}
		var a map[string][]string
		if json.Unmarshal([]byte(c.Arguments), &a) == nil {
			return clean(a[arg]), nil
		}
	}
	text := strings.TrimSpace(r.Message.Content)
	if m := fence.FindStringSubmatch(text); m != nil {
		text = strings.TrimSpace(m[1])
	}
	var list []string
	if json.Unmarshal([]byte(text), &list) == nil {
		return clean(list), nil
	}
	var obj map[string][]string
	if json.Unmarshal([]byte(text), &obj) == nil {
		return clean(obj[arg]), nil
	}
	var out []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.Trim(strings.TrimSpace(line), "-*`\"',")
		if line != "" && !strings.EqualFold(line, "none") && !strings.EqualFold(line, "[]") {
			out = append(out, line)
		}
	}
	return out, nil
}

func clean(xs []string) []string {
	out := xs[:0]
	for _, x := range xs {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// manageHistory is H(msgs_prev): at most HistoryTurns earlier user turns
// stay (0: none); older ones are dropped (truncate) or summarised into the system
// message (summarize). The working set is untouched.
func (s *Conversation) manageHistory(ctx context.Context) error {
	var starts []int
	for i, m := range s.msgs {
		if m.Role == "user" {
			starts = append(starts, i)
		}
	}
	if len(starts) <= s.Config.HistoryTurns {
		return nil
	}
	cut := len(s.msgs) // 0: the tools alone carry the conversation on
	if s.Config.HistoryTurns > 0 {
		cut = starts[len(starts)-s.Config.HistoryTurns]
	}
	old := s.msgs[:cut]
	if s.Config.History == "summarize" {
		var b strings.Builder
		if s.summary != "" {
			b.WriteString("Earlier summary: " + s.summary + "\n\n")
		}
		for _, m := range old {
			switch {
			case m.Role == "user" || (m.Role == "assistant" && m.Content != ""):
				fmt.Fprintf(&b, "%s: %s\n", m.Role, m.Content)
			case m.Role == "tool" && !strings.HasPrefix(m.Name, "SYS_"):
				fmt.Fprintf(&b, "tool %s: %s\n", m.Name, oneLine(m.Content, 300))
			}
		}
		r, err := s.controller().Chat(ctx, llm.Request{Messages: []chat.Message{{Role: "system", Content: summaryPrompt}, {Role: "user", Content: b.String()}}})
		if err != nil {
			return fmt.Errorf("memtool: summarising the history: %w", err)
		}
		s.summary = strings.TrimSpace(r.Message.Content)
	}
	s.msgs = slices.Clone(s.msgs[cut:])
	return nil
}
