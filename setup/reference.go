package setup

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"time"
)

// Reference writes the configuration reference in Markdown: every key of
// the config, in the order the config structs declare them, with its type,
// its default and the comment its field carries in the source under root
// (the module's directory), so the page cannot drift from the code.
func Reference(w io.Writer, root string) error {
	docs := fieldDocs{root: root, seen: map[string]map[string]string{}}
	def := reflect.ValueOf(Default())
	fmt.Fprint(w, `# Configuration reference

Every key the YAML config takes (`+"`--config FILE`"+`, and `+"`--set key=value`"+` on
every command), with its type and default. Generated from the config
structs and their comments by `+"`make docs`"+`; do not edit by hand.
`)
	t := def.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		fmt.Fprintf(w, "\n## %s\n\n", name)
		if d := docs.of(t, f.Name); d != "" {
			fmt.Fprintf(w, "%s\n\n", d)
		}
		if f.Type.Kind() != reflect.Struct || f.Type == reflect.TypeOf(time.Duration(0)) {
			fmt.Fprintf(w, "| key | type | default | |\n| --- | --- | --- | --- |\n")
			fmt.Fprintf(w, "| `%s` | %s | %s | |\n", name, typeName(f.Type), value(def.Field(i)))
			continue
		}
		fmt.Fprintf(w, "| key | type | default | meaning |\n| --- | --- | --- | --- |\n")
		if err := docs.rows(w, name, def.Field(i)); err != nil {
			return err
		}
	}
	return docs.err
}

// fieldDocs reads the comments of struct fields from the package sources.
type fieldDocs struct {
	root string
	seen map[string]map[string]string // "pkgpath.Type" → field → comment
	err  error
}

func (d *fieldDocs) rows(w io.Writer, prefix string, v reflect.Value) error {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if err := d.rows(w, prefix, v.Field(i)); err != nil {
				return err
			}
			continue
		}
		name := yamlName(f)
		if name == "" {
			continue
		}
		key := prefix + "." + name
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
			if err := d.rows(w, key, v.Field(i)); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(w, "| `%s` | %s | %s | %s |\n", key, typeName(f.Type), value(v.Field(i)), cell(d.of(t, f.Name)))
	}
	return nil
}

// of is the comment of field name of struct type t (doc comment above the
// field, else the line comment after it).
func (d *fieldDocs) of(t reflect.Type, name string) string {
	id := t.PkgPath() + "." + t.Name()
	fields, ok := d.seen[id]
	if !ok {
		fields = d.parse(t)
		d.seen[id] = fields
	}
	return fields[name]
}

func (d *fieldDocs) parse(t reflect.Type) map[string]string {
	out := map[string]string{}
	rel, ok := strings.CutPrefix(t.PkgPath(), "github.com/agemem/agemem")
	if !ok {
		return out
	}
	// Files are parsed one by one: parser.ParseDir is deprecated, and the
	// package's non-test files are all the reference needs.
	dir := filepath.Join(d.root, filepath.FromSlash(rel))
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		d.err = fmt.Errorf("config reference: %w", err)
		return out
	}
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			d.err = fmt.Errorf("config reference: %w", err)
			return out
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != t.Name() {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			for _, fl := range st.Fields.List {
				text := fl.Doc.Text()
				if text == "" {
					text = fl.Comment.Text()
				}
				for _, n := range fl.Names {
					out[n.Name] = strings.Join(strings.Fields(text), " ")
				}
			}
			return false
		})
	}
	return out
}

func yamlName(f reflect.StructField) string {
	tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
	if tag == "-" {
		return ""
	}
	return tag
}

func typeName(t reflect.Type) string {
	switch {
	case t == reflect.TypeOf(time.Duration(0)):
		return "duration"
	case t.Kind() == reflect.Slice:
		return "list of " + typeName(t.Elem())
	case t.Kind() == reflect.Map:
		return "map of " + typeName(t.Elem())
	case t.Kind() == reflect.Struct:
		return "object"
	case t.Kind() == reflect.Pointer:
		return typeName(t.Elem())
	}
	return t.Kind().String()
}

func value(v reflect.Value) string {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "unset"
		}
		v = v.Elem()
	}
	switch {
	case v.Type() == reflect.TypeOf(time.Duration(0)):
		return "`" + time.Duration(v.Int()).String() + "`"
	case v.Kind() == reflect.String && v.String() == "":
		return `""`
	case (v.Kind() == reflect.Slice || v.Kind() == reflect.Map) && v.Len() == 0:
		return "empty"
	}
	return "`" + cell(fmt.Sprint(v.Interface())) + "`"
}

// cell keeps a table cell on one line.
func cell(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ") }
