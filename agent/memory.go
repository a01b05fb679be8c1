package agent

import (
	"context"
	"encoding/json"
	"errors"
	"slices"

	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/model/chat"
)

// MemoryTools are AgeMem's long-term memory tools (Add, Update, Delete,
// Retrieve, with the paper's schemas) acting on rt's store, as tools of
// this loop: any function-calling model can keep memories in the same
// store the AgeMem agent and serve use.
func MemoryTools(rt *memtools.Runtime) []Tool {
	ltmTools := []string{memtools.ToolAdd, memtools.ToolUpdate, memtools.ToolDelete, memtools.ToolRetrieve}
	var out []Tool
	for _, s := range memtools.Schemas() {
		if !slices.Contains(ltmTools, s.Name) {
			continue
		}
		required := s.Parameters.Required
		if required == nil {
			required = []string{}
		}
		params, _ := json.Marshal(map[string]any{"type": "object", "properties": s.Parameters.Properties, "required": required})
		name := s.Name
		out = append(out, Tool{Function: chat.Function{Name: name, Description: s.Description, Parameters: params},
			Call: func(ctx context.Context, args json.RawMessage) (string, error) {
				r, err := rt.Execute(ctx, memtools.Call{Name: name, Arguments: args})
				if err != nil {
					return "", err
				}
				if !r.OK {
					return "", errors.New(r.Content)
				}
				return r.Content, nil
			}})
	}
	return out
}
