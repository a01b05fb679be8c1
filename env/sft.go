package env

import (
	"github.com/agemem/agemem/memtools/stm"
)

// SFTRecord is one supervised example in the OpenAI chat format: the
// messages the policy saw at one step, then the assistant reply to learn.
// The loss goes on the last message only.
type SFTRecord struct {
	TaskID   string        `json:"task_id"`
	Stage    int           `json:"stage"`
	Messages []stm.Message `json:"messages"`
}

// SFTRecords turns an episode into one record per policy call. Each record
// holds exactly the context of that call (after any Filter or Summary
// rewrote earlier messages), so the model learns to act on what it will
// actually see.
func SFTRecords(r Result) []SFTRecord {
	var out []SFTRecord
	for stage, turns := range r.Stages {
		for _, turn := range turns {
			for _, step := range turn.Trace.Steps {
				msgs := append(append([]stm.Message(nil), step.Prompt...), stm.Message{Role: stm.Assistant, Content: step.Completion.Text})
				out = append(out, SFTRecord{TaskID: r.TaskID, Stage: stage + 1, Messages: msgs})
			}
		}
	}
	return out
}
