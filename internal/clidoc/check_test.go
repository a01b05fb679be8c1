package clidoc

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// A command tree like the binaries': a root with a persistent --set, a
// subcommand with a flag, a nested one.
func tree() *cobra.Command {
	root := &cobra.Command{Use: "tool"}
	root.PersistentFlags().StringArray("set", nil, "")
	run := &cobra.Command{Use: "run", RunE: func(*cobra.Command, []string) error { return nil }}
	run.Flags().Int("steps", 0, "")
	data := &cobra.Command{Use: "data"}
	data.AddCommand(&cobra.Command{Use: "synth", RunE: func(*cobra.Command, []string) error { return nil }})
	root.AddCommand(run, data)
	return root
}

func TestLinesAndCheck(t *testing.T) {
	md := filepath.Join(t.TempDir(), "a.md")
	os.WriteFile(md, []byte("Run `tool run --nope` in prose: not a block.\n"+
		"```bash\n"+
		"# tool run --comment\n"+
		"$ tool run --steps 3 \\\n   --set rl.k=\"8\"\n"+
		"X=1 bin/tool data synth > out.json\n"+
		"echo hi | go run ./cmd/tool run --steps=2\n"+
		"other run --steps 3\n"+
		"tool run --stpes 3  # a comment -> here\n"+
		"tool dta synth\n"+
		"tool run --set rl.nope=1\n"+
		"# tool: config --set: unknown key rl.nope; ...\n"+
		"```\n"), 0o644)
	ls, err := Lines([]string{md}, "tool")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range ls {
		got = append(got, strings.Join(l.Args, " "))
	}
	want := []string{"run --steps 3 --set rl.k=8", "data synth", "run --steps=2", "run --stpes 3", "dta synth", "run --set rl.nope=1"}
	if !slices.Equal(got, want) || ls[0].N != 4 {
		t.Fatalf("lines %q (first at %d), want %q", got, ls[0].N, want)
	}
	sets, err := Check(tree(), ls[0])
	if err != nil || !slices.Equal(sets, []string{"rl.k=8"}) {
		t.Fatalf("a good line: %v, sets %v", err, sets)
	}
	for _, l := range ls[1:3] {
		if _, err := Check(tree(), l); err != nil {
			t.Fatalf("%q: %v", l.Text, err)
		}
	}
	if _, err := Check(tree(), ls[3]); err == nil || !strings.Contains(err.Error(), "--stpes") || !strings.Contains(err.Error(), md+":9") {
		t.Fatalf("a misspelt flag: %v", err)
	}
	if _, err := Check(tree(), ls[4]); err == nil || !strings.Contains(err.Error(), "dta") {
		t.Fatalf("a misspelt command: %v", err)
	}
	if ls[5].Fails != "config --set: unknown key rl.nope;" || ls[4].Fails != "" {
		t.Fatalf("the documented failure %q (and %q)", ls[5].Fails, ls[4].Fails)
	}
}
