package fittext

import (
	"fmt"
	"strings"
)

// The prompts of the paper's Appendix E, written out: each asks for its
// operator's output between Begin and End and nothing else.

func analysisPrompt(query string) string {
	return `You can use many tools (functions) to do the task below, but you have none yet: every function must first be retrieved from a function corpus.
Analyse the task once, completely, and decide every function it needs. Describe each function you need in detail, each in its own block:
` + Begin + ` [Describe the function you need in detail here] ` + End + `
If the task suggests a function, you may include that hint in the description. Write all the blocks at once, then stop.

Task: ` + query
}

func exemplarBlock(blurbs []string) string {
	var b strings.Builder
	for i, s := range blurbs {
		fmt.Fprintf(&b, "%d. %s\n", i+1, strings.TrimSpace(s))
	}
	return strings.TrimRight(b.String(), "\n")
}

const oneBlock = `Output RULES (STRICT):
- Output exactly one block: ` + Begin + ` ...the description... ` + End + `
- No commentary before or after the block. No extra blocks.`

func refinePrompt(query, ancestor, current string, blurbs []string) string {
	return `You help an agent that retrieves functions (tools) from a function database. Refine exactly one function description for the current subtask only; do not add other functions.

Global user query (for reference only):
` + query + `

The subtask's original description (keep its intent):
` + ancestor + `

Draft description to refine:
` + current + `

Function descriptions retrieved so far for this subtask (database style):
` + exemplarBlock(blurbs) + `

Goal: a description that (1) closely matches the style and structure of the retrieved examples, and (2) is optimized for retrieval: adapt or rephrase it to maximise the chance of retrieving the most suitable function for this subtask.

` + oneBlock
}

func scatterPrompt(query, ancestor string, blurbs []string) string {
	return `You help an agent that retrieves functions (tools) from a function database. Write exactly one diversified function description for the current subtask only.

Global user query (for reference only):
` + query + `

Draft description (reference only; do not copy it):
` + ancestor + `

Function descriptions retrieved for this subtask (database style):
` + exemplarBlock(blurbs) + `

Goal: a new description that (1) preserves the subtask's intent, (2) follows the style of the retrieved examples, (3) is optimized for retrieval, and (4) introduces variation in phrasing or emphasis: you are called several times, vary the wording each call.

` + oneBlock
}

func seedPrompt(query, ancestor string, blurbs []string, n int) string {
	return fmt.Sprintf(`You help an agent that retrieves functions (tools) from a function database.

Global user query (for reference only):
%s

Ancestor description (keep its intent):
%s

Function descriptions retrieved for it (database style):
%s

Produce %d alternative pseudo-tool descriptions that preserve the ancestor intent but vary wording and structure, each in the style of the retrieved examples.

Output RULES (STRICT):
- Output exactly %d blocks, each %s ...a description... %s
- No commentary.`, query, ancestor, exemplarBlock(blurbs), n, n, Begin, End)
}

func crossoverPrompt(query, ancestor, p1, p2 string) string {
	return `You help an agent that retrieves functions (tools) from a function database.

Global user query (for reference only):
` + query + `

Lineage anchor (the intent to keep):
` + ancestor + `

Parent 1:
` + p1 + `

Parent 2:
` + p2 + `

Create exactly one coherent child description that combines the strongest constraints, parameters, and intent from both parents.

` + oneBlock
}

func mutationPrompt(query, ancestor, parent string) string {
	return `You help an agent that retrieves functions (tools) from a function database.

Global user query (for reference only):
` + query + `

Lineage anchor (the intent to keep):
` + ancestor + `

Parent:
` + parent + `

Create exactly one mutated variant of the parent that keeps the same intent but adjusts wording/constraints to improve retrieval.

` + oneBlock
}

// ibiPrompt is IBI's one global refinement: every description at once,
// grounded in every tool retrieved so far (the paper gives no prompt; this
// is DBD's with the whole set of descriptions in place of one lineage).
func ibiPrompt(query string, ds []string, blurbs []string) string {
	var cur strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&cur, "%s %s %s\n", Begin, d, End)
	}
	return `You help an agent that retrieves functions (tools) from a function database. Improve the whole set of function descriptions the task needs.

Global user query:
` + query + `

Current function descriptions:
` + strings.TrimRight(cur.String(), "\n") + `

Function descriptions retrieved so far for all of them (database style):
` + exemplarBlock(blurbs) + `

Goal: descriptions that together cover every function the task needs, each (1) in the style and structure of the retrieved examples and (2) optimized for retrieval. You may rephrase, merge, split, drop or add descriptions.

Output RULES (STRICT):
- Output each description in its own block: ` + Begin + ` ...a description... ` + End + `
- No commentary.`
}

// sufficiencyPrompt is IBI's judge (j=1): do the tools retrieved so far
// suffice? (The paper gives no prompt.)
func sufficiencyPrompt(query string, blurbs []string) string {
	return `Decide whether the functions below are enough to complete the user's task.

User task:
` + query + `

Functions retrieved so far:
` + exemplarBlock(blurbs) + `

Output: ONLY "yes" if they suffice, or "no".`
}

// fitnessPrompt is Memetic V2's "Memetic Fitness Judge" (App. E).
func fitnessPrompt(query, pseudo string, tools []string) string {
	return `Rate how well these retrieved tools collectively address the user query:
- User query: ` + query + `
- Pseudo-tool used for retrieval: ` + pseudo + `
- Retrieved tools:
` + exemplarBlock(tools) + `
Scale: 1.0=perfect, 0.7=mostly covers, 0.4=partial, 0.0=irrelevant
Output: ONLY a single decimal number between 0.0 and 1.0.`
}

// guidedPrompt is Memetic V2's guided mutation (App. E): a variant that
// steers away from the parent's low-scoring tools.
func guidedPrompt(query, ancestor, parent string, low []string) string {
	return `You help an agent that retrieves functions (tools) from a function database.

Global user query (for reference only):
` + query + `

Lineage anchor (the intent to keep):
` + ancestor + `

Parent:
` + parent + `

Low-scoring tools to avoid:
` + exemplarBlock(low) + `

Create one mutated variant that keeps the same intent but steers AWAY from the low-scoring tools listed above. Modify wording to AVOID retrieving them; shift emphasis toward aspects those tools failed to address.

` + oneBlock
}
