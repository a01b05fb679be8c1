package simcse

import (
	"context"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/embed"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/model/bert"
	"github.com/agemem/agemem/model/optim"
)

func TestSpearmanMatchesScipy(t *testing.T) {
	// scipy.stats.spearmanr([1,2,3,4,5], [5,6,7,8,7]) = 0.8207826816681233 (ties averaged)
	if got := Spearman([]float64{1, 2, 3, 4, 5}, []float64{5, 6, 7, 8, 7}); math.Abs(got-0.8207826816681233) > 1e-12 {
		t.Errorf("spearman %v", got)
	}
	if got := Spearman([]float64{1, 2, 3}, []float64{3, 2, 1}); got != -1 {
		t.Errorf("reversed: %v", got)
	}
	if got := Spearman([]float64{1, 1, 1}, []float64{3, 2, 1}); got != 0 {
		t.Errorf("constant: %v", got)
	}
}

func TestReadSTSLayouts(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	glue := write("glue.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"+
		"0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000\n"+
		"1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man is playing a flute.\tA man is playing a bamboo flute.\t3.800\n")
	orig := write("orig.tsv", "main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane is taking off.\tAn air plane is taking off.\n"+
		"main-captions\tMSRvid\t2012test\t0004\t3.800\tA man is playing a flute.\tA man is playing a bamboo flute.\n")
	three := write("three.tsv", "A plane is taking off.\tAn air plane is taking off.\t5\nA man is playing a flute.\tA man is playing a bamboo flute.\t3.8\n")
	for _, p := range []string{glue, orig, three} {
		pairs, err := ReadSTS(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(pairs) != 2 || pairs[0].A != "A plane is taking off." || pairs[1].B != "A man is playing a bamboo flute." || pairs[1].Score != 3.8 {
			t.Errorf("%s: %+v", filepath.Base(p), pairs)
		}
	}
	for _, c := range []struct{ body, want string }{
		{"a\tb\n", "2 columns"},
		{"a\tb\t5\nc\td\tfive\n", ":2: score \"five\""},
		{"a\tb\t5\nc\td\n", ":2: 2 columns"},
		{"a\tb\t5\n", "at least 2"},
	} {
		if _, err := ReadSTS(write("bad.tsv", c.body)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.body, err, c.want)
		}
	}
}

// tinyEncoder is a random 1-layer BERT over the generator's vocabulary.
func tinyEncoder(t *testing.T, corpus []string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "enc")
	cfg := bert.Config{ModelType: "bert", HiddenSize: 32, Layers: 1, Heads: 2, Intermediate: 64, MaxPositions: 48}
	if err := bert.InitRandom(dir, cfg, Vocab(corpus, 3), true, 1); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Unsupervised SimCSE on the synthetic paraphrase corpus moves held-out
// STS Spearman up, well above the untrained encoder; a resumed run
// continues from its checkpoint. On the tape and on a device (the CPU
// backend standing in for a GPU: bert.Trainer, attention dropout drawn
// there).
func TestUnsupervisedSimCSELearns(t *testing.T) {
	t.Run("tape", func(t *testing.T) { unsupervisedLearns(t, false) })
	t.Run("device", func(t *testing.T) { unsupervisedLearns(t, true) })
}

func unsupervisedLearns(t *testing.T, device bool) {
	corpus := NewGenerator(1).Corpus(3000)
	dir := tinyEncoder(t, corpus)
	sts := NewGenerator(7).STS(300)
	score := func(path string) float64 {
		e, err := bert.LoadEncoder(path, bert.PoolMean, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := STS(context.Background(), e, sts)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := score(dir)
	var data []Example
	for _, s := range corpus {
		data = append(data, Example{Anchor: s, Positive: s})
	}
	out := filepath.Join(t.TempDir(), "run")
	o := Options{Steps: 80, Batch: 64, LR: 1e-3, Warmup: 5, Temperature: 0.05, Dropout: 0.1, AttnDropout: 0.1, Pooling: bert.PoolMean,
		Optim: optim.DefaultConfig(), SaveEvery: 40, EvalEvery: 40, Out: out, Log: io.Discard,
		Eval: func(ctx context.Context, e *bert.Encoder) (map[string]float64, error) {
			s, err := STS(ctx, e, sts)
			return map[string]float64{"spearman": s}, err
		}}
	if device {
		o.Device = cpu.New()
	}
	res, err := Train(context.Background(), dir, data, o)
	if err != nil {
		t.Fatal(err)
	}
	after := score(res.Encoder)
	hashing, _ := STS(context.Background(), embed.NewHashing(384, []int{3, 4}), sts)
	t.Logf("STS Spearman %.3f -> %.6f (hashing %.3f), loss %.6f -> %.6f", before, after, hashing, res.FirstLoss, res.LastLoss)
	if after < before+0.05 || after < hashing+0.1 || res.LastLoss >= res.FirstLoss {
		t.Errorf("Spearman %.3f -> %.3f (hashing %.3f), loss %.3f -> %.3f: SimCSE did not learn", before, after, hashing, res.FirstLoss, res.LastLoss)
	}
	if math.Abs(res.Eval["spearman"]-after) > 1e-9 {
		t.Errorf("the final eval %v differs from the saved encoder's %v", res.Eval["spearman"], after)
	}
	for _, f := range []string{"metrics.jsonl", "loss.png", "eval.png", "checkpoint-40/trainer_state.json", "checkpoint-80/trainer_state.json", "encoder/vocab.txt", "encoder/config.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing %s", f)
		}
	}
	o.Resume, o.Steps, o.Out = filepath.Join(out, "checkpoint-40"), 50, filepath.Join(t.TempDir(), "resumed")
	res2, err := Train(context.Background(), dir, data, o)
	if err != nil || res2.Steps != 10 {
		t.Fatalf("resume: %d steps, %v", res2.Steps, err)
	}
}

// Supervised SimCSE trains on triples with hard negatives; bad inputs are
// refused by name.
func TestSupervisedSimCSEAndErrors(t *testing.T) {
	g := NewGenerator(2)
	triples := g.Triples(400)
	var corpus []string
	for _, e := range triples {
		corpus = append(corpus, e.Anchor, e.Positive, e.Negative)
	}
	dir := tinyEncoder(t, corpus)
	o := Options{Steps: 30, Batch: 16, LR: 1e-3, Temperature: 0.05, Dropout: 0.1, Pooling: bert.PoolCLSMLP,
		Optim: optim.DefaultConfig(), Out: filepath.Join(t.TempDir(), "sup"), Log: io.Discard}
	res, err := Train(context.Background(), dir, triples, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.LastLoss >= res.FirstLoss {
		t.Errorf("supervised loss %.3f -> %.3f", res.FirstLoss, res.LastLoss)
	}
	if _, err := Train(context.Background(), dir, triples[:1], o); err == nil || !strings.Contains(err.Error(), "at least 2") {
		t.Errorf("one example: %v", err)
	}
	mixed := append([]Example{{Anchor: "a", Positive: "a"}}, triples[:20]...)
	o.Batch = 21
	if _, err := Train(context.Background(), dir, mixed, o); err == nil || !strings.Contains(err.Error(), "mixes") {
		t.Errorf("mixed: %v", err)
	}
	if _, err := Train(context.Background(), t.TempDir(), triples, o); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("no encoder: %v", err)
	}
}
