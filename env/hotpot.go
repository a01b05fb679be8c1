package env

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/agemem/agemem/internal/jsonerr"
)

// hotpotRecord is one question in HotpotQA's official JSON format.
type hotpotRecord struct {
	ID              string            `json:"_id"`
	Question        string            `json:"question"`
	Answer          string            `json:"answer"`
	SupportingFacts []json.RawMessage `json:"supporting_facts"` // [title, sentence index]
	Context         []json.RawMessage `json:"context"`          // [title, [sentences]]
	Type            string            `json:"type"`
	Level           string            `json:"level"`
}

// LoadHotpot reads a whole HotpotQA-format file.
func LoadHotpot(path string) ([]Task, error) {
	var out []Task
	err := StreamHotpotFile(path, func(t Task) error {
		out = append(out, t)
		return nil
	})
	return out, err
}

// LoadScored reads a HotpotQA-format file of tasks that are played and
// scored (training, validation, evaluation): it must hold a task, and every
// task an answer. HotpotQA's test files carry none, and a policy scored
// against empty answers would get a table of zeros instead of an error.
func LoadScored(path string) ([]Task, error) {
	tasks, err := LoadHotpot(path)
	if err != nil {
		return nil, err
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("%s holds no tasks", path)
	}
	for i, t := range tasks {
		if strings.TrimSpace(t.Answer) == "" {
			return nil, fmt.Errorf("%s: record %d (_id %q) has no answer to score against (HotpotQA's test files have none: use the dev or train file)", path, i, t.ID)
		}
	}
	return tasks, nil
}

// StreamHotpotFile calls fn for each task of a HotpotQA-format file without
// holding the file in memory (the 90k-question training file is 540 MB).
// Errors name the file, the line and column and the record.
func StreamHotpotFile(path string, fn func(Task) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = StreamHotpot(f, fn)
	var pe *PositionError
	if errors.As(err, &pe) {
		line, col := lineCol(path, pe.Offset)
		return fmt.Errorf("%s:%d:%d: %s", path, line, col, pe.Msg)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// PositionError is malformed input at a byte offset.
type PositionError struct {
	Offset int64
	Msg    string
}

func (e *PositionError) Error() string { return fmt.Sprintf("byte %d: %s", e.Offset, e.Msg) }

// StreamHotpot decodes a JSON array of HotpotQA records from r, one record
// at a time.
func StreamHotpot(r io.Reader, fn func(Task) error) error {
	dec := json.NewDecoder(bufio.NewReaderSize(r, 1<<20))
	tok, err := dec.Token()
	if err != nil {
		return &PositionError{dec.InputOffset(), "expected a JSON array of HotpotQA records: " + err.Error()}
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return &PositionError{0, "expected a JSON array of HotpotQA records"}
	}
	for i := 0; dec.More(); i++ {
		start := dec.InputOffset()
		var rec hotpotRecord
		if err := dec.Decode(&rec); err != nil {
			off := start
			var se *json.SyntaxError
			var te *json.UnmarshalTypeError
			switch {
			case errors.As(err, &se):
				off = se.Offset
			case errors.As(err, &te):
				off = te.Offset
			}
			if _, msg, ok := jsonerr.Type(err); ok {
				return &PositionError{off, fmt.Sprintf("record %d: %s", i, msg)}
			}
			return &PositionError{off, fmt.Sprintf("record %d: %v", i, err)}
		}
		t, err := rec.task()
		if err != nil {
			return &PositionError{start, fmt.Sprintf("record %d (_id %q): %v", i, rec.ID, err)}
		}
		if err := fn(t); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return &PositionError{dec.InputOffset(), "unterminated array: " + err.Error()}
	}
	return nil
}

func (r hotpotRecord) task() (Task, error) {
	if r.ID == "" {
		return Task{}, errors.New(`missing "_id"`)
	}
	if strings.TrimSpace(r.Question) == "" {
		return Task{}, errors.New(`missing "question"`)
	}
	type para struct {
		title string
		sents []string
	}
	var paras []para
	byTitle := map[string]int{}
	for j, raw := range r.Context {
		var pair []json.RawMessage
		var p para
		if json.Unmarshal(raw, &pair) != nil || len(pair) != 2 ||
			json.Unmarshal(pair[0], &p.title) != nil || json.Unmarshal(pair[1], &p.sents) != nil {
			return Task{}, fmt.Errorf("context[%d] must be [title, [sentences...]]", j)
		}
		byTitle[p.title] = len(paras)
		paras = append(paras, p)
	}
	t := Task{ID: r.ID, Question: r.Question, Answer: r.Answer, Type: r.Type, Level: r.Level}
	gold := map[string]bool{}
	for j, raw := range r.SupportingFacts {
		var pair []json.RawMessage
		var title string
		var idx int
		if json.Unmarshal(raw, &pair) != nil || len(pair) != 2 ||
			json.Unmarshal(pair[0], &title) != nil || json.Unmarshal(pair[1], &idx) != nil {
			return Task{}, fmt.Errorf("supporting_facts[%d] must be [title, sentence index]", j)
		}
		p, ok := byTitle[title]
		if !ok {
			return Task{}, fmt.Errorf("supporting_facts[%d]: title %q is not in context", j, title)
		}
		gold[title] = true
		// The official files hold a few indices past a paragraph's end;
		// the reference evaluation skips them, and so do we.
		if idx < 0 || idx >= len(paras[p].sents) {
			continue
		}
		s := strings.TrimSpace(paras[p].sents[idx])
		t.SupportingFacts = append(t.SupportingFacts, s)
		t.Context = append(t.Context, s)
	}
	for _, p := range paras {
		if !gold[p.title] {
			t.Distractors = append(t.Distractors, strings.TrimSpace(strings.Join(trimAll(p.sents), " ")))
		}
	}
	return t, nil
}

func trimAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.TrimSpace(s)
	}
	return out
}

// lineCol turns a byte offset of path into a 1-based line and column.
func lineCol(path string, off int64) (int, int) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	buf := make([]byte, off)
	n, _ := io.ReadFull(f, buf)
	buf = buf[:n]
	line := bytes.Count(buf, []byte{'\n'}) + 1
	col := len(buf) - bytes.LastIndexByte(buf, '\n')
	return line, col
}

// WriteHotpot writes tasks made by the synthetic generator in the official
// format, one record per line.
func WriteHotpot(w io.Writer, recs []HotpotRecord) error {
	bw := bufio.NewWriter(w)
	bw.WriteString("[\n")
	for i, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		bw.Write(b)
		if i < len(recs)-1 {
			bw.WriteString(",")
		}
		bw.WriteString("\n")
	}
	bw.WriteString("]\n")
	return bw.Flush()
}

// HotpotRecord is a record to write in the official format.
type HotpotRecord struct {
	ID              string  `json:"_id"`
	Question        string  `json:"question"`
	Answer          string  `json:"answer"`
	SupportingFacts [][]any `json:"supporting_facts"`
	Context         [][]any `json:"context"`
	Type            string  `json:"type"`
	Level           string  `json:"level"`
}

// Task is rec as LoadHotpot reads it back from a file.
func (rec HotpotRecord) Task() (Task, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return Task{}, err
	}
	var r hotpotRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return Task{}, err
	}
	return r.task()
}
