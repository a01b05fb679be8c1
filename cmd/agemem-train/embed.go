package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/kernels/device"
	"github.com/agemem/agemem/model/bert"
	"github.com/agemem/agemem/model/simcse"
)

func embedCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "embed", Short: "Sentence encoders: synthetic data, a random BERT, SimCSE training, evaluation"}
	cmd.AddCommand(embedDataCmd(), embedInitCmd(), embedTrainCmd(g), embedEvalCmd(g))
	return cmd
}

func embedDataCmd() *cobra.Command {
	var out string
	var n int
	var seed uint64
	cmd := &cobra.Command{
		Use:   "data",
		Short: "Write a synthetic paraphrase corpus, NLI triples, STS sets and held-out tasks",
		Long: `Writes, under --out: corpus.txt (unsupervised SimCSE: facts about invented
names, each relation written several ways, and the sentences of synthetic
HotpotQA tasks), nli.tsv (supervised: a fact, the same fact written another
way, a contradiction), sts-dev.tsv and sts-test.tsv (graded pairs with new
names: 5 a paraphrase, 3 another object, 2 another relation of the same
subject, 1 the same wording about other names, 0 unrelated) and
tasks-eval.json (held-out HotpotQA-format tasks for recall@k).`,
		Example: "  agemem-train embed data --out data/simcse --n 20000",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n < 100 {
				return fmt.Errorf("--n must be at least 100, got %d", n)
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			gen := simcse.NewGenerator(seed)
			corpus := gen.Corpus(n)
			tasks, err := synthTasks(seed, n/20)
			if err != nil {
				return err
			}
			for _, t := range tasks {
				corpus = append(corpus, t.Question)
				corpus = append(corpus, t.SupportingFacts...)
				corpus = append(corpus, t.Distractors...)
			}
			if err := os.WriteFile(filepath.Join(out, "corpus.txt"), []byte(strings.Join(corpus, "\n")+"\n"), 0o644); err != nil {
				return err
			}
			var nli strings.Builder
			for _, e := range gen.Triples(n / 2) {
				fmt.Fprintf(&nli, "%s\t%s\t%s\n", e.Anchor, e.Positive, e.Negative)
			}
			if err := os.WriteFile(filepath.Join(out, "nli.tsv"), []byte(nli.String()), 0o644); err != nil {
				return err
			}
			if err := simcse.WriteSTS(filepath.Join(out, "sts-dev.tsv"), simcse.NewGenerator(seed+1000).STS(500)); err != nil {
				return err
			}
			if err := simcse.WriteSTS(filepath.Join(out, "sts-test.tsv"), simcse.NewGenerator(seed+2000).STS(1000)); err != nil {
				return err
			}
			f, err := os.Create(filepath.Join(out, "tasks-eval.json"))
			if err != nil {
				return err
			}
			if err := env.WriteHotpot(f, env.NewSynth(seed+3000).Generate(200)); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d corpus sentences, %d NLI triples, 500 + 1000 STS pairs, 200 tasks to %s\n", len(corpus), n/2, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "data/simcse", "output folder")
	cmd.Flags().IntVar(&n, "n", 20000, "corpus facts (NLI triples: n/2; task sentences come on top)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed (the STS sets and tasks use seeds of their own)")
	return cmd
}

// synthTasks are n synthetic HotpotQA tasks.
func synthTasks(seed uint64, n int) ([]env.Task, error) {
	var buf bytes.Buffer
	if err := env.WriteHotpot(&buf, env.NewSynth(seed).Generate(n)); err != nil {
		return nil, err
	}
	var tasks []env.Task
	err := env.StreamHotpot(&buf, func(t env.Task) error { tasks = append(tasks, t); return nil })
	return tasks, err
}

func embedInitCmd() *cobra.Command {
	var corpus, out, act string
	var hidden, layers, heads, inter, maxPos, minCount int
	var seed uint64
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Write a random BERT encoder with a WordPiece vocabulary learned from a corpus",
		Example: `  agemem-train embed init --corpus data/simcse/corpus.txt --out runs/tiny/encoder
  agemem-train embed init --corpus data/simcse/corpus.txt --hidden 256 --layers 4 --heads 4 --intermediate 1024 --out runs/enc`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lines, err := readLines(corpus)
			if err != nil {
				return err
			}
			vocab := simcse.Vocab(lines, minCount)
			cfg := bert.Config{ModelType: "bert", Architectures: []string{"BertModel"}, HiddenSize: hidden, Layers: layers, Heads: heads,
				Intermediate: inter, HiddenAct: act, HiddenDropout: 0.1, AttnDropout: 0.1, MaxPositions: maxPos, TypeVocab: 2, LayerNormEps: 1e-12}
			if err := bert.InitRandom(out, cfg, vocab, true, seed); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote a random %d-layer BERT (hidden %d, %d-token vocabulary) to %s\n", layers, hidden, len(vocab), out)
			return nil
		},
	}
	cmd.Flags().StringVar(&corpus, "corpus", "data/simcse/corpus.txt", "sentences the vocabulary is learned from")
	cmd.Flags().StringVar(&out, "out", "runs/tiny/encoder", "output directory (Hugging Face layout)")
	cmd.Flags().IntVar(&hidden, "hidden", 128, "hidden size")
	cmd.Flags().IntVar(&layers, "layers", 2, "layers")
	cmd.Flags().IntVar(&heads, "heads", 4, "attention heads")
	cmd.Flags().IntVar(&inter, "intermediate", 512, "feed-forward size")
	cmd.Flags().IntVar(&maxPos, "max-positions", 128, "position table (the longest input)")
	cmd.Flags().IntVar(&minCount, "min-count", 3, "words seen at least this often get their own token")
	cmd.Flags().StringVar(&act, "act", "gelu", "gelu | gelu_new")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed")
	return cmd
}

func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" {
			out = append(out, s)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no sentences", path)
	}
	return out, nil
}

// readExamples reads unsup sentences or sup triples.
func readExamples(path, mode string) ([]simcse.Example, error) {
	lines, err := readLines(path)
	if err != nil {
		return nil, err
	}
	out := make([]simcse.Example, len(lines))
	for i, l := range lines {
		if mode == "unsup" {
			out[i] = simcse.Example{Anchor: l, Positive: l}
			continue
		}
		cols := strings.Split(l, "\t")
		if len(cols) != 3 {
			return nil, fmt.Errorf("%s:%d: %d tab-separated columns; supervised SimCSE wants anchor, entailment, contradiction", path, i+1, len(cols))
		}
		out[i] = simcse.Example{Anchor: cols[0], Positive: cols[1], Negative: cols[2]}
	}
	return out, nil
}

// evaluator scores an embedder on the configured STS file and tasks.
func evaluator(stsPath, tasksPath string, k int) (func(context.Context, embed.Embedder) (map[string]float64, error), error) {
	var pairs []simcse.Pair
	var tasks []env.Task
	var err error
	if stsPath != "" {
		if pairs, err = simcse.ReadSTS(stsPath); err != nil {
			return nil, err
		}
	}
	if tasksPath != "" {
		if k < 1 {
			return nil, fmt.Errorf("recall@%d: k must be at least 1", k)
		}
		if tasks, err = env.LoadHotpot(tasksPath); err != nil {
			return nil, err
		}
		if len(tasks) == 0 {
			return nil, fmt.Errorf("%s holds no tasks to measure recall on", tasksPath)
		}
	}
	return func(ctx context.Context, e embed.Embedder) (map[string]float64, error) {
		m := map[string]float64{}
		if len(pairs) > 0 {
			s, err := simcse.STS(ctx, e, pairs)
			if err != nil {
				return nil, err
			}
			m["spearman"] = s
		}
		if len(tasks) > 0 {
			r, err := env.SupportRecall(ctx, e, tasks, k)
			if err != nil {
				return nil, err
			}
			m[fmt.Sprintf("recall@%d", k)] = r
		}
		return m, nil
	}, nil
}

func embedTrainCmd(g *globals) *cobra.Command {
	var resume string
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train a sentence encoder with SimCSE (simcse section of the config)",
		Long: `Unsupervised SimCSE (simcse.mode unsup): every sentence of simcse.data is
encoded twice under different dropout masks, its two vectors are the
positive pair and the other sentences of the batch the negatives (InfoNCE
at temperature simcse.temperature). Supervised (sup): each line is an
anchor, an entailment (the positive) and a contradiction (a hard
negative). AdamW, warmup, clipping and checkpoints are the training
core's; Spearman on simcse.sts and supporting-fact recall@k on
simcse.tasks are logged every simcse.eval_every steps. Writes
simcse.out/encoder (a Hugging Face BERT directory: embed.backend encoder
reads it), checkpoint-N/, metrics.jsonl, loss.png and eval.png.`,
		Example: `  agemem-train embed train --config configs/tiny.yaml
  agemem-train embed train --config configs/tiny.yaml --set simcse.mode=sup --set simcse.data=data/simcse/nli.tsv
  agemem-train embed train --config configs/tiny.yaml --resume runs/tiny/simcse/checkpoint-100`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			sc := cfg.SimCSE
			data, err := readExamples(sc.Data, sc.Mode)
			if err != nil {
				return fmt.Errorf("simcse.data: %w", err)
			}
			ev, err := evaluator(sc.STS, sc.Tasks, sc.RecallK)
			if err != nil {
				return err
			}
			dev, err := device.OpenEncoderTrainer(sc.Device, sc.Dtype == "bf16", cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("simcse.device: %w", err)
			}
			res, err := simcse.Train(cmd.Context(), sc.Init, data, simcse.Options{Device: dev,
				Steps: sc.Steps, Batch: sc.Batch, LR: sc.LR, Warmup: sc.WarmupSteps, Temperature: sc.Temperature,
				Dropout: sc.Dropout, AttnDropout: sc.AttnDropout, Pooling: sc.Pooling, Seed: uint64(cfg.Seed), Optim: cfg.Optim, SaveEvery: sc.SaveEvery,
				EvalEvery: sc.EvalEvery, Out: sc.Out, Resume: resume, Config: cfg.YAML(), Log: cmd.ErrOrStderr(),
				Eval: func(ctx context.Context, e *bert.Encoder) (map[string]float64, error) { return ev(ctx, e) },
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "simcse: loss %.4f -> %.4f over %d steps; final %v; encoder in %s\n", res.FirstLoss, res.LastLoss, res.Steps, res.Eval, res.Encoder)
			return nil
		},
	}
	cmd.Flags().StringVar(&resume, "resume", "", "continue from a checkpoint directory")
	return cmd
}

func embedEvalCmd(g *globals) *cobra.Command {
	var stsPath, tasksPath, pooling string
	var k int
	cmd := &cobra.Command{
		Use:   "eval [ENCODER_DIR|hashing ...]",
		Short: "Spearman on STS-B-format pairs and supporting-fact recall@k of encoders",
		Long: `Scores each named embedder: an encoder directory (BERT family, --pooling)
or "hashing" (embed.dim, embed.char_ngrams). --sts takes STS-B's TSV (GLUE
or original layout) or sentence1/sentence2/score; --tasks a HotpotQA-format
file, where each question retrieves its top k among its task's sentences.`,
		Example: "  agemem-train embed eval hashing runs/tiny/encoder runs/tiny/simcse/encoder --sts data/simcse/sts-test.tsv --tasks data/simcse/tasks-eval.json",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if stsPath == "" && tasksPath == "" {
				return fmt.Errorf("give --sts FILE, --tasks FILE or both")
			}
			ev, err := evaluator(stsPath, tasksPath, k)
			if err != nil {
				return err
			}
			be, err := device.Open(cfg.Embed.Device, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("embed.device: %w", err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%-36s %10s %10s\n", "embedder", "spearman", fmt.Sprintf("recall@%d", k))
			for _, a := range args {
				var e embed.Embedder
				if a == "hashing" {
					e = embed.NewHashing(cfg.Embed.Dim, cfg.Embed.CharNgrams)
				} else if e, err = bert.LoadEncoder(a, pooling, cfg.Embed.BatchTokens, be); err != nil {
					return err
				}
				m, err := ev(cmd.Context(), e)
				if err != nil {
					return err
				}
				cell := func(key string) string {
					if v, ok := m[key]; ok {
						return fmt.Sprintf("%.4f", v)
					}
					return "-"
				}
				fmt.Fprintf(w, "%-36s %10s %10s\n", a, cell("spearman"), cell(fmt.Sprintf("recall@%d", k)))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&stsPath, "sts", "", "STS-B-format TSV")
	cmd.Flags().StringVar(&tasksPath, "tasks", "", "HotpotQA-format tasks")
	cmd.Flags().StringVar(&pooling, "pooling", "mean", "encoder pooling: mean | cls | cls_mlp")
	cmd.Flags().IntVar(&k, "k", 3, "recall@k")
	return cmd
}
