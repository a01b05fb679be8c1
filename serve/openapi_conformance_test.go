package serve

// The OpenAPI document held to the handlers: every documented operation is
// sent, with the document's own example bodies and parameters, to a real
// server (the scripted backend, SQLite, the MCP endpoints and the tool
// gateway), and every answer must have a documented status and a body
// valid against the documented schema for it. Then every operation that
// can fail is made to fail with each client error it documents.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/papers/memtool"
)

// startAll starts a server with every route on, the tool gateway included
// (with no upstream MCP server: its routes and meta-tools are all there).
func startAll(t *testing.T) *testServer {
	t.Helper()
	c := testConfig(t)
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := memtool.NewGateway(context.Background(), c.Embed.Hashing(), nil, memtool.Config{Limit: 3, TopK: 1})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store, o.ToolGateway = newScripted(), db, gw }))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: newHTTPTest(s), srv: s, db: db}
	t.Cleanup(func() { ts.Close(); s.Close(); db.Close() })
	return ts
}

// apiCall is one request of an operation: its body and how it departs
// from the documented example request.
type apiCall struct {
	op     apiOperation
	name   string // the example's name
	key    string
	body   []byte
	ctype  string
	header map[string]string // extra headers
	params map[string]string // parameter values in place of the examples
	omit   string            // a required parameter left out
}

// apiAnswer is what came back; open marks a stream that does not end by
// itself (an MCP GET), of which only the status and headers are read.
type apiAnswer struct {
	status int
	header http.Header
	body   []byte
	open   bool
}

// example is a parameter's example value: example, else the first of
// examples, else the first of its schema's examples.
func (d *apiDoc) example(t *testing.T, p map[string]any) (string, bool) {
	v, ok := p["example"]
	if ex, isMap := p["examples"].(map[string]any); !ok && isMap && len(ex) > 0 {
		v, ok = d.deref(t, ex[slices.Sorted(maps.Keys(ex))[0]])["value"], true
	}
	if list, isList := d.deref(t, p["schema"])["examples"].([]any); !ok && isList && len(list) > 0 {
		v, ok = list[0], true
	}
	if !ok {
		return "", false
	}
	if s, isString := v.(string); isString {
		return s, true
	}
	raw, _ := json.Marshal(v)
	return string(raw), true
}

// mediaTypes are the media types op's responses are documented in, for
// its requests' Accept.
func (d *apiDoc) mediaTypes(t *testing.T, op apiOperation) string {
	var types []string
	rs, _ := op.Op["responses"].(map[string]any)
	for _, r := range rs {
		content, _ := d.deref(t, r)["content"].(map[string]any)
		types = append(types, slices.Collect(maps.Keys(content))...)
	}
	slices.Sort(types)
	return strings.Join(slices.Compact(types), ", ")
}

// send makes c's request: path, required header and query parameters from
// c.params, else the values earlier answers gave (live, by path and
// name), else the document's examples.
func (d *apiDoc) send(t *testing.T, base string, c apiCall, live map[string]string) apiAnswer {
	t.Helper()
	path, query, header := c.op.Path, url.Values{}, http.Header{}
	for _, p := range c.op.Params {
		name, in := p["name"].(string), p["in"].(string)
		required, _ := p["required"].(bool)
		v, given := c.params[name]
		if !given && (!required || name == c.omit) {
			continue
		}
		if !given {
			v, given = live[c.op.Path+" "+name]
		}
		if !given {
			if v, given = d.example(t, p); !given {
				t.Errorf("%s: the required parameter %s has no example (nor a value an earlier answer gave)", c.op, name)
				return apiAnswer{status: -1}
			}
		}
		switch in {
		case "path":
			path = strings.ReplaceAll(path, "{"+name+"}", url.PathEscape(v))
		case "query":
			query.Set(name, v)
		case "header":
			header.Set(name, v)
		}
	}
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, strings.ToUpper(c.op.Method), base+path, bytes.NewReader(c.body))
	req.Header = header
	req.Header.Set("Accept", d.mediaTypes(t, c.op))
	if c.ctype != "" {
		req.Header.Set("Content-Type", c.ctype)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s (%s): %v", c.op, c.name, err)
	}
	defer resp.Body.Close()
	a := apiAnswer{status: resp.StatusCode, header: resp.Header}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" && c.op.Method == "get" {
		a.open = true
		return a
	}
	a.body, _ = io.ReadAll(resp.Body)
	return a
}

// check validates a against op's documentation: the status is documented,
// the Content-Type is one of its media types (no body where it has none),
// and the body is valid against that media type's schema.
func (d *apiDoc) check(t *testing.T, op apiOperation, a apiAnswer) error {
	r := d.response(t, op, a.status)
	if r == nil {
		return fmt.Errorf("status %d is not documented: %s", a.status, a.body)
	}
	content, _ := r["content"].(map[string]any)
	if len(content) == 0 {
		if len(a.body) > 0 {
			return fmt.Errorf("status %d is documented without a body, and it has %d bytes: %.200s", a.status, len(a.body), a.body)
		}
		return nil
	}
	mt, _, _ := mime.ParseMediaType(a.header.Get("Content-Type"))
	media, ok := content[mt].(map[string]any)
	if !ok {
		return fmt.Errorf("status %d: Content-Type %q, documented: %v", a.status, a.header.Get("Content-Type"), slices.Sorted(maps.Keys(content)))
	}
	if a.open {
		return nil
	}
	schema := media["schema"]
	var instance any
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		if err := json.Unmarshal(a.body, &instance); err != nil {
			return fmt.Errorf("status %d: the body is not JSON: %v: %.200s", a.status, err, a.body)
		}
	case mt == "application/x-ndjson" || mt == "application/jsonl":
		lines := []any{}
		for i, line := range strings.Split(strings.TrimSpace(string(a.body)), "\n") {
			var v any
			if err := json.Unmarshal([]byte(line), &v); err != nil {
				return fmt.Errorf("status %d: line %d is not JSON: %v", a.status, i+1, err)
			}
			lines = append(lines, v)
		}
		instance = lines
	case mt == "text/event-stream":
		events, err := d.checkEvents(t, schema, a.body)
		if err != nil {
			return fmt.Errorf("status %d: %v", a.status, err)
		}
		instance = events
	default:
		instance = string(a.body)
	}
	if err := d.validate(schema, instance); err != nil {
		return fmt.Errorf("status %d %s: the body does not match the documented schema: %v\n%.600s", a.status, mt, err, a.body)
	}
	return nil
}

// checkEvents parses server-sent events into objects of their fields
// (data, event, id, retry) and validates each event's data, as JSON,
// against the schema's items.properties.data.contentSchema. A data of
// [DONE] may end the stream.
func (d *apiDoc) checkEvents(t *testing.T, schema any, body []byte) ([]any, error) {
	items := d.deref(t, d.deref(t, schema)["items"])
	props, _ := items["properties"].(map[string]any)
	data, _ := props["data"].(map[string]any)
	contentSchema, ok := data["contentSchema"]
	if !ok {
		return nil, fmt.Errorf("a text/event-stream schema must be an array of events whose data has a contentSchema")
	}
	var events []any
	for i, block := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		ev := map[string]any{}
		var lines []string
		for _, line := range strings.Split(block, "\n") {
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "":
				// a comment
			case "data":
				lines = append(lines, value)
			case "retry":
				n, err := strconv.Atoi(value)
				if err != nil {
					return nil, fmt.Errorf("event %d: retry %q", i, value)
				}
				ev[field] = n
			default:
				ev[field] = value
			}
		}
		if lines != nil {
			ev["data"] = strings.Join(lines, "\n")
		}
		events = append(events, ev)
		if ev["data"] == "[DONE]" {
			if !strings.HasSuffix(strings.TrimSpace(string(body)), block) {
				return nil, fmt.Errorf("event %d: [DONE] before the end of the stream", i)
			}
			continue
		}
		var v any
		if err := json.Unmarshal([]byte(fmt.Sprint(ev["data"])), &v); err != nil {
			return nil, fmt.Errorf("event %d: the data is not JSON: %v: %.200s", i, err, block)
		}
		if err := d.validate(contentSchema, v); err != nil {
			return nil, fmt.Errorf("event %d does not match the documented schema: %v\n%.400s", i, err, block)
		}
	}
	if len(events) == 0 {
		return nil, fmt.Errorf("no event")
	}
	return events, nil
}

type exampleBody struct {
	name, ctype string
	body        []byte
}

// bodies are op's documented example request bodies, each encoded in its
// media type: JSON as JSON, an array as JSON Lines for a lines type.
func (d *apiDoc) bodies(t *testing.T, op apiOperation) []exampleBody {
	rb := d.deref(t, op.Op["requestBody"])
	content, _ := rb["content"].(map[string]any)
	var out []exampleBody
	for _, mt := range slices.Sorted(maps.Keys(content)) {
		media := content[mt].(map[string]any)
		values := map[string]any{}
		if v, ok := media["example"]; ok {
			values["example"] = v
		}
		if ex, ok := media["examples"].(map[string]any); ok {
			for name, e := range ex {
				values[name] = d.deref(t, e)["value"]
			}
		}
		for _, name := range slices.Sorted(maps.Keys(values)) {
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			if list, ok := values[name].([]any); ok && (mt == "application/jsonl" || mt == "application/x-ndjson") {
				for _, v := range list {
					enc.Encode(v)
				}
			} else if s, ok := values[name].(string); ok && !strings.Contains(mt, "json") {
				b.WriteString(s)
			} else {
				enc.Encode(values[name])
			}
			out = append(out, exampleBody{name, mt, b.Bytes()})
		}
	}
	if len(content) > 0 && len(out) == 0 {
		t.Errorf("%s documents a request body without an example", op)
	}
	return out
}

// methodOrder runs the operations that make things before those that
// read, change and delete them.
var methodOrder = []string{"post", "put", "get", "head", "options", "patch", "delete", "trace"}

// TestOpenAPIConformance sends every documented operation, once per
// example request body, in the order create, read, change, delete, to a
// real server. Each example must succeed (2xx), and each answer must be
// one the document describes. Values an answer's documented headers give
// (an MCP session id) feed the later requests of the same path.
func TestOpenAPIConformance(t *testing.T) {
	d := loadAPIDoc(t)
	ts := startAll(t)
	ops := d.operations(t)
	slices.SortStableFunc(ops, func(a, b apiOperation) int {
		return slices.Index(methodOrder, a.Method) - slices.Index(methodOrder, b.Method)
	})
	live := map[string]string{}
	for _, op := range ops {
		calls := []apiCall{{op: op, name: "no body", key: adminKey}}
		if bs := d.bodies(t, op); len(bs) > 0 {
			calls = calls[:0]
			for _, b := range bs {
				calls = append(calls, apiCall{op: op, name: b.name, key: adminKey, body: b.body, ctype: b.ctype})
			}
		}
		for _, c := range calls {
			a := d.send(t, ts.URL, c, live)
			if a.status < 0 {
				continue
			}
			if err := d.check(t, op, a); err != nil {
				t.Errorf("%s (%s): %v", op, c.name, err)
				continue
			}
			if a.status/100 != 2 {
				t.Errorf("%s (%s): the documented example is refused: %d %s", op, c.name, a.status, a.body)
				continue
			}
			headers, _ := d.response(t, op, a.status)["headers"].(map[string]any)
			for name := range headers {
				if v := a.header.Get(name); v != "" {
					live[op.Path+" "+name] = v
				}
			}
			t.Logf("%s (%s): %d", op, c.name, a.status)
		}
	}
}

// notFound makes an operation's request name something that does not
// exist, for the operations that document 404: what names nothing is
// particular to each route.
var notFound = map[string]func(c *apiCall){
	"GET /v1/models/{model}":    func(c *apiCall) { c.params = map[string]string{"model": "gpt-4o"} },
	"POST /v1/chat/completions": func(c *apiCall) { c.body = []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`) },
	"POST /v1/embeddings":       func(c *apiCall) { c.body = []byte(`{"model":"gpt-4o","input":"hi"}`) },
	"DELETE /v1/sessions/{id}":  func(c *apiCall) { c.params = map[string]string{"id": "never-opened"} },
	"GET /v1/memories/{id}":     func(c *apiCall) { c.params = map[string]string{"id": "mem_ffffffff"} },
	"PATCH /v1/memories/{id}":   func(c *apiCall) { c.params = map[string]string{"id": "mem_ffffffff"} },
	"DELETE /v1/memories/{id}":  func(c *apiCall) { c.params = map[string]string{"id": "mem_ffffffff"} },
	"POST /mcp":                 unknownMCPSession,
	"GET /mcp":                  unknownMCPSession,
	"DELETE /mcp":               unknownMCPSession,
	"POST /mcp/tools":           unknownMCPSession,
	"GET /mcp/tools":            unknownMCPSession,
	"DELETE /mcp/tools":         unknownMCPSession,
}

func unknownMCPSession(c *apiCall) { c.params = map[string]string{"Mcp-Session-Id": "no-such-session"} }

// needsKey says whether op is behind the API keys (its security, else
// the document's, lists no empty requirement).
func (d *apiDoc) needsKey(op apiOperation) bool {
	sec, ok := op.Op["security"].([]any)
	if !ok {
		sec, _ = d.root["security"].([]any)
	}
	for _, req := range sec {
		if m, _ := req.(map[string]any); len(m) == 0 {
			return false
		}
	}
	return len(sec) > 0
}

func hasParam(op apiOperation, name string, required bool) bool {
	return slices.ContainsFunc(op.Params, func(p map[string]any) bool {
		r, _ := p["required"].(bool)
		return p["name"] == name && (r || !required)
	})
}

// TestOpenAPIErrors makes every operation fail with each client error it
// documents, on a fresh server: 401 without a key; 403 with a key naming
// another's namespace (or not an admin's); 400 with a body cut short, else
// without a required header, else naming an invalid namespace; 404 naming
// nothing (notFound); 413 with a body one byte over serve.max_body_bytes;
// 415 with the example body sent as text/plain. Each answer must be the
// status expected, in the error envelope the document gives for it.
func TestOpenAPIErrors(t *testing.T) {
	d := loadAPIDoc(t)
	ts := startAll(t)
	maxBody := int(testConfig(t).Serve.MaxBodyBytes)
	probes := 0
	for _, op := range d.operations(t) {
		base := apiCall{op: op, key: adminKey}
		if bs := d.bodies(t, op); len(bs) > 0 {
			base.body, base.ctype = bs[0].body, bs[0].ctype
		}
		probe := func(status int, why string, change func(c *apiCall)) {
			c := base
			c.name = why
			change(&c)
			probes++
			a := d.send(t, ts.URL, c, nil)
			if a.status < 0 {
				return
			}
			if a.status != status {
				t.Errorf("%s %s: status %d, want %d: %.300s", op, why, a.status, status, a.body)
				return
			}
			media, _ := d.response(t, op, status)["content"].(map[string]any)["application/json"].(map[string]any)
			if schema, _ := media["schema"].(map[string]any); schema["$ref"] != "#/components/schemas/ErrorResponse" {
				t.Errorf("%s documents %d without the ErrorResponse schema", op, status)
			}
			if err := d.check(t, op, a); err != nil {
				t.Errorf("%s %s: %v", op, why, err)
			}
		}
		if d.needsKey(op) {
			if !documents(op, 401) {
				t.Errorf("%s needs a key and does not document 401", op)
			}
			probe(401, "without a key", func(c *apiCall) { c.key = "" })
		}
		if documents(op, 403) {
			probe(403, "with another's namespace", func(c *apiCall) {
				c.key = aliceKey
				if hasParam(op, "X-AgeMem-Namespace", false) {
					c.header = map[string]string{"X-AgeMem-Namespace": "bob"}
				}
			})
		}
		if documents(op, 400) {
			var required string
			for _, p := range op.Params {
				if r, _ := p["required"].(bool); r && p["in"] == "header" {
					required = p["name"].(string)
				}
			}
			switch {
			case base.body != nil:
				probe(400, "with a body cut short", func(c *apiCall) { c.body = []byte("{") })
			case required != "":
				probe(400, "without "+required, func(c *apiCall) { c.omit = required })
			case hasParam(op, "X-AgeMem-Namespace", false):
				probe(400, "naming an invalid namespace", func(c *apiCall) { c.header = map[string]string{"X-AgeMem-Namespace": "not a namespace"} })
			default:
				t.Errorf("%s documents 400 and no probe here provokes it: add one", op)
			}
		}
		if documents(op, 404) {
			if change, ok := notFound[op.String()]; ok {
				probe(404, "naming nothing", change)
			} else {
				t.Errorf("%s documents 404: add what names nothing to notFound", op)
			}
		}
		if documents(op, 413) {
			probe(413, "with a body over max_body_bytes", func(c *apiCall) {
				c.body = []byte(`{"content":"` + strings.Repeat("a", maxBody) + `"}`)
			})
		}
		if documents(op, 415) {
			probe(415, "as text/plain", func(c *apiCall) { c.ctype = "text/plain" })
		}
	}
	t.Logf("%d error probes", probes)
}
