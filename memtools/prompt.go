package memtools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// systemPromptTemplate is the AgeMem system prompt of Appendix A.1, with the
// PDF's line breaks mended and Python's doubled braces undone.
const systemPromptTemplate = `You are an intelligent assistant that solves complex problems by managing context and memory with tools when needed.

## Available Tools:
[TOOLS]

## Problem-Solving Workflow
You must follow a structured reasoning and action process for every task:

1. **Think & Plan**
Always start with a <think>...</think> block. Inside it, explain your reasoning, plan your next step, and decide whether you need to call a tool or provide a final answer.

2. **Tool Calls**
If you decide to use one or more tools, follow your <think> block with a <tool_call>...</tool_call> block.
- You may call **one or multiple tools** in a single step.
- List multiple tool calls as elements of a JSON array.
- Each tool call must include "name" and "arguments".
- Example: <tool_call>[{"name": "Retrieve_memory", "arguments": {"query": "math problem solving strategies", "top_k": 3}}, {"name": "Add_memory", "arguments": {"content": "Strategy summary for reuse", "memory_type": "problem_solving"}}]</tool_call>

3. **Final Answer**
When you no longer need tools and are ready to present your final output, follow your last <think> block with an <answer>...</answer> block containing the full response.

4. **Mutual Exclusivity Rule**
After **each <think> block**, you must choose exactly **one** of the following:
- a "<tool_call>" block (if you need tools), **or**
- an "<answer>" block (if you are ready to respond).
You must **never** include both "<tool_call>" and "<answer>" immediately after the same "<think>" block.

5. **Iterative Solving**
You may repeat this sequence as needed: "<think>" -> "<tool_call>" -> "<think>" -> "<tool_call>" ... -> "<think>" -> "<answer>" until the problem is completely solved.

## Response Format (Strict)
Your full output must follow these rules:
- Every reasoning step must appear inside <think> tags.
- Every tool usage must appear inside one <tool_call> tag (even if it includes multiple tool invocations).
- The final solution must be wrapped in <answer> tags.
- No text should appear outside these tags.

## Guidelines
- Always start with reasoning (<think>).
- After each reasoning step, decide: call tool(s) or answer.
- You can call multiple tools within one <tool_call> JSON array.
- Be concise, logical, and explicit in reasoning.
- Manage memory actively: retrieve, add, update, summarize, filter, or delete as needed.
- Use <answer> only once when the final solution is ready.

Let's start!`

// SystemPrompt returns the Appendix A.1 prompt with the tool schemas filled
// in as indented JSON.
func SystemPrompt() string { return paperPrompt(ToolNames) }

func paperPrompt(tools []string) string {
	var buf bytes.Buffer
	json.Indent(&buf, schemasOf(tools), "", "  ")
	return strings.Replace(systemPromptTemplate, "[TOOLS]", buf.String(), 1)
}

// schemasOf is the embedded schemas JSON with only the named tools: all
// six, byte for byte, when all are named.
func schemasOf(tools []string) []byte {
	if len(tools) == len(ToolNames) {
		return bytes.TrimSpace(schemasJSON)
	}
	var all []json.RawMessage
	if err := json.Unmarshal(schemasJSON, &all); err != nil {
		panic("memtools: schemas.json: " + err.Error()) // embedded, checked by tests
	}
	var keep []json.RawMessage
	for i, s := range Schemas() {
		if slices.Contains(tools, s.Name) {
			keep = append(keep, all[i])
		}
	}
	out, _ := json.Marshal(keep)
	return out
}

// SummaryPrompt is the summarisation system prompt of Appendix A.1 (SUMMARY);
// [CONVERSATION_TEXT] is replaced by the span to summarise.
const SummaryPrompt = `You are a conversation summarization assistant. Your goal is to compress the given conversation span into a concise summary that preserves all important information, intentions, decisions, and unresolved questions.
The summary will later be used to replace the original conversation in the context, so make sure nothing essential is lost.

Instructions:
1. Read the provided conversation rounds carefully.
2. Identify the main topics, actions, results, and open issues.
3. Write a clear, factual summary in natural language.
4. Do NOT include greetings, filler text, or redundant phrasing.

Input:
- Conversation content: [CONVERSATION_TEXT]

Output:
- A concise yet comprehensive summary of the above conversation span.

Let's start the conversation summarization.`

// Prompt styles (config key agent.system_prompt).
const (
	// PromptPaper is Appendix A.1 verbatim: the product's prompt.
	PromptPaper = "paper"
	// PromptCompact lists the same six tools (one line each, from the same
	// schemas) and the same response format in about a tenth of the tokens:
	// for small models trained from scratch on a CPU, where the paper's
	// prompt would be most of every training sequence and rollout prompt.
	PromptCompact = "compact"
)

// SystemPromptFor returns the system prompt of a style with all six tools.
func SystemPromptFor(style string) (string, error) { return SystemPromptWith(style, ToolNames) }

// SystemPromptWith returns the system prompt of a style listing only the
// given tools (tools.subset).
func SystemPromptWith(style string, tools []string) (string, error) {
	switch style {
	case PromptPaper, "":
		return paperPrompt(tools), nil
	case PromptCompact:
		return compactPrompt(tools), nil
	}
	return "", fmt.Errorf("system prompt %q is not %s or %s", style, PromptPaper, PromptCompact)
}

func compactPrompt(offered []string) string {
	var tools []struct {
		Name       string `json:"name"`
		Parameters struct {
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		} `json:"parameters"`
	}
	if err := json.Unmarshal(schemasOf(offered), &tools); err != nil {
		panic("memtools: schemas.json: " + err.Error()) // embedded, checked by tests
	}
	var b strings.Builder
	b.WriteString("You manage context and memory with tools.\nTools (arguments; ? = optional):\n")
	for _, t := range tools {
		args := slices.Clone(t.Parameters.Required)
		var opt []string
		for name := range t.Parameters.Properties {
			if !slices.Contains(t.Parameters.Required, name) {
				opt = append(opt, name+"?")
			}
		}
		sort.Strings(opt)
		fmt.Fprintf(&b, "- %s(%s)\n", t.Name, strings.Join(append(args, opt...), ", "))
	}
	b.WriteString(`Reply with <think>...</think>, then exactly one of <tool_call>[{"name": ..., "arguments": {...}}]</tool_call> or <answer>...</answer>. No text outside tags.`)
	return b.String()
}
