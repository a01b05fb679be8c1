package env

import (
	"slices"

	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
)

// SFTRecord is one supervised example in the OpenAI chat format: the
// messages the policy saw, with the assistant replies to learn.
type SFTRecord struct {
	TaskID   string       `json:"task_id"`
	Stage    int          `json:"stage"`
	Messages []SFTMessage `json:"messages"`
}

// SFTMessage is a message of a record. Weight is OpenAI's fine-tuning
// field: an assistant message with weight 0 is context, not learned.
type SFTMessage struct {
	chat.Message
	Weight *int `json:"weight,omitempty"`
}

var learnWeights = [2]int{0, 1}

// SFTRecords turns an episode into one record per policy call. Each record
// holds exactly the context of that call (after any Filter or Summary
// rewrote earlier messages), so the model learns to act on what it will
// actually see; only its last message is learned.
func SFTRecords(r Result) []SFTRecord {
	var out []SFTRecord
	for stage, turns := range r.Stages {
		for _, turn := range turns {
			for _, step := range turn.Trace.Steps {
				out = append(out, SFTRecord{TaskID: r.TaskID, Stage: stage + 1, Messages: record(step.Prompt, step.Response.Message.Content)})
			}
		}
	}
	return out
}

// SFTConversations holds the same examples as SFTRecords in fewer tokens:
// a call whose context is the previous call's context and reply followed
// by new messages (a tool result, the next user turn) extends that record
// instead of repeating it, so a stage without context rewrites becomes one
// conversation whose every reply is learned (weight 1) against exactly the
// context it was given. The examples are the same; the tokens to process
// about halve on AgeMem episodes. A Filter or Summary that rewrote
// the context starts a new record, where the earlier replies it holds are
// weight 0.
func SFTConversations(r Result) []SFTRecord {
	var out []SFTRecord
	for stage, turns := range r.Stages {
		var cur []SFTMessage // the record being extended, within this stage
		for _, turn := range turns {
			for _, step := range turn.Trace.Steps {
				if len(cur) > 0 && extends(step.Prompt, cur) {
					cur = append(cur, record(step.Prompt[len(cur):], step.Response.Message.Content)...)
					out[len(out)-1].Messages = cur
					continue
				}
				cur = record(step.Prompt, step.Response.Message.Content)
				out = append(out, SFTRecord{TaskID: r.TaskID, Stage: stage + 1, Messages: cur})
			}
		}
	}
	return out
}

// record is msgs (assistant messages among them weight 0) then reply
// (weight 1).
func record(msgs []chat.Message, reply string) []SFTMessage {
	out := make([]SFTMessage, 0, len(msgs)+1)
	for _, m := range msgs {
		sm := SFTMessage{Message: m}
		if m.Role == stm.Assistant {
			sm.Weight = &learnWeights[0]
		}
		out = append(out, sm)
	}
	return append(out, SFTMessage{Message: chat.Message{Role: stm.Assistant, Content: reply}, Weight: &learnWeights[1]})
}

// extends reports whether prompt begins with the messages of rec.
func extends(prompt []chat.Message, rec []SFTMessage) bool {
	if len(prompt) <= len(rec) {
		return false
	}
	return slices.EqualFunc(prompt[:len(rec)], rec, func(a chat.Message, b SFTMessage) bool {
		return a.Role == b.Role && a.Content == b.Content && a.Name == b.Name
	})
}
