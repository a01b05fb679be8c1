// Package nestful is the NESTFUL benchmark (Basu et al., 2024: nested
// sequences of API calls, where a call's output is an argument of a later
// one) as MemToolAgent evaluates it: its published data, the model's
// answer read back as a call sequence, NESTFUL's metrics (function and
// parameter F1, partial and full sequence accuracy, win rate by executing
// the calls with the benchmark's own Python functions) and the agent with
// and without MemToolAgent's memory.
package nestful

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Sample is one NESTFUL record (data_v2/nestful_data.jsonl).
type Sample struct {
	ID     string `json:"sample_id"`
	Input  string `json:"input"`
	Output []Call `json:"output"` // the gold sequence
	Tools  []Tool `json:"tools"`
	// GoldAnswer is what executing Output returns, as JSON.
	GoldAnswer json.RawMessage `json:"gold_answer"`
}

// Call is one function call of a sequence: its output is labelled
// ("$var_1") and a later argument "$var_1.result$" is that output.
type Call struct {
	Name      string `json:"name"`
	Label     string `json:"label,omitempty"`
	Arguments Args   `json:"arguments"`
	// badArgs: the call's arguments were not an object (the scorer still
	// counts its name; it cannot run).
	badArgs bool
}

// UnmarshalJSON reads a call: a name (a string), an optional label and
// arguments in their order. Arguments that are not an object are kept as
// none, marked, as NESTFUL's scorer keeps such a call's name.
func (c *Call) UnmarshalJSON(b []byte) error {
	// Keys as written (Go's field matching ignores case; Python's does not).
	var r map[string]json.RawMessage
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	var name string
	if raw, ok := r["name"]; !ok || json.Unmarshal(raw, &name) != nil {
		return errors.New("a call without a name")
	}
	*c = Call{Name: name}
	if raw, ok := r["label"]; ok {
		var l any
		if json.Unmarshal(raw, &l) == nil && l != nil {
			if s, ok := l.(string); ok {
				c.Label = s
			} else {
				c.Label = pyStr(l)
			}
		}
	}
	if raw, ok := r["arguments"]; ok {
		if err := c.Arguments.UnmarshalJSON(raw); err != nil {
			c.Arguments, c.badArgs = nil, true
		}
	}
	return nil
}

// Tool is a function's specification as the data gives it.
type Tool struct {
	Name        string         `json:"name"`
	Description string         `json:"description"`
	Parameters  map[string]any `json:"parameters"`
	// The output's name: output_parameters in the scorer, output_parameter
	// in some copies of the data.
	OutputParameters map[string]any `json:"output_parameters,omitempty"`
	OutputParameter  map[string]any `json:"output_parameter,omitempty"`
	// raw is the specification as the data wrote it (every key, in its
	// order): what the prompt shows and the executor reads.
	raw json.RawMessage
}

// UnmarshalJSON reads a tool and keeps its text.
func (t *Tool) UnmarshalJSON(b []byte) error {
	type plain Tool
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*t = Tool(p)
	t.raw = append(json.RawMessage(nil), b...)
	return nil
}

// MarshalJSON writes the tool as the data wrote it (its fields when made
// in code).
func (t Tool) MarshalJSON() ([]byte, error) {
	if len(t.raw) > 0 {
		var b bytes.Buffer
		if err := json.Compact(&b, t.raw); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
	type plain Tool
	return json.Marshal(plain(t))
}

// Load reads NESTFUL records: JSON lines (the GitHub release) or one JSON
// array. The Hugging Face export writes output, tools and gold_answer as
// JSON text inside strings; those are decoded too. A record that is not
// JSON, has no input or no gold calls, or a call without a name, is an
// error naming the file and line.
func Load(path string) ([]Sample, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Sample
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] == '[' {
		var recs []json.RawMessage
		if err := json.Unmarshal(t, &recs); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for i, r := range recs {
			s, err := decode(r)
			if err != nil {
				return nil, fmt.Errorf("%s: record %d: %w", path, i+1, err)
			}
			out = append(out, s)
		}
	} else {
		sc := bufio.NewScanner(bytes.NewReader(raw))
		sc.Buffer(nil, 64<<20)
		for line := 1; sc.Scan(); line++ {
			if len(bytes.TrimSpace(sc.Bytes())) == 0 {
				continue
			}
			s, err := decode(sc.Bytes())
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, line, err)
			}
			out = append(out, s)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no NESTFUL records", path)
	}
	return out, nil
}

// decode reads one record, unwrapping fields given as JSON text.
func decode(raw []byte) (Sample, error) {
	var r struct {
		ID         json.RawMessage `json:"sample_id"`
		Input      string          `json:"input"`
		Output     json.RawMessage `json:"output"`
		Tools      json.RawMessage `json:"tools"`
		GoldAnswer json.RawMessage `json:"gold_answer"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return Sample{}, err
	}
	var s Sample
	var id any
	if len(r.ID) > 0 {
		if err := json.Unmarshal(r.ID, &id); err != nil {
			return s, fmt.Errorf("sample_id: %w", err)
		}
	}
	if id != nil {
		s.ID = fmt.Sprint(id)
	}
	s.Input = r.Input
	if strings.TrimSpace(s.Input) == "" {
		return s, fmt.Errorf("sample %s: no input", s.ID)
	}
	if err := unwrap(r.Output, &s.Output); err != nil {
		return s, fmt.Errorf("sample %s: output: %w", s.ID, err)
	}
	if len(s.Output) == 0 {
		return s, fmt.Errorf("sample %s: no gold calls (output)", s.ID)
	}
	for i, c := range s.Output {
		if c.Name == "" {
			return s, fmt.Errorf("sample %s: gold call %d has no name", s.ID, i+1)
		}
	}
	if err := unwrap(r.Tools, &s.Tools); err != nil {
		return s, fmt.Errorf("sample %s: tools: %w", s.ID, err)
	}
	if len(r.GoldAnswer) > 0 {
		s.GoldAnswer = r.GoldAnswer
		// The Hugging Face export's gold_answer is text: the JSON it
		// holds when it parses as JSON, else the answer is that string.
		var str string
		if json.Unmarshal(r.GoldAnswer, &str) == nil && json.Valid([]byte(str)) {
			s.GoldAnswer = json.RawMessage(str)
		}
	}
	return s, nil
}

// unwrap decodes raw into v, or the JSON text raw holds as a string.
func unwrap(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] == '"' {
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return err
		}
		raw = json.RawMessage(text)
	}
	return json.Unmarshal(raw, v)
}

var (
	thinkBlock = regexp.MustCompile(`(?s)<think>.*?</think>`)
	codeBlock  = regexp.MustCompile("(?s)```(?:json)?\\s*(.*?)```")
)

// ParseCalls reads the model's answer back as a call sequence: the whole
// answer as JSON, else a fenced code block, else the text from the first
// '[' to the last ']' (a reasoning model's <think> block dropped first).
// A single call object is a sequence of one. An element of the list that
// is not a call (not an object, or without a string name) is left out and
// counted in bad, as NESTFUL's scorer counts a call it cannot parse. An
// answer with no list in it is an error quoting its start.
func ParseCalls(text string) (calls []Call, bad int, err error) {
	text = strings.TrimSpace(thinkBlock.ReplaceAllString(text, ""))
	try := []string{text}
	for _, m := range codeBlock.FindAllStringSubmatch(text, -1) {
		try = append(try, m[1])
	}
	if i, j := strings.Index(text, "["), strings.LastIndex(text, "]"); i >= 0 && j > i {
		try = append(try, text[i:j+1])
	}
	for _, t := range try {
		t = strings.TrimSpace(t)
		var elems []json.RawMessage
		if err := json.Unmarshal([]byte(t), &elems); err == nil {
			calls, bad = nil, 0
			for _, e := range elems {
				var c Call
				if err := json.Unmarshal(e, &c); err != nil {
					bad++
					continue
				}
				calls = append(calls, c)
			}
			return calls, bad, nil
		}
		var one Call
		if json.Unmarshal([]byte(t), &one) == nil {
			return []Call{one}, 0, nil
		}
	}
	quote := text
	if len(quote) > 120 {
		quote = quote[:120] + "..."
	}
	return nil, 0, fmt.Errorf("nestful: no JSON list of calls in the answer %q", quote)
}
