// Package eval is the paper's held-out comparison (Tables 2-4): policies
// play the same tasks in the environment training plays, built by roles
// from the same config (runtime, embedder, summariser), and are scored by
// the reward section's own judges, so what is evaluated is what was
// trained. It reports the judge score J, exact match, memory quality MQ,
// context size and tool use, each with its standard error and by question
// type.
package eval

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/rl/reward"
	"github.com/agemem/agemem/rl/rollout"
	"github.com/agemem/agemem/setup"
)

// Method is one row of the table.
type Method struct {
	Name string
	// Dir is a model directory (a Hugging Face directory or a PEFT adapter)
	// played by the native engine, greedily; empty plays Scripted.
	Dir string
	// Scripted is a scripted policy: no-memory or oracle.
	Scripted string
	// Policy, when set, plays instead: a model behind an API (Ollama, an
	// OpenAI-compatible server), one task at a time.
	Policy llm.Model
	// Tools is the tool subset it plays with (tools.subset: all, ltm, stm);
	// empty: the config's.
	Tools string
}

// Options are an evaluation's inputs.
type Options struct {
	Config  setup.Config
	Tasks   []env.Task
	Methods []Method
	Log     io.Writer // progress (nil: none)
}

// Stat is a mean over tasks with its standard error.
type Stat struct {
	Mean float64 `json:"mean"`
	SE   float64 `json:"se"`
}

// Row is one policy's results.
type Row struct {
	Policy       string             `json:"policy"`
	Tasks        int                `json:"tasks"`
	J            Stat               `json:"j"`
	EM           Stat               `json:"em"`
	MQ           Stat               `json:"mq"`
	Answered     float64            `json:"answered"`
	PromptTokens float64            `json:"avg_prompt_tokens"`
	ToolCalls    map[string]float64 `json:"avg_tool_calls"`
	FormatErrors float64            `json:"avg_format_errors"`
	// ContextFull is the share of tasks that ended unanswered because the
	// agent's context outgrew the model.
	ContextFull float64 `json:"context_full"`
	// ByType is J by question type (bridge, comparison).
	ByType map[string]Stat `json:"j_by_type"`
	// ByAnswer is J by the gold answer's form: "yes/no" or "span" (the
	// split HotpotQA analyses report: a policy can gain on yes/no
	// questions by its answers' form alone).
	ByAnswer map[string]Stat `json:"j_by_answer"`
	// SaysYes is the share of the yes/no questions answered "yes" (a
	// policy that cannot compare says one of them always; 0 without
	// such questions).
	SaysYes float64 `json:"says_yes"`
	// PerTask is each task's J, in task order (paired comparisons).
	PerTask []float64 `json:"per_task_j"`
	// Answers are the final answers, in task order ("" where the episode
	// ended unanswered), so a loss can be read without replaying it.
	Answers []string `json:"per_task_answer"`
}

// Run plays every task with every policy and scores them.
func Run(ctx context.Context, o Options) ([]Row, error) {
	h, err := setup.NewHelpers(ctx, o.Config)
	if err != nil {
		return nil, err
	}
	rew, err := setup.Reward(ctx, o.Config, h)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, p := range o.Methods {
		cfg := o.Config
		if p.Tools != "" {
			cfg.Tools.Subset = p.Tools
			if err := cfg.Tools.Validate(); err != nil {
				return nil, fmt.Errorf("%s: tools: %w", p.Name, err)
			}
		}
		outs, err := play(ctx, cfg, h, o.Tasks, p, o.Log)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.Name, err)
		}
		row, err := score(ctx, p.Name, outs, rew.Judges.Task, o.Config.Reward.StorageF1Threshold)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.Name, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// play runs one rollout of every task: scripted and API policies one task
// at a time, a model directory all tasks decoded together.
func play(ctx context.Context, cfg setup.Config, h setup.Helpers, tasks []env.Task, p Method, log io.Writer) ([]env.Outcome, error) {
	if p.Dir == "" {
		e := setup.AgeMem(cfg, h, tasks, nil)
		var outs []env.Outcome
		var pr *train.Progress
		if log != nil {
			pr = train.NewProgress(log, len(tasks), false)
		}
		for i, t := range tasks {
			pol := p.Policy
			switch {
			case pol != nil:
			case p.Scripted == "no-memory":
				pol = env.NewNoMemory(t)
			case p.Scripted == "oracle":
				pol = env.NewOracle(t, 0, 0, uint64(cfg.Seed)).Offering(cfg.Tools.Offered())
			default:
				return nil, fmt.Errorf("no model directory, API policy or scripted policy (no-memory, oracle)")
			}
			out, err := e.Play(ctx, pol, i, uint64(i))
			if err != nil {
				return nil, err
			}
			outs = append(outs, out)
			if pr != nil {
				pr.Update(i+1, p.Name)
			}
		}
		return outs, nil
	}
	be, err := device.Open(cfg.Model.Device, logOrDiscard(log))
	if err != nil {
		return nil, err
	}
	cp, err := native.Open(be, p.Dir, "", cfg.Model.Generation())
	if err != nil {
		return nil, err
	}
	defer cp.Model.Close()
	pol := cp.Start(native.Options{Sampling: llm.Sampling{MaxTokens: cfg.Agent.ResponseBudget},
		Engine: engine.Options{PrefixBudget: len(tasks) * cp.Model.MaxPositions}})
	defer pol.Close()
	e := setup.AgeMem(cfg, h, tasks, cp.Tokenizer)
	idx := make([]int, len(tasks))
	for i := range idx {
		idx[i] = i
	}
	ro := rollout.Options{K: 1, Seed: uint64(cfg.Seed)}
	if log != nil {
		pr := train.NewProgress(log, len(tasks), false)
		ro.Done = func(finished, _ int) { pr.Update(finished, p.Name) }
	}
	rs, _, err := rollout.Run(ctx, pol, e, idx, ro)
	if err != nil {
		return nil, err
	}
	outs := make([]env.Outcome, len(rs))
	for i, r := range rs {
		if r.Err != nil {
			return nil, r.Err
		}
		outs[i] = r.Result
	}
	return outs, nil
}

func logOrDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// The gold answer's forms of Row.ByAnswer.
const (
	AnswerYesNo = "yes/no"
	AnswerSpan  = "span"
)

func score(ctx context.Context, name string, outs []env.Outcome, judge reward.Judge, thr float64) (Row, error) {
	row := Row{Policy: name, Tasks: len(outs), ToolCalls: map[string]float64{}, ByType: map[string]Stat{}, ByAnswer: map[string]Stat{}}
	n := float64(len(outs))
	var j, em, mq []float64
	byType, byAnswer := map[string][]float64{}, map[string][]float64{}
	yes := 0
	for _, o := range outs {
		r, t := o.Result, o.Task
		s := 0.0
		if r.HasAnswer {
			v, err := judge.Score(ctx, t.Question, t.Answer, r.Answer)
			if err != nil {
				return row, err
			}
			s = v
			row.Answered += 1 / n
		}
		j, em, mq = append(j, s), append(em, r.EM), append(mq, MemoryQuality(r, t, thr))
		if r.HasAnswer {
			row.Answers = append(row.Answers, r.Answer)
		} else {
			row.Answers = append(row.Answers, "")
		}
		byType[t.Type] = append(byType[t.Type], s)
		form := AnswerSpan
		if g := env.NormalizeAnswer(t.Answer); g == "yes" || g == "no" {
			form = AnswerYesNo
			if r.HasAnswer && env.NormalizeAnswer(r.Answer) == "yes" {
				yes++
			}
		}
		byAnswer[form] = append(byAnswer[form], s)
		row.PromptTokens += float64(r.ContextTokens) / n
		for k, v := range r.ToolCalls() {
			row.ToolCalls[k] += float64(v) / n
		}
		row.FormatErrors += float64(r.FormatErrors()) / n
		if r.ContextFull {
			row.ContextFull += 1 / n
		}
	}
	row.J, row.EM, row.MQ, row.PerTask = stat(j), stat(em), stat(mq), j
	for k, v := range byType {
		row.ByType[k] = stat(v)
	}
	for k, v := range byAnswer {
		row.ByAnswer[k] = stat(v)
	}
	if n := len(byAnswer[AnswerYesNo]); n > 0 {
		row.SaysYes = float64(yes) / float64(n)
	}
	return row, nil
}

// stat is the mean and its standard error (sample standard deviation over
// √n).
func stat(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	var m float64
	for _, x := range v {
		m += x
	}
	m /= float64(len(v))
	if len(v) < 2 {
		return Stat{Mean: m}
	}
	var ss float64
	for _, x := range v {
		ss += (x - m) * (x - m)
	}
	return Stat{Mean: m, SE: math.Sqrt(ss/float64(len(v)-1)) / math.Sqrt(float64(len(v)))}
}

// MemoryQuality is the F1 of the long-term memory after the episode
// against the supporting facts: recall is the share of facts some entry
// matches, precision the share of entries that match some fact (token F1
// at least thr), a deterministic stand-in for the LLM evaluator of
// Appendix C.2.
func MemoryQuality(r env.Result, t env.Task, thr float64) float64 {
	entries := r.LTM[2]
	if len(entries) == 0 || len(t.SupportingFacts) == 0 {
		return 0
	}
	covered, relevant := 0, 0
	for _, f := range t.SupportingFacts {
		for _, e := range entries {
			if env.F1(e.Content, f) >= thr {
				covered++
				break
			}
		}
	}
	for _, e := range entries {
		for _, f := range t.SupportingFacts {
			if env.F1(e.Content, f) >= thr {
				relevant++
				break
			}
		}
	}
	p, rc := float64(relevant)/float64(len(entries)), float64(covered)/float64(len(t.SupportingFacts))
	if p+rc == 0 {
		return 0
	}
	return 2 * p * rc / (p + rc)
}

// Types are the question types of rows, sorted.
func Types(rows []Row) []string {
	seen := map[string]bool{}
	for _, r := range rows {
		for k := range r.ByType {
			seen[k] = true
		}
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// WriteJSON writes the rows to path (creating its folder).
func WriteJSON(path string, rows []Row) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeJSONFile(path, rows)
}
