// Package env holds AgeMem's task sources and the three-stage episode:
// HotpotQA-format tasks (loaded or generated), the stage builders of
// Algorithms 3-5, and the scripted policies that need no model.
package env

// Task is one question q with its context I_q, distractors and gold answer
// A_q.
type Task struct {
	ID       string `json:"id"`
	Question string `json:"question"`
	Answer   string `json:"answer"`
	Type     string `json:"type"`  // bridge or comparison
	Level    string `json:"level"` // easy, medium or hard
	// Context is I_q, fed to Stage 1 one piece per user turn: the
	// supporting sentences.
	Context []string `json:"context"`
	// SupportingFacts are the sentences an answer needs; they are what
	// storage quality (Eq. 23) compares stored entries with.
	SupportingFacts []string `json:"supporting_facts"`
	// Distractors are the non-supporting paragraphs, injected in Stage 2.
	Distractors []string `json:"distractors"`
}
