package sft

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"time"

	"github.com/agemem/agemem/config"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/memtools"
	"github.com/agemem/agemem/memtools/stm"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/decode"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tape"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
)

// Options are a run's inputs besides the config.
type Options struct {
	Config  config.Config
	YAML    string // the effective config, saved with checkpoints
	Resume  string // a checkpoint directory to continue from
	Log     io.Writer
	TTY     bool
	GenEval int // held-out prompts generated from at the end to score the format
}

// Result summarises a run.
type Result struct {
	Steps                    int
	EvalLossStart, EvalLoss  float64 // mean NLL per learned held-out token
	TrainLossStart, TrainEnd float64 // first and last step's training loss
	TokensPerSec             float64 // tokens through forward+backward per second
	ParseOK, ParseN          int     // generated held-out responses the AgeMem parser accepts
	Policy                   string  // where the tuned policy was written
}

// Run fine-tunes cfg.Model.Path on cfg.SFT.Data.
func Run(ctx context.Context, o Options) (Result, error) {
	c := o.Config
	s := c.SFT
	var res Result
	tok, err := tokenizer.Load(filepath.Join(c.Model.Path, "tokenizer.json"))
	if err != nil {
		return res, err
	}
	p, err := train.Open(c.Model.Path, c.LoRA, uint64(c.Seed))
	if err != nil {
		return res, err
	}
	tmpl, err := chat.Detect(c.Model.Path, p.W.ModelType)
	if err != nil {
		return res, err
	}
	if tok.VocabSize() > p.W.VocabSize {
		return res, fmt.Errorf("%s: the tokenizer has %d ids but the model only %d", c.Model.Path, tok.VocabSize(), p.W.VocabSize)
	}
	all, err := Load(s.Data, tok, tmpl, s.LossOn, p.W.MaxPositions)
	if err != nil {
		return res, err
	}
	rng := rand.New(rand.NewPCG(uint64(c.Seed), 0x736674))
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	trainSet, evalSet := Split(all, s.EvalFraction)
	sched := optim.Schedule{Warmup: s.WarmupSteps, Total: s.Steps, Cosine: s.Schedule == "cosine", MinRatio: s.MinLRRatio}
	tr := train.NewOptimizer(p, c.Optim, s.LR, sched, uint64(c.Seed), o.YAML)
	if err := tr.ResumeFrom(o.Resume, o.Log); err != nil {
		return res, err
	}
	learner, err := train.NewLearner(tr, c.Model, o.Log)
	if err != nil {
		return res, err
	}
	batches := Plan(trainSet, s.BatchTokens, s.Steps*s.GradAccum, uint64(c.Seed))
	evalBatches := Plan(evalSet, s.BatchTokens, 0, 0)
	metrics, err := train.OpenMetrics(filepath.Join(s.Out, "metrics.jsonl"), o.Resume != "")
	if err != nil {
		return res, err
	}
	defer metrics.Close()
	fmt.Fprintf(o.Log, "sft: %d records (%d train, %d held out), %d trainable parameters, %d steps of %d micro-batch(es)\n",
		len(all), len(trainSet), len(evalSet), tr.NumParams(), s.Steps, s.GradAccum)
	evaluate := func() float64 {
		learner.SyncHost()
		l := EvalLoss(p.W, evalBatches)
		metrics.Log(map[string]any{"step": tr.Step, "eval_loss": l})
		return l
	}
	res.EvalLossStart = math.NaN()
	if o.Resume == "" && len(evalSet) > 0 {
		res.EvalLossStart = evaluate()
		fmt.Fprintf(o.Log, "eval loss before training: %.4f\n", res.EvalLossStart)
	}
	prog := train.NewProgress(o.Log, s.Steps, o.TTY)
	var tokens int
	start := time.Now()
	for tr.Step < s.Steps {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		t0 := time.Now()
		micro := batches[tr.Step*s.GradAccum : (tr.Step+1)*s.GradAccum]
		learned := 0
		for _, b := range micro {
			learned += len(b.LossRows)
		}
		parts := make([]float64, len(micro))
		stepTokens := 0
		for _, b := range micro {
			stepTokens += len(b.Tokens)
		}
		err := learner.Accumulate(micro, func(i int) train.TrainOptions {
			return train.TrainOptions{Recompute: s.Recompute, Dropout: true, Seed: uint64(c.Seed)<<32 ^ uint64(tr.Step*s.GradAccum+i)}
		}, func(i int, lp []float32, _ []float64) []float32 {
			d := make([]float32, len(lp))
			for j, v := range lp {
				parts[i] -= float64(v)
				d[j] = -1 / float32(learned) // d(mean NLL)/d logp
			}
			return d
		})
		if err != nil {
			return res, err
		}
		var loss float64
		for _, v := range parts {
			loss += v
		}
		loss /= float64(max(learned, 1))
		norm, lr, err := learner.Update()
		if err != nil {
			return res, err
		}
		tokens += stepTokens
		dt := time.Since(t0).Seconds()
		if tr.Step == 1 || res.TrainLossStart == 0 {
			res.TrainLossStart = loss
		}
		res.TrainEnd = loss
		metrics.Log(map[string]any{"step": tr.Step, "loss": loss, "grad_norm": norm, "lr": lr, "tokens": stepTokens, "learned_tokens": learned, "tokens_per_s": float64(stepTokens) / dt})
		prog.Update(tr.Step, fmt.Sprintf("loss %.4f", loss))
		if s.EvalEvery > 0 && tr.Step%s.EvalEvery == 0 && tr.Step < s.Steps && len(evalSet) > 0 {
			evaluate()
		}
		if s.SaveEvery > 0 && tr.Step%s.SaveEvery == 0 && tr.Step < s.Steps {
			if err := learner.Save(filepath.Join(s.Out, fmt.Sprintf("checkpoint-%d", tr.Step))); err != nil {
				return res, err
			}
		}
	}
	res.Steps = tr.Step
	res.TokensPerSec = float64(tokens) / time.Since(start).Seconds()
	res.EvalLoss = math.NaN()
	if len(evalSet) > 0 {
		res.EvalLoss = evaluate()
	}
	if par, ok := learner.(*train.Parallel); ok {
		par.MemoryReport()
	}
	if err := learner.Save(filepath.Join(s.Out, fmt.Sprintf("checkpoint-%d", tr.Step))); err != nil {
		return res, err
	}
	learner.SyncHost()
	dtype := map[string]safetensors.DType{"f32": safetensors.F32, "bf16": safetensors.BF16}[c.Model.Dtype]
	res.Policy = filepath.Join(s.Out, "policy")
	if err := p.Export(res.Policy, dtype); err != nil {
		return res, err
	}
	if err := train.Plot(filepath.Join(s.Out, "loss.png"), "SFT loss (mean NLL per learned token)",
		map[string][]train.Point{"train": metrics.Series["loss"], "eval": metrics.Series["eval_loss"]}); err != nil {
		return res, err
	}
	if o.GenEval > 0 && len(evalSet) > 0 {
		res.ParseOK, res.ParseN, err = FormatEval(ctx, p.W, tok, tmpl, evalSet, o.GenEval, c.Agent.ResponseBudget)
		if err != nil {
			return res, err
		}
		metrics.Log(map[string]any{"step": tr.Step, "parse_rate": float64(res.ParseOK) / float64(res.ParseN)})
	}
	return res, nil
}

// Plan groups examples into micro-batches of at most batchTokens packed
// tokens (a prefix the batch shares counts once), in a seeded order that
// reshuffles each epoch, until n batches exist (n = 0: one pass, in order).
func Plan(ex []Example, batchTokens, n int, seed uint64) []train.Batch {
	if len(ex) == 0 {
		return nil
	}
	var out []train.Batch
	rng := rand.New(rand.NewPCG(seed, 0x706c616e))
	for epoch := 0; n == 0 && epoch == 0 || len(out) < n; epoch++ {
		order := make([]int, len(ex))
		for i := range order {
			order[i] = i
		}
		if n > 0 {
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		var cur []train.Sequence
		flush := func() {
			if len(cur) > 0 {
				out = append(out, train.Pack(cur))
				cur = nil
			}
		}
		for _, i := range order {
			next := append(append([]train.Sequence(nil), cur...), ex[i].Seq)
			if len(cur) > 0 && len(train.Pack(next).Tokens) > batchTokens {
				flush()
			}
			cur = append(cur, ex[i].Seq)
		}
		flush()
	}
	if n > 0 {
		out = out[:n]
	}
	return out
}

// EvalLoss is the mean negative log-likelihood per learned token, without
// gradients or dropout.
func EvalLoss(w *train.Weights[float32], batches []train.Batch) float64 {
	var sum float64
	n := 0
	for _, b := range batches {
		tp := tape.New[float32]()
		lp := w.LogProbs(tp, b, train.TrainOptions{})
		for _, v := range lp.Val {
			sum -= float64(v)
		}
		n += len(lp.Val)
		tp.Release()
	}
	return sum / float64(max(n, 1))
}

// FormatEval generates greedily from up to n held-out prompts and counts
// the responses the AgeMem parser accepts: well-formed think, tool-call and
// answer blocks with no format error.
func FormatEval(ctx context.Context, w *train.Weights[float32], tok *tokenizer.Tokenizer, tmpl chat.Template, ex []Example, n, maxTokens int) (ok, total int, err error) {
	m, err := w.Engine(cpu.New())
	if err != nil {
		return 0, 0, err
	}
	pol := decode.NewGenerator(m, tok, decode.Sampling{MaxTokens: min(maxTokens, 256)})
	pol.Template = tmpl
	var convs [][]stm.Message
	for _, e := range ex[:min(n, len(ex))] {
		var c []stm.Message
		for _, msg := range e.Prompt {
			c = append(c, stm.Message{Role: msg.Role, Content: msg.Content})
		}
		convs = append(convs, c)
	}
	for lo := 0; lo < len(convs); lo += 8 {
		outs, err := pol.CompleteBatch(ctx, convs[lo:min(lo+8, len(convs))])
		if err != nil {
			return 0, 0, err
		}
		for _, o := range outs {
			p := memtools.Parse(o.Text)
			if len(p.Errors) == 0 && (len(p.Calls) > 0 || p.HasAnswer) {
				ok++
			}
			total++
		}
	}
	return ok, total, nil
}
