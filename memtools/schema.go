// Package memtools is the memory-tool runtime that training rollouts and
// serve share: the six AgeMem tools (Appendix A.1, Figures 6-7), the
// response parser, the system prompt and the agent loop.
package memtools

import (
	_ "embed"
	"encoding/json"
	"fmt"
)

// Tool names, exactly as the paper's schemas spell them.
const (
	ToolSummary  = "Summary_context"
	ToolFilter   = "Filter_context"
	ToolRetrieve = "Retrieve_memory"
	ToolAdd      = "Add_memory"
	ToolUpdate   = "Update_memory"
	ToolDelete   = "Delete_memory"
)

// ToolNames lists the tools in the order of Figures 6 and 7.
var ToolNames = []string{ToolSummary, ToolFilter, ToolRetrieve, ToolAdd, ToolUpdate, ToolDelete}

// schemasJSON is STM_TOOLS followed by LTM_TOOLS, copied from Figures 6-7.
//
//go:embed schemas.json
var schemasJSON []byte

// Schema is one tool definition.
type Schema struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Parameters  struct {
		Properties map[string]Property `json:"properties"`
		Required   []string            `json:"required"`
	} `json:"parameters"`
}

// Property is one parameter of a tool.
type Property struct {
	Description string `json:"description"`
	Type        string `json:"type"`
}

// Schemas returns the six tool definitions, parsed.
func Schemas() []Schema {
	var s []Schema
	if err := json.Unmarshal(schemasJSON, &s); err != nil {
		panic(fmt.Sprintf("memtools: embedded schemas.json: %v", err))
	}
	return s
}

// SchemasJSON returns the tool definitions as the JSON array the paper shows,
// for the [TOOLS] slot of the system prompt and for chat templates.
func SchemasJSON() []byte { return append([]byte(nil), schemasJSON...) }
