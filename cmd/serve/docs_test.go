package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/clidoc"
	"github.com/agemem/agemem/serve"
	"github.com/agemem/agemem/setup"
)

// TestCLIReferenceIsCurrent: docs/reference/cli holds the serve pages
// `make docs` writes from the command tree now.
func TestCLIReferenceIsCurrent(t *testing.T) {
	dir := t.TempDir()
	if err := clidoc.Write(newRoot(), dir); err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(dir, "*.md"))
	if len(pages) < 3 {
		t.Fatalf("%d pages written", len(pages))
	}
	for _, p := range pages {
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join("../../docs/reference/cli", filepath.Base(p)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("docs/reference/cli/%s is not what the code generates: run `make docs`", filepath.Base(p))
		}
	}
}

// TestOpenAPIReferenceIsCurrent: docs/reference/openapi.json is the
// document serve serves at /openapi.json, as `make docs` writes it.
func TestOpenAPIReferenceIsCurrent(t *testing.T) {
	want, err := serve.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/reference/openapi.json")
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("docs/reference/openapi.json is not the document serve serves: run `make docs`")
	}
}

// TestDocumentedCommandsExist: every serve command line in README.md and
// docs/ names a command and flags serve has, and its --set keys are config
// keys.
func TestDocumentedCommandsExist(t *testing.T) {
	files, err := clidoc.Markdown("../..")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := clidoc.Lines(files, "serve")
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) < 3 {
		t.Fatalf("only %d serve command lines in README and docs", len(lines))
	}
	for _, l := range lines {
		sets, err := clidoc.Check(newRoot(), l)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, kv := range sets {
			if _, err := setup.Load("", []string{kv}); err != nil && strings.Contains(err.Error(), "unknown key") {
				t.Errorf("%s:%d: --set %s: %v", l.File, l.N, kv, err)
			}
		}
	}
	t.Logf("%d command lines checked", len(lines))
}
