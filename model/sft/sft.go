package sft

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/engine"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
)

// Options are a run's inputs: the sft section and what it shares with
// the rest of the config.
type Options struct {
	Config Config
	// Model is the Hugging Face directory training starts from (model.path).
	Model string
	LoRA  lora.Options
	Optim optim.Config
	// Copies opens the copy sequences of Config.CopySequences over the
	// tokenizer's first vocab ids, drawn from seed (setup gives pretrain's:
	// the same spans and gaps the model was pretrained on).
	Copies func(tok *tokenizer.Tokenizer, vocab int, seed uint64) (Sequencer, error)
	// Learner says where the steps run (model.devices, train_dtype,
	// zero_stage).
	Learner train.LearnerOptions
	// Dtype stores the exported full weights (model.dtype).
	Dtype safetensors.DType
	Seed  uint64
	// ResponseBudget bounds the responses of the format check (GenEval).
	ResponseBudget int
	YAML           string // the effective config, saved with checkpoints
	Resume         string // a checkpoint directory to continue from
	Log            io.Writer
	TTY            bool
	GenEval        int // held-out prompts generated from at the end to score the format
	// GenDevice decodes GenEval's responses (model.device; nil: the CPU).
	GenDevice kernels.Backend
	// WellFormed says whether a generated response is in the trained
	// format (AgeMem's: memtools.WellFormed); GenEval needs it.
	WellFormed func(reply string) bool
}

// Sequencer draws training sequences (pretraining's copy sequences). An
// alias, so that a source written without this package (env/pretrain's)
// has the same function type.
type Sequencer = interface{ Next() train.Sequence }

// Result summarises a run.
type Result struct {
	Steps                   int
	EvalLossStart, EvalLoss float64 // mean NLL per learned held-out token
	// EvalCopyLossStart, EvalCopyLoss: the same on the held-out tokens that
	// copy their context (MarkCopies); NaN when there are none.
	EvalCopyLossStart, EvalCopyLoss float64
	TrainLossStart, TrainEnd        float64 // first and last step's training loss
	TokensPerSec                    float64 // tokens through forward+backward per second
	ParseOK, ParseN                 int     // generated held-out responses WellFormed accepts
	Policy                          string  // where the tuned policy was written
}

// Run fine-tunes o.Model on o.Config.Data.
func Run(ctx context.Context, o Options) (Result, error) {
	s := o.Config
	var res Result
	tok, err := tokenizer.Load(filepath.Join(o.Model, "tokenizer.json"))
	if err != nil {
		return res, err
	}
	p, err := train.Open(o.Model, o.LoRA, o.Seed)
	if err != nil {
		return res, err
	}
	tmpl, err := chat.Detect(o.Model, p.W.ModelType)
	if err != nil {
		return res, err
	}
	if tok.VocabSize() > p.W.VocabSize {
		return res, fmt.Errorf("%s: the tokenizer has %d ids but the model only %d", o.Model, tok.VocabSize(), p.W.VocabSize)
	}
	all, err := Load(s.Data, tok, tmpl, s.LossOn, p.W.MaxPositions)
	if err != nil {
		return res, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x736674))
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	MarkCopies(all)
	if s.CopyWeight != 1 {
		for i, e := range all {
			all[i].Seq.Weights = make([]float32, len(e.Copy))
			for j, c := range e.Copy {
				all[i].Seq.Weights[j] = 1
				if c {
					all[i].Seq.Weights[j] = float32(s.CopyWeight)
				}
			}
		}
	}
	trainSet, evalSet := Split(all, s.EvalFraction)
	var evalCopy []Example // held-out records learning only their copy tokens
	for _, e := range evalSet {
		if slices.Contains(e.Copy, true) {
			evalCopy = append(evalCopy, Example{Seq: train.Sequence{IDs: e.Seq.IDs, Loss: e.Copy}})
		}
	}
	tr := train.NewOptimizer(p, o.Optim, s.LR, s.Over(s.Steps), o.Seed, o.YAML)
	if err := tr.ResumeFrom(o.Resume, o.Log); err != nil {
		return res, err
	}
	learner, err := train.NewLearner(tr, o.Learner, o.Log)
	if err != nil {
		return res, err
	}
	batches := Plan(trainSet, s.BatchTokens, s.Steps*s.GradAccum, o.Seed)
	var copies Sequencer
	if s.CopySequences > 0 {
		if o.Copies == nil {
			return res, fmt.Errorf("sft.copy_sequences %d: no source of copy sequences", s.CopySequences)
		}
		var err error
		if copies, err = o.Copies(tok, p.W.VocabSize, o.Seed^0x73667463); err != nil {
			return res, fmt.Errorf("sft.copy_sequences: %w", err)
		}
		for range tr.Step * s.CopySequences { // a resumed run draws what it would have
			copies.Next()
		}
	}
	evalBatches := Plan(evalSet, s.BatchTokens, 0, 0)
	evalCopyBatches := Plan(evalCopy, s.BatchTokens, 0, 0)
	fmt.Fprintf(o.Log, "sft: %d records (%d train, %d held out), %d trainable parameters, %d steps of %d micro-batch(es)\n",
		len(all), len(trainSet), len(evalSet), tr.NumParams(), s.Steps, s.GradAccum)
	res.EvalLossStart, res.EvalLoss = math.NaN(), math.NaN()
	var tokens int
	var elapsed time.Duration
	loop := train.Loop{Steps: s.Steps, EvalEvery: s.EvalEvery, SaveEvery: s.SaveEvery, EvalFirst: true,
		Out: s.Out, Resumed: o.Resume != "", Log: o.Log, TTY: o.TTY, Save: learner.Save,
		Charts: []train.Chart{{File: "loss.png", Title: "SFT: loss on the learned tokens",
			YLabel: "mean NLL (nats per token)", Series: []string{"loss", "eval_loss"}}}}
	if len(evalSet) > 0 {
		loop.Eval = func(_ context.Context, n int) (map[string]any, error) {
			l, err := train.EvalLoss(learner, p.W, evalBatches)
			if err != nil {
				return nil, err
			}
			m := map[string]any{"eval_loss": l}
			cl := math.NaN()
			if len(evalCopyBatches) > 0 {
				if cl, err = train.EvalLoss(learner, p.W, evalCopyBatches); err != nil {
					return nil, err
				}
				m["eval_copy_loss"] = cl
			}
			if n == 0 {
				res.EvalLossStart, res.EvalCopyLossStart = l, cl
				fmt.Fprintf(o.Log, "eval loss before training: %.4f (copied tokens: %.4f)\n", l, cl)
			}
			res.EvalLoss, res.EvalCopyLoss = l, cl
			return m, nil
		}
	}
	loop.Step = func(_ context.Context, n int) (map[string]any, string, error) {
		t0 := time.Now()
		micro := batches[(n-1)*s.GradAccum : n*s.GradAccum]
		if copies != nil {
			seqs := make([]train.Sequence, s.CopySequences)
			for i := range seqs {
				seqs[i] = copies.Next()
			}
			micro = append(micro[:len(micro):len(micro)], train.Pack(seqs))
		}
		learned, stepTokens := 0, 0
		var weight float64 // Σ of the learned tokens' weights
		for _, b := range micro {
			learned += len(b.LossRows)
			stepTokens += len(b.Tokens)
			weight += float64(len(b.LossRows))
			for _, w := range b.Weights {
				weight += float64(w) - 1
			}
		}
		parts := make([]float64, len(micro))
		err := learner.Accumulate(micro, func(i int) train.TrainOptions {
			return train.TrainOptions{Recompute: s.Recompute, Dropout: true, Seed: o.Seed<<32 ^ uint64((n-1)*s.GradAccum+i)}
		}, func(i int, lp []float32) []float32 {
			d := make([]float32, len(lp))
			for j, v := range lp {
				parts[i] -= float64(v)
				w := float32(1)
				if micro[i].Weights != nil {
					w = micro[i].Weights[j]
				}
				d[j] = -w / float32(weight) // d(weighted mean NLL)/d logp
			}
			return d
		})
		if err != nil {
			return nil, "", err
		}
		var loss float64
		for _, v := range parts {
			loss += v
		}
		loss /= float64(max(learned, 1))
		norm, lr, err := learner.Update()
		if err != nil {
			return nil, "", err
		}
		dt := time.Since(t0)
		tokens, elapsed = tokens+stepTokens, elapsed+dt
		if res.TrainLossStart == 0 {
			res.TrainLossStart = loss
		}
		res.TrainEnd = loss
		return map[string]any{"loss": loss, "grad_norm": norm, "lr": lr, "tokens": stepTokens, "learned_tokens": learned,
			"tokens_per_s": float64(stepTokens) / dt.Seconds()}, fmt.Sprintf("loss %.4f", loss), nil
	}
	metrics, err := loop.Run(ctx, tr.Step)
	if err != nil {
		return res, err
	}
	defer metrics.Close()
	res.Steps = tr.Step
	res.TokensPerSec = float64(tokens) / elapsed.Seconds()
	if par, ok := learner.(*train.Parallel); ok {
		par.MemoryReport()
	}
	learner.SyncHost()
	res.Policy = filepath.Join(s.Out, "policy")
	if err := p.Export(res.Policy, o.Dtype); err != nil {
		return res, err
	}
	if o.GenEval > 0 && len(evalSet) > 0 && o.WellFormed != nil {
		res.ParseOK, res.ParseN, err = FormatEval(ctx, o.GenDevice, p.W, tok, tmpl, evalSet, o.GenEval, o.ResponseBudget, o.WellFormed)
		if err != nil {
			return res, err
		}
		if err := metrics.Log(map[string]any{"step": tr.Step, "parse_rate": float64(res.ParseOK) / float64(res.ParseN)}); err != nil {
			return res, err
		}
	}
	return res, nil
}

// FormatEval generates greedily from up to n held-out prompts and counts
// the responses wellFormed accepts.
func FormatEval(ctx context.Context, be kernels.Backend, w *train.Weights[float32], tok *tokenizer.Tokenizer, tmpl chat.Template, ex []Example, n, maxTokens int, wellFormed func(string) bool) (ok, total int, err error) {
	if be == nil {
		be = cpu.New()
	}
	m, err := w.Engine(be)
	if err != nil {
		return 0, 0, err
	}
	s := engine.Sampling{MaxTokens: min(maxTokens, 256)}
	for _, name := range []string{"<|im_end|>", "<|endoftext|>"} {
		if id, ok := tok.TokenID(name); ok {
			s.StopIDs = append(s.StopIDs, id)
		}
	}
	var prompts [][]int
	for _, e := range ex[:min(n, len(ex))] {
		text, err := chat.Render(e.Prompt, chat.Options{Template: tmpl, AddGenerationPrompt: true})
		if err != nil {
			return 0, 0, err
		}
		prompts = append(prompts, tok.Encode(text))
	}
	gens, err := engine.Generate(ctx, m, prompts, s, tok)
	if err != nil {
		return 0, 0, err
	}
	for _, g := range gens {
		ids := g.Tokens
		if g.FinishReason == "stop" && len(ids) > 0 && slices.Contains(s.StopIDs, ids[len(ids)-1]) {
			ids = ids[:len(ids)-1]
		}
		if wellFormed(tok.Decode(ids, true)) {
			ok++
		}
		total++
	}
	return ok, total, nil
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
