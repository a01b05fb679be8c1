package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/agent"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/setup"
)

const agentLong = `Runs the function-calling agent loop once: the model on the OpenAI-compatible
server at openai.base_url (--model, or openai.model), or a local Qwen
checkpoint run by the built-in engine (--native DIR, the tools rendered by
its own chat template and its <tool_call> blocks parsed back), answers --prompt,
calling tools until it answers without one (or --max-steps turns pass).
Tools: with --memory, AgeMem's long-term memory tools on the store serve
uses (memory.path, or memory.dsn with memory.store postgres; namespace
memory.namespace); and the
tools of every MCP server in the config's mcp.servers and named with
--mcp-url (streamable HTTP; headers with --mcp-header NAME=VALUE) or
--mcp-command (a command line started over stdio). A call to an unknown tool, with arguments that break the
tool's JSON Schema, or to a server that failed is told to the model.
Prints the trace (--json for machines).`

func agentCmd(g *globals) *cobra.Command {
	var prompt, system, model, native, dev string
	var memory, asJSON bool
	var maxSteps int
	var mf mcpFlags
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run one function-calling conversation with memory tools and MCP servers' tools",
		Long:  agentLong,
		Example: `  agemem-train agent --set openai.base_url=http://127.0.0.1:8000/v1 --model Qwen/Qwen3-4B --memory \
    --prompt "Remember that my sister's name is Ada."
  agemem-train agent --set openai.base_url=http://127.0.0.1:11434/v1 --model qwen3:4b \
    --mcp-url http://127.0.0.1:8080/mcp --mcp-header "Authorization=Bearer $KEY" --prompt "What do you remember about Ada?"
  agemem-train agent --set openai.base_url=http://127.0.0.1:8000/v1 --model m \
    --mcp-command "npx -y @modelcontextprotocol/server-everything" --prompt "Add 2 and 3 with a tool."`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if strings.TrimSpace(prompt) == "" {
				return fmt.Errorf("--prompt is required")
			}
			if maxSteps < 1 {
				return fmt.Errorf("--max-steps %d: the model needs at least one turn", maxSteps)
			}
			ctx := cmd.Context()
			m, err := chatModel(cmd, cfg, model, native, dev)
			if err != nil {
				return err
			}
			servers, err := mf.servers(cfg)
			if err != nil {
				return err
			}
			ts, closeTools, err := setup.AgentToolset(ctx, cfg, memory, servers)
			if err != nil {
				return err
			}
			defer closeTools()
			var msgs []chat.Message
			if system != "" {
				msgs = append(msgs, chat.Message{Role: "system", Content: system})
			}
			msgs = append(msgs, chat.Message{Role: "user", Content: prompt})
			tr, err := agent.Run(ctx, m, ts, msgs, agent.Limits{MaxSteps: maxSteps})
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if jerr := enc.Encode(tr); jerr != nil {
					return jerr
				}
				return err
			}
			printAgentTrace(cmd.OutOrStdout(), ts.Names(), tr)
			return err
		},
	}
	cmd.Flags().StringVar(&prompt, "prompt", "", "the user's message")
	cmd.Flags().StringVar(&system, "system", "", "a system message")
	cmd.Flags().StringVar(&model, "model", "", "the model on the server (default openai.model), or ollama:NAME for Ollama's own API with native tools")
	cmd.Flags().StringVar(&native, "native", "", "a local Qwen2/2.5/3 checkpoint directory, run by the built-in engine (greedy)")
	cmd.Flags().StringVar(&dev, "device", "auto", "the --native model's device: auto, cpu, cuda or cuda:N")
	cmd.Flags().BoolVar(&memory, "memory", false, "add AgeMem's long-term memory tools on the configured store (memory.path, or memory.dsn with memory.store postgres)")
	mf.add(cmd)
	cmd.Flags().IntVar(&maxSteps, "max-steps", 8, "the most model turns")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the trace as JSON")
	return cmd
}

func printAgentTrace(w io.Writer, tools []string, tr agent.Trace) {
	fmt.Fprintf(w, "tools: %s\n", strings.Join(tools, ", "))
	for i, st := range tr.Steps {
		if c := strings.TrimSpace(st.Reply.Message.Content); c != "" && len(st.Results) > 0 {
			fmt.Fprintf(w, "[%d] %s\n", i+1, c)
		}
		for _, r := range st.Results {
			mark := "ok"
			if !r.OK {
				mark = "refused"
			}
			fmt.Fprintf(w, "[%d] %s(%s) -> %s: %s\n", i+1, r.Call.Name, r.Call.Arguments, mark, r.Result)
		}
	}
	switch {
	case tr.HasAnswer:
		fmt.Fprintf(w, "answer: %s\n", tr.Answer)
	case tr.StepLimitHit:
		fmt.Fprintf(w, "no answer: the model was still calling tools after %d turns (--max-steps)\n", len(tr.Steps))
	}
}

// chatModel is the llm.Model the flags name: a local checkpoint on the
// built-in engine (native), else the model on the OpenAI-compatible server.
func chatModel(cmd *cobra.Command, cfg setup.Config, model, dir, dev string) (llm.Model, error) {
	return chatModels(cmd, cfg, model, dir, dev, 1)
}

// chatModels is chatModel for parallel agents: on the native engine their
// calls decode together.
func chatModels(cmd *cobra.Command, cfg setup.Config, model, dir, dev string, parallel int) (llm.Model, error) {
	return setup.ChatModel(cmd.Context(), cfg, setup.Models{Model: model, Native: dir}, dev, parallel, cmd.ErrOrStderr())
}

// mcpFlags are the MCP servers a command takes beside the config's
// mcp.servers: --mcp-url (streamable HTTP, with --mcp-header NAME=VALUE)
// and --mcp-command (a command line started over stdio).
type mcpFlags struct{ urls, headers, commands []string }

func (f *mcpFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.urls, "mcp-url", nil, "an MCP server over streamable HTTP (repeatable)")
	cmd.Flags().StringArrayVar(&f.headers, "mcp-header", nil, "NAME=VALUE sent to every --mcp-url server (repeatable)")
	cmd.Flags().StringArrayVar(&f.commands, "mcp-command", nil, "an MCP server started over stdio, as one command line (repeatable)")
}

// servers are mcp.servers, then the flags' servers.
func (f *mcpFlags) servers(cfg setup.Config) ([]agent.MCPServer, error) {
	servers := slices.Clone(cfg.MCP.Servers)
	hdr := map[string]string{}
	for _, h := range f.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--mcp-header %q: want NAME=VALUE", h)
		}
		hdr[k] = v
	}
	for i, u := range f.urls {
		servers = append(servers, agent.MCPServer{Name: fmt.Sprintf("url%d", i+1), URL: u, Headers: hdr})
	}
	for i, c := range f.commands {
		args := strings.Fields(c)
		if len(args) == 0 {
			return nil, fmt.Errorf("--mcp-command is empty")
		}
		servers = append(servers, agent.MCPServer{Name: fmt.Sprintf("command%d", i+1), Command: args})
	}
	return servers, nil
}
