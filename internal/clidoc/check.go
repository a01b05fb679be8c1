package clidoc

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// Line is a command line found in a Markdown file.
type Line struct {
	File string
	N    int      // the line it starts on
	Args []string // after the binary's name
	Text string
	// Fails is the error the docs show the line ending with: the comment
	// line after it, when that starts with the binary's name and a colon
	// ("# agemem-train: config --set: unknown key ..."), without the "..."
	// a shortened message ends with.
	Fails string
}

// Lines are the command lines of binary (its name, also as bin/NAME,
// ./bin/NAME or go run ./cmd/NAME, after any VAR=value assignments and a
// "$ " prompt) in the fenced code blocks of the Markdown files, a line
// ending in "\" continued on the next.
func Lines(files []string, binary string) ([]Line, error) {
	var out []Line
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		fenced, n, start := false, 0, 0
		var cont strings.Builder
		for sc.Scan() {
			n++
			l := sc.Text()
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				fenced = !fenced
				continue
			}
			if !fenced {
				continue
			}
			if cont.Len() == 0 {
				start = n
			}
			if t, ok := strings.CutSuffix(strings.TrimRight(l, " "), `\`); ok {
				cont.WriteString(t + " ")
				continue
			}
			cont.WriteString(l)
			text := cont.String()
			cont.Reset()
			if msg, ok := strings.CutPrefix(strings.TrimSpace(l), "# "+binary+": "); ok && len(out) > 0 && out[len(out)-1].File == f && out[len(out)-1].N == start-1 {
				out[len(out)-1].Fails = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(msg), "..."))
				continue
			}
			if args, ok := commandOf(text, binary); ok {
				out = append(out, Line{File: f, N: start, Args: args, Text: strings.TrimSpace(text)})
			}
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return out, nil
}

// commandOf splits a shell line and returns the arguments after binary,
// or false when the line does not run it (comments, other commands,
// pipelines into it are read from the binary's name on).
func commandOf(text, binary string) ([]string, bool) {
	text = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "$ "))
	if strings.HasPrefix(text, "#") {
		return nil, false
	}
	if i := strings.Index(text, "| "); i >= 0 { // echo x | binary ...: the binary's part
		text = text[i+2:]
	}
	words := split(text)
	for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
		words = words[1:] // VAR=value
	}
	switch {
	case len(words) >= 3 && words[0] == "go" && words[1] == "run" && strings.TrimPrefix(words[2], "./") == "cmd/"+binary:
		return cut(words[3:]), true
	case len(words) > 0 && (words[0] == binary || strings.HasSuffix(words[0], "/"+binary)):
		return cut(words[1:]), true
	}
	return nil, false
}

// cut ends a command at a shell operator or redirection.
func cut(args []string) []string {
	for i, a := range args {
		switch a {
		case "|", "&&", "||", ";", ">", ">>", "2>", "2>&1", "&", "<":
			return args[:i]
		}
	}
	return args
}

// split splits a shell line into words: quotes group, and are removed; a
// word starting with # starts a comment.
func split(s string) []string {
	var out []string
	var w strings.Builder
	var quote rune
	in := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == '#' && !in: // a comment to the end of the line
			return out
		case r == ' ' || r == '\t':
			if in {
				out = append(out, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if in {
		out = append(out, w.String())
	}
	return out
}

// Check finds args' command in root and parses its flags: an unknown
// command or flag is the error, naming the line. It returns the values
// of every --set flag (to check the keys against the config).
func Check(root *cobra.Command, l Line) (sets []string, err error) {
	cmd, rest, err := root.Find(l.Args)
	if err != nil {
		return nil, fmt.Errorf("%s:%d: %q: %w", l.File, l.N, l.Text, err)
	}
	if len(l.Args) > 0 && cmd == root && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") && root.Args != nil && root.Args(root, rest[:1]) != nil {
		return nil, fmt.Errorf("%s:%d: %q: unknown command %q", l.File, l.N, l.Text, rest[0])
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return nil, fmt.Errorf("%s:%d: %q: %s: %w", l.File, l.N, l.Text, cmd.CommandPath(), err)
	}
	if f := cmd.Flags().Lookup("set"); f != nil && f.Changed {
		if sv, ok := f.Value.(interface{ GetSlice() []string }); ok {
			sets = sv.GetSlice()
		}
	}
	return sets, nil
}

// Markdown are README.md and every .md file under docs/ of the module at
// root.
func Markdown(root string) ([]string, error) {
	files := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return filepath.SkipDir
			}
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") && !strings.Contains(p, filepath.Join("docs", "reference")) {
			files = append(files, p)
		}
		return nil
	})
	return files, err
}
