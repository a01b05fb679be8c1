package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/clidoc"
	"github.com/agemem/agemem/setup"
)

// TestReferencesAreCurrent: docs/reference holds what `make docs` writes
// from the code now; a changed command, flag or config key without a
// regenerated reference fails here.
func TestReferencesAreCurrent(t *testing.T) {
	dir := t.TempDir()
	if err := writeReferences(newRoot(), dir, "../.."); err != nil {
		t.Fatal(err)
	}
	made := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		made[rel] = true
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join("../../docs/reference", rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("docs/reference/%s is not what the code generates: run `make docs`", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	old, _ := filepath.Glob("../../docs/reference/cli/agemem-train*.md")
	for _, p := range old {
		if rel := filepath.Join("cli", filepath.Base(p)); !made[rel] {
			t.Errorf("docs/reference/%s documents a command that no longer exists: run `make docs`", rel)
		}
	}
}

// TestDocumentedCommandsExist: every agemem-train command line in README.md
// and docs/ names a command and flags the CLI has, and its --set keys are
// config keys.
func TestDocumentedCommandsExist(t *testing.T) {
	files, err := clidoc.Markdown("../..")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := clidoc.Lines(files, "agemem-train")
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) < 10 {
		t.Fatalf("only %d agemem-train command lines in README and docs", len(lines))
	}
	for _, l := range lines {
		sets, err := clidoc.Check(newRoot(), l)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, kv := range sets {
			if _, err := setup.Load("", []string{kv}); err != nil && strings.Contains(err.Error(), "unknown key") && l.Fails == "" {
				t.Errorf("%s:%d: --set %s: %v", l.File, l.N, kv, err)
			}
		}
	}
	t.Logf("%d command lines checked", len(lines))
	// The ones that take seconds on the shipped tiny policy run, from the
	// repository's root as a reader would run them.
	t.Chdir("../..")
	ran := 0
	for _, l := range lines {
		if !quick(l.Args) {
			continue
		}
		root := newRoot()
		var out bytes.Buffer
		root.SetArgs(l.Args)
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetIn(strings.NewReader("Where was Marla Quenby born?\n"))
		err := root.Execute()
		switch {
		case l.Fails != "" && (err == nil || !strings.HasPrefix(err.Error(), l.Fails)):
			t.Errorf("%s:%d: %q: the docs show it failing with %q, it gave %v", l.File, l.N, l.Text, l.Fails, err)
		case l.Fails == "" && err != nil:
			t.Errorf("%s:%d: %q: %v\n%s", l.File, l.N, l.Text, err, out.String())
		}
		ran++
	}
	t.Logf("%d of them run", ran)
}

// quick says whether a documented command runs in seconds without
// writing into the tree: the config, and the shipped policy's generation
// and tokenisation, with every file it names there (not the output of an
// earlier step).
func quick(args []string) bool {
	if len(args) == 0 {
		return false
	}
	for _, a := range args {
		if _, v, ok := strings.Cut(a, "="); ok {
			a = v
		}
		if strings.Contains(a, "/") && !strings.Contains(a, " ") {
			if _, err := os.Stat(a); err != nil {
				return false
			}
		}
	}
	switch args[0] {
	case "config":
		return true
	case "generate", "tokenize":
		for _, a := range args {
			if strings.Contains(a, "checkpoints/tiny") {
				return true
			}
		}
	}
	return false
}

// TestDocsSpeakOfTheProduct: README and docs describe the product as it is:
// no dates but on a results page's "Measured on" lines, no narration of
// work sessions, no references to an issue tracker's issues.
func TestDocsSpeakOfTheProduct(t *testing.T) {
	files, err := clidoc.Markdown("../..")
	if err != nil {
		t.Fatal(err)
	}
	date := regexp.MustCompile(`\b20\d\d-\d\d-\d\d\b`)
	narration := regexp.MustCompile(`(?i)\b(this|last|next|previous|earlier|later|first|second|third|[a-z]+th) session\b|\bthe issue\b|\bissue #?\d+`)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			if date.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "Measured on") {
				t.Errorf("%s:%d: a date outside a \"Measured on\" line: %s", f, i+1, line)
			}
			if m := narration.FindString(line); m != "" {
				t.Errorf("%s:%d: %q narrates the work, not the product: %s", f, i+1, m, line)
			}
		}
	}
}
