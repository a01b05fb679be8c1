package locomo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/agemem/agemem/internal/jsonerr"
)

// Prediction is one line of a predictions file.
type Prediction struct {
	SampleID   string `json:"sample_id"`
	QAIndex    int    `json:"qa_index"` // position in that sample's qa list
	Prediction string `json:"prediction"`
	// Context, if given, is the dialogue ids (or "S<n>" sessions) the
	// method retrieved, for evidence recall.
	Context []string `json:"context,omitempty"`
	// An agent's retrieval, when the method has one (ta-mem): the tools it
	// called, its turns and its tokens (prompt and completion).
	Tools  []string `json:"tools,omitempty"`
	Turns  int      `json:"turns,omitempty"`
	Tokens int      `json:"tokens,omitempty"`
}

// ReadPredictions reads predictions JSONL; errors name the line.
func ReadPredictions(path string) ([]Prediction, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	var out []Prediction
	for line := 1; sc.Scan(); line++ {
		raw := strings.TrimSpace(sc.Text())
		if raw == "" {
			continue
		}
		var p Prediction
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("%s:%d: %v (want {\"sample_id\", \"qa_index\", \"prediction\", \"context\"?, \"tools\"?, \"turns\"?, \"tokens\"?})", path, line, jsonerr.Explain(err))
		}
		if p.SampleID == "" {
			return nil, fmt.Errorf("%s:%d: no sample_id", path, line)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// Scored is one question's score.
type Scored struct {
	SampleID   string  `json:"sample_id"`
	QAIndex    int     `json:"qa_index"`
	Category   int     `json:"category"`
	Question   string  `json:"question"`
	Answer     string  `json:"answer"`
	Prediction string  `json:"prediction"`
	F1         float64 `json:"f1"`
	// AMemF1 and BLEU1 are the second table's (A-Mem's utils.py): against
	// the answer as given, adversarial questions (no answer) included as 0.
	AMemF1     float64 `json:"amem_f1"`
	BLEU1      float64 `json:"bleu1"`
	Recall     float64 `json:"evidence_recall"`
	HasContext bool    `json:"has_context"`
}

// Cell is a mean over questions.
type Cell struct {
	Mean float64 `json:"mean"`
	N    int     `json:"n"`
}

// AMemCell is a category's A-Mem-style means.
type AMemCell struct {
	F1    float64 `json:"f1"`
	BLEU1 float64 `json:"bleu1"`
	N     int     `json:"n"`
}

// Report is the table: F1 per category and overall, evidence recall over
// the predictions that gave a context.
type Report struct {
	ByCategory map[string]Cell `json:"by_category"`
	Overall    Cell            `json:"overall"`
	// AMem is the second table other papers report (A-Mem's token F1 and
	// BLEU-1) by category, and over categories 1-4 as "overall" (they
	// leave the adversarial questions out).
	AMem   map[string]AMemCell `json:"amem"`
	Recall Cell                `json:"evidence_recall"`
	// Questions is how many questions the samples hold; Missing how many of
	// them have no prediction (not scored).
	Questions int `json:"questions"`
	Missing   int `json:"missing"`
	// Answered is how many predictions state an answer (retrieval-only
	// predictions carry only their context).
	Answered int `json:"answered"`
	// Agent is the retrieval agent's use of its tools by category, when
	// the predictions carry it (the paper's Figure 2, its turns and token
	// usage).
	Agent map[string]*AgentCell `json:"agent,omitempty"`
}

// AgentCell is an agent's retrieval over a category's questions.
type AgentCell struct {
	N      int            `json:"n"`
	Turns  float64        `json:"turns"`  // mean
	Tokens float64        `json:"tokens"` // mean
	Tools  map[string]int `json:"tools"`  // calls per tool
}

// Score scores predictions against the samples. A prediction naming an
// unknown sample or question, or one given twice, is an error.
func Score(samples []Sample, preds []Prediction) (Report, []Scored, error) {
	bySample := map[string]*Sample{}
	rep := Report{ByCategory: map[string]Cell{}, AMem: map[string]AMemCell{}}
	for i := range samples {
		bySample[samples[i].ID] = &samples[i]
		rep.Questions += len(samples[i].QA)
	}
	seen := map[string]bool{}
	var out []Scored
	sums := map[string]float64{}
	var total, recall float64
	for i, p := range preds {
		s := bySample[p.SampleID]
		if s == nil {
			return rep, nil, fmt.Errorf("prediction %d: no sample %q", i+1, p.SampleID)
		}
		if p.QAIndex < 0 || p.QAIndex >= len(s.QA) {
			return rep, nil, fmt.Errorf("prediction %d: sample %q has questions 0-%d, not %d", i+1, p.SampleID, len(s.QA)-1, p.QAIndex)
		}
		key := fmt.Sprintf("%s/%d", p.SampleID, p.QAIndex)
		if seen[key] {
			return rep, nil, fmt.Errorf("prediction %d: question %d of %q predicted twice", i+1, p.QAIndex, p.SampleID)
		}
		seen[key] = true
		q := s.QA[p.QAIndex]
		sc := Scored{SampleID: p.SampleID, QAIndex: p.QAIndex, Category: q.Category, Question: q.Question, Answer: q.Answer,
			Prediction: p.Prediction, F1: ScoreQA(q, p.Prediction), Recall: EvidenceRecall(q, p.Context), HasContext: p.Context != nil,
			AMemF1: AMemF1(p.Prediction, q.Answer), BLEU1: BLEU1(p.Prediction, q.Answer)}
		out = append(out, sc)
		if strings.TrimSpace(p.Prediction) != "" {
			rep.Answered++
		}
		for _, k := range []string{Categories[q.Category], "overall"} {
			if k == "overall" && q.Category == 5 {
				continue
			}
			a := rep.AMem[k]
			a.F1, a.BLEU1, a.N = a.F1+sc.AMemF1, a.BLEU1+sc.BLEU1, a.N+1
			rep.AMem[k] = a
		}
		cat := Categories[q.Category]
		if p.Tools != nil || p.Turns > 0 {
			if rep.Agent == nil {
				rep.Agent = map[string]*AgentCell{}
			}
			for _, k := range []string{cat, "overall"} {
				if k == "overall" && q.Category == 5 {
					continue // the paper's means are over categories 1-4
				}
				a := rep.Agent[k]
				if a == nil {
					a = &AgentCell{Tools: map[string]int{}}
					rep.Agent[k] = a
				}
				a.N++
				a.Turns += float64(p.Turns)
				a.Tokens += float64(p.Tokens)
				for _, t := range p.Tools {
					a.Tools[t]++
				}
			}
		}
		sums[cat] += sc.F1
		c := rep.ByCategory[cat]
		c.N++
		rep.ByCategory[cat] = c
		total += sc.F1
		if sc.HasContext {
			recall += sc.Recall
			rep.Recall.N++
		}
	}
	for cat, c := range rep.ByCategory {
		c.Mean = sums[cat] / float64(c.N)
		rep.ByCategory[cat] = c
	}
	for k, a := range rep.AMem {
		a.F1, a.BLEU1 = a.F1/float64(a.N), a.BLEU1/float64(a.N)
		rep.AMem[k] = a
	}
	for _, a := range rep.Agent {
		a.Turns /= float64(a.N)
		a.Tokens /= float64(a.N)
	}
	rep.Overall = Cell{N: len(out)}
	if len(out) > 0 {
		rep.Overall.Mean = total / float64(len(out))
	}
	if rep.Recall.N > 0 {
		rep.Recall.Mean = recall / float64(rep.Recall.N)
	}
	rep.Missing = rep.Questions - len(out)
	return rep, out, nil
}

// Print writes the table: F1 by category (LoCoMo's order), overall, and
// evidence recall.
func (r Report) Print(w io.Writer) {
	var cats []int
	for n := range Categories {
		cats = append(cats, n)
	}
	sort.Ints(cats)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "category\tquestions\tF1")
	for _, n := range cats {
		if c, ok := r.ByCategory[Categories[n]]; ok {
			fmt.Fprintf(tw, "%d %s\t%d\t%.4f\n", n, Categories[n], c.N, c.Mean)
		}
	}
	fmt.Fprintf(tw, "overall\t%d\t%.4f\n", r.Overall.N, r.Overall.Mean)
	tw.Flush()
	if len(r.AMem) > 0 {
		fmt.Fprintln(w, "\nA-Mem-style (token F1 of word sets, NLTK BLEU-1; overall over categories 1-4), as other memory papers report:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "category\tquestions\tF1\tBLEU-1")
		for _, n := range cats {
			if a, ok := r.AMem[Categories[n]]; ok {
				fmt.Fprintf(tw, "%d %s\t%d\t%.4f\t%.4f\n", n, Categories[n], a.N, a.F1, a.BLEU1)
			}
		}
		if a, ok := r.AMem["overall"]; ok {
			fmt.Fprintf(tw, "overall (1-4)\t%d\t%.4f\t%.4f\n", a.N, a.F1, a.BLEU1)
		}
		tw.Flush()
	}
	if r.Answered == 0 && r.Overall.N > 0 {
		fmt.Fprintln(w, "no prediction states an answer, so every F1 above is 0 (retrieval-only predictions are measured by evidence recall)")
	}
	if r.Recall.N > 0 {
		fmt.Fprintf(w, "evidence recall: %.4f over %d predictions with a context\n", r.Recall.Mean, r.Recall.N)
	}
	if len(r.Agent) > 0 {
		r.printAgent(w, cats)
	}
	if r.Missing > 0 {
		fmt.Fprintf(w, "%d of %d questions have no prediction (not scored)\n", r.Missing, r.Questions)
	}
}

// printAgent writes the retrieval agent's turns, tokens and share of each
// tool's calls by category (the paper's Figure 2), tools by name.
func (r Report) printAgent(w io.Writer, cats []int) {
	var tools []string
	for _, a := range r.Agent {
		for t := range a.Tools {
			if !slices.Contains(tools, t) {
				tools = append(tools, t)
			}
		}
	}
	sort.Strings(tools)
	fmt.Fprintln(w, "\nthe retrieval agent by category (turns and tokens a question; each tool's share of the calls):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "category\tquestions\tturns\ttokens")
	for _, t := range tools {
		fmt.Fprintf(tw, "\t%s", t)
	}
	fmt.Fprintln(tw)
	row := func(name string, a *AgentCell) {
		calls := 0
		for _, n := range a.Tools {
			calls += n
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f", name, a.N, a.Turns, a.Tokens)
		for _, t := range tools {
			share := 0.0
			if calls > 0 {
				share = float64(a.Tools[t]) / float64(calls)
			}
			fmt.Fprintf(tw, "\t%.2f", share)
		}
		fmt.Fprintln(tw)
	}
	for _, n := range cats {
		if a, ok := r.Agent[Categories[n]]; ok {
			row(fmt.Sprintf("%d %s", n, Categories[n]), a)
		}
	}
	if a, ok := r.Agent["overall"]; ok {
		row("overall (1-4)", a)
	}
	tw.Flush()
}
