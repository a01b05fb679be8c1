package serve

// The HTTP API's OpenAPI 3.1 document. It is written as YAML in
// openapi/, one file per part of the API so that each stays readable;
// openapi/openapi.yaml holds the document's head and the shared
// components, and every other file adds paths and components to it. The
// merged document is served as JSON at GET /openapi.json, and `serve docs`
// writes it to docs/reference/openapi.json.

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"
)

//go:embed openapi/*.yaml
var openapiFiles embed.FS

// openapiHead is the file the others merge into.
const openapiHead = "openapi.yaml"

var openapiOnce = sync.OnceValues(func() ([]byte, error) { return assembleOpenAPI(openapiFiles) })

// OpenAPI is the API's OpenAPI 3.1 document as indented JSON, keys in the
// order the YAML gives them.
func OpenAPI() ([]byte, error) { return openapiOnce() }

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	doc, err := OpenAPI()
	if err != nil {
		writeError(w, &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "openapi_error", Message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(doc)
}

// assembleOpenAPI merges openapi/*.yaml of fsys (the head first, the rest
// by name) and encodes the result as JSON.
func assembleOpenAPI(fsys fs.FS) ([]byte, error) {
	names, err := fs.Glob(fsys, "openapi/*.yaml")
	if err != nil {
		return nil, err
	}
	head := "openapi/" + openapiHead
	if !slices.Contains(names, head) {
		return nil, fmt.Errorf("openapi: no %s", head)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return n == head })
	var doc *yaml.Node
	for _, name := range append([]string{head}, names...) {
		raw, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		var file yaml.Node
		if err := yaml.Unmarshal(raw, &file); err != nil {
			return nil, fmt.Errorf("serve/%s: %w", name, err)
		}
		if len(file.Content) != 1 || file.Content[0].Kind != yaml.MappingNode {
			return nil, fmt.Errorf("serve/%s: want a YAML mapping", name)
		}
		if doc == nil {
			doc = file.Content[0]
			continue
		}
		if err := mergeYAML(doc, file.Content[0], "serve/"+name, ""); err != nil {
			return nil, err
		}
	}
	var b bytes.Buffer
	if err := encodeYAMLAsJSON(&b, doc); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// mergeYAML adds src's keys to dst: a file adds paths and components
// (schemas, responses, ...), merged into the mappings of the same name;
// an item (a path, a schema) two files both define is an error naming it,
// so no part silently changes another's.
func mergeYAML(dst, src *yaml.Node, file, path string) error {
	for i := 0; i+1 < len(src.Content); i += 2 {
		k, v := src.Content[i], src.Content[i+1]
		at := path + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k.Value) // a JSON pointer
		j := -1
		for d := 0; d+1 < len(dst.Content); d += 2 {
			if dst.Content[d].Value == k.Value {
				j = d
			}
		}
		if j < 0 {
			dst.Content = append(dst.Content, k, v)
			continue
		}
		d := dst.Content[j+1]
		if d.Kind != yaml.MappingNode || v.Kind != yaml.MappingNode || (path != "" && path != "/components") {
			return fmt.Errorf("%s:%d: %s is defined in another file too", file, k.Line, at)
		}
		if err := mergeYAML(d, v, file, at); err != nil {
			return err
		}
	}
	return nil
}

// encodeYAMLAsJSON writes n as JSON, keeping the order of mapping keys.
func encodeYAMLAsJSON(b *bytes.Buffer, n *yaml.Node) error {
	switch n.Kind {
	case yaml.AliasNode:
		return encodeYAMLAsJSON(b, n.Alias)
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			if n.Content[i].Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: a mapping key must be a scalar", n.Content[i].Line)
			}
			writeJSONValue(b, n.Content[i].Value)
			b.WriteByte(':')
			if err := encodeYAMLAsJSON(b, n.Content[i+1]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodeYAMLAsJSON(b, c); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		var v any = n.Value // strings, and timestamps kept as written
		switch n.Tag {
		case "!!int", "!!float", "!!bool", "!!null":
			if err := n.Decode(&v); err != nil {
				return fmt.Errorf("line %d: %w", n.Line, err)
			}
		}
		writeJSONValue(b, v)
	default:
		return fmt.Errorf("line %d: unexpected YAML node", n.Line)
	}
	return nil
}

// writeJSONValue writes v without HTML escaping, so that descriptions read
// as written (<key>, not \u003ckey\u003e).
func writeJSONValue(b *bytes.Buffer, v any) {
	var s strings.Builder
	enc := json.NewEncoder(&s)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	b.WriteString(strings.TrimSuffix(s.String(), "\n"))
}
