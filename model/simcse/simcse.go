// Package simcse trains sentence encoders with SimCSE (Gao et al., 2021):
// unsupervised, where a sentence encoded twice under different dropout
// masks is its own positive and the rest of the batch are negatives, and
// supervised, where entailment pairs are positives and contradictions hard
// negatives; both with the InfoNCE loss at temperature τ. It also
// evaluates encoders: Spearman correlation on STS pairs and AgeMem's
// supporting-fact recall@k.
package simcse

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/model/bert"
	"github.com/agemem/agemem/model/checkpoint"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/tape"
	"github.com/agemem/agemem/model/train"
)

// Example is one training example: Positive is Anchor itself in the
// unsupervised objective; Negative, if set, is a hard negative.
type Example struct{ Anchor, Positive, Negative string }

// Options shape a run.
type Options struct {
	Steps       int
	Batch       int     // examples per step
	LR          float64 // peak learning rate
	Warmup      int
	Temperature float64 // τ, 0.05 in the paper
	Dropout     float64 // hidden dropout, the unsupervised noise (0.1)
	AttnDropout float64 // dropout on attention probabilities (0.1)
	// Pooling trains through cls_mlp (SimCSE's MLP head over [CLS]) or
	// cls or mean.
	Pooling string
	Seed    uint64
	Optim   optim.Config
	// Device, if set, runs each step there (bert.Trainer: the weights,
	// gradients and AdamW moments stay on it, a GPU); nil runs the CPU's
	// autodiff tape.
	Device    kernels.EncoderTrainer
	SaveEvery int
	EvalEvery int
	// Eval, if set, scores the encoder being trained (metrics and the
	// eval plot).
	Eval   func(ctx context.Context, e *bert.Encoder) (map[string]float64, error)
	Out    string
	Resume string // a checkpoint directory to continue from
	Config string // the effective config, kept in checkpoints
	Log    io.Writer
	TTY    bool
}

// Result summarises a run.
type Result struct {
	Steps     int
	FirstLoss float64
	LastLoss  float64
	Eval      map[string]float64 // the final evaluation
	Encoder   string             // the trained encoder's directory
}

// Train fine-tunes the encoder in initDir on data and writes out/encoder
// (a Hugging Face directory), out/checkpoint-N, metrics.jsonl, loss.png
// and eval.png.
func Train(ctx context.Context, initDir string, data []Example, o Options) (Result, error) {
	var res Result
	if len(data) < 2 || o.Batch < 2 {
		return res, fmt.Errorf("simcse: %d examples in batches of %d; in-batch negatives need at least 2 of each", len(data), o.Batch)
	}
	w, err := bert.Load[float32](initDir, true)
	if err != nil {
		return res, err
	}
	tok, err := bert.LoadTokenizer(initDir)
	if err != nil {
		return res, err
	}
	evalPool := bert.PoolCLS
	if o.Pooling == bert.PoolMean {
		evalPool = bert.PoolMean
	}
	opt := optim.NewAdamW(o.Optim.AdamW())
	step := 0
	rng := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	if o.Resume != "" {
		st, err := checkpoint.Load(o.Resume)
		if err != nil {
			return res, err
		}
		for _, n := range w.Named {
			v, ok := st.Params[n.Name]
			if !ok || len(v) != len(n.V.Val) {
				return res, fmt.Errorf("%s: no parameter %s of %d values", o.Resume, n.Name, len(n.V.Val))
			}
			copy(n.V.Val, v)
		}
		if st.Optim != nil {
			opt = st.Optim
		}
		step = st.Step
	}
	var dev *bert.Trainer
	if o.Device != nil {
		dev = bert.NewTrainer(o.Device, w, decays)
		dev.LoadMoments(opt)
	}
	// download brings the device's weights (and, with opt, moments) to the
	// host before anything reads them there.
	download := func(opt *optim.AdamW) {
		if dev != nil {
			dev.Download(opt, step)
		}
	}
	sched := optim.Schedule{Warmup: o.Warmup, Total: o.Steps}
	enc := &bert.Encoder{W: w, Tok: tok, Pooling: evalPool}
	maxLen := w.MaxTokens()
	encode := func(s string) []int { return tok.Encode(s, maxLen) }
	fmt.Fprintf(o.Log, "simcse: %d examples, %d steps of %d, %d parameters, τ %g, dropout %g (attention %g)\n", len(data), o.Steps, o.Batch, w.NumParams(), o.Temperature, o.Dropout, o.AttnDropout)
	order := rng.Perm(len(data))
	pos := (step * o.Batch) % len(data)
	loop := train.Loop{Steps: o.Steps, EvalEvery: o.EvalEvery, SaveEvery: o.SaveEvery, EvalFirst: true,
		Out: o.Out, Resumed: o.Resume != "", Log: o.Log, TTY: o.TTY,
		Save: func(dir string) error {
			download(opt)
			return save(w, opt, step, o, dir)
		},
		Charts: []train.Chart{{File: "loss.png", Title: "SimCSE: InfoNCE loss", YLabel: "loss (nats per example)", Series: []string{"loss"}},
			{File: "eval.png", Title: "SimCSE: held-out evaluation", YLabel: "Spearman ρ / recall", Prefix: "eval_"}}}
	if o.Eval != nil {
		loop.Eval = func(ctx context.Context, n int) (map[string]any, error) {
			download(nil)
			enc.Reload() // the weights moved since the last evaluation
			m, err := o.Eval(ctx, enc)
			if err != nil {
				return nil, err
			}
			rec := map[string]any{}
			for k, v := range m {
				rec["eval_"+k] = v
			}
			res.Eval = m
			fmt.Fprintf(o.Log, "simcse: step %d eval %v\n", n, m)
			return rec, nil
		}
	}
	loop.Step = func(_ context.Context, n int) (map[string]any, string, error) {
		t0 := time.Now()
		var batch []Example
		for len(batch) < o.Batch {
			if pos == len(data) {
				order, pos = rng.Perm(len(data)), 0
			}
			batch = append(batch, data[order[pos]])
			pos++
		}
		lr := sched.LR(o.LR, step)
		var loss, norm float64
		if dev != nil {
			if loss, err = deviceStep(dev, batch, encode, o, uint64(step)+o.Seed<<20); err != nil {
				return nil, "", err
			}
			norm = dev.Step(opt.Config, step+1, lr, o.Optim.ClipNorm)
			opt.StepN = step + 1
		} else {
			if loss, err = trainStep(w, batch, encode, o, uint64(step)+o.Seed<<20); err != nil {
				return nil, "", err
			}
			var params []optim.Param
			for _, nv := range w.Named {
				if nv.V.Grad != nil {
					params = append(params, optim.Param{Name: nv.Name, W: nv.V.Val, G: nv.V.Grad, Decay: decays(nv.Name)})
				}
			}
			norm = optim.GlobalNorm(params)
			if o.Optim.ClipNorm > 0 {
				optim.ClipGlobalNorm(params, o.Optim.ClipNorm)
			}
			if err := opt.Step(params, lr); err != nil {
				return nil, "", err
			}
			optim.ZeroGrad(params)
		}
		step++
		if res.Steps == 0 {
			res.FirstLoss = loss
		}
		res.Steps++
		res.LastLoss = loss
		return map[string]any{"loss": loss, "lr": lr, "grad_norm": norm, "step_seconds": time.Since(t0).Seconds()},
			fmt.Sprintf("loss %.4f lr %.2e grad norm %.3f", loss, lr, norm), nil
	}
	metrics, err := loop.Run(ctx, step)
	if err != nil {
		return res, err
	}
	defer metrics.Close()
	download(nil)
	res.Encoder = filepath.Join(o.Out, "encoder")
	if err := w.Save(res.Encoder); err != nil {
		return res, err
	}
	if err := lora.CopyFiles(initDir, res.Encoder, "vocab.txt", "tokenizer.json", "tokenizer_config.json"); err != nil {
		return res, err
	}
	return res, metrics.Close()
}

// decays says which parameters AdamW's weight decay applies to: matrices,
// not biases or LayerNorms.
func decays(name string) bool { return optim.DecayFor(name) && !strings.Contains(name, "LayerNorm") }

// batchSeqs is a batch's sequences: the anchors, then their positives, then
// (supervised) their hard negatives.
func batchSeqs(batch []Example, encode func(string) []int) ([][]int, error) {
	var seqs [][]int
	for _, e := range batch {
		seqs = append(seqs, encode(e.Anchor))
	}
	for _, e := range batch {
		seqs = append(seqs, encode(e.Positive))
	}
	hard := batch[0].Negative != ""
	for _, e := range batch {
		if (e.Negative != "") != hard {
			return nil, fmt.Errorf("simcse: a batch mixes examples with and without hard negatives")
		}
		if hard {
			seqs = append(seqs, encode(e.Negative))
		}
	}
	return seqs, nil
}

func trainStep(w *bert.Weights[float32], batch []Example, encode func(string) []int, o Options, seed uint64) (float64, error) {
	b := len(batch)
	seqs, err := batchSeqs(batch, encode)
	if err != nil {
		return 0, err
	}
	tp := tape.New[float32]()
	defer tp.Release()
	h, segs, err := w.Forward(tp, seqs, o.Dropout, o.AttnDropout, seed)
	if err != nil {
		return 0, err
	}
	z, err := w.Pool(tp, h, segs, o.Pooling)
	if err != nil {
		return 0, err
	}
	anchors := make([]int, b)
	cands := make([]int, len(seqs)-b)
	for i := range anchors {
		anchors[i] = i
	}
	for i := range cands {
		cands[i] = b + i
	}
	logits := tp.Scale(tp.Linear(tp.Gather(z, anchors), tp.Gather(z, cands), nil), 1/o.Temperature)
	targets := make([]int, b)
	for i := range targets {
		targets[i] = i
	}
	lp := tp.LogProbs(logits, targets)
	var loss float64
	dy := make([]float32, b)
	for i, v := range lp.Val {
		loss -= float64(v)
		dy[i] = -1 / float32(b)
	}
	tp.Backward(lp, dy)
	loss /= float64(b)
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return loss, fmt.Errorf("simcse: the loss is %g; lower the learning rate", loss)
	}
	return loss, nil
}

// deviceStep is trainStep on a bert.Trainer: the encoder's forward and
// backward on its device, the InfoNCE loss over the pooled vectors here
// (a few kilobytes each way).
func deviceStep(tr *bert.Trainer, batch []Example, encode func(string) []int, o Options, seed uint64) (float64, error) {
	seqs, err := batchSeqs(batch, encode)
	if err != nil {
		return 0, err
	}
	pooled, pass, err := tr.Forward(seqs, o.Pooling, o.Dropout, o.AttnDropout, seed)
	if err != nil {
		return 0, err
	}
	loss, dPooled := InfoNCE(pooled, len(seqs), len(batch), o.Temperature)
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return loss, fmt.Errorf("simcse: the loss is %g; lower the learning rate", loss)
	}
	return loss, pass.Backward(dPooled)
}

// InfoNCE is SimCSE's loss over n pooled vectors (rows of p, not yet
// normalised) of which the first b are anchors and the rest candidates,
// anchor i's positive being candidate i: the mean over anchors of
// −log softmax_j(cos(z_i, z_{b+j})/τ)[i], and its gradient with respect to
// p (through the L2 normalisation, ‖p‖ floored at 1e-12 as the tape's).
func InfoNCE(p []float32, n, b int, tau float64) (float64, []float32) {
	h := len(p) / n
	z := make([][]float64, n)
	norms := make([]float64, n)
	for i := range z {
		row := p[i*h : (i+1)*h]
		var s float64
		for _, v := range row {
			s += float64(v) * float64(v)
		}
		norms[i] = math.Max(math.Sqrt(s), 1e-12)
		z[i] = make([]float64, h)
		for j, v := range row {
			z[i][j] = float64(v) / norms[i]
		}
	}
	dz := make([][]float64, n)
	for i := range dz {
		dz[i] = make([]float64, h)
	}
	m := n - b
	var loss float64
	logits := make([]float64, m)
	for i := range b {
		mx := math.Inf(-1)
		for j := range m {
			var d float64
			for e := range h {
				d += z[i][e] * z[b+j][e]
			}
			logits[j] = d / tau
			mx = math.Max(mx, logits[j])
		}
		var sum float64
		for j := range m {
			logits[j] = math.Exp(logits[j] - mx)
			sum += logits[j]
		}
		loss -= math.Log(logits[i] / sum)
		for j := range m {
			g := logits[j] / sum // softmax − onehot, over b anchors and τ
			if j == i {
				g--
			}
			g /= float64(b) * tau
			for e := range h {
				dz[i][e] += g * z[b+j][e]
				dz[b+j][e] += g * z[i][e]
			}
		}
	}
	dp := make([]float32, len(p))
	for i := range n {
		var dot float64
		for e := range h {
			dot += z[i][e] * dz[i][e]
		}
		for e := range h {
			dp[i*h+e] = float32((dz[i][e] - z[i][e]*dot) / norms[i])
		}
	}
	return loss / float64(b), dp
}

func save(w *bert.Weights[float32], opt *optim.AdamW, step int, o Options, dir string) error {
	st := checkpoint.State{Step: step, Config: o.Config, Params: map[string][]float32{}, Shapes: map[string][]int{}, Optim: opt}
	for _, n := range w.Named {
		st.Params[n.Name] = n.V.Val
		st.Shapes[n.Name] = []int{n.V.Rows, n.V.Cols}
	}
	if err := checkpoint.Save(dir, st); err != nil {
		return err
	}
	return nil
}
