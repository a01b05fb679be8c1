package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/serve"
)

// synthPrompts are user messages of the synthetic world the tiny policy
// was trained in: facts to remember and questions about them.
func synthPrompts(n int) []string {
	var buf bytes.Buffer
	env.WriteHotpot(&buf, env.NewSynth(7).Generate(n))
	var out []string
	env.StreamHotpot(&buf, func(t env.Task) error {
		out = append(out, t.SupportingFacts...)
		out = append(out, t.Question)
		return nil
	})
	return out
}

func loadtestCmd() *cobra.Command {
	var o serve.LoadOptions
	var promptsFile string
	cmd := &cobra.Command{
		Use:   "loadtest",
		Short: "Load-test a running server: concurrent chat completions for a fixed time",
		Long: `Runs --clients concurrent clients against a server's /v1/chat/completions,
each sending one request after another (stateless, one user message each)
until --duration has passed, and reports requests/s, generated tokens/s,
latency percentiles of successful requests and every non-200 answer.
Prompts are one per line of --prompts, or synthetic facts and questions.`,
		Example: `  serve loadtest --url http://127.0.0.1:8080 --key sk-alice-0001 --clients 32 --duration 30s`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if promptsFile != "" {
				f, err := os.Open(promptsFile)
				if err != nil {
					return err
				}
				defer f.Close()
				sc := bufio.NewScanner(f)
				for sc.Scan() {
					if s := strings.TrimSpace(sc.Text()); s != "" {
						o.Prompts = append(o.Prompts, s)
					}
				}
				if len(o.Prompts) == 0 {
					return fmt.Errorf("%s holds no prompts", promptsFile)
				}
			} else {
				o.Prompts = synthPrompts(50)
			}
			rep, err := serve.LoadTest(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), rep)
			if len(rep.Errors) > 0 {
				return fmt.Errorf("%d of %d requests failed", rep.Requests-rep.OK, rep.Requests)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.URL, "url", "http://127.0.0.1:8080", "the server's base URL")
	f.StringVar(&o.Key, "key", os.Getenv("AGEMEM_API_KEY"), "API key (default $AGEMEM_API_KEY)")
	f.StringVar(&o.Model, "model", "agemem", "model name")
	f.IntVar(&o.Clients, "clients", 32, "concurrent clients")
	f.DurationVar(&o.Duration, "duration", 30*time.Second, "how long to send")
	f.StringVar(&promptsFile, "prompts", "", "file of user messages, one per line")
	f.IntVar(&o.MaxTokens, "max-tokens", 0, "max_tokens per request (0: the server's)")
	f.Float64Var(&o.Temperature, "temperature", 0, "temperature per request")
	return cmd
}
