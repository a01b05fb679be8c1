package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/ltm"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/setup"
)

// ollamaPolicy is an AgeMem policy on the Ollama server (ollama.host, in
// ollama.format), sampling as s says.
func ollamaPolicy(cmd *cobra.Command, cfg setup.Config, model string, s llm.Sampling) (llm.Model, error) {
	pol, m, err := setup.OllamaPolicy(cmd.Context(), cfg, model)
	if err != nil {
		return nil, err
	}
	m.Sampling.Temperature, m.Sampling.Seed = s.Temperature, s.Seed
	return pol, nil
}

// openaiPolicy is an AgeMem policy on the OpenAI-compatible server at
// openai.base_url (model: openai.model when empty; in openai.format).
func openaiPolicy(cfg setup.Config, model string, s llm.Sampling) (llm.Model, error) {
	if model == "" {
		model = cfg.OpenAI.Model
	}
	if model == "" {
		return nil, fmt.Errorf("an OpenAI-compatible policy needs a model: openai:MODEL, --openai-model NAME or openai.model")
	}
	s.MaxTokens = cfg.Agent.ResponseBudget
	return setup.OpenAIPolicy(cfg, model, s)
}

const episodeLong = `Plays Stage 1 (facts arrive in casual turns; the policy may store them),
resets the short-term context, plays Stage 2 (distractors; the policy may
filter or summarise) and Stage 3 (the question; the policy may retrieve and
answers). With --task it prints the trace of one task and the long-term
memory after each stage; with --first N it prints a summary over N tasks.
Policies: oracle (knows the supporting facts, uses the tools), no-memory
(never calls a tool) and native (a Qwen checkpoint given with --model, run by
the built-in engine: the paper's AgeMem-noRL baseline for an untrained
model) and ollama (--ollama-model on the ollama server, driven in
ollama.format: raw for policies exported here, tools for models with native
tool calling such as qwen3:4b) and openai (--openai-model, or openai.model,
on any OpenAI-compatible server at openai.base_url: vLLM, llama.cpp's
server, LM Studio, SGLang, a hosted API, our own serve; driven in
openai.format).`

func episodeCmd(g *globals) *cobra.Command {
	var data, taskID, policyNames, modelDir, adapterDir, dev, ollamaModel, openaiModel string
	var sampling llm.Sampling
	var first int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "episode",
		Short: "Play the three AgeMem stages on tasks and print the trace",
		Long:  episodeLong,
		Example: `  agemem-train episode --data data/synth.json --task synth-000001 --policy oracle
  agemem-train episode --data data/synth.json --first 50 --policy no-memory,oracle
  agemem-train episode --data data/synth.json --first 50 --policy oracle --json
  agemem-train episode --data data/synth.json --first 20 --policy ollama --ollama-model qwen3:4b --set ollama.format=tools
  agemem-train episode --data data/synth.json --first 20 --policy openai --set openai.base_url=http://127.0.0.1:8000/v1 --openai-model Qwen/Qwen3-4B --set openai.format=tools`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadData(&data)
			if err != nil {
				return err
			}
			if first < 0 {
				return fmt.Errorf("--first %d: want a number of tasks", first)
			}
			if !(sampling.Temperature >= 0) {
				return fmt.Errorf("--temperature %g: want 0 (greedy) or more", sampling.Temperature)
			}
			if (taskID == "") == (first == 0) {
				return fmt.Errorf("give exactly one of --task ID or --first N")
			}
			pols, done, err := episodePolicies(cmd, cfg, policyNames, modelDir, adapterDir, dev, ollamaModel, openaiModel, sampling)
			if err != nil {
				return err
			}
			defer done()
			helpers, err := setup.NewHelpers(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			policies := strings.Split(policyNames, ",")
			if taskID != "" && len(policies) > 1 {
				return fmt.Errorf("--task plays one policy; name one in --policy")
			}
			for _, p := range policies {
				if _, err := pols.Policy(cfg, p, env.Task{}); err != nil {
					return err
				}
			}
			tasks, err := selectTasks(data, taskID, first)
			if err != nil {
				return err
			}
			var sums []summary
			var results []env.Result
			for _, name := range policies {
				progress := func(int) {}
				if len(tasks) > 1 {
					pr := train.NewProgress(cmd.ErrOrStderr(), len(tasks), isatty.IsTerminal(os.Stderr.Fd()))
					progress = func(done int) { pr.Update(done, name) }
				}
				if results, err = setup.PlayEpisodes(cmd.Context(), cfg, helpers, pols, name, tasks, progress); err != nil {
					return err
				}
				sums = append(sums, summarize(name, results))
			}
			if taskID != "" {
				return printEpisode(cmd.OutOrStdout(), tasks[0], results[0], asJSON)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), sums)
			}
			printSummary(cmd.OutOrStdout(), sums)
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "HotpotQA-format task file (default: data.train from the config)")
	cmd.Flags().StringVar(&taskID, "task", "", "task id to play")
	cmd.Flags().IntVar(&first, "first", 0, "play the first N tasks and print a summary")
	cmd.Flags().StringVar(&policyNames, "policy", "oracle", "oracle, no-memory, native (--model) or ollama (--ollama-model); with --first, a comma-separated list compares them")
	cmd.Flags().StringVar(&ollamaModel, "ollama-model", "", "model on the ollama server for --policy ollama (ollama.host, ollama.format)")
	cmd.Flags().StringVar(&openaiModel, "openai-model", "", "model for --policy openai (default openai.model; openai.base_url, openai.format)")
	cmd.Flags().StringVar(&modelDir, "model", "", "Qwen checkpoint directory for --policy native (config.json, tokenizer.json, safetensors)")
	cmd.Flags().StringVar(&adapterDir, "adapter", "", "LoRA adapter directory (PEFT layout) for the native policy")
	cmd.Flags().StringVar(&dev, "device", "auto", "native policy device: auto (a GPU if found, else CPU), cpu, cuda or cuda:N")
	cmd.Flags().Float64Var(&sampling.Temperature, "temperature", 0, "native and ollama policy sampling temperature (0: greedy)")
	cmd.Flags().Uint64Var(&sampling.Seed, "sample-seed", 1, "native and ollama policy sampling seed")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for machines")
	return cmd
}

var errStop = errors.New("stop")

// episodePolicies are the models the flags name: a local checkpoint (with
// its adapter) sampled as s says up to agent.response_budget tokens, a
// model on the Ollama server, and one on the OpenAI-compatible server
// when the policies name openai. done unloads the local one.
func episodePolicies(cmd *cobra.Command, cfg setup.Config, names, dir, adapter, dev, ollamaModel, openaiModel string, s llm.Sampling) (pols setup.Policies, done func(), err error) {
	done = func() {}
	if dir != "" {
		s.MaxTokens = cfg.Agent.ResponseBudget
		be, err := device.Open(dev, cmd.ErrOrStderr())
		if err != nil {
			return pols, done, err
		}
		cp, err := native.Open(be, dir, adapter, cfg.Model.Generation())
		if err != nil {
			return pols, done, err
		}
		pols.Native = cp.Start(native.Options{Sampling: s, Engine: engine.Options{PrefixBudget: cp.Model.MaxPositions}})
		done = func() {
			pols.Native.Close()
			cp.Model.Close()
		}
	}
	if ollamaModel != "" {
		if pols.Ollama, err = ollamaPolicy(cmd, cfg, ollamaModel, s); err != nil {
			done()
			return pols, func() {}, fmt.Errorf("--ollama-model: %w", err)
		}
	}
	if strings.Contains(names, "openai") {
		if pols.OpenAI, err = openaiPolicy(cfg, openaiModel, s); err != nil {
			done()
			return pols, func() {}, err
		}
	}
	return pols, done, nil
}

// selectTasks reads the task taskID of the HotpotQA-format file data, or
// its first tasks.
func selectTasks(data, taskID string, first int) ([]env.Task, error) {
	var tasks []env.Task
	err := env.StreamHotpotFile(data, func(t env.Task) error {
		if (taskID != "" && t.ID == taskID) || (first > 0 && len(tasks) < first) {
			tasks = append(tasks, t)
		}
		if first > 0 && len(tasks) == first {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, err
	}
	if len(tasks) == 0 && taskID == "" {
		return nil, fmt.Errorf("%s holds no tasks", data)
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("task %q is not in %s", taskID, data)
	}
	return tasks, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

type summary struct {
	Policy        string             `json:"policy"`
	Tasks         int                `json:"tasks"`
	EM            float64            `json:"em"`
	F1            float64            `json:"f1"`
	Answered      float64            `json:"answered"`
	ContextTokens float64            `json:"avg_context_tokens"`
	ToolCalls     map[string]float64 `json:"avg_tool_calls"`
	FormatErrors  int                `json:"format_errors"`
	ContextFull   int                `json:"context_full"` // tasks ended by a context the model cannot read
}

func summarize(name string, rs []env.Result) summary {
	s := summary{Policy: name, Tasks: len(rs), ToolCalls: map[string]float64{}}
	for _, r := range rs {
		s.EM += r.EM
		s.F1 += r.F1
		if r.HasAnswer {
			s.Answered++
		}
		s.ContextTokens += float64(r.ContextTokens)
		for k, v := range r.ToolCalls() {
			s.ToolCalls[k] += float64(v)
		}
		s.FormatErrors += r.FormatErrors()
		if r.ContextFull {
			s.ContextFull++
		}
	}
	n := float64(max(len(rs), 1))
	s.EM, s.F1, s.Answered, s.ContextTokens = s.EM/n, s.F1/n, s.Answered/n, s.ContextTokens/n
	for k := range s.ToolCalls {
		s.ToolCalls[k] /= n
	}
	return s
}

func printSummary(w io.Writer, ss []summary) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\ttasks\tEM\tF1\tanswered\tavg prompt tokens\tadd\tupdate\tdelete\tretrieve\tsummary\tfilter\tformat errors\tcontext full")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.2f\t%.0f", s.Policy, s.Tasks, s.EM, s.F1, s.Answered, s.ContextTokens)
		for _, t := range []string{memtools.ToolAdd, memtools.ToolUpdate, memtools.ToolDelete, memtools.ToolRetrieve, memtools.ToolSummary, memtools.ToolFilter} {
			fmt.Fprintf(tw, "\t%.2f", s.ToolCalls[t])
		}
		fmt.Fprintf(tw, "\t%d\t%d\n", s.FormatErrors, s.ContextFull)
	}
	tw.Flush()
}

// printEpisode prints one task's episode: its trace, or the result as
// JSON.
func printEpisode(w io.Writer, t env.Task, r env.Result, asJSON bool) error {
	if asJSON {
		return writeJSON(w, r)
	}
	printTrace(w, t, r)
	return nil
}

func printTrace(w io.Writer, t env.Task, r env.Result) {
	fmt.Fprintf(w, "task %s (%s, %s)\nquestion: %s\ngold answer: %s\n", t.ID, t.Type, t.Level, t.Question, t.Answer)
	names := []string{"Stage 1: LTM construction", "Stage 2: STM control under distractors", "Stage 3: integrated reasoning"}
	for i, turns := range r.Stages {
		fmt.Fprintf(w, "\n=== %s\n", names[i])
		for _, turn := range turns {
			fmt.Fprintf(w, "\n[user] %s\n", indent(turn.User))
			for _, st := range turn.Trace.Steps {
				fmt.Fprintf(w, "[assistant, %d prompt tokens] %s\n", st.PromptTokens, indent(st.Response.Message.Content))
				for _, res := range st.Results {
					fmt.Fprintf(w, "[tool %s] %s\n", res.Name, indent(res.Content))
				}
				if len(st.Parsed.Errors) > 0 {
					fmt.Fprintf(w, "[format error] %s\n", strings.Join(st.Parsed.Errors, "; "))
				}
			}
		}
		fmt.Fprintf(w, "\n--- long-term memory after stage %d: %d entries\n", i+1, len(r.LTM[i]))
		entries := append([]ltm.Entry(nil), r.LTM[i]...)
		sort.SliceStable(entries, func(a, b int) bool { return entries[a].ID < entries[b].ID })
		for _, e := range entries {
			fmt.Fprintf(w, "  %s  %s\n", e.ID, e.Content)
		}
	}
	fmt.Fprintf(w, "\nanswer: %q  (EM %.0f, F1 %.2f; %d prompt tokens at answer time)\n", r.Answer, r.EM, r.F1, r.ContextTokens)
}

func indent(s string) string { return strings.ReplaceAll(s, "\n", "\n    ") }
