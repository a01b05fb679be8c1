package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/jsonschema-go/jsonschema"
)

// apiDoc is the OpenAPI document as the tests read it.
type apiDoc struct {
	root map[string]any
}

func loadAPIDoc(t *testing.T) *apiDoc {
	t.Helper()
	raw, err := OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := json.Unmarshal(raw, &root); err != nil {
		t.Fatalf("the document is not JSON: %v", err)
	}
	return &apiDoc{root: root}
}

// deref follows local $refs (#/components/...) until an object without
// one; a referring object's other fields (a path item's description) are
// kept where the target has none.
func (d *apiDoc) deref(t *testing.T, v any) map[string]any {
	t.Helper()
	m, _ := v.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		var target any = d.root
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			obj, _ := target.(map[string]any)
			target = obj[strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")]
		}
		next, ok := target.(map[string]any)
		if !ok {
			t.Fatalf("$ref %s resolves to nothing", ref)
		}
		merged := maps.Clone(next)
		for k, v := range m {
			if _, has := merged[k]; !has && k != "$ref" {
				merged[k] = v
			}
		}
		m = merged
	}
	return m
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// apiOperation is one method of one path, with its parameters (the path
// item's and its own) resolved.
type apiOperation struct {
	Method, Path string
	Op           map[string]any
	Params       []map[string]any
}

func (o apiOperation) String() string { return strings.ToUpper(o.Method) + " " + o.Path }

// operations lists the document's operations by path, then method.
func (d *apiDoc) operations(t *testing.T) []apiOperation {
	t.Helper()
	paths, _ := d.root["paths"].(map[string]any)
	var ops []apiOperation
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		item := d.deref(t, paths[p])
		for _, m := range httpMethods {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			o := apiOperation{Method: m, Path: p, Op: op}
			for _, list := range []any{item["parameters"], op["parameters"]} {
				ps, _ := list.([]any)
				for _, prm := range ps {
					o.Params = append(o.Params, d.deref(t, prm))
				}
			}
			ops = append(ops, o)
		}
	}
	return ops
}

// response is the documented response for status (an exact code, then
// its range such as 4XX, then default), or nil.
func (d *apiDoc) response(t *testing.T, op apiOperation, status int) map[string]any {
	t.Helper()
	rs, _ := op.Op["responses"].(map[string]any)
	for _, key := range []string{strconv.Itoa(status), fmt.Sprintf("%dXX", status/100), "default"} {
		if r, ok := rs[key]; ok {
			return d.deref(t, r)
		}
	}
	return nil
}

// documents says whether op documents status exactly.
func documents(op apiOperation, status int) bool {
	rs, _ := op.Op["responses"].(map[string]any)
	_, ok := rs[strconv.Itoa(status)]
	return ok
}

// validate checks instance (a value decoded from JSON) against schema, a
// schema object of the document: its $refs to components/schemas become
// refs to $defs of one JSON Schema 2020-12 document, which OpenAPI 3.1's
// schemas are.
func (d *apiDoc) validate(schema, instance any) error {
	root := map[string]any{}
	if s, ok := schema.(map[string]any); ok {
		maps.Copy(root, s)
	}
	root["$defs"] = d.root["components"].(map[string]any)["schemas"]
	raw, err := json.Marshal(root)
	if err != nil {
		return err
	}
	raw = bytes.ReplaceAll(raw, []byte(`"#/components/schemas/`), []byte(`"#/$defs/`))
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("the schema is not JSON Schema: %w", err)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		return fmt.Errorf("resolving the schema: %w", err)
	}
	return rs.Validate(instance)
}

// TestOpenAPIServed: GET /openapi.json, without a key, is the document.
func TestOpenAPIServed(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	r := do(t, "GET", ts.URL+"/openapi.json", "", nil)
	want, _ := OpenAPI()
	if r.Status != 200 || r.Header.Get("Content-Type") != "application/json" || !bytes.Equal(r.Body, want) {
		t.Fatalf("status %d, Content-Type %q, %d bytes (want %d)", r.Status, r.Header.Get("Content-Type"), len(r.Body), len(want))
	}
	if v := loadAPIDoc(t).root["openapi"]; v != "3.1.0" {
		t.Fatalf("openapi %v", v)
	}
}

// TestOpenAPIFilesMerge: the parts of the document merge into one, and a
// key two parts both define is an error naming the file and the key, not
// a silent override.
func TestOpenAPIFilesMerge(t *testing.T) {
	head := "openapi: 3.1.0\npaths:\n  /h: {}\ncomponents:\n  schemas:\n    A: {type: string}\n"
	for _, tc := range []struct {
		name, part, want string
	}{
		{"adds", "paths:\n  /x: {}\ncomponents:\n  schemas:\n    B: {type: integer}\n",
			`{"openapi":"3.1.0","paths":{"/h":{},"/x":{}},"components":{"schemas":{"A":{"type":"string"},"B":{"type":"integer"}}}}`},
		{"redefines", "components:\n  schemas:\n    A: {type: integer}\n", "serve/openapi/part.yaml:3: /components/schemas/A is defined in another file too"},
		{"redefines a path", "paths:\n  /h: {get: {}}\n", "serve/openapi/part.yaml:2: /paths/~1h is defined in another file too"},
		{"not YAML", "paths: [\n", "serve/openapi/part.yaml: yaml: line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := assembleOpenAPI(fstest.MapFS{"openapi/openapi.yaml": {Data: []byte(head)}, "openapi/part.yaml": {Data: []byte(tc.part)}})
			if err != nil {
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %q, want %q", err, tc.want)
				}
				return
			}
			var compact bytes.Buffer
			json.Compact(&compact, got)
			if compact.String() != tc.want {
				t.Fatalf("got %s\nwant %s", compact.String(), tc.want)
			}
		})
	}
}

// routePatterns reads the route patterns the package registers from its
// source: the literal first argument of every Handle and HandleFunc call,
// and of every call to a local function that passes its own first
// parameter on as a Handle pattern (server.go's api). Reading the source
// rather than a running server's mux finds routes a configuration turns
// off (the /mcp/tools gateway) and needs no route registry in the server;
// the price is that a pattern must be a literal, which this enforces.
func routePatterns(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, _ := filepath.Glob("*.go")
	var patterns []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		// wrappers: name := func(pattern string, ...) { mux.Handle(pattern, ...) }
		wrappers, inWrapper := map[string]bool{}, map[*ast.CallExpr]bool{}
		ast.Inspect(file, func(n ast.Node) bool {
			var names []*ast.Ident
			var values []ast.Expr
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					id, _ := l.(*ast.Ident)
					names = append(names, id)
				}
				values = n.Rhs
			case *ast.ValueSpec:
				names, values = n.Names, n.Values
			}
			for i, v := range values {
				lit, ok := v.(*ast.FuncLit)
				if !ok || i >= len(names) || names[i] == nil || len(lit.Type.Params.List) == 0 || len(lit.Type.Params.List[0].Names) == 0 {
					continue
				}
				param := lit.Type.Params.List[0].Names[0].Name
				ast.Inspect(lit.Body, func(n ast.Node) bool {
					if c, ok := n.(*ast.CallExpr); ok && isHandle(c) {
						if id, ok := c.Args[0].(*ast.Ident); ok && id.Name == param {
							wrappers[names[i].Name], inWrapper[c] = true, true
						}
					}
					return true
				})
			}
			return true
		})
		ast.Inspect(file, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok || len(c.Args) == 0 || inWrapper[c] {
				return true
			}
			if fn, ok := c.Fun.(*ast.Ident); !isHandle(c) && !(ok && wrappers[fn.Name]) {
				return true
			}
			lit, ok := c.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: a route registered with a pattern that is not a string literal: write it as one so that the OpenAPI test can read it", fset.Position(c.Pos()))
				return true
			}
			p, _ := strconv.Unquote(lit.Value)
			patterns = append(patterns, p)
			return true
		})
	}
	slices.Sort(patterns)
	return slices.Compact(patterns)
}

func isHandle(c *ast.CallExpr) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	return ok && (sel.Sel.Name == "Handle" || sel.Sel.Name == "HandleFunc") && len(c.Args) == 2
}

var routeWildcard = regexp.MustCompile(`\{([A-Za-z0-9_]+)(\.\.\.)?\}`)

// TestOpenAPIDescribesEveryRoute: every route the server registers is in
// the document (a pattern without a method needs at least one operation
// on its path), and every documented operation is a registered route. The
// catch-all "/" is the JSON 404 for unknown paths, which the document's
// description covers; /ui is the web console's HTML pages, which the
// serving guide describes (not an API).
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	patterns := routePatterns(t)
	if len(patterns) < 15 {
		t.Fatalf("only %d route patterns found in the source: %q", len(patterns), patterns)
	}
	d := loadAPIDoc(t)
	documented := map[string]bool{} // "get /v1/models", and "/v1/models" for the path
	for _, op := range d.operations(t) {
		documented[op.Method+" "+op.Path] = true
		documented[op.Path] = true
	}
	registered := map[string]bool{}
	for _, p := range patterns {
		if p == "/" || p == "/ui/" || p == "GET /ui" {
			continue
		}
		method, path, hasMethod := strings.Cut(p, " ")
		if !hasMethod {
			method, path = "", p
		}
		path = strings.ReplaceAll(routeWildcard.ReplaceAllString(path, "{$1}"), "{$}", "")
		key := strings.TrimSpace(strings.ToLower(method) + " " + path)
		registered[key] = true
		if !documented[key] {
			t.Errorf("serve registers %q, which serve/openapi/*.yaml does not describe: document it (%s)", p, key)
		}
	}
	for _, op := range d.operations(t) {
		if !registered[op.Method+" "+op.Path] && !registered[op.Path] {
			t.Errorf("the document describes %s, which serve does not register", op)
		}
	}
	t.Logf("%d route patterns, %d documented operations", len(patterns), len(d.operations(t)))
}

// TestOpenAPIValidates runs a real OpenAPI validator on the document:
// Redocly's OpenAPI engine (@redocly/openapi-core, installed by `make
// deps`) under its recommended-strict rules (testdata/openapi-lint.mjs).
// It skips without node or the package, unless AGEMEM_REQUIRE_NODE is set
// (as CI sets it).
func TestOpenAPIValidates(t *testing.T) {
	prefix := os.Getenv("AGEMEM_NPM_PREFIX")
	if prefix == "" {
		prefix = filepath.Join("..", ".cache", "npm")
	}
	pkg, _ := filepath.Abs(filepath.Join(prefix, "node_modules", "@redocly", "openapi-core"))
	node, err := exec.LookPath("node")
	missing := ""
	if err != nil {
		missing = "node is not installed"
	} else if _, err := os.Stat(filepath.Join(pkg, "package.json")); err != nil {
		missing = "@redocly/openapi-core is not in " + prefix + " (run `make deps`)"
	}
	if missing != "" {
		if os.Getenv("AGEMEM_REQUIRE_NODE") != "" {
			t.Fatalf("%s, and AGEMEM_REQUIRE_NODE is set", missing)
		}
		t.Skipf("%s; set AGEMEM_REQUIRE_NODE=1 to fail instead", missing)
	}
	doc, err := OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "openapi.json")
	os.WriteFile(path, doc, 0o644)
	out, err := exec.Command(node, filepath.Join("testdata", "openapi-lint.mjs"), pkg, path).CombinedOutput()
	if err != nil {
		t.Fatalf("the OpenAPI validator refuses the document (%v):\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
}
