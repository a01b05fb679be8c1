package memtool

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// Oracle is a scripted model that plays every role perfectly, knowing
// each query's gold tools: as the agent it removes the loaded tools the
// query does not need (when it can), searches for the missing ones with
// the keyword that finds each (Keyword), calls the gold tools and answers
// with their results; as the controller it prunes and searches the same
// way. It checks the modes' control flow and the metrics, and is the
// benchmark's ceiling on any tool collection.
//
// SkipRemoval makes it a teacher with a habit to unlearn (memtool data):
// in that share of the user queries it leaves the loaded tools the query
// does not need where they are, and once a search hits L it answers with
// what it has rather than removing. At 1 it never removes: the
// never-removing agent of memtool eval.
type Oracle struct {
	Gold map[string][]string // query text → gold tool names
	KB   *agent.Catalog
	// TopK is how many tools a search returns per keyword (memtool.top_k);
	// a keyword whose search returns the gold tool among them does when
	// none ranks it first. 0 counts only keywords that rank it first.
	TopK int
	// SkipRemoval is the share of queries without removal, drawn per query
	// text with Seed, so the same query is always treated alike.
	SkipRemoval float64
	Seed        uint64
}

var userQuery = regexp.MustCompile("(?s)User Query: `(.*)` ")

// Chat implements llm.Model.
func (o Oracle) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	has := func(name string) bool {
		return slices.ContainsFunc(req.Tools, func(s chat.Function) bool { return s.Name == name })
	}
	call := func(name string, args any) llm.Response {
		b, _ := json.Marshal(args)
		return llm.Response{Message: chat.Message{Role: "assistant", ToolCalls: []chat.ToolCall{{Name: name, Arguments: string(b)}}}}
	}
	last := req.Messages[len(req.Messages)-1]
	switch {
	case has("remove_tools") || has("search_tools"): // the controller's prune or search
		m := userQuery.FindStringSubmatch(last.Content)
		if m == nil {
			return llm.Response{}, fmt.Errorf("oracle: no user query in %q", last.Content)
		}
		query := m[1]
		gold := o.Gold[query]
		var existing []string
		if _, list, ok := strings.Cut(last.Content, "```\n"); ok {
			list, _, _ = strings.Cut(list, "```")
			for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
				if name, _, ok := strings.Cut(line, ":"); ok {
					existing = append(existing, name)
				}
			}
		}
		if has("remove_tools") {
			var drop []string
			if !o.skips(query) {
				drop = without(existing, gold)
			}
			return call("remove_tools", map[string][]string{"tool_names": drop}), nil
		}
		kw, err := o.keywords(ctx, query, without(gold, existing))
		if err != nil {
			return llm.Response{}, err
		}
		return call("search_tools", map[string][]string{"keywords": kw}), nil
	case len(req.Tools) == 0: // a summary
		return llm.Response{Message: chat.Message{Role: "assistant", Content: "The user asked for company figures, which were given."}}, nil
	}
	u := len(req.Messages) - 1
	for req.Messages[u].Role != "user" {
		u--
	}
	query := req.Messages[u].Content
	gold := o.Gold[query]
	did := map[string]bool{}
	results := map[string]string{}
	for _, m := range req.Messages[u+1:] {
		for _, c := range m.ToolCalls {
			did[c.Name] = true
		}
		if m.Role == "tool" {
			results[m.Name] = m.Content
		}
	}
	var loaded []string
	for _, s := range req.Tools {
		if !strings.HasPrefix(s.Name, "SYS_") {
			loaded = append(loaded, s.Name)
		}
	}
	if extra := without(loaded, gold); has(RemoveTools) && !o.skips(query) && !did[RemoveTools] && !did[SearchTools] && len(extra) > 0 {
		return call(RemoveTools, map[string][]string{"tool_names": extra}), nil
	}
	if missing := without(gold, loaded); has(SearchTools) && !did[SearchTools] && len(missing) > 0 {
		kw, err := o.keywords(ctx, query, missing)
		if err != nil {
			return llm.Response{}, err
		}
		return call(SearchTools, map[string][]string{"keywords": kw}), nil
	}
	var calls []chat.ToolCall
	for _, g := range gold {
		if i := slices.IndexFunc(req.Tools, func(s chat.Function) bool { return s.Name == g }); i >= 0 && !did[g] {
			calls = append(calls, chat.ToolCall{Name: g, Arguments: ExampleArguments(req.Tools[i].Parameters)})
		}
	}
	if len(calls) > 0 {
		return llm.Response{Message: chat.Message{Role: "assistant", ToolCalls: calls}}, nil
	}
	var parts []string
	for _, g := range gold {
		if r, ok := results[g]; ok {
			parts = append(parts, g+": "+r)
		}
	}
	if len(parts) == 0 {
		return llm.Response{Message: chat.Message{Role: "assistant", Content: "I cannot answer the question with the available tools."}}, nil
	}
	return llm.Response{Message: chat.Message{Role: "assistant", Content: strings.Join(parts, "; ")}}, nil
}

// skips draws whether the oracle leaves query's unneeded tools loaded.
func (o Oracle) skips(query string) bool {
	if o.SkipRemoval <= 0 {
		return false
	}
	h := fnv.New64a()
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], o.Seed)
	h.Write(seed[:])
	h.Write([]byte(query))
	return float64(h.Sum64()>>11)/(1<<53) < o.SkipRemoval
}

func (o Oracle) keywords(ctx context.Context, query string, names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		kw, err := o.Keyword(ctx, query, n)
		if err != nil {
			return nil, err
		}
		if kw != "" && !slices.Contains(out, kw) {
			out = append(out, kw)
		}
	}
	return out, nil
}

// clauseSep cuts a query into the phrases that may each ask for one tool.
var clauseSep = regexp.MustCompile(`[,;:.?!\n]+|\s+and\s+`)

// Phrases are the parts of a query that may each ask for one tool: cut
// at punctuation and at "and".
func Phrases(query string) []string {
	var out []string
	for _, p := range clauseSep.Split(query, -1) {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Keyword is what the oracle searches with for tool name while answering
// query: the first candidate that the knowledge base ranks the tool first
// for, among the query's own phrases (what a model can copy), the tool's
// name, its description, and both (the document the knowledge base
// indexed, which ranks it first unless another tool's document is the
// same); failing that, the candidate that ranks it highest within TopK,
// and failing that the document. A tool description alone rarely does on
// real collections, where many tools share a short one ("Concert info").
// "" when the tool is not in the knowledge base.
func (o Oracle) Keyword(ctx context.Context, query, name string) (string, error) {
	t, ok := o.KB.Get(name)
	if !ok {
		return "", nil
	}
	var cands []string
	add := func(s string) {
		if s = strings.TrimSpace(s); s != "" && !slices.Contains(cands, s) {
			cands = append(cands, s)
		}
	}
	for _, c := range Phrases(query) {
		add(c)
	}
	add(t.Name)
	add(t.Description)
	doc := t.Document()
	add(doc)
	k := max(o.TopK, 1)
	hits, err := o.KB.Rank(ctx, cands, k)
	if err != nil {
		return "", fmt.Errorf("oracle: %w", err)
	}
	best, bestRank := doc, k
	for i, hs := range hits {
		r := slices.IndexFunc(hs, func(h agent.Hit) bool { return h.Name == name })
		if r == 0 {
			return cands[i], nil
		}
		if r > 0 && r < bestRank {
			best, bestRank = cands[i], r
		}
	}
	return best, nil
}

func without(xs, drop []string) []string {
	var out []string
	for _, x := range xs {
		if !slices.Contains(drop, x) {
			out = append(out, x)
		}
	}
	return out
}
