// Package pretrain gives a model trained from scratch the circuit copying
// needs before it learns anything else. An agent that stores what it is
// told and answers from what it retrieved copies names and numbers it has
// never seen from its context into its output; a transformer does that
// with induction heads (Olsson et al., 2022), which a tiny model does not
// form in the few million tokens of SFT a CPU run allows, because the
// chat data is mostly boilerplate it can predict without copying. Here
// every learned token is a copy: sequences of random tokens that repeat
// after a gap of random length, so that no position trick works and only
// looking up where the current token appeared before, and taking what
// followed it, predicts the repeat.
package pretrain

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/internal/valid"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
)

// Config is the pretraining run (config section "pretrain").
type Config struct {
	// Init is the model to pretrain: a random init from agemem-train
	// init-model, with its tokenizer.
	Init string `yaml:"init"`
	// Steps optimiser steps of Sequences sequences each.
	Steps     int `yaml:"steps"`
	Sequences int `yaml:"sequences"`
	// A sequence is a random span of SpanMin..SpanMax tokens, a gap of
	// GapMin..GapMax filler tokens, and the span again (learned).
	SpanMin int `yaml:"span_min"`
	SpanMax int `yaml:"span_max"`
	GapMin  int `yaml:"gap_min"`
	GapMax  int `yaml:"gap_max"`
	// Cued sequences teach where a copy starts, which a bare repeat cannot
	// (its first token follows filler, so nothing predicts it): the span
	// follows an announcement (SourceCues), Distractors other spans sit
	// before and after it, some behind the very cue that later asks for the
	// copy (as stored memories sit behind "content":" in a user turn), and
	// the repeat follows a request cue (TargetCues: a tool argument, an
	// answer tag), all of it learned. Cued is the share of sequences that
	// are cued: from a random init, cued sequences alone do not start
	// (induction forms on bare repeats first), so a run mixes both or
	// continues a bare-repeat run.
	Cued        float64 `yaml:"cued"`
	Distractors int     `yaml:"distractors"`
	// Filler is what fills the gaps: "tokens", drawn from the spans' own
	// merged tokens, so that only matching the current token against the
	// context (induction) predicts a repeat; or "bytes", printable-ASCII
	// byte tokens. With byte filler a model can copy "the tokens that are
	// not bytes, in order" without matching anything: its held-out copy loss
	// falls to 0.19 nats in 2,000 steps, yet it copies no natural sentence
	// (0 of 100 world sentences continued after their first two tokens) and
	// SFT from it copies no name.
	Filler string `yaml:"filler"`
	// Text, when set, is a HotpotQA task file (data.train), or a .txt file
	// of one sentence a line, whose sentences replace random tokens: a span is one sentence, the gaps and
	// distractors are other sentences, each tokenized as it appears (after
	// its cue), so the model copies names among sentences that share most
	// of their words. Random spans rarely repeat a token, so an induction
	// head trained on them keys on the one token before; in the agent's
	// world " in" or " is a" precede many names, and which one to copy is
	// told by the tokens before those (README, "Demo results"). "synth":
	// sentences of the synthetic world drawn fresh for every sequence (on a
	// random stream no `data synth` seed gives), so no name recurs often
	// enough to be learned by heart and only copying predicts it.
	Text string `yaml:"text"`
	// QA is the share of text sequences that are a task's last step
	// instead of a copy: its supporting facts among the first sentences of
	// a third of its distractor paragraphs, one a line in random order, then "Question: " and the
	// question, then "<answer>" and the answer, which is what is learned.
	// Tasks come from Text: drawn fresh with "synth", else the file's
	// (its last 5% held out). Copying alone leaves the tiny policy to
	// answer "Are X and Y in the same country?" with a country and an
	// "A or B?" question with a name spliced from both (README, "Demo
	// results").
	QA float64 `yaml:"qa"`
	// Reason ends a QA sequence as the reasoning teacher's reply does
	// (env.ReasonedAnswer: "<think>" and a comparison's values and verdict,
	// "</think>", then the answer), all of it learned, so the steps SFT's
	// comparisons take are practised on fresh tasks, not on SFT's 2,000.
	Reason bool `yaml:"reason"`
	// The learning rate and its schedule: induction forms at 1e-3 and not
	// at the 1e-2 SFT of a tiny model from scratch uses.
	optim.ScheduleConfig `yaml:",inline"`
	// EvalEvery steps the copy loss on held-out sequences is logged.
	EvalEvery int `yaml:"eval_every"`
	// Out receives metrics.jsonl, loss.png, checkpoints and policy/.
	Out string `yaml:"out"`
}

// DefaultConfig is the embedded default's recipe.
func DefaultConfig() Config {
	return Config{Init: "runs/tiny/init", Steps: 2500, Sequences: 16, SpanMin: 12, SpanMax: 12, GapMin: 5, GapMax: 64, Distractors: 2, Filler: "tokens",
		ScheduleConfig: optim.ScheduleConfig{LR: 1e-3, Schedule: "cosine", WarmupSteps: 10, MinLRRatio: 0.1},
		EvalEvery:      250, Out: "runs/tiny/pretrain"}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	e.AtLeast("steps", c.Steps, 1)
	e.AtLeast("sequences", c.Sequences, 1)
	e.AtLeast("span_min", c.SpanMin, 1)
	e.AtLeast("span_max", c.SpanMax, c.SpanMin)
	e.AtLeast("gap_min", c.GapMin, 0)
	e.AtLeast("gap_max", c.GapMax, c.GapMin)
	e.AtLeast("distractors", c.Distractors, 0)
	e.Ratio("cued", c.Cued)
	e.Ratio("qa", c.QA)
	if c.QA > 0 && c.Text == "" {
		e.Add("qa", "%g needs pretrain.text (a task file, or synth)", c.QA)
	}
	if c.Reason && c.QA == 0 {
		e.Add("reason", "needs pretrain.qa above 0 (it shapes the QA sequences' answers)")
	}
	e.OneOf("filler", c.Filler, "tokens", "bytes")
	if err := c.ScheduleConfig.Validate(); err != nil {
		e = append(e, err.(valid.Errors)...)
	}
	e.AtLeast("eval_every", c.EvalEvery, 0)
	return e.Err()
}

// Options are a run's inputs.
type Options struct {
	Config  Config
	Optim   optim.Config
	Learner train.LearnerOptions
	Dtype   safetensors.DType
	Seed    uint64
	YAML    string
	Resume  string
	Log     io.Writer
	TTY     bool
}

// Result summarises a run.
type Result struct {
	Steps                   int
	CopyLossStart, CopyLoss float64 // held-out copy loss (nats per copied token)
	Policy                  string
}

// Sequences draws n copy sequences over a vocabulary: the span's tokens
// from [lo, hi), the filler's from the same range or (Filler "bytes") from
// the byte tokens of printable ASCII.
type Sequences struct {
	c             Config
	lo, hi        int
	r             *rand.Rand
	sources, asks [][]int // cue token ids (Cued)
	// Text mode (Config.Text): the sentences, and where more come from
	// (synth: each sequence adds a record's sentences, dropping the oldest).
	tok       *tokenizer.Tokenizer
	sentences []string
	more      func() []string
	task      func() env.Task // QA sequences' tasks (Config.QA)
}

// SourceCues announce what is to be copied, TargetCues ask for the copy:
// the phrasings of the agent's world (a user's casual aside, a memory
// tool's argument, an answer), with generic ones beside them so that the
// circuit keys on "announced" rather than on four strings.
var (
	SourceCues = []string{"By the way, ", "Something I read today: ", "A friend mentioned this: ",
		"Here is a note from my reading: ", "Note: ", "Fact: ", "I learned that ", "Remember this: "}
	TargetCues = []string{`{"content":"`, `"content":"`, `<answer>`, `{"query":"`, "Stored: ", "So: "}
)

// NewSequences draws from seed over the tokens [lo, hi). Cued sequences
// need the cues in tok's ids (c.Cued > 0 with a nil tok is an error).
func NewSequences(c Config, lo, hi int, seed uint64, tok *tokenizer.Tokenizer) (*Sequences, error) {
	s := &Sequences{c: c, lo: lo, hi: hi, r: rand.New(rand.NewPCG(seed, 0x636f7079))}
	if c.Cued == 0 {
		return s, nil
	}
	if tok == nil {
		return nil, fmt.Errorf("cued copy sequences need the tokenizer")
	}
	for _, t := range SourceCues {
		s.sources = append(s.sources, tok.Encode(t))
	}
	for _, t := range TargetCues {
		s.asks = append(s.asks, tok.Encode(t))
	}
	return s, nil
}

// NewTextSequences draws sequences whose spans and fillers are
// sentences (Config.Text), each line of the context one piece tokenized
// whole, as a chat message's text is.
func NewTextSequences(c Config, sentences []string, seed uint64, tok *tokenizer.Tokenizer) (*Sequences, error) {
	if len(sentences) < 2*(c.Distractors+2) {
		return nil, fmt.Errorf("%d sentences; copy sequences need at least %d", len(sentences), 2*(c.Distractors+2))
	}
	return &Sequences{c: c, r: rand.New(rand.NewPCG(seed, 0x636f7079)), tok: tok, sentences: sentences}, nil
}

// Next is one sequence: span, gap, span again (only the repeat learned);
// cued, the spans among distractors behind their cues.
func (s *Sequences) Next() train.Sequence {
	if s.sentences != nil {
		return s.nextText()
	}
	r, c := s.r, s.c
	var seq train.Sequence
	push := func(ids []int, learn bool) {
		for _, id := range ids {
			seq.IDs = append(seq.IDs, id)
			seq.Loss = append(seq.Loss, learn)
		}
	}
	span := func() []int {
		ids := make([]int, c.SpanMin+r.IntN(c.SpanMax-c.SpanMin+1))
		for i := range ids {
			ids[i] = s.lo + r.IntN(s.hi-s.lo)
		}
		return ids
	}
	filler := func(n int) []int {
		ids := make([]int, n)
		for i := range ids {
			if c.Filler == "bytes" {
				ids[i] = 32 + r.IntN(95)
			} else {
				ids[i] = s.lo + r.IntN(s.hi-s.lo)
			}
		}
		return ids
	}
	src := span()
	if s.sources == nil || r.Float64() >= c.Cued {
		push(src, false)
		push(filler(c.GapMin+r.IntN(c.GapMax-c.GapMin+1)), false)
		push(src, true)
		return seq
	}
	ask := s.asks[r.IntN(len(s.asks))]
	at := r.IntN(c.Distractors + 1) // the source's place among the spans
	for i := range c.Distractors + 1 {
		push(filler(1+r.IntN(8)), false)
		switch {
		case i == at:
			push(s.sources[r.IntN(len(s.sources))], false)
			push(src, false)
		case r.IntN(2) == 0:
			push(ask, false)
			fallthrough
		default:
			push(span(), false)
		}
	}
	push(filler(c.GapMin+r.IntN(c.GapMax-c.GapMin+1)), false)
	push(ask, false)
	push(src, true)
	return seq
}

// nextText is Next over sentences: the context is lines (a sentence, or
// a cue and a sentence), gaps are whole sentences until at least the drawn
// number of tokens, and the repeat is the source sentence after a request
// cue (cued) or on a line of its own (bare), its tokens the ones learned.
func (s *Sequences) nextText() train.Sequence {
	r, c := s.r, s.c
	if s.more != nil {
		s.sentences = append(s.sentences[len(s.sentences)/16:], s.more()...)
	}
	var seq train.Sequence
	// line appends text as one line; learned, its tokens after those it
	// shares with cue's are the ones the loss is on.
	line := func(text, cue string, learned bool) {
		ids := s.tok.Encode(text + "\n")
		k := 0
		if cue != "" {
			p := s.tok.Encode(cue)
			for k < len(p) && k < len(ids) && p[k] == ids[k] {
				k++
			}
		}
		for i, id := range ids {
			seq.IDs = append(seq.IDs, id)
			seq.Loss = append(seq.Loss, learned && i >= k)
		}
	}
	sentence := func() string { return s.sentences[r.IntN(len(s.sentences))] }
	gap := func() {
		for n, want := 0, c.GapMin+r.IntN(c.GapMax-c.GapMin+1); n < want; {
			t := sentence()
			n += s.tok.Count(t + "\n")
			line(t, "", false)
		}
	}
	if s.task != nil && r.Float64() < c.QA {
		t := s.task()
		lines := qaLines(r, t)
		for _, l := range lines {
			line(l, "", false)
		}
		line("Question: "+t.Question, "", false)
		if c.Reason {
			line(env.ReasonedAnswer(t, strings.Join(lines, "\n")), "<think>", true)
		} else {
			line("<answer>"+t.Answer+"</answer>", "<answer>", true)
		}
		return seq
	}
	src := sentence()
	if r.Float64() >= c.Cued {
		line(src, "", false)
		gap()
		line(src, "", true)
		return seq
	}
	ask := TargetCues[r.IntN(len(TargetCues))]
	at := r.IntN(c.Distractors + 1)
	for i := range c.Distractors + 1 {
		if r.IntN(2) == 0 {
			line(sentence(), "", false)
		}
		switch {
		case i == at:
			line(SourceCues[r.IntN(len(SourceCues))]+src, "", false)
		case r.IntN(2) == 0:
			line(ask+sentence(), "", false)
		default:
			line(sentence(), "", false)
		}
	}
	gap()
	line(ask+src, ask, true)
	return seq
}

// SpanTokens is the range of ids spans are drawn from: the merged tokens
// (real word pieces, whose embeddings SFT then starts from), not the bytes
// or the added and special tokens.
func SpanTokens(tok *tokenizer.Tokenizer, vocab int) (lo, hi int, err error) {
	lo, hi = 256, min(tok.VocabSize(), vocab)
	for id := lo; id < hi; id++ {
		if tok.IsSpecial(id) || tok.IsAdded(id) {
			hi = id
			break
		}
	}
	if hi-lo < 16 {
		return 0, 0, fmt.Errorf("%d merged tokens to draw spans from; copy sequences need a BPE vocabulary", max(hi-lo, 0))
	}
	return lo, hi, nil
}

// Open returns c's copy sequences over tok's vocabulary (its first vocab
// ids): gen drawn from seed, held (for held-out losses) from another seed
// and, with c.Text, from sentences gen never draws.
func Open(c Config, tok *tokenizer.Tokenizer, vocab int, seed uint64) (gen, held *Sequences, err error) {
	if c.Text == "" {
		lo, hi, err := SpanTokens(tok, vocab)
		if err != nil {
			return nil, nil, err
		}
		if gen, err = NewSequences(c, lo, hi, seed, tok); err != nil {
			return nil, nil, err
		}
		held, err = NewSequences(c, lo, hi, seed^0x686f6c64, tok)
		return gen, held, err
	}
	if c.Text == "synth" {
		synth := func(seed uint64) (*Sequences, error) {
			g := env.NewSynthStream(seed, 0x70726574)
			id := 0
			more := func() []string { id++; return g.Next(id).Sentences() }
			qa := env.NewSynthStream(seed, 0x71615f5f)
			qid := 0
			task := func() env.Task {
				qid++
				t, err := qa.Next(qid).Task()
				if err != nil {
					panic(err) // the generator writes valid records
				}
				return t
			}
			var pool []string
			for len(pool) < 256 {
				pool = append(pool, more()...)
			}
			s, err := NewTextSequences(c, pool, seed, tok)
			if s != nil {
				s.more, s.task = more, task
			}
			return s, err
		}
		if gen, err = synth(seed); err == nil {
			held, err = synth(seed ^ 0x686f6c64)
		}
		return gen, held, err
	}
	lines, err := textLines(c.Text)
	if err != nil {
		return nil, nil, fmt.Errorf("pretrain.text: %w", err)
	}
	cut := len(lines) - max(len(lines)/20, 2*(c.Distractors+2)) // the last 5% held out
	if cut < 0 {
		cut = 0
	}
	if gen, err = NewTextSequences(c, lines[:cut], seed, tok); err != nil {
		return nil, nil, fmt.Errorf("pretrain.text %s: %w", c.Text, err)
	}
	if held, err = NewTextSequences(c, lines[cut:], seed^0x686f6c64, tok); err != nil {
		return nil, nil, fmt.Errorf("pretrain.text %s: %w", c.Text, err)
	}
	if c.QA > 0 {
		tasks, err := env.LoadHotpot(c.Text)
		if err != nil {
			return nil, nil, fmt.Errorf("pretrain.text: %w", err)
		}
		if len(tasks) < 2 {
			return nil, nil, fmt.Errorf("pretrain.text %s: %d tasks; pretrain.qa needs at least 2 (one held out)", c.Text, len(tasks))
		}
		cut := len(tasks) - max(len(tasks)/20, 1)
		gen.task, held.task = drawTask(gen.r, tasks[:cut]), drawTask(held.r, tasks[cut:])
	}
	return gen, held, nil
}

// qaLines are a QA sequence's context: t's supporting facts among the
// first sentences of a third of its distractor paragraphs, in random order.
func qaLines(r *rand.Rand, t env.Task) []string {
	lines := append([]string(nil), t.SupportingFacts...)
	for _, d := range t.Distractors {
		if r.IntN(3) == 0 {
			if first, _, cut := strings.Cut(d, ". "); cut {
				d = first + "."
			}
			lines = append(lines, d)
		}
	}
	r.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
	return lines
}

// drawTask draws one of tasks with r.
func drawTask(r *rand.Rand, tasks []env.Task) func() env.Task {
	return func() env.Task { return tasks[r.IntN(len(tasks))] }
}

// textLines are the distinct sentences of a task file's contexts and
// distractor paragraphs, in file order; of a .txt file, its distinct
// non-empty lines (a world other than the HotpotQA-style one: memtool data
// --text writes MemTool's).
func textLines(path string) ([]string, error) {
	seen := map[string]bool{}
	var lines []string
	if strings.HasSuffix(path, ".txt") {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		for _, s := range strings.Split(string(raw), "\n") {
			if s = strings.TrimSpace(s); s != "" && !seen[s] {
				seen[s] = true
				lines = append(lines, s)
			}
		}
		if len(lines) == 0 {
			return nil, fmt.Errorf("%s: no lines", path)
		}
		return lines, nil
	}
	err := env.StreamHotpotFile(path, func(t env.Task) error {
		for _, s := range append(t.Context, t.Distractors...) {
			if s = strings.TrimSpace(s); s != "" && !seen[s] {
				seen[s] = true
				lines = append(lines, s)
			}
		}
		return nil
	})
	return lines, err
}

// Run pretrains c.Init and writes Out/policy.
func Run(ctx context.Context, o Options) (Result, error) {
	c := o.Config
	var res Result
	tok, err := tokenizer.Load(filepath.Join(c.Init, "tokenizer.json"))
	if err != nil {
		return res, err
	}
	p, err := train.Open(c.Init, lora.Options{}, o.Seed)
	if err != nil {
		return res, err
	}
	gen, held, err := Open(c, tok, p.W.VocabSize, o.Seed)
	if err != nil {
		return res, fmt.Errorf("%s: %w", c.Init, err)
	}
	tr := train.NewOptimizer(p, o.Optim, c.LR, c.Over(c.Steps), o.Seed, o.YAML)
	if err := tr.ResumeFrom(o.Resume, o.Log); err != nil {
		return res, err
	}
	learner, err := train.NewLearner(tr, o.Learner, o.Log)
	if err != nil {
		return res, err
	}
	var evalSeqs []train.Sequence
	for range 64 {
		evalSeqs = append(evalSeqs, held.Next())
	}
	evalBatch := train.Pack(evalSeqs)
	// A resumed run draws the same sequences the uninterrupted one would.
	for range tr.Step * c.Sequences {
		gen.Next()
	}
	spans := fmt.Sprintf("spans of %d-%d of %d tokens", c.SpanMin, c.SpanMax, gen.hi-gen.lo)
	if c.Text != "" {
		spans = fmt.Sprintf("spans: %d sentences of %s", len(gen.sentences), c.Text)
		if gen.more != nil {
			spans = "spans: fresh sentences of the synthetic world"
		}
	}
	fmt.Fprintf(o.Log, "pretrain: %d steps of %d copy sequences (%s, gaps of %d-%d), %d parameters\n",
		c.Steps, c.Sequences, spans, c.GapMin, c.GapMax, tr.NumParams())
	res.CopyLossStart = -1
	loop := train.Loop{Steps: c.Steps, EvalEvery: c.EvalEvery, EvalFirst: true, Out: c.Out, Resumed: o.Resume != "",
		Log: o.Log, TTY: o.TTY, Save: learner.Save,
		Charts: []train.Chart{{File: "loss.png", Title: "Copy pretraining: loss on the repeated spans",
			YLabel: "mean NLL (nats per token)", Series: []string{"loss", "eval_loss"}}},
		Eval: func(_ context.Context, n int) (map[string]any, error) {
			l, err := train.EvalLoss(learner, p.W, []train.Batch{evalBatch})
			if err != nil {
				return nil, err
			}
			if res.CopyLossStart < 0 {
				res.CopyLossStart = l
			}
			res.CopyLoss = l
			return map[string]any{"eval_loss": l}, nil
		},
		Step: func(_ context.Context, n int) (map[string]any, string, error) {
			t0 := time.Now()
			seqs := make([]train.Sequence, c.Sequences)
			for i := range seqs {
				seqs[i] = gen.Next()
			}
			b := train.Pack(seqs)
			var loss float64
			err := learner.Accumulate([]train.Batch{b}, func(int) train.TrainOptions { return train.TrainOptions{} },
				func(_ int, lp []float32) []float32 {
					d := make([]float32, len(lp))
					for j, v := range lp {
						loss -= float64(v) / float64(len(lp))
						d[j] = -1 / float32(len(lp))
					}
					return d
				})
			if err != nil {
				return nil, "", err
			}
			norm, lr, err := learner.Update()
			if err != nil {
				return nil, "", err
			}
			return map[string]any{"loss": loss, "grad_norm": norm, "lr": lr, "tokens": len(b.Tokens),
				"tokens_per_s": float64(len(b.Tokens)) / time.Since(t0).Seconds()}, fmt.Sprintf("copy loss %.3f", loss), nil
		}}
	metrics, err := loop.Run(ctx, tr.Step)
	if err != nil {
		return res, err
	}
	defer metrics.Close()
	learner.SyncHost()
	res.Steps = tr.Step
	res.Policy = filepath.Join(c.Out, "policy")
	if err := p.Export(res.Policy, o.Dtype); err != nil {
		return res, err
	}
	return res, metrics.Close()
}

// CopySource is SFT's source of c's copy sequences (sft.Options.Copies).
func CopySource(c Config) func(tok *tokenizer.Tokenizer, vocab int, seed uint64) (interface{ Next() train.Sequence }, error) {
	return func(tok *tokenizer.Tokenizer, vocab int, seed uint64) (interface{ Next() train.Sequence }, error) {
		gen, _, err := Open(c, tok, vocab, seed)
		if err != nil {
			return nil, err
		}
		return gen, nil
	}
}
