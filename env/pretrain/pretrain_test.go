package pretrain

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/model/chat"
	"github.com/agemem/agemem/model/optim"
	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
	"github.com/agemem/agemem/model/tokenizer"
	"github.com/agemem/agemem/model/train"
)

func TestSequencesRepeatTheSpan(t *testing.T) {
	c := DefaultConfig()
	c.SpanMin, c.SpanMax, c.GapMin, c.GapMax = 3, 9, 0, 20
	s, _ := NewSequences(c, 300, 400, 5, nil)
	for range 200 {
		q := s.Next()
		learned := 0
		for _, l := range q.Loss {
			if l {
				learned++
			}
		}
		n := learned
		if n < c.SpanMin || n > c.SpanMax {
			t.Fatalf("span of %d tokens, want %d..%d", n, c.SpanMin, c.SpanMax)
		}
		if gap := len(q.IDs) - 2*n; gap < c.GapMin || gap > c.GapMax {
			t.Fatalf("gap of %d tokens, want %d..%d", gap, c.GapMin, c.GapMax)
		}
		if !slices.Equal(q.IDs[:n], q.IDs[len(q.IDs)-n:]) {
			t.Fatalf("the repeat %v is not the span %v", q.IDs[len(q.IDs)-n:], q.IDs[:n])
		}
		for i, id := range q.IDs {
			if learn := i >= len(q.IDs)-n; q.Loss[i] != learn {
				t.Fatalf("token %d learned=%v, only the repeat is learned", i, q.Loss[i])
			}
			if id < 300 || id >= 400 {
				// Filler from the spans' own tokens: no id tells span from gap.
				t.Fatalf("token %d (position %d) outside [300, 400)", id, i)
			}
		}
	}
	c.Filler = "bytes"
	s, _ = NewSequences(c, 300, 400, 5, nil)
	for range 50 {
		q := s.Next()
		n := 0
		for _, l := range q.Loss {
			if l {
				n++
			}
		}
		for i, id := range q.IDs {
			gap := i >= n && i < len(q.IDs)-n
			if gap != (id >= 32 && id < 127) {
				t.Fatalf("filler bytes: token %d at %d (span %d of %d tokens)", id, i, n, len(q.IDs))
			}
		}
	}
	a, _ := NewSequences(c, 300, 400, 9, nil)
	b, _ := NewSequences(c, 300, 400, 9, nil)
	for range 10 {
		if !slices.Equal(a.Next().IDs, b.Next().IDs) {
			t.Fatal("the same seed drew different sequences")
		}
	}
}

// TestCuedSequences: a cued sequence learns exactly the announced span,
// after a request cue, with the distractor spans (some behind the request
// cue itself) elsewhere and never learned.
func TestCuedSequences(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join(tinyInit(t, 420), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Cued, c.Distractors, c.SpanMin, c.SpanMax = 1, 2, 3, 8
	if _, err := NewSequences(c, 300, 400, 1, nil); err == nil {
		t.Fatal("cued sequences without a tokenizer")
	}
	s, err := NewSequences(c, 300, 400, 4, tok)
	if err != nil {
		t.Fatal(err)
	}
	var sources, asks [][]int
	for _, x := range SourceCues {
		sources = append(sources, tok.Encode(x))
	}
	for _, x := range TargetCues {
		asks = append(asks, tok.Encode(x))
	}
	endsWith := func(ids []int, cues [][]int) bool {
		return slices.ContainsFunc(cues, func(cue []int) bool { return len(ids) >= len(cue) && slices.Equal(ids[len(ids)-len(cue):], cue) })
	}
	askedDistractor := 0
	for range 200 {
		q := s.Next()
		first := slices.Index(q.Loss, true)
		learned := q.IDs[first:]
		if first < 0 || slices.Contains(q.Loss[first:], false) || len(learned) < c.SpanMin || len(learned) > c.SpanMax {
			t.Fatalf("learned part %v of %v", learned, q.Loss)
		}
		if !endsWith(q.IDs[:first], asks) {
			t.Fatal("the repeat does not follow a request cue")
		}
		// The span occurs once before, right after an announcement.
		n, at := 0, -1
		for i := 0; i+len(learned) <= first; i++ {
			if slices.Equal(q.IDs[i:i+len(learned)], learned) {
				n, at = n+1, i
			}
		}
		if n != 1 || !endsWith(q.IDs[:at], sources) {
			t.Fatalf("the source span occurs %d times, announced: %v", n, at >= 0 && endsWith(q.IDs[:at], sources))
		}
		for i := range first {
			if q.IDs[i] >= 300 && q.IDs[i] < 400 && (i == 0 || q.IDs[i-1] < 256) && i != at && endsWith(q.IDs[:i], asks) {
				askedDistractor++
			}
		}
	}
	if askedDistractor == 0 {
		t.Fatal("no distractor ever sat behind a request cue")
	}
	// A mixed run: about half the sequences cued, the rest bare repeats.
	c.Cued = 0.5
	s, _ = NewSequences(c, 300, 400, 5, tok)
	cued := 0
	for range 400 {
		q := s.Next()
		if endsWith(q.IDs[:slices.Index(q.Loss, true)], asks) {
			cued++
		}
	}
	if cued < 150 || cued > 250 {
		t.Fatalf("%d of 400 sequences cued at cued = 0.5", cued)
	}
}

// tinyInit writes what `agemem-train init-model` writes: a random tiny Qwen3
// with a BPE tokenizer learned on some words.
func tinyInit(t *testing.T, vocab int) string {
	dir := t.TempDir()
	var texts []string
	for i := range 400 {
		texts = append(texts, fmt.Sprintf("Laimford %d is a town in Baipeaia near Orsk and Velmar, founded by Ada Quill.", i))
	}
	raw, err := tokenizer.Train(texts, tokenizer.TrainOptions{VocabSize: vocab, Special: tokenizer.ChatML})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tokenizer.WriteConfig(dir, tok, chat.Qwen3Text, 256); err != nil {
		t.Fatal(err)
	}
	cfg := qwen.Config{ModelType: "qwen3", HiddenSize: 64, Layers: 2, Heads: 4, KVHeads: 4, HeadDim: 16, Intermediate: 128,
		RMSNormEps: 1e-6, RopeTheta: 1e4, TieEmbeddings: true, VocabSize: tok.VocabSize(), MaxPositions: 256}
	if err := qwen.InitRandom(dir, cfg, safetensors.F32, 3); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPretrainTeachesCopying: spans are uniform random tokens, so a model
// that does not copy cannot get below log(number of span tokens) nats per
// token on held-out sequences; after pretraining the loss must be far
// below that, which only looking back at the first occurrence achieves.
func TestPretrainTeachesCopying(t *testing.T) {
	init := tinyInit(t, 420)
	c := DefaultConfig()
	c.Init, c.Out = init, filepath.Join(t.TempDir(), "out")
	c.Steps, c.Sequences, c.SpanMin, c.SpanMax, c.GapMin, c.GapMax = 400, 16, 6, 6, 0, 6
	c.LR, c.WarmupSteps, c.EvalEvery = 3e-3, 10, 100
	// Byte filler: the loop is checked on the objective a tiny model learns
	// in 400 steps (with the spans' own tokens as filler, true induction
	// forms far more slowly; see Filler).
	c.Filler = "bytes"
	oc := optim.DefaultConfig()
	res, err := Run(context.Background(), Options{Config: c, Optim: oc, Dtype: safetensors.F32, Seed: 1, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(filepath.Join(init, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	lo, hi, err := SpanTokens(tok, tok.VocabSize())
	if err != nil {
		t.Fatal(err)
	}
	chance := math.Log(float64(hi - lo))
	t.Logf("held-out copy loss %.3f -> %.3f (no copying: >= %.3f over %d span tokens)", res.CopyLossStart, res.CopyLoss, chance, hi-lo)
	if !(res.CopyLoss < 0.5*chance) {
		t.Fatalf("copy loss %.3f after %d steps: not below half of the no-copying floor %.3f", res.CopyLoss, res.Steps, chance)
	}
	for _, f := range []string{"metrics.jsonl", "loss.png", "policy/model.safetensors", "policy/tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(c.Out, f)); err != nil {
			t.Errorf("missing output: %v", err)
		}
	}
}

func TestSpanTokensNeedMerges(t *testing.T) {
	raw, err := tokenizer.Train([]string{"ab"}, tokenizer.TrainOptions{VocabSize: 259, Special: tokenizer.ChatML})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := SpanTokens(tok, tok.VocabSize()); err == nil || !strings.Contains(err.Error(), "BPE vocabulary") {
		t.Fatalf("a byte-only vocabulary: %v, want an error asking for a BPE vocabulary", err)
	}
}

func TestConfigNamesBadKeys(t *testing.T) {
	c := DefaultConfig()
	c.SpanMin, c.SpanMax, c.GapMax, c.Steps = 8, 4, -1, 0
	err := c.Validate()
	if err == nil {
		t.Fatal("a bad config validated")
	}
	for _, key := range []string{"span_max", "gap_max", "steps"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("%q does not name %s", err, key)
		}
	}
}

// TestTextSequences: with pretrain.text the span is a sentence of the task
// file, announced once among other sentences, and the learned tokens are
// exactly that sentence (and its line end) after the request cue.
func TestTextSequences(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join(tinyInit(t, 420), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for i := range 40 {
		lines = append(lines, fmt.Sprintf("Laimford %d is a town in Baipeaia.", i))
	}
	c := DefaultConfig()
	c.Cued, c.Distractors, c.GapMin, c.GapMax = 1, 2, 5, 30
	if _, err := NewTextSequences(c, lines[:3], 1, tok); err == nil {
		t.Fatal("three sentences accepted for sequences with two distractors")
	}
	s, err := NewTextSequences(c, lines, 1, tok)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		q := s.Next()
		first := slices.Index(q.Loss, true)
		if first < 0 || slices.Contains(q.Loss[first:], false) {
			t.Fatalf("learned part not one run at the end: %v", q.Loss)
		}
		context, learned := tok.Decode(q.IDs[:first], false), tok.Decode(q.IDs[first:], false)
		src := strings.TrimSuffix(learned, "\n")
		if !slices.Contains(lines, src) {
			t.Fatalf("learned %q is not a sentence of the text", learned)
		}
		announced := false
		for _, cue := range SourceCues {
			announced = announced || strings.Contains(context, cue+src+"\n")
		}
		asked := slices.ContainsFunc(TargetCues, func(cue string) bool { return strings.HasSuffix(context, cue) })
		if !announced || !asked {
			t.Fatalf("sentence %q announced %v, asked for %v in %q", src, announced, asked, context)
		}
	}
	c.Cued = 0 // bare: the sentence on a line of its own, then again
	s, _ = NewTextSequences(c, lines, 2, tok)
	for range 50 {
		q := s.Next()
		first := slices.Index(q.Loss, true)
		learned := tok.Decode(q.IDs[first:], false)
		if !strings.HasPrefix(tok.Decode(q.IDs[:first], false), learned) {
			t.Fatalf("bare repeat %q is not the first line", learned)
		}
	}
}

// TestTextLinesFile: pretrain.text may be a .txt file of one sentence a
// line (memtool data --text): its distinct lines are the sentences, the
// last ones held out (5%, at least enough for one sequence: 8 here), and
// every learned sentence is one of them.
func TestTextLinesFile(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join(tinyInit(t, 420), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range 60 {
		fmt.Fprintf(&b, "the revenue of Laimford %d Corp\n\n", i%50)
	}
	path := filepath.Join(t.TempDir(), "world.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	lines, err := textLines(path)
	if err != nil || len(lines) != 50 {
		t.Fatalf("%d lines (%v), want the 50 distinct ones", len(lines), err)
	}
	c := DefaultConfig()
	c.Text, c.Cued = path, 0.5
	gen, held, err := Open(c, tok, tok.VocabSize(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Sequences{gen, held} {
		for range 20 {
			q := s.Next()
			learned := strings.TrimSuffix(tok.Decode(q.IDs[slices.Index(q.Loss, true):], false), "\n")
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasSuffix(l, learned) }) {
				t.Fatalf("learned %q is no line of the file", learned)
			}
		}
	}
	if len(held.sentences) != 8 || slices.Contains(gen.sentences, held.sentences[0]) {
		t.Fatalf("held out %d sentences, shared with training: %v", len(held.sentences), slices.Contains(gen.sentences, held.sentences[0]))
	}
	if err := os.WriteFile(path, []byte("\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := textLines(path); err == nil || !strings.Contains(err.Error(), "no lines") {
		t.Fatalf("an empty file: %v", err)
	}
}

// TestSynthTextIsFresh: pretrain.text "synth" copies sentences drawn fresh
// from the synthetic world, so the sentences to copy (almost) never recur
// and the held-out ones are none of the trained ones; a missing task file
// is an error naming the key.
func TestSynthTextIsFresh(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join(tinyInit(t, 420), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Text, c.Cued = "synth", 0.5
	gen, held, err := Open(c, tok, tok.VocabSize(), 1)
	if err != nil {
		t.Fatal(err)
	}
	learned := func(s *Sequences) string {
		q := s.Next()
		return tok.Decode(q.IDs[slices.Index(q.Loss, true):], false)
	}
	trained := map[string]bool{}
	for range 300 {
		trained[learned(gen)] = true
	}
	if len(trained) < 280 {
		t.Fatalf("%d distinct sentences copied in 300 sequences", len(trained))
	}
	for range 50 {
		if s := learned(held); trained[s] {
			t.Fatalf("held-out sentence %q was trained on", s)
		}
	}
	c.Text = filepath.Join(t.TempDir(), "missing.json")
	if _, _, err := Open(c, tok, tok.VocabSize(), 1); err == nil || !strings.Contains(err.Error(), "pretrain.text") {
		t.Fatalf("missing task file: %v", err)
	}
}

// TestQASequences: with pretrain.qa a sequence is a task's last step: its
// supporting facts on lines of their own, the question, and the answer
// after "<answer>", the answer's tokens (and the closing tag) the only
// ones learned; synth tasks are fresh, a file's held-out tasks are not
// trained on, and qa without a text is refused by name.
func TestQASequences(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join(tinyInit(t, 420), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.QA = 1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "qa") {
		t.Fatalf("qa without pretrain.text: %v", err)
	}
	c.QA = 1.5
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "qa") {
		t.Fatalf("qa 1.5: %v", err)
	}
	var recs []env.HotpotRecord
	g := env.NewSynth(9)
	for i := range 40 {
		recs = append(recs, g.Next(i))
	}
	file := filepath.Join(t.TempDir(), "tasks.json")
	f, _ := os.Create(file)
	if err := env.WriteHotpot(f, recs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	tasks, err := env.LoadHotpot(file)
	if err != nil {
		t.Fatal(err)
	}
	byQuestion := map[string]env.Task{}
	for _, task := range tasks {
		byQuestion[task.Question] = task
	}
	c.QA, c.Text = 1, file
	gen, held, err := Open(c, tok, tok.VocabSize(), 1)
	if err != nil {
		t.Fatal(err)
	}
	check := func(q train.Sequence) env.Task {
		t.Helper()
		first := slices.Index(q.Loss, true)
		if first < 0 || slices.Contains(q.Loss[first:], false) {
			t.Fatalf("learned part not one run at the end: %v", q.Loss)
		}
		context, learned := tok.Decode(q.IDs[:first], false), tok.Decode(q.IDs[first:], false)
		lines := strings.Split(strings.TrimSuffix(context, "<answer>"), "\n")
		question, ok := strings.CutPrefix(lines[len(lines)-2], "Question: ")
		task, known := byQuestion[question]
		if !ok || !known || !strings.HasSuffix(context, "\n<answer>") {
			t.Fatalf("no question line of a task before <answer>: %q", context)
		}
		if learned != task.Answer+"</answer>\n" {
			t.Fatalf("learned %q, want the answer %q", learned, task.Answer)
		}
		for _, fact := range task.SupportingFacts {
			if !slices.Contains(lines, fact) {
				t.Fatalf("supporting fact %q not on a line of %q", fact, context)
			}
		}
		return task
	}
	cut := len(tasks) - 2
	trained := map[string]bool{}
	for range 200 {
		trained[check(gen.Next()).ID] = true
	}
	for range 50 {
		if task := check(held.Next()); trained[task.ID] || slices.IndexFunc(tasks, func(x env.Task) bool { return x.ID == task.ID }) < cut {
			t.Fatalf("held-out sequence asks %s, a trained task", task.ID)
		}
	}
	if len(trained) < 30 {
		t.Fatalf("%d of %d training tasks drawn in 200 sequences", len(trained), cut)
	}
	c.QA = 0.5 // half QA, half copies
	gen, _, _ = Open(c, tok, tok.VocabSize(), 2)
	qa := 0
	for range 400 {
		q := gen.Next()
		if strings.HasSuffix(tok.Decode(q.IDs[:slices.Index(q.Loss, true)], false), "\n<answer>") {
			qa++
		}
	}
	if qa < 160 || qa > 240 {
		t.Fatalf("%d of 400 sequences QA at qa 0.5", qa)
	}
	c.Text, c.QA = "synth", 1 // fresh tasks
	gen, _, err = Open(c, tok, tok.VocabSize(), 3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 100 {
		q := gen.Next()
		first := slices.Index(q.Loss, true)
		lines := strings.Split(tok.Decode(q.IDs[:first], false), "\n")
		seen[lines[len(lines)-2]] = true
	}
	if len(seen) < 95 {
		t.Fatalf("%d distinct questions in 100 synth QA sequences", len(seen))
	}
}

// TestQAReasonSequences: with pretrain.reason a QA sequence ends as the
// reasoning teacher's reply: "<think>" (in the context), then each option
// of a comparison with the value its fact gives, in the order the facts
// stand in the context, the verdict, "</think>" and the answer, all of it
// learned; a bridge question's thought says the facts are there. reason
// without qa is refused by name.
func TestQAReasonSequences(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join(tinyInit(t, 421), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Text, c.Reason = "synth", true
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "reason") {
		t.Fatalf("reason without qa: %v", err)
	}
	c.QA = 1
	gen, _, err := Open(c, tok, tok.VocabSize(), 4)
	if err != nil {
		t.Fatal(err)
	}
	value := regexp.MustCompile(`^(.+?) (?:is a town in (.+)|(?:is|was) (?:.* )?born in (\d{4})|(?:is|was) (?:.* )?founded in (\d{4}))\.$`)
	kinds := map[string]int{}
	for range 300 {
		q := gen.Next()
		first := slices.Index(q.Loss, true)
		if first < 0 || slices.Contains(q.Loss[first:], false) {
			t.Fatalf("learned part not one run at the end: %v", q.Loss)
		}
		context, learned := tok.Decode(q.IDs[:first], false), tok.Decode(q.IDs[first:], false)
		if !strings.HasSuffix(context, "\n<think>") {
			t.Fatalf("context does not end in <think>: %q", context)
		}
		lines := strings.Split(context, "\n")
		question := strings.TrimPrefix(lines[len(lines)-2], "Question: ")
		thought, ans, ok := strings.Cut(learned, "</think>\n<answer>")
		if !ok || !strings.HasSuffix(ans, "</answer>\n") {
			t.Fatalf("learned %q is not a thought and an answer", learned)
		}
		ans = strings.TrimSuffix(ans, "</answer>\n")
		// Each fact's subject and value, in context order.
		var names, values []string
		for _, l := range lines {
			if m := value.FindStringSubmatch(l); m != nil && strings.Contains(question, m[1]) {
				names = append(names, m[1])
				values = append(values, m[2]+m[3]+m[4])
			}
		}
		if strings.Contains(question, " or ") || strings.HasPrefix(question, "Are ") {
			if len(values) != 2 {
				t.Fatalf("%q: facts on its options %q in %q", question, values, context)
			}
		}
		switch {
		case strings.HasPrefix(question, "Are "):
			kinds["same"]++
			verdict := "Different countries."
			if values[0] == values[1] {
				verdict = "The same country."
			}
			want := names[0] + ": " + values[0] + ". " + names[1] + ": " + values[1] + ". " + verdict
			if thought != want || (ans == "yes") != (values[0] == values[1]) {
				t.Fatalf("%q: learned %q, want the thought %q", question, learned, want)
			}
		case strings.Contains(question, " or "):
			kinds["earlier"]++
			early := 0
			if values[1] < values[0] {
				early = 1
			}
			want := values[0] + ": " + names[0] + ". " + values[1] + ": " + names[1] + ". The earlier is " + values[early] + ": " + names[early] + "."
			if thought != want || ans != names[early] {
				t.Fatalf("%q: learned %q, want the thought %q and %q", question, learned, want, names[early])
			}
		default:
			kinds["bridge"]++
			if thought != "The supporting facts are in my context, so I can answer." {
				t.Fatalf("%q (bridge): thought %q", question, thought)
			}
		}
	}
	if kinds["same"] < 20 || kinds["earlier"] < 40 || kinds["bridge"] < 60 {
		t.Fatalf("question kinds in 300 sequences: %v", kinds)
	}
}
