package workbench

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Task is one row of a WorkBench *_queries_and_answers.csv file.
type Task struct {
	Query string
	// Answer are the gold actions, as written in the file.
	Answer         []string
	BaseTemplate   string
	ChosenTemplate string
	Domains        []string
}

// EmbeddedTasks are the tasks of a domain shipped with the sandbox
// (analytics, calendar or email).
func EmbeddedTasks(domain string) ([]Task, error) {
	f, err := embedded.Open("data/" + domain + "_queries_and_answers.csv")
	if err != nil {
		return nil, fmt.Errorf("workbench: no embedded tasks for %q (analytics, calendar, email)", domain)
	}
	defer f.Close()
	return readTasks(f, domain+"_queries_and_answers.csv")
}

// LoadTasks reads a queries-and-answers CSV file (header query, answer,
// base_template, chosen_template, domains; answer and domains are Python
// lists of strings). Errors name the file, the line and the column.
func LoadTasks(path string) ([]Task, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readTasks(f, path)
}

func readTasks(f io.Reader, path string) ([]Task, error) {
	r := csv.NewReader(f)
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: header: %w", path, err)
	}
	idx := map[string]int{}
	for i, h := range head {
		idx[h] = i
	}
	for _, want := range []string{"query", "answer", "base_template", "chosen_template", "domains"} {
		if _, ok := idx[want]; !ok {
			return nil, fmt.Errorf("%s: no %q column (columns %v)", path, want, head)
		}
	}
	var out []Task
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		line, _ := r.FieldPos(0)
		t := Task{Query: rec[idx["query"]], BaseTemplate: rec[idx["base_template"]], ChosenTemplate: rec[idx["chosen_template"]]}
		if t.Answer, err = pyStrings(rec[idx["answer"]]); err != nil {
			return nil, fmt.Errorf("%s:%d: answer: %w", path, line, err)
		}
		if t.Domains, err = pyStrings(rec[idx["domains"]]); err != nil {
			return nil, fmt.Errorf("%s:%d: domains: %w", path, line, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// pyStrings parses a Python list of string literals: ['a', "b"] or [].
func pyStrings(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
		return nil, fmt.Errorf("%.60q is not a Python list", s)
	}
	body := strings.TrimSpace(s[1 : len(s)-1])
	out := []string{}
	for body != "" {
		q := body[0]
		if q != '\'' && q != '"' {
			return nil, fmt.Errorf("%.60q: an element is not a string", body)
		}
		end := -1
		for i := 1; i < len(body); i++ {
			if body[i] == '\\' {
				i++
				continue
			}
			if body[i] == q {
				end = i
				break
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("%.60q: unterminated string", body)
		}
		v, err := unquotePython(body[1:end])
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		body = strings.TrimSpace(body[end+1:])
		if strings.HasPrefix(body, ",") {
			body = strings.TrimSpace(body[1:])
		} else if body != "" {
			return nil, fmt.Errorf("%.60q: expected a comma", body)
		}
	}
	return out, nil
}

// Run executes actions on a fresh sandbox as WorkBench's scorer does: an
// action that cannot be parsed or raises is skipped.
func (d *Data) Run(actions []string) *Sandbox {
	s := d.New()
	for _, a := range actions {
		act, err := ParseAction(a)
		if err != nil {
			continue
		}
		s.Call(act.Tool, act.Args())
	}
	return s
}

// Score is one task's outcome as WorkBench measures it.
type Score struct {
	// Correct: the state after the agent's actions equals the state after
	// the gold actions (is_correct).
	Correct bool `json:"correct"`
	// ExactMatch: the agent's side-effect actions, lower-cased and sorted,
	// are the gold ones.
	ExactMatch bool `json:"exact_match"`
	// SideEffects: the agent changed the state, and not correctly
	// (has_side_effects).
	SideEffects bool `json:"side_effects"`
}

// Grade scores predicted actions against gold ones. failed marks a run
// that ended in error (WorkBench's error column): never correct.
func (d *Data) Grade(predicted, gold []string, failed bool) Score {
	after, want := d.Run(predicted), d.Run(gold)
	correct := !failed && after.Equal(want)
	return Score{
		Correct:     correct,
		ExactMatch:  exactMatch(predicted, gold),
		SideEffects: !after.same(d.New()) && !after.Equal(want),
	}
}

func exactMatch(predicted, gold []string) bool {
	var p []string
	for _, a := range predicted {
		// get_function_name: the first two dotted parts before "(".
		parts := strings.Split(strings.SplitN(a, "(", 2)[0], ".")
		name := strings.Join(parts[:min(2, len(parts))], ".")
		if t, ok := ByName(name); ok && t.SideEffects {
			p = append(p, strings.ToLower(a))
		}
	}
	g := make([]string, len(gold))
	for i, a := range gold {
		g[i] = strings.ToLower(a)
	}
	slices.Sort(p)
	slices.Sort(g)
	return slices.Equal(p, g)
}
