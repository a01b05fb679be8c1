// Package locomo reads LoCoMo (long conversations with question answering,
// the benchmark of TA-Mem), writes synthetic conversations in its exact
// format, and scores predictions as LoCoMo's own evaluation does.
package locomo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/agemem/agemem/internal/jsonerr"
)

// Turn is one utterance of a session.
type Turn struct {
	Speaker     string `json:"speaker"`
	DiaID       string `json:"dia_id"` // "D<session>:<turn>"
	Text        string `json:"text"`
	ImgURL      any    `json:"img_url,omitempty"`
	BlipCaption string `json:"blip_caption,omitempty"`
}

// Session is one dated session of a conversation.
type Session struct {
	N        int
	DateTime string
	Turns    []Turn
}

// QA is one question. Answer is the gold answer as text (LoCoMo stores
// strings and numbers; a number is written as Python's str() would);
// category 5 (adversarial) questions have AdversarialAnswer instead.
type QA struct {
	Question          string   `json:"question"`
	Answer            string   `json:"-"`
	AdversarialAnswer string   `json:"adversarial_answer,omitempty"`
	Evidence          []string `json:"evidence"`
	Category          int      `json:"category"`
}

// Sample is one conversation with its questions.
type Sample struct {
	ID        string
	SpeakerA  string
	SpeakerB  string
	Sessions  []Session
	QA        []QA
	raw       map[string]json.RawMessage // the other fields, kept for writing back
	rawConv   map[string]json.RawMessage
	rawQA     []map[string]json.RawMessage
	dialogIDs map[string]bool
}

// Categories are LoCoMo's question categories by number.
var Categories = map[int]string{1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}

var sessionKey = regexp.MustCompile(`^session_(\d+)$`)

// Load reads a locomo10.json-style file: a JSON list of samples. Errors
// name the sample, the session and the turn or question.
func Load(path string) ([]Sample, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out, err := Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// Parse reads the JSON of a LoCoMo file.
func Parse(raw []byte) ([]Sample, error) {
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("not a JSON list of LoCoMo samples: %w", err)
	}
	out := make([]Sample, 0, len(list))
	ids := map[string]bool{}
	for i, m := range list {
		s, err := parseSample(m)
		if err != nil {
			name := fmt.Sprintf("sample %d", i)
			if s.ID != "" {
				name = fmt.Sprintf("sample %d (%s)", i, s.ID)
			}
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if ids[s.ID] {
			return nil, fmt.Errorf("sample %d: sample_id %q repeats an earlier one", i, s.ID)
		}
		ids[s.ID] = true
		out = append(out, s)
	}
	return out, nil
}

func parseSample(m map[string]json.RawMessage) (Sample, error) {
	s := Sample{raw: m, dialogIDs: map[string]bool{}}
	if err := json.Unmarshal(m["sample_id"], &s.ID); err != nil || s.ID == "" {
		return s, fmt.Errorf(`"sample_id" must be a non-empty string`)
	}
	if err := json.Unmarshal(m["conversation"], &s.rawConv); err != nil {
		return s, fmt.Errorf(`"conversation" must be an object: %v`, err)
	}
	json.Unmarshal(s.rawConv["speaker_a"], &s.SpeakerA)
	json.Unmarshal(s.rawConv["speaker_b"], &s.SpeakerB)
	if s.SpeakerA == "" || s.SpeakerB == "" {
		return s, fmt.Errorf(`the conversation needs "speaker_a" and "speaker_b"`)
	}
	for k, v := range s.rawConv {
		mm := sessionKey.FindStringSubmatch(k)
		if mm == nil {
			continue
		}
		n, _ := strconv.Atoi(mm[1])
		ses := Session{N: n}
		if err := json.Unmarshal(v, &ses.Turns); err != nil {
			return s, fmt.Errorf("%s: a list of turns {speaker, dia_id, text}: %v", k, err)
		}
		json.Unmarshal(s.rawConv[k+"_date_time"], &ses.DateTime)
		for t, tu := range ses.Turns {
			switch {
			case tu.DiaID == "":
				return s, fmt.Errorf("%s, turn %d: no dia_id", k, t)
			case tu.Speaker == "":
				return s, fmt.Errorf("%s, turn %d (%s): no speaker", k, t, tu.DiaID)
			case s.dialogIDs[tu.DiaID]:
				return s, fmt.Errorf("%s, turn %d: dia_id %q repeats", k, t, tu.DiaID)
			}
			s.dialogIDs[tu.DiaID] = true
		}
		s.Sessions = append(s.Sessions, ses)
	}
	if len(s.Sessions) == 0 {
		return s, fmt.Errorf("the conversation has no session_N")
	}
	sort.Slice(s.Sessions, func(a, b int) bool { return s.Sessions[a].N < s.Sessions[b].N })
	if err := json.Unmarshal(m["qa"], &s.rawQA); err != nil {
		return s, fmt.Errorf(`"qa" must be a list of questions: %v`, err)
	}
	for i, q := range s.rawQA {
		var qa QA
		b, _ := json.Marshal(q)
		if err := json.Unmarshal(b, &qa); err != nil {
			return s, fmt.Errorf("qa %d: %v", i, jsonerr.Explain(err))
		}
		if _, ok := Categories[qa.Category]; !ok {
			return s, fmt.Errorf("qa %d (%q): category %d is not 1-5", i, qa.Question, qa.Category)
		}
		if a, ok := q["answer"]; ok {
			text, err := answerText(a)
			if err != nil {
				return s, fmt.Errorf("qa %d (%q): answer: %v", i, qa.Question, err)
			}
			qa.Answer = text
		} else if qa.Category != 5 {
			return s, fmt.Errorf("qa %d (%q): no answer (only category 5 questions may lack one)", i, qa.Question)
		}
		s.QA = append(s.QA, qa)
	}
	return s, nil
}

// answerText is a gold answer as Python's str() writes it: strings as
// they are, integers as digits, other numbers as Python floats print.
func answerText(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		if i, err := strconv.ParseInt(x.String(), 10, 64); err == nil {
			return strconv.FormatInt(i, 10), nil
		}
		f, err := x.Float64()
		if err != nil {
			return "", err
		}
		return pyFloat(f), nil
	case bool:
		if x {
			return "True", nil
		}
		return "False", nil
	case nil:
		return "None", nil
	}
	return "", fmt.Errorf("a %T, want a string or a number", v)
}

// pyFloat formats f as Python's repr(float) does: the shortest digits
// that round-trip, positional for exponents in [-4, 16), else scientific
// with a two-digit exponent.
func pyFloat(f float64) string {
	mant, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
	n, _ := strconv.Atoi(exp)
	if n >= -4 && n < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if n < 0 {
		sign, n = "-", -n
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, n)
}

// HasDialog reports whether the sample has a turn with this dia_id.
func (s Sample) HasDialog(id string) bool { return s.dialogIDs[id] }
