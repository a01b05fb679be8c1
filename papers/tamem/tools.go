package tamem

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/model/chat"
)

// K is the top-k of the similarity queries (the paper's k = 5).
const K = 5

// Retrieval is one question's retrieval: the database's tools over one
// conversation, with the per-question cache and the pages seen.
type Retrieval struct {
	db *DB
	ns string
	k  int
	// seen holds the pages and profiles already returned; a later result
	// names them instead of repeating them.
	seen  map[string]bool
	pages []int // pages returned, in order
}

// NewRetrieval starts a question's retrieval over conversation ns.
func (d *DB) NewRetrieval(ns string, k int) *Retrieval {
	return &Retrieval{db: d, ns: ns, k: k, seen: map[string]bool{}}
}

// Pages are the pages this session returned, in order.
func (s *Retrieval) Pages() []int { return s.pages }

// pagesResult renders pages, those already returned shown only by id.
func (s *Retrieval) pagesResult(ctx context.Context, ids []int, empty string) (string, error) {
	if len(ids) == 0 {
		return empty, nil
	}
	var out []any
	for _, id := range ids {
		key := fmt.Sprintf("page %d", id)
		if s.seen[key] {
			out = append(out, map[string]any{"page_id": id, "already_retrieved": true})
			continue
		}
		p, err := s.db.Page(ctx, s.ns, id)
		if err != nil {
			return "", err
		}
		s.seen[key] = true
		s.pages = append(s.pages, id)
		out = append(out, map[string]any{"page_id": p.ID, "time": p.Time, "summary": p.Note.Summary, "tag": p.Note.Tag, "dialogue": p.Dialogue})
	}
	raw, err := json.Marshal(out)
	return string(raw), err
}

const noKey = "nothing matches; list the available %s with %s and use one of them exactly"

// Tools are the ten query tools of the paper's Figure 2.
func (s *Retrieval) Tools() []agent.Tool {
	str := func(name, desc string) json.RawMessage {
		raw, _ := json.Marshal(map[string]any{"type": "object", "properties": map[string]any{name: map[string]any{"type": "string", "description": desc}},
			"required": []string{name}, "additionalProperties": false})
		return raw
	}
	none := json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)
	arg := func(raw json.RawMessage, name string) string {
		var m map[string]string
		json.Unmarshal(raw, &m)
		return m[name]
	}
	byKey := func(tool, kind, lister, what string) agent.Tool {
		return agent.Tool{Function: chat.Function{Name: tool, Description: fmt.Sprintf("Memory pages (dialogue, time, summary) indexed by the %s given, exactly one of list_%s.", kind, lister),
			Parameters: str(kind, "the "+kind)},
			Call: func(ctx context.Context, raw json.RawMessage) (string, error) {
				ids, err := s.db.ByKey(ctx, s.ns, kind, arg(raw, kind))
				if err != nil {
					return "", err
				}
				return s.pagesResult(ctx, ids, fmt.Sprintf(noKey, what, "list_"+lister))
			}}
	}
	similar := func(tool, kind, what string) agent.Tool {
		return agent.Tool{Function: chat.Function{Name: tool, Description: fmt.Sprintf("Memory pages holding the %d %s most similar to a description.", s.k, what),
			Parameters: str("query", "what to look for")},
			Call: func(ctx context.Context, raw json.RawMessage) (string, error) {
				ids, err := s.db.Similar(ctx, s.ns, kind, arg(raw, "query"), s.k)
				if err != nil {
					return "", err
				}
				return s.pagesResult(ctx, ids, "no "+what+" stored")
			}}
	}
	profile := func(tool, kind, what string) agent.Tool {
		return agent.Tool{Function: chat.Function{Name: tool, Description: fmt.Sprintf("All %s of a person, as stored.", what), Parameters: str("person", "the person's name")},
			Call: func(ctx context.Context, raw json.RawMessage) (string, error) {
				person := arg(raw, "person")
				key := kind + " profile " + norm(person)
				if s.seen[key] {
					return fmt.Sprintf("already retrieved: the %s of %s above", what, person), nil
				}
				recs, err := s.db.Profile(ctx, s.ns, kind, person)
				if err != nil {
					return "", err
				}
				if len(recs) == 0 {
					return fmt.Sprintf(noKey, "people", "list_persons"), nil
				}
				s.seen[key] = true
				var out []any
				for _, r := range recs {
					if kind == "event" {
						out = append(out, map[string]string{"event": r.Event, "time": r.Time})
					} else {
						out = append(out, r.Event)
					}
				}
				raw, err = json.Marshal(out)
				return string(raw), err
			}}
	}
	lister := func(tool, kind string) agent.Tool {
		return agent.Tool{Function: chat.Function{Name: tool, Description: fmt.Sprintf("Every %s the memory is indexed by.", kind), Parameters: none},
			Call: func(ctx context.Context, _ json.RawMessage) (string, error) {
				keys, err := s.db.Keys(ctx, s.ns, kind)
				if err != nil {
					return "", err
				}
				return strings.Join(keys, "; "), nil
			}}
	}
	return []agent.Tool{
		byKey("match_keyword", "keyword", "keywords", "keywords"),
		byKey("match_person", "person", "persons", "people"),
		byKey("match_tag", "tag", "tags", "tags"),
		similar("match_events", "event", "events"),
		similar("match_facts", "fact", "facts"),
		profile("person_events", "event", "events"),
		profile("person_facts", "fact", "facts"),
		lister("list_keywords", "keyword"),
		lister("list_persons", "person"),
		lister("list_tags", "tag"),
	}
}
