package memtoolagent

import (
	"context"
	"fmt"
	"strings"

	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
)

// AgentPrompt is the acting agent's system prompt (MemToolAgent, Figure
// 10): the environment's own instructions, then the recalled entries and
// how to use them. With nothing recalled it is the instructions alone.
func AgentPrompt(instructions string, recalled []Entry) string {
	if len(recalled) == 0 {
		return instructions
	}
	return instructions + "\nHere are similar queries, their executions, and user feedback:\n" + Render(recalled) +
		"For each query where user feedback indicates incorrect execution, reflect on what went wrong and use these insights to avoid similar mistakes. Consider these examples when solving the current task."
}

// ExtractorPrompt is the memory extractor's prompt for an incorrect
// execution (Figure 6): the environment's instructions, the tools, similar
// entries from memory and the whole execution, with the paper's checks.
func ExtractorPrompt(instructions, tools string, similar []Entry, execution string) string {
	var b strings.Builder
	b.WriteString("You are an agent responsible for analyzing the INCORRECT execution of a tool-use agent.\n")
	b.WriteString(instructions + "\n")
	b.WriteString("The agent had access to these tools:\n" + tools + "\n")
	b.WriteString("Here are similar queries, their executions, and user feedback:\n" + Render(similar))
	b.WriteString("For each query where user feedback indicates incorrect execution, reflect on what went wrong and use these insights.\n")
	b.WriteString("The whole agent execution including tool calls and corresponding responses is:\n" + execution + "\n")
	b.WriteString(`Check if the agent used a correct order of tools
Check if the agent hallucinated any tool parameters
Check if the agent used wrong values for tool parameters
Check if the agent only used the information from tools or directly from user.
Check if the agent had a correct temporal and conditional reasoning.
Before sending any error message, verify you're not contradicting yourself
Remember this is a wrong response, there is at least one mistake in tool usage
Reflect on the query, response, and other similar queries to catch the mistake, try to keep your response short.`)
	return b.String()
}

// Reflect asks the extractor model for the reflection on a failed
// execution: prompt as the system message, the query as the user's.
func Reflect(ctx context.Context, m llm.Model, prompt, query string) (string, error) {
	r, err := m.Chat(ctx, llm.Request{Messages: []chat.Message{{Role: "system", Content: prompt}, {Role: "user", Content: "Query: " + query}}})
	if err != nil {
		return "", fmt.Errorf("toolmem: the memory extractor: %w", err)
	}
	if strings.TrimSpace(r.Message.Content) == "" {
		return "", fmt.Errorf("toolmem: the memory extractor wrote no reflection")
	}
	return strings.TrimSpace(r.Message.Content), nil
}

// ToolList is tools described one a line, for the extractor's prompt.
func ToolList(specs []chat.Function) string {
	var b strings.Builder
	for _, s := range specs {
		fmt.Fprintf(&b, "- %s: %s %s\n", s.Name, s.Description, s.Parameters)
	}
	return b.String()
}
