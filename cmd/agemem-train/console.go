package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/console"
)

// consoleCmd serves the training runs' pages of the web console.
func consoleCmd() *cobra.Command {
	var runs, addr string
	var refresh time.Duration
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve a web console of training runs: curves, runs side by side, evaluation tables, rollouts",
		Long: `console serves the training runs below --runs at http://ADDR/ui/: every folder
holding a metrics.jsonl is a run (pretrain, sft, GRPO). A run's page draws its
curves (GRPO's reward and its components with a moving average, KL, loss,
validation J; any logged metric on demand) as SVG; several runs share a chart
on the compare page; agemem-train eval's JSON reports show side by side; a
GRPO run's rollout browser lists each step's groups and shows a group's K
trajectories (each turn's messages, the policy's replies, tool calls and
results, the reward's components). A run still training refreshes itself.

The console has no login: it listens on loopback by default. serve shows the
same pages to admin keys with serve.console.runs.`,
		Example: "  agemem-train console --runs runs/\n  agemem-train console --runs runs/ --addr 127.0.0.1:8090 --refresh 10s",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if st, err := os.Stat(runs); err != nil {
				return fmt.Errorf("--runs: %w", err)
			} else if !st.IsDir() {
				return fmt.Errorf("--runs %s: not a folder", runs)
			}
			cfg := console.DefaultConfig()
			cfg.Runs, cfg.Refresh = runs, refresh
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			c, err := console.New(console.Options{Config: cfg, Open: console.Principal{Admin: true, KeyID: "local"}, Title: "agemem-train", Logger: log})
			if err != nil {
				return fmt.Errorf("console: %w", err)
			}
			mux := http.NewServeMux()
			mux.Handle(console.Prefix+"/", c)
			mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix+"/", http.StatusSeeOther))
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--addr: %w", err)
			}
			if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
				log.Warn("the console has no login and listens beyond loopback: anyone who reaches it reads the runs", "addr", ln.Addr().String())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "console: http://%s%s/ (runs below %s; Ctrl-C stops it)\n", ln.Addr(), console.Prefix, runs)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&runs, "runs", "runs", "the folder of training runs")
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8090", "listen address")
	cmd.Flags().DurationVar(&refresh, "refresh", 5*time.Second, "how often a run still training refreshes its page")
	return cmd
}
