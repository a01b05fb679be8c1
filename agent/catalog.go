package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/chat"
)

// CatalogTool is one tool of the knowledge base: its function-calling spec and
// where it comes from.
type CatalogTool struct {
	chat.Function
	Server   string `json:"server,omitempty"`
	Category string `json:"category,omitempty"`
}

// Document is what the knowledge base embeds for a tool: its name and its
// description (the paper indexes "tool names and descriptions").
func (t CatalogTool) Document() string {
	return strings.ReplaceAll(t.Name, "_", " ") + ": " + t.Description
}

// Catalog is the tool knowledge base 𝒱: tools indexed by name and description
// with an embedder, searched by cosine similarity (exact top-k; on a GPU
// when the index is large and embed.Index.OnDevice was given one).
type Catalog struct {
	tools  []CatalogTool
	byName map[string]int
	emb    embed.Embedder
	index  *embed.Index
}

// batch is how many tool documents go to the embedder at once.
const batch = 256

// NewCatalog embeds every tool's document. Names must be unique and valid
// function names (Qualify makes them so).
func NewCatalog(ctx context.Context, emb embed.Embedder, tools []CatalogTool) (*Catalog, error) {
	kb := &Catalog{byName: map[string]int{}, emb: emb, index: embed.NewIndex(emb.Dim())}
	for _, t := range tools {
		if !ValidName.MatchString(t.Name) {
			return nil, fmt.Errorf("agent: tool name %q is not a function name (%s)", t.Name, ValidName)
		}
		if _, dup := kb.byName[t.Name]; dup {
			return nil, fmt.Errorf("agent: two tools named %q", t.Name)
		}
		kb.byName[t.Name] = len(kb.tools)
		kb.tools = append(kb.tools, t)
	}
	for lo := 0; lo < len(kb.tools); lo += batch {
		hi := min(lo+batch, len(kb.tools))
		docs := make([]string, 0, hi-lo)
		for _, t := range kb.tools[lo:hi] {
			docs = append(docs, t.Document())
		}
		vecs, err := emb.Embed(ctx, docs)
		if err != nil {
			return nil, fmt.Errorf("agent: embedding tools %d-%d: %w", lo, hi-1, err)
		}
		for _, v := range vecs {
			if _, err := kb.index.Add(v); err != nil {
				return nil, err
			}
		}
	}
	return kb, nil
}

// Len is the number of tools.
func (kb *Catalog) Len() int { return len(kb.tools) }

// Tools are the tools in the order given.
func (kb *Catalog) Tools() []CatalogTool { return kb.tools }

// Embedder is what the knowledge base embeds with (descriptions compared
// with each other are embedded alike).
func (kb *Catalog) Embedder() embed.Embedder { return kb.emb }

// Get looks a tool up by name.
func (kb *Catalog) Get(name string) (CatalogTool, bool) {
	i, ok := kb.byName[name]
	if !ok {
		return CatalogTool{}, false
	}
	return kb.tools[i], true
}

// UseDevice searches the index on the device dev gives (a GPU), when the
// index is large enough for a kernel to beat the CPU's scan
// (embed.DeviceMinFloats); dev may return nil (the CPU).
func (kb *Catalog) UseDevice(dev func() kernels.TopKer) {
	if dev == nil || kb.index.Len()*kb.index.Dim() < embed.DeviceMinFloats {
		return
	}
	if be := dev(); be != nil {
		kb.index.OnDevice(be)
	}
}

// Search is VectorSearch(Q, 𝒱, k): the k tools most similar to each
// keyword, best first, keywords in order, each tool once.
func (kb *Catalog) Search(ctx context.Context, keywords []string, k int) ([]CatalogTool, error) {
	var qs []string
	for _, q := range keywords {
		if q = strings.TrimSpace(q); q != "" {
			qs = append(qs, q)
		}
	}
	if len(qs) == 0 || k <= 0 {
		return nil, nil
	}
	vecs, err := kb.emb.Embed(ctx, qs)
	if err != nil {
		return nil, fmt.Errorf("agent: embedding the search keywords: %w", err)
	}
	seen := map[int]bool{}
	var out []CatalogTool
	for _, v := range vecs {
		hits, err := kb.index.Search(v, k, nil)
		if err != nil {
			return nil, err
		}
		for _, h := range hits {
			if !seen[h.Row] {
				seen[h.Row] = true
				out = append(out, kb.tools[h.Row])
			}
		}
	}
	return out, nil
}

// Hit is a retrieved tool and its cosine similarity.
type Hit struct {
	Name  string  `json:"name"`
	Score float64 `json:"score"`
}

// Rank retrieves, for each text, its k most similar tools, best first:
// RET(d, 𝒯, k). The texts are embedded in one batch.
func (kb *Catalog) Rank(ctx context.Context, texts []string, k int) ([][]Hit, error) {
	if len(texts) == 0 {
		return nil, nil
	}
	vecs, err := kb.emb.Embed(ctx, texts)
	if err != nil {
		return nil, fmt.Errorf("agent: embedding %d texts: %w", len(texts), err)
	}
	out := make([][]Hit, len(vecs))
	for i, v := range vecs {
		hits, err := kb.index.Search(v, k, nil)
		if err != nil {
			return nil, err
		}
		for _, h := range hits {
			out[i] = append(out[i], Hit{Name: kb.tools[h.Row].Name, Score: float64(h.Score)})
		}
	}
	return out, nil
}

// Scores are one query's k best tools by name (a run for the retrieval
// metrics).
func (kb *Catalog) Scores(ctx context.Context, query string, k int) (map[string]float64, error) {
	hits, err := kb.Rank(ctx, []string{query}, k)
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(hits[0]))
	for _, h := range hits[0] {
		out[h.Name] = h.Score
	}
	return out, nil
}

// ValidName is what function-calling APIs accept as a tool name (OpenAI's
// pattern).
var ValidName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

var notName = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// FunctionName turns any text into a valid tool name: runs of other
// characters become one underscore, and it is cut to 64 characters.
func FunctionName(s string) string {
	s = strings.Trim(notName.ReplaceAllString(strings.TrimSpace(s), "_"), "_")
	if s == "" {
		s = "tool"
	}
	if len(s) > 64 {
		s = strings.TrimRight(s[:64], "_")
	}
	return s
}

// Qualify makes the tools' names valid and unique: a name that is not a
// function name is rewritten (FunctionName), and a name two servers share
// is prefixed with its server ("server__name", numbered if that collides
// too). It returns how many names it changed.
func Qualify(tools []CatalogTool) int {
	count := map[string]int{}
	for i := range tools {
		count[FunctionName(tools[i].Name)]++
	}
	taken := map[string]bool{}
	changed := 0
	for i := range tools {
		t := &tools[i]
		name := FunctionName(t.Name)
		if count[name] > 1 && t.Server != "" {
			name = FunctionName(t.Server + "__" + name)
		}
		base := name
		for n := 2; taken[name]; n++ {
			suffix := fmt.Sprintf("_%d", n)
			name = base[:min(len(base), 64-len(suffix))] + suffix
		}
		taken[name] = true
		if name != t.Name {
			t.Name = name
			changed++
		}
	}
	return changed
}

// ParametersOrEmpty is a tool's parameters, or the empty object schema.
func ParametersOrEmpty(raw json.RawMessage) json.RawMessage {
	if len(strings.TrimSpace(string(raw))) == 0 || string(raw) == "null" {
		return json.RawMessage(`{"type":"object","properties":{}}`)
	}
	return raw
}
