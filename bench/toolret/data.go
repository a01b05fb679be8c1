package toolret

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/bench/stabletoolbench"
	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/model/chat"
)

// Query is a retrieval query with its judged tools (corpus ids).
type Query struct {
	ID     string `json:"id"`
	Text   string `json:"query"`
	Subset string `json:"subset"`
	Gold   Qrels  `json:"gold"`
}

// Dataset is a tool corpus and its queries. The knowledge base names a
// tool by a function name (agent.Qualify); IDs maps it back to the
// corpus id that qrels and run files use.
type Dataset struct {
	Tools   []agent.CatalogTool
	IDs     map[string]string // knowledge-base name → corpus id
	Queries []Query
}

// readRecords reads a JSON list or JSON Lines of objects, naming the line
// of a bad record.
func readRecords(path string) ([]json.RawMessage, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	trim := bytes.TrimSpace(data)
	if len(trim) > 0 && trim[0] == '[' {
		var out []json.RawMessage
		if err := json.Unmarshal(trim, &out); err != nil {
			return nil, fmt.Errorf("%s: not a JSON list: %w", path, jsonerr.Explain(err))
		}
		return out, nil
	}
	var out []json.RawMessage
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if !json.Valid(b) || b[0] != '{' {
			return nil, fmt.Errorf("%s:%d: not a JSON object", path, line)
		}
		out = append(out, append(json.RawMessage(nil), b...))
	}
	return out, sc.Err()
}

// LoadToolRet reads ToolRet's layout: a tool corpus (records with "id" and
// "documentation" or "description", JSON list or JSONL) and queries
// (records with "id", "query", optional "instruction" and "subset", and
// "labels": a list, or a JSON string of a list, of {"id", "relevance"}).
// A query's subset defaults to its file's name. Errors name the file and
// the record.
func LoadToolRet(queriesPath, corpusPath string) (Dataset, error) {
	var ds Dataset
	recs, err := readRecords(corpusPath)
	if err != nil {
		return ds, err
	}
	known := map[string]bool{}
	for i, raw := range recs {
		var r struct {
			ID            json.RawMessage `json:"id"`
			Documentation json.RawMessage `json:"documentation"`
			Description   string          `json:"description"`
			Name          string          `json:"name"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return ds, fmt.Errorf("%s: tool %d: %w", corpusPath, i, jsonerr.Explain(err))
		}
		id := idString(r.ID)
		if id == "" {
			return ds, fmt.Errorf("%s: tool %d has no id", corpusPath, i)
		}
		if known[id] {
			return ds, fmt.Errorf("%s: tool id %q appears twice", corpusPath, id)
		}
		known[id] = true
		doc := r.Description
		if len(r.Documentation) > 0 {
			var s string
			if json.Unmarshal(r.Documentation, &s) == nil {
				doc = s
			} else {
				doc = string(r.Documentation) // ToolRet's documentation is often a JSON object
			}
		}
		if strings.TrimSpace(doc) == "" {
			return ds, fmt.Errorf("%s: tool %q has no documentation or description", corpusPath, id)
		}
		ds.Tools = append(ds.Tools, agent.CatalogTool{Function: chat.Function{Name: id, Description: doc}, Server: r.Name})
	}
	ds.nameTools()
	qrecs, err := readRecords(queriesPath)
	if err != nil {
		return ds, err
	}
	subset := strings.TrimSuffix(filepath.Base(queriesPath), filepath.Ext(queriesPath))
	for i, raw := range qrecs {
		var r struct {
			ID          json.RawMessage `json:"id"`
			Query       string          `json:"query"`
			Instruction string          `json:"instruction"`
			Subset      string          `json:"subset"`
			Labels      json.RawMessage `json:"labels"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return ds, fmt.Errorf("%s: query %d: %w", queriesPath, i, jsonerr.Explain(err))
		}
		q := Query{ID: idString(r.ID), Text: strings.TrimSpace(r.Query), Subset: r.Subset, Gold: Qrels{}}
		where := fmt.Sprintf("%s: query %d (id %s)", queriesPath, i, q.ID)
		if q.ID == "" || q.Text == "" {
			return ds, fmt.Errorf("%s: needs an id and a query", where)
		}
		if q.Subset == "" {
			q.Subset = subset
		}
		labels := r.Labels
		var s string
		if json.Unmarshal(labels, &s) == nil { // ToolRet stores the list as a JSON string
			labels = json.RawMessage(s)
		}
		var ls []struct {
			ID        json.RawMessage `json:"id"`
			Relevance int             `json:"relevance"`
		}
		if err := json.Unmarshal(labels, &ls); err != nil || len(ls) == 0 {
			return ds, fmt.Errorf("%s: labels is not a non-empty list of {id, relevance}", where)
		}
		for _, l := range ls {
			id := idString(l.ID)
			if !known[id] {
				return ds, fmt.Errorf("%s: labelled tool %q is not in the corpus %s", where, id, corpusPath)
			}
			rel := l.Relevance
			if rel == 0 {
				rel = 1 // a label without a level is relevant
			}
			q.Gold[id] = rel
		}
		ds.Queries = append(ds.Queries, q)
	}
	if len(ds.Queries) == 0 {
		return ds, fmt.Errorf("%s: no queries", queriesPath)
	}
	return ds, nil
}

func idString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return strings.TrimSpace(string(raw)) // a number
}

// nameTools gives the tools knowledge-base names, remembering their ids.
func (ds *Dataset) nameTools() {
	ids := make([]string, len(ds.Tools))
	for i, t := range ds.Tools {
		ids[i] = t.Name
	}
	agent.Qualify(ds.Tools)
	ds.IDs = map[string]string{}
	for i, t := range ds.Tools {
		ds.IDs[t.Name] = ids[i]
	}
}

// LoadStableToolBench reads StableToolBench's solvable_queries layout: the
// corpus is every API of the queries' api_lists, the gold tools their
// "relevant APIs"; the subset is the file's name (G1_instruction, ...).
func LoadStableToolBench(path string) (Dataset, error) {
	qs, err := stabletoolbench.LoadQueries(path)
	if err != nil {
		return Dataset{}, err
	}
	ds := Dataset{Tools: stabletoolbench.QueryTools(qs), IDs: map[string]string{}}
	for _, t := range ds.Tools {
		ds.IDs[t.Name] = t.Name
	}
	subset := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	for _, q := range qs {
		g := Qrels{}
		for _, n := range q.Gold {
			g[n] = 1
		}
		ds.Queries = append(ds.Queries, Query{ID: q.ID, Text: q.Text, Subset: subset, Gold: g})
	}
	return ds, nil
}

// Qrels are the queries' judgments by query id, as TREC qrels hold them.
func (ds Dataset) Qrels() map[string]Qrels {
	qr := make(map[string]Qrels, len(ds.Queries))
	for _, q := range ds.Queries {
		qr[q.ID] = q.Gold
	}
	return qr
}
