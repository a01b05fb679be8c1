package stabletoolbench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/internal/jsonerr"
	"github.com/agemem/agemem/model/chat"
)

// collectionServer is one MCP server of a tool collection file, in the
// layout public MCP tool collections use: the server, and under "tools"
// its tools keyed by server name ({"tools": {"srv": {"tools": [...]}}});
// a plain list of tools under "tools" is read too.
type collectionServer struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Category    string          `json:"category"`
	Tools       json.RawMessage `json:"tools"`
}

type mcpTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// LoadCollection reads a JSON list of MCP servers and their tools. Names
// are made valid and unique (agent.Qualify). Errors name the file and the server.
func LoadCollection(path string) ([]agent.CatalogTool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var servers []collectionServer
	if err := strictList(data, &servers); err != nil {
		return nil, fmt.Errorf("%s: not a JSON list of MCP servers: %w", path, err)
	}
	var out []agent.CatalogTool
	for i, s := range servers {
		where := fmt.Sprintf("%s: server %d (%q)", path, i, s.Name)
		tools, err := serverTools(s.Tools)
		if err != nil {
			return nil, fmt.Errorf("%s: tools: %w", where, err)
		}
		for j, t := range tools {
			if strings.TrimSpace(t.Name) == "" {
				return nil, fmt.Errorf("%s: tool %d has no name", where, j)
			}
			if err := checkSchema(t.InputSchema); err != nil {
				return nil, fmt.Errorf("%s: tool %q: inputSchema: %w", where, t.Name, err)
			}
			desc := t.Description
			if desc == "" {
				desc = s.Description
			}
			out = append(out, agent.CatalogTool{Function: specOf(t.Name, desc, agent.ParametersOrEmpty(t.InputSchema)), Server: s.Name, Category: s.Category})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no tools", path)
	}
	agent.Qualify(out)
	return out, nil
}

func serverTools(raw json.RawMessage) ([]mcpTool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '[' {
		var ts []mcpTool
		err := json.Unmarshal(raw, &ts)
		return ts, err
	}
	var byServer map[string]struct {
		Tools []mcpTool `json:"tools"`
	}
	if err := json.Unmarshal(raw, &byServer); err != nil {
		return nil, err
	}
	var ts []mcpTool
	for _, name := range slices.Sorted(maps.Keys(byServer)) {
		ts = append(ts, byServer[name].Tools...)
	}
	return ts, nil
}

// Query is one benchmark query: its text, the tools that answer it (Gold,
// knowledge-base names) and the APIs it came with.
type Query struct {
	ID    string              `json:"query_id"`
	Text  string              `json:"query"`
	Gold  []string            `json:"gold"`
	Tools []agent.CatalogTool `json:"-"`
	// Relevant are the gold tools as the file names them, [tool_name,
	// api_name] each (ResolveGold also reads them as [server, tool]).
	Relevant [][2]string `json:"-"`
}

// stbQuery is StableToolBench's solvable_queries layout.
type stbQuery struct {
	Query    string          `json:"query"`
	QueryID  json.RawMessage `json:"query_id"`
	APIList  []stbAPI        `json:"api_list"`
	Relevant [][]string      `json:"relevant APIs"`
}

type stbAPI struct {
	Category    string     `json:"category_name"`
	ToolName    string     `json:"tool_name"`
	APIName     string     `json:"api_name"`
	Description string     `json:"api_description"`
	Required    []stbParam `json:"required_parameters"`
	Optional    []stbParam `json:"optional_parameters"`
	Method      string     `json:"method"`
}

type stbParam struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Description string `json:"description"`
	Default     any    `json:"default"`
}

// LoadQueries reads queries in StableToolBench's solvable_queries layout.
// Each API becomes a tool named as ToolBench names its functions
// ("<api>_for_<tool>", standardised, the last 64 characters); a query's
// gold tools are its "relevant APIs" (all of api_list when it has none).
// Errors name the file and the query.
func LoadQueries(path string) ([]Query, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw []stbQuery
	if err := strictList(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: not a JSON list of queries: %w", path, err)
	}
	out := make([]Query, 0, len(raw))
	for i, r := range raw {
		id := strings.Trim(string(r.QueryID), `"`)
		if id == "" || id == "null" {
			id = fmt.Sprint(i)
		}
		where := fmt.Sprintf("%s: query %d (query_id %s)", path, i, id)
		if strings.TrimSpace(r.Query) == "" {
			return nil, fmt.Errorf("%s: no query text", where)
		}
		if len(r.APIList) == 0 {
			return nil, fmt.Errorf("%s: empty api_list", where)
		}
		q := Query{ID: id, Text: r.Query}
		names := map[[2]string]string{}
		for j, a := range r.APIList {
			if a.ToolName == "" || a.APIName == "" {
				return nil, fmt.Errorf("%s: api_list[%d] needs tool_name and api_name", where, j)
			}
			t := agent.CatalogTool{Function: specOf(ToolBenchName(a.ToolName, a.APIName), apiDescription(a), apiSchema(a)),
				Server: a.ToolName, Category: a.Category}
			q.Tools = append(q.Tools, t)
			names[[2]string{a.ToolName, a.APIName}] = t.Name
		}
		for j, rel := range r.Relevant {
			if len(rel) != 2 {
				return nil, fmt.Errorf("%s: relevant APIs[%d] is not [tool_name, api_name]", where, j)
			}
			name, ok := names[[2]string{rel[0], rel[1]}]
			if !ok {
				return nil, fmt.Errorf("%s: relevant API %q of %q is not in api_list", where, rel[1], rel[0])
			}
			q.Gold = append(q.Gold, name)
			q.Relevant = append(q.Relevant, [2]string{rel[0], rel[1]})
		}
		if len(r.Relevant) == 0 {
			for j, t := range q.Tools {
				q.Gold = append(q.Gold, t.Name)
				q.Relevant = append(q.Relevant, [2]string{r.APIList[j].ToolName, r.APIList[j].APIName})
			}
		}
		out = append(out, q)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no queries", path)
	}
	return out, nil
}

// QueryTools are the distinct tools of the queries' API lists, the
// knowledge base of a benchmark given by a query file alone.
func QueryTools(qs []Query) []agent.CatalogTool {
	seen := map[string]bool{}
	var out []agent.CatalogTool
	for _, q := range qs {
		for _, t := range q.Tools {
			if !seen[t.Name] {
				seen[t.Name] = true
				out = append(out, t)
			}
		}
	}
	return out
}

var (
	notWord  = regexp.MustCompile(`[^\p{Han}a-zA-Z0-9_]`)
	repeated = regexp.MustCompile(`_+`)
)

// standardize is ToolBench's: other characters to "_", runs of "_" to
// one, lower case, no "_" at either end, "get_" before a leading digit.
func standardize(s string) string {
	s = strings.Trim(strings.ToLower(repeated.ReplaceAllString(notWord.ReplaceAllString(s, "_"), "_")), "_")
	if s != "" && s[0] >= '0' && s[0] <= '9' {
		s = "get_" + s
	}
	return s
}

// ToolBenchName is the function name ToolBench gives API api of tool
// tool: "<api>_for_<tool>", standardised, Python keywords prefixed "is_",
// its last 64 characters.
func ToolBenchName(tool, api string) string {
	a := standardize(api)
	switch a {
	case "from", "class", "return", "false", "true", "id", "and":
		a = "is_" + a
	}
	name := a + "_for_" + standardize(tool)
	if len(name) > 64 {
		name = name[len(name)-64:]
	}
	return name
}

func apiDescription(a stbAPI) string {
	d := strings.TrimSpace(a.Description)
	if d == "" {
		d = a.APIName
	}
	return fmt.Sprintf("This is the subfunction for tool %q, you can use this tool. The description of this function is: %q", a.ToolName, d)
}

// apiSchema is the JSON Schema of an API's parameters (ToolBench's types:
// STRING, NUMBER, BOOLEAN, ...; anything else is a string).
func apiSchema(a stbAPI) json.RawMessage {
	props := map[string]any{}
	required := []string{}
	add := func(ps []stbParam, req bool) {
		for _, p := range ps {
			if p.Name == "" {
				continue
			}
			typ := "string"
			switch strings.ToUpper(p.Type) {
			case "NUMBER", "INTEGER", "INT", "FLOAT":
				typ = "number"
			case "BOOLEAN", "BOOL":
				typ = "boolean"
			}
			prop := map[string]any{"type": typ, "description": p.Description}
			if p.Default != nil && p.Default != "" {
				prop["example_value"] = p.Default
			}
			props[p.Name] = prop
			if req {
				required = append(required, p.Name)
			}
		}
	}
	add(a.Required, true)
	add(a.Optional, false)
	b, _ := json.Marshal(map[string]any{"type": "object", "properties": props, "required": required})
	return b
}

func specOf(name, desc string, params json.RawMessage) chat.Function {
	return chat.Function{Name: name, Description: desc, Parameters: params}
}

// checkSchema accepts an absent schema or a JSON object.
func checkSchema(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("not a JSON object")
	}
	return nil
}

// strictList decodes a JSON list, naming the line of a syntax error.
func strictList(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line := 1 + bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n"))
			return fmt.Errorf("line %d: %w", line, err)
		}
		return jsonerr.Explain(err)
	}
	return nil
}

// ResolveGold names each query's gold tools as the knowledge base kb
// does. A relevant API [tool_name, api_name] is the tool ToolBench names
// "<api>_for_<tool>" (what LoadQueries named it: a knowledge base of the
// queries' own api_lists, or a collection written with those names, as
// Synth's), else the tool api_name of the MCP server named tool_name (a
// collection's server, or a live one: mcp.servers' name; url1, command1,
// ... for servers given by flag), qualified as server__name where two
// servers share the name. A pair with no such tool is an error naming the
// query.
func ResolveGold(qs []Query, kb *agent.Catalog) error {
	for i := range qs {
		q := &qs[i]
		gold := make([]string, 0, len(q.Relevant))
		for _, rel := range q.Relevant {
			name := ""
			for _, n := range []string{ToolBenchName(rel[0], rel[1]), agent.FunctionName(rel[1]), agent.FunctionName(rel[0] + "__" + rel[1])} {
				if t, ok := kb.Get(n); ok && (t.Server == rel[0] || t.Server == "") {
					name = n
					break
				}
			}
			if name == "" {
				return fmt.Errorf("query %s: relevant API %q of %q is not in the knowledge base (as %q, or as a tool of the MCP server %q)", q.ID, rel[1], rel[0], ToolBenchName(rel[0], rel[1]), rel[0])
			}
			gold = append(gold, name)
		}
		q.Gold = gold
	}
	return nil
}
