package env

import (
	"context"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/memtools"
)

// AgeMem is the paper's environment: HotpotQA-format tasks played as the
// three stages of Algorithms 3-5, each rollout on a fresh runtime (its own
// long-term memory M). It is the rollout.Env the trainer and the
// evaluation play.
type AgeMem struct {
	Tasks   []Task
	Episode EpisodeConfig
	// NewRuntime returns a fresh runtime for an episode: an empty store
	// (ids drawn from seed), context, embedder and summariser.
	NewRuntime func(seed uint64) *memtools.Runtime
}

// Outcome is a played episode with its task: what the reward reads.
type Outcome struct {
	Task   Task
	Result Result
}

// Len implements rollout.Env.
func (a *AgeMem) Len() int { return len(a.Tasks) }

// Play implements rollout.Env: the three stages of task t.
func (a *AgeMem) Play(ctx context.Context, pol llm.Model, t int, seed uint64) (Outcome, error) {
	task := a.Tasks[t]
	res, err := RunEpisode(ctx, pol, a.NewRuntime(seed), task, a.Episode)
	return Outcome{Task: task, Result: res}, err
}
