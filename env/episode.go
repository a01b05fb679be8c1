package env

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// Stage numbers, as in Section 3.3.
const (
	Stage1 = 1 // LTM construction
	Stage2 = 2 // STM control under distractors
	Stage3 = 3 // integrated reasoning
)

// Episode is a task laid out as the user turns of the three stages.
type Episode struct {
	Stage1 []string // one piece of I_q per user turn
	Stage2 []string // one distractor per user turn
	Query  string   // the Stage 3 user message
}

// Stages shapes the three stages of Appendix A.3 (config section
// "episode").
type Stages struct {
	// Stage1MaxTurns bounds the user turns that feed I_q.
	Stage1MaxTurns int `yaml:"stage1_max_turns"`
	// Stage2MaxTurns bounds the distractor turns.
	Stage2MaxTurns int `yaml:"stage2_max_turns"`
	// AutoRetrieveK is k of the automatic retrieval of Algorithm 3, line 4;
	// 0 turns it off.
	AutoRetrieveK int `yaml:"auto_retrieve_k"`
}

// DefaultStages are up to 16 turns of facts and 8 of distractors.
func DefaultStages() Stages { return Stages{Stage1MaxTurns: 16, Stage2MaxTurns: 8, AutoRetrieveK: 3} }

// Validate checks every key.
func (s Stages) Validate() error {
	var e valid.Errors
	e.AtLeast("stage1_max_turns", s.Stage1MaxTurns, 1)
	e.AtLeast("stage2_max_turns", s.Stage2MaxTurns, 0)
	e.AtLeast("auto_retrieve_k", s.AutoRetrieveK, 0)
	return e.Err()
}

// EpisodeConfig shapes an episode: its stages, the agent loop's limits and
// the policy's system message (empty: the paper's, memtools.SystemPrompt).
type EpisodeConfig struct {
	Stages
	Limits       memtools.Limits
	SystemPrompt string
}

// NewEpisodeConfig is the episode of the "episode" and "agent" sections,
// its prompt listing the tools offered.
func NewEpisodeConfig(s Stages, a memtools.Agent, tools []string) EpisodeConfig {
	return EpisodeConfig{Stages: s, Limits: a.Limits(), SystemPrompt: a.Prompt(tools)}
}

// casual phrasings for Stage 1 turns: I_q arrives as conversation, not as a
// list of facts to memorise.
var casual = []string{
	"By the way, %s",
	"Something I read today: %s",
	relayed + "%s",
	"Here is a note from my reading: %s",
}

// relayed opens a Stage 1 turn that passes on what someone else said.
const relayed = "A friend mentioned this: "

// Relayed reports whether a Stage 1 turn passes on what someone else said
// (an SFT teacher may trust those less: Scripted.ForgetRelayedRate).
func Relayed(text string) bool { return strings.HasPrefix(text, relayed) }

// BuildEpisode lays a task out as turns. When I_q has more pieces than
// Stage 1 has turns, the pieces are shared out over the turns in order.
// The turns take the casual phrasings in turn, from one the task's ID
// picks, so that every phrasing opens some tasks' first turn (a two-fact
// task would otherwise never see the last two).
func BuildEpisode(t Task, cfg EpisodeConfig) Episode {
	var ep Episode
	turns := min(len(t.Context), max(cfg.Stage1MaxTurns, 1))
	h := fnv.New32a()
	h.Write([]byte(t.ID))
	first := int(h.Sum32() % uint32(len(casual)))
	for i := range turns {
		lo, hi := i*len(t.Context)/turns, (i+1)*len(t.Context)/turns
		ep.Stage1 = append(ep.Stage1, fmt.Sprintf(casual[(first+i)%len(casual)], strings.Join(t.Context[lo:hi], " ")))
	}
	for i, d := range t.Distractors {
		if i >= cfg.Stage2MaxTurns {
			break
		}
		ep.Stage2 = append(ep.Stage2, d)
	}
	ep.Query = "Question: " + t.Question + "\nAnswer with the answer alone."
	return ep
}

// memoriesTag wraps the memories that Stage 1 retrieves automatically for
// each turn (Algorithm 3: M_ret = RETRIEVE(M, m_t, k) ∪ m_t).
const memoriesTag = "\n\n<memories>\n"

// SplitTurn separates a user turn into its text and the automatically
// retrieved memories appended to it.
func SplitTurn(content string) (text, memories string) {
	text, memories, _ = strings.Cut(content, memoriesTag)
	return text, strings.TrimSuffix(memories, "\n</memories>")
}

// Turn is one user message and the agent loop it started.
type Turn struct {
	User  string         `json:"user"`
	Trace memtools.Trace `json:"trace"`
}

// Result is a whole three-stage episode.
type Result struct {
	TaskID    string         `json:"task_id"`
	Stages    [3][]Turn      `json:"stages"`
	LTM       [3][]ltm.Entry `json:"ltm_after_stage"`
	Answer    string         `json:"answer"`
	HasAnswer bool           `json:"has_answer"`
	Gold      string         `json:"gold"`
	EM        float64        `json:"em"`
	F1        float64        `json:"f1"`
	// ContextTokens is T_used when the answer was given (Eq. 19).
	ContextTokens int `json:"context_tokens"`
	// Final is the STM when the episode ended.
	Final []chat.Message `json:"final_context"`
	// ContextFull: the episode ended early, unanswered, because the
	// agent's context outgrew the model (a failed task, not a crash).
	ContextFull bool `json:"context_full,omitempty"`
}

// ToolCalls counts successful tool calls over the episode by name.
func (r Result) ToolCalls() map[string]int {
	n := map[string]int{}
	for _, st := range r.Stages {
		for _, t := range st {
			for k, v := range t.Trace.ToolCalls() {
				n[k] += v
			}
		}
	}
	return n
}

// FormatErrors counts malformed responses over the episode.
func (r Result) FormatErrors() int {
	n := 0
	for _, st := range r.Stages {
		for _, t := range st {
			n += t.Trace.FormatErrors
		}
	}
	return n
}

// RunEpisode plays the three stages of Algorithms 3-5 with one policy on a
// runtime whose Store is the episode's LTM M. The STM is reset (system
// prompt kept) between Stages 1 and 2; M persists; Stage 3 continues the
// Stage 2 context.
//
// A policy that lets its context outgrow the model (llm.ErrContextFull)
// ends the episode unanswered with ContextFull set; the stages not reached
// see the LTM as it was left. Any other error is returned.
func RunEpisode(ctx context.Context, p llm.Model, rt *memtools.Runtime, t Task, cfg EpisodeConfig) (Result, error) {
	res := Result{TaskID: t.ID, Gold: t.Answer}
	err := playEpisode(ctx, p, rt, t, cfg, &res)
	if !errors.Is(err, llm.ErrContextFull) {
		return res, err
	}
	res.ContextFull = true
	all, lerr := rt.Store.List(ctx)
	for i := range all {
		all[i].Embedding = nil
	}
	// The stage that overflowed (the last with a turn) and the ones after
	// it were never snapshotted.
	failed := 0
	for s := range res.Stages {
		if len(res.Stages[s]) > 0 {
			failed = s
		}
	}
	for s := failed; s < len(res.LTM); s++ {
		res.LTM[s] = all
	}
	res.Final = rt.Context.Messages()
	return res, lerr
}

func playEpisode(ctx context.Context, p llm.Model, rt *memtools.Runtime, t Task, cfg EpisodeConfig, res *Result) error {
	ep := BuildEpisode(t, cfg)
	rt.Context.Remove(func(int, chat.Message) bool { return true })
	sys := cfg.SystemPrompt
	if sys == "" {
		sys = memtools.SystemPrompt()
	}
	rt.Context.Append(chat.Message{Role: stm.System, Content: sys})
	turn := func(stage int, user string) (memtools.Trace, error) {
		rt.Context.Append(chat.Message{Role: stm.User, Content: user})
		tr, err := memtools.Run(ctx, p, rt, cfg.Limits)
		res.Stages[stage-1] = append(res.Stages[stage-1], Turn{User: user, Trace: tr})
		if err != nil {
			return tr, fmt.Errorf("task %s, stage %d: %w", t.ID, stage, err)
		}
		return tr, nil
	}
	snapshot := func(stage int) error {
		all, err := rt.Store.List(ctx)
		for i := range all {
			all[i].Embedding = nil
		}
		res.LTM[stage-1] = all
		return err
	}
	// Stage 1: casual turns, each with automatic retrieval.
	for _, m := range ep.Stage1 {
		user := m
		if cfg.AutoRetrieveK > 0 {
			if n, _ := rt.Store.Count(ctx); n > 0 {
				v, err := rt.Embedder.Embed(ctx, []string{m})
				if err != nil {
					return err
				}
				hits, err := rt.Store.Retrieve(ctx, v[0], cfg.AutoRetrieveK, nil)
				if err != nil {
					return err
				}
				user += memoriesTag + memtools.RetrievedJSON(hits) + "\n</memories>"
			}
		}
		if _, err := turn(Stage1, user); err != nil {
			return err
		}
	}
	if err := snapshot(Stage1); err != nil {
		return err
	}
	// Reset the STM; M persists (Algorithm 1, line 11).
	rt.Context.Reset()
	for _, d := range ep.Stage2 {
		if _, err := turn(Stage2, d); err != nil {
			return err
		}
	}
	if err := snapshot(Stage2); err != nil {
		return err
	}
	tr, err := turn(Stage3, ep.Query)
	if err != nil {
		return err
	}
	if err := snapshot(Stage3); err != nil {
		return err
	}
	res.Answer, res.HasAnswer = tr.Answer, tr.HasAnswer
	if len(tr.Steps) > 0 {
		res.ContextTokens = tr.Steps[len(tr.Steps)-1].PromptTokens
	}
	if res.HasAnswer {
		res.EM, res.F1 = ExactMatch(res.Answer, t.Answer), F1(res.Answer, t.Answer)
	}
	res.Final = rt.Context.Messages()
	return nil
}
