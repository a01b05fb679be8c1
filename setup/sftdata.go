package setup

import (
	"context"
	"encoding/json"
	"errors"
	"io"

	"github.com/agemem/agemem/env"
)

// OracleSFT shapes the oracle whose episodes become SFT data.
type OracleSFT struct {
	// Forget, ForgetRelayed and KeepDistractor are the oracle's error
	// rates: a fact it does not store, a relayed fact it does not store, a
	// distractor it does not filter.
	Forget, ForgetRelayed, KeepDistractor float64
	// Reason thinks a comparison out before answering it.
	Reason bool
	// Tasks bounds the tasks played (0: all).
	Tasks int
	// Stages are the stages whose calls are written.
	Stages []int
	// PerCall writes a record per call instead of one per conversation.
	PerCall bool
}

// errEnough ends a task stream early.
var errEnough = errors.New("enough tasks")

// WriteOracleSFT plays the oracle o describes on the tasks of the
// HotpotQA-format file data, the episode and agent sections' episodes
// with their built-in helpers, and writes its calls to w as chat JSONL
// (env.SFTConversations, or env.SFTRecords per call).
func WriteOracleSFT(ctx context.Context, cfg Config, data string, o OracleSFT, w io.Writer) (tasks, records int, err error) {
	keep := map[int]bool{}
	for _, s := range o.Stages {
		keep[s] = true
	}
	enc := json.NewEncoder(w)
	newRuntime := Runtime(cfg, Helpers{}, nil)
	err = env.StreamHotpotFile(data, func(t env.Task) error {
		if o.Tasks > 0 && tasks >= o.Tasks {
			return errEnough
		}
		oracle := env.NewOracle(t, o.Forget, o.KeepDistractor, uint64(cfg.Seed)).ForgettingRelayed(o.ForgetRelayed).ReasoningAloud(o.Reason).Offering(cfg.Tools.Offered())
		res, err := env.RunEpisode(ctx, oracle, newRuntime(uint64(cfg.Seed)+uint64(tasks)), t, cfg.EpisodeConfig())
		if err != nil {
			return err
		}
		recs := env.SFTConversations(res)
		if o.PerCall {
			recs = env.SFTRecords(res)
		}
		for _, r := range recs {
			if !keep[r.Stage] {
				continue
			}
			if err := enc.Encode(r); err != nil {
				return err
			}
			records++
		}
		tasks++
		return nil
	})
	if errors.Is(err, errEnough) {
		err = nil
	}
	return tasks, records, err
}
