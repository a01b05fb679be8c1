package memtools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// Runtime is what the tools act on: the LTM M, the STM C, the encoder enc(.)
// and the summariser.
type Runtime struct {
	Store      ltm.Store
	Context    *stm.Context
	Embedder   embed.Embedder
	Summarizer Summarizer
	Options    Options
}

// Result is the outcome of one tool call. Content is the tool message the
// model reads; the other fields record the effect for traces and rewards.
type Result struct {
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Content string `json:"content"`
	Error   string `json:"error,omitempty"`

	Entry        *ltm.Entry   `json:"entry,omitempty"`     // added, updated or deleted
	Retrieved    []ltm.Scored `json:"retrieved,omitempty"` // Retrieve_memory
	Removed      int          `json:"removed,omitempty"`   // Filter_context, Summary_context
	TokensBefore int          `json:"tokens_before,omitempty"`
	TokensAfter  int          `json:"tokens_after,omitempty"`
}

// Execute runs one call. Bad arguments never fail the caller: they give a
// Result whose Content tells the model what was wrong. The error return is
// for failures outside the model's control (a store that cannot be written).
func (rt *Runtime) Execute(ctx context.Context, c Call) (Result, error) {
	args, err := decodeArgs(c, rt.Options.Offered())
	if err != nil {
		return rt.fail(c.Name, err), nil
	}
	var r Result
	switch c.Name {
	case ToolAdd:
		r, err = rt.add(ctx, args)
	case ToolUpdate:
		r, err = rt.update(ctx, args)
	case ToolDelete:
		r, err = rt.delete(ctx, args)
	case ToolRetrieve:
		r, err = rt.retrieve(ctx, args)
	case ToolSummary:
		r, err = rt.summary(ctx, args)
	case ToolFilter:
		r, err = rt.filter(ctx, args)
	}
	var bad badArgs
	if errors.As(err, &bad) {
		return rt.fail(c.Name, err), nil
	}
	if err != nil {
		return rt.fail(c.Name, err), err
	}
	r.Name, r.OK = c.Name, true
	return r, nil
}

// badArgs marks an error the model caused and can fix.
type badArgs struct{ msg string }

func (b badArgs) Error() string { return b.msg }

func badf(format string, a ...any) error { return badArgs{fmt.Sprintf(format, a...)} }

func (rt *Runtime) fail(name string, err error) Result {
	return Result{Name: name, Error: err.Error(), Content: toJSON(map[string]any{"status": "error", "tool": name, "error": err.Error()})}
}

// args holds a call's arguments, checked against the tool's schema.
type args map[string]json.RawMessage

func decodeArgs(c Call, offered []string) (args, error) {
	var schema *Schema
	for _, s := range Schemas() {
		if s.Name == c.Name {
			schema = &s
			break
		}
	}
	if schema == nil {
		return nil, badf("unknown tool %q; the tools are %s", c.Name, strings.Join(offered, ", "))
	}
	if !slices.Contains(offered, c.Name) {
		return nil, badf("tool %q is not offered here; the tools are %s", c.Name, strings.Join(offered, ", "))
	}
	var a args
	if err := json.Unmarshal(c.Arguments, &a); err != nil {
		return nil, badf("arguments must be a JSON object")
	}
	// The paper's own case study writes "confirmed"; accept it as the
	// schema's "confirmation".
	if c.Name == ToolDelete {
		if v, ok := a["confirmed"]; ok {
			if _, dup := a["confirmation"]; !dup {
				a["confirmation"] = v
			}
			delete(a, "confirmed")
		}
	}
	accepted := slices.Sorted(func(yield func(string) bool) {
		for k := range schema.Parameters.Properties {
			if !yield(k) {
				return
			}
		}
	})
	// In sorted order: the message the model reads must not depend on map
	// iteration, or two runs of the same seed part ways here.
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if _, ok := schema.Parameters.Properties[k]; !ok {
			return nil, badf("unknown argument %q; %s accepts %s", k, c.Name, strings.Join(accepted, ", "))
		}
	}
	for _, req := range schema.Parameters.Required {
		if v, ok := a[req]; !ok || string(v) == "null" {
			return nil, badf("missing required argument %q", req)
		}
	}
	return a, nil
}

func (a args) str(key string) (string, bool, error) {
	raw, ok := a[key]
	if !ok || string(raw) == "null" {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", true, badf("argument %q must be a string", key)
	}
	return s, true, nil
}

func (a args) object(key string) (map[string]any, error) {
	raw, ok := a[key]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, badf("argument %q must be a JSON object", key)
	}
	return m, nil
}

func (a args) content(key string) (string, error) {
	s, _, err := a.str(key)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(s) == "" {
		return "", badf("argument %q must not be empty", key)
	}
	return s, nil
}

func (a args) memoryID() (string, error) {
	id, _, err := a.str("memory_id")
	if err != nil {
		return "", err
	}
	if !ltm.ValidID(id) {
		return "", badf("memory_id %q is not a memory id; ids look like mem_1a2b3c4d and come from Retrieve_memory or Add_memory", id)
	}
	return id, nil
}

func (rt *Runtime) embedOne(ctx context.Context, text string) ([]float32, error) {
	v, err := rt.Embedder.Embed(ctx, []string{text})
	if err != nil {
		return nil, fmt.Errorf("embed: %w", err)
	}
	return v[0], nil
}

// entryArgs reads the content and metadata that ADD and UPDATE share and
// embeds the content.
func (rt *Runtime) entryArgs(ctx context.Context, a args) (string, map[string]any, []float32, error) {
	content, err := a.content("content")
	if err != nil {
		return "", nil, nil, err
	}
	md, err := a.object("metadata")
	if err != nil {
		return "", nil, nil, err
	}
	v, err := rt.embedOne(ctx, content)
	return content, md, v, err
}

// add is ADD (Eq. 10-11).
func (rt *Runtime) add(ctx context.Context, a args) (Result, error) {
	content, md, v, err := rt.entryArgs(ctx, a)
	if err != nil {
		return Result{}, err
	}
	typ, _, err := a.str("memory_type")
	if err != nil {
		return Result{}, err
	}
	e, err := rt.Store.Add(ctx, ltm.Entry{Content: content, Embedding: v, Metadata: md, MemoryType: typ})
	if err != nil {
		return Result{}, err
	}
	return Result{Entry: &e, Content: toJSON(map[string]any{"status": "success", "memory_id": e.ID, "message": "Memory added."})}, nil
}

// update is UPDATE (Eq. 12).
func (rt *Runtime) update(ctx context.Context, a args) (Result, error) {
	id, err := a.memoryID()
	if err != nil {
		return Result{}, err
	}
	content, md, v, err := rt.entryArgs(ctx, a)
	if err != nil {
		return Result{}, err
	}
	e, err := rt.Store.Update(ctx, id, content, v, md)
	if errors.Is(err, ltm.ErrNotFound) {
		return Result{}, badf("no memory with id %s; retrieve memories first to get their ids", id)
	}
	if err != nil {
		return Result{}, err
	}
	return Result{Entry: &e, Content: toJSON(map[string]any{"status": "success", "memory_id": e.ID, "message": "Memory updated."})}, nil
}

// delete is DELETE (Eq. 13); it acts only on an explicit true confirmation.
func (rt *Runtime) delete(ctx context.Context, a args) (Result, error) {
	id, err := a.memoryID()
	if err != nil {
		return Result{}, err
	}
	var confirmed bool
	if err := json.Unmarshal(a["confirmation"], &confirmed); err != nil {
		return Result{}, badf("argument \"confirmation\" must be true or false")
	}
	if !confirmed {
		return Result{}, badf("not deleted: set \"confirmation\" to true to delete %s permanently", id)
	}
	e, err := rt.Store.Get(ctx, id)
	if errors.Is(err, ltm.ErrNotFound) {
		return Result{}, badf("no memory with id %s; retrieve memories first to get their ids", id)
	}
	if err != nil {
		return Result{}, err
	}
	if err := rt.Store.Delete(ctx, id); err != nil {
		if errors.Is(err, ltm.ErrNotFound) {
			return Result{}, badf("no memory with id %s", id)
		}
		return Result{}, err
	}
	return Result{Entry: &e, Content: toJSON(map[string]any{"status": "success", "memory_id": id, "message": "Memory deleted."})}, nil
}

// retrieve is RETRIEVE (Eq. 8-9): the top-k entries go into the context as
// this tool's message.
func (rt *Runtime) retrieve(ctx context.Context, a args) (Result, error) {
	q, err := a.content("query")
	if err != nil {
		return Result{}, err
	}
	k := rt.Options.TopK
	if raw, ok := a["top_k"]; ok && string(raw) != "null" {
		if k, err = parseInt(raw); err != nil {
			return Result{}, badf("argument \"top_k\" must be an integer")
		}
		if k < 1 || k > rt.Options.MaxTopK {
			return Result{}, badf("top_k %d is outside [1, %d]", k, rt.Options.MaxTopK)
		}
	}
	filter, err := a.object("metadata_filter")
	if err != nil {
		return Result{}, err
	}
	v, err := rt.embedOne(ctx, q)
	if err != nil {
		return Result{}, err
	}
	hits, err := rt.Store.Retrieve(ctx, v, k, filter)
	if err != nil {
		return Result{}, err
	}
	return Result{Retrieved: hits, Content: RetrievedJSON(hits)}, nil
}

// RetrievedJSON renders retrieved memories as the tool message shows them.
func RetrievedJSON(hits []ltm.Scored) string {
	type mem struct {
		ID       string         `json:"memory_id"`
		Content  string         `json:"content"`
		Type     string         `json:"memory_type,omitempty"`
		Metadata map[string]any `json:"metadata,omitempty"`
		Score    float64        `json:"score"`
	}
	ms := make([]mem, len(hits))
	for i, h := range hits {
		ms[i] = mem{h.ID, h.Content, h.MemoryType, h.Metadata, float64(int(h.Score*1000+0.5)) / 1000}
	}
	return toJSON(map[string]any{"status": "success", "memories": ms})
}

func parseInt(raw json.RawMessage) (int, error) {
	var f float64
	if err := json.Unmarshal(raw, &f); err == nil {
		if f != float64(int(f)) {
			return 0, errors.New("not an integer")
		}
		return int(f), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(s))
}

// span returns the indices of the messages a Summary_context span covers:
// every non-system message ("all") or the last N of them. The newest message
// is the assistant's own call, which is never summarised.
func (rt *Runtime) span(spec string) ([]int, error) {
	var cand []int
	for i := 0; i < rt.Context.Len()-1; i++ {
		if rt.Context.At(i).Role != stm.System {
			cand = append(cand, i)
		}
	}
	spec = strings.TrimSpace(strings.ToLower(spec))
	if spec == "all" {
		return cand, nil
	}
	n, err := strconv.Atoi(spec)
	if err != nil || n < 1 {
		return nil, badf("span %q must be \"all\" or a positive number of rounds", spec)
	}
	if n < len(cand) {
		cand = cand[len(cand)-n:]
	}
	return cand, nil
}

// summary is SUMMARY (Eq. 14).
func (rt *Runtime) summary(ctx context.Context, a args) (Result, error) {
	raw := a["span"]
	spec, _, err := a.str("span")
	if err != nil {
		// Accept a bare number: models often write "span": 5.
		n, ierr := parseInt(raw)
		if ierr != nil {
			return Result{}, badf("argument \"span\" must be \"all\" or a number")
		}
		spec = strconv.Itoa(n)
	}
	idx, err := rt.span(spec)
	if err != nil {
		return Result{}, err
	}
	if len(idx) == 0 {
		return Result{}, badf("there is nothing to summarise: the context holds no user, assistant or tool messages")
	}
	msgs := make([]chat.Message, len(idx))
	for i, j := range idx {
		msgs[i] = rt.Context.At(j)
	}
	text, err := rt.Summarizer.Summarize(ctx, msgs)
	if err != nil {
		return Result{}, fmt.Errorf("summarise: %w", err)
	}
	before := rt.Context.Tokens()
	rt.Context.Replace(idx, chat.Message{Role: stm.User, Content: SummaryPrefix + text})
	return Result{
		Removed: len(idx), TokensBefore: before, TokensAfter: rt.Context.Tokens(),
		Content: toJSON(map[string]any{"status": "success", "summarized_messages": len(idx), "tokens_before": before, "tokens_after": rt.Context.Tokens()}),
	}, nil
}

// SummaryPrefix starts the message that replaces a summarised span.
const SummaryPrefix = "[Summary of earlier conversation] "

// filter is FILTER (Eq. 15): drop every non-system message whose cosine
// similarity to the criteria is at least theta. The assistant's own call is
// kept.
func (rt *Runtime) filter(ctx context.Context, a args) (Result, error) {
	crit, err := a.content("criteria")
	if err != nil {
		return Result{}, err
	}
	last := rt.Context.Len() - 1
	var texts []string
	var idx []int
	for i := 0; i < last; i++ {
		if m := rt.Context.At(i); m.Role != stm.System {
			texts = append(texts, m.Content)
			idx = append(idx, i)
		}
	}
	vecs, err := rt.Embedder.Embed(ctx, append([]string{crit}, texts...))
	if err != nil {
		return Result{}, fmt.Errorf("embed: %w", err)
	}
	drop := map[int]bool{}
	for j, i := range idx {
		if embed.Cosine(vecs[0], vecs[j+1]) >= rt.Options.FilterThreshold {
			drop[i] = true
		}
	}
	before := rt.Context.Tokens()
	removed := rt.Context.Remove(func(i int, _ chat.Message) bool { return drop[i] })
	return Result{
		Removed: removed, TokensBefore: before, TokensAfter: rt.Context.Tokens(),
		Content: toJSON(map[string]any{"status": "success", "removed_messages": removed, "tokens_before": before, "tokens_after": rt.Context.Tokens()}),
	}, nil
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
