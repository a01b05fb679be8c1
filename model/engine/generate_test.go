package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agemem/agemem/model/qwen"
	"github.com/agemem/agemem/model/safetensors"
)

func tinyModel(t *testing.T, preset string) *qwen.Model {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "m")
	if err := qwen.InitRandom(dir, qwen.Presets[preset], safetensors.F32, 3); err != nil {
		t.Fatal(err)
	}
	m, err := qwen.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestBatchedEqualsUnbatched(t *testing.T) {
	m := tinyModel(t, "tiny-qwen3")
	seqs := [][]int{{5, 6, 7, 8, 9}, {100, 200}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}}
	var caches []*qwen.Cache
	for range seqs {
		caches = append(caches, m.NewCache(32))
	}
	batched, err := m.ForwardBatch(seqs, caches)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range seqs {
		alone, _ := m.Forward(s, m.NewCache(32))
		for j := range alone {
			if d := math.Abs(float64(alone[j] - batched[i][j])); d > 1e-5 {
				t.Fatalf("sequence %d logit %d: batched %g vs alone %g", i, j, batched[i][j], alone[j])
			}
		}
	}
}

func TestGenerateLogProbsAgreeWithScore(t *testing.T) {
	m := tinyModel(t, "tiny-qwen2")
	sys := []int{10, 11, 12, 13, 14, 15}
	prompts := [][]int{append(slices.Clone(sys), 20, 21), append(slices.Clone(sys), 30), append(slices.Clone(sys), 20, 22, 23)}
	s := Sampling{Temperature: 1, TopP: 0.95, TopK: 50, Seed: 9, MaxTokens: 12}
	gens, err := Generate(context.Background(), m, prompts, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gens {
		if len(g.Tokens) != 12 || g.FinishReason != "length" {
			t.Fatalf("seq %d: %d tokens, %s", i, len(g.Tokens), g.FinishReason)
		}
		score, err := m.Score(prompts[i], g.Tokens)
		if err != nil {
			t.Fatal(err)
		}
		for j := range score {
			if d := math.Abs(float64(score[j] - g.LogProbs[j])); d > 1e-4 {
				t.Fatalf("seq %d token %d: generate logprob %g, score %g", i, j, g.LogProbs[j], score[j])
			}
		}
	}
	// Same seed, same output; each sequence alone equals its batched self.
	again, _ := Generate(context.Background(), m, prompts, s, nil)
	for i := range gens {
		if !slices.Equal(gens[i].Tokens, again[i].Tokens) {
			t.Fatal("same seed gave different tokens")
		}
	}
	// Greedy: every token is the argmax, and a stop id ends the sequence.
	greedy, _ := Generate(context.Background(), m, prompts[:1], Sampling{MaxTokens: 8}, nil)
	stopAt := greedy[0].Tokens[2]
	stopped, _ := Generate(context.Background(), m, prompts[:1], Sampling{MaxTokens: 8, StopIDs: []int{stopAt}}, nil)
	first := slices.Index(greedy[0].Tokens, stopAt)
	if stopped[0].FinishReason != "stop" || len(stopped[0].Tokens) != first+1 {
		t.Fatalf("stop id: %+v (greedy %v)", stopped[0], greedy[0].Tokens)
	}
}

func TestSampleTopKTopP(t *testing.T) {
	logits := []float32{0, 5, 4.9, 1, -3}
	r := newTestRand()
	seen := map[int]int{}
	for range 2000 {
		seen[sample(logits, Sampling{Temperature: 1, TopK: 2}, r)]++
	}
	if len(seen) != 2 || seen[1] == 0 || seen[2] == 0 {
		t.Fatalf("top-k 2 drew %v", seen)
	}
	seen = map[int]int{}
	for range 2000 {
		seen[sample(logits, Sampling{Temperature: 1, TopP: 0.4}, r)]++
	}
	if len(seen) != 1 || seen[1] != 2000 {
		t.Fatalf("top-p 0.4 drew %v", seen)
	}
	if sample(logits, Sampling{}, r) != 1 {
		t.Fatal("temperature 0 must be greedy")
	}
	// The whole distribution at temperature 2: frequencies within four
	// standard errors of softmax(logits/2).
	const n = 40000
	counts := make([]float64, len(logits))
	for range n {
		counts[sample(logits, Sampling{Temperature: 2, TopP: 1}, r)]++
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v) / 2)
	}
	for i, v := range logits {
		p := math.Exp(float64(v)/2) / z
		if se := math.Sqrt(p * (1 - p) / n); math.Abs(counts[i]/n-p) > 4*se {
			t.Errorf("id %d drawn %.4f of the time, softmax(logits/2) gives %.4f", i, counts[i]/n, p)
		}
	}
}

func newTestRand() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

// digits decodes each id as its decimal text, enough to test stop strings.
type digits struct{}

func (digits) Decode(ids []int, _ bool) string {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%d,", id)
	}
	return b.String()
}

func TestGenerateStopsAtStopString(t *testing.T) {
	m := tinyModel(t, "tiny-qwen2")
	prompt := []int{4, 8, 15, 16}
	full, _ := Generate(context.Background(), m, [][]int{prompt}, Sampling{MaxTokens: 8}, nil)
	stop := fmt.Sprintf("%d,", full[0].Tokens[2])
	got, err := Generate(context.Background(), m, [][]int{prompt}, Sampling{MaxTokens: 8, Stop: []string{stop}}, digits{})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Index(digits{}.Decode(full[0].Tokens, false), stop)
	if got[0].FinishReason != "stop" || len(digits{}.Decode(got[0].Tokens, false)) != want+len(stop) {
		t.Fatalf("stop string %q: got %v (%s), full %v", stop, got[0].Tokens, got[0].FinishReason, full[0].Tokens)
	}
}

// TestPrefixCacheReusesEarlierTurns: a conversation whose every call
// resends the context so far decodes the same tokens with the prefix
// cache as without it, while the cache serves almost all of each later
// prompt; a prompt that shares nothing starts from scratch.
func TestPrefixCacheReusesEarlierTurns(t *testing.T) {
	m := tinyModel(t, "tiny-qwen3")
	e := New(m, nil, Options{})
	defer e.Close()
	pc := e.Prefixes()
	s := Sampling{MaxTokens: 6, Seed: 3}
	convs := [][]int{{5, 6, 7, 8, 9, 10}, {5, 6, 7, 8, 100, 101}}
	for turn := range 3 {
		plain, err := Generate(context.Background(), m, convs, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		cached, err := batch(e, convs, s)
		if err != nil {
			t.Fatal(err)
		}
		for i := range convs {
			if !slices.Equal(plain[i].Tokens, cached[i].Tokens) {
				t.Fatalf("turn %d, conversation %d: %v with the cache, %v without", turn, i, cached[i].Tokens, plain[i].Tokens)
			}
			for j := range plain[i].LogProbs {
				if d := math.Abs(float64(plain[i].LogProbs[j] - cached[i].LogProbs[j])); d > 1e-5 {
					t.Fatalf("turn %d: log-probabilities differ by %g", turn, d)
				}
			}
			// The next call: the reply and a new user turn appended.
			convs[i] = append(append(slices.Clone(convs[i]), plain[i].Tokens...), 200+turn, 201+turn)
		}
	}
	if pc.Reused*10 < pc.Looked*6 {
		t.Fatalf("%d of %d prompt tokens came from the cache", pc.Reused, pc.Looked)
	}
	if src, n := pc.Match([]int{400, 401, 402}, ""); src != nil || n != 0 {
		t.Fatalf("an unrelated prompt matched %d tokens", n)
	}
	t.Logf("%d of %d prompt tokens served from the cache", pc.Reused, pc.Looked)
}

// TestPagedPoolAtItsSmallest: under the smallest pool (one whole sequence
// and a block) a prompt that starts from a prefix cache's entry and three
// that share a prefix (prefilled once for the batch) take turns in the
// pool, preempted and recomputed; every sequence still samples exactly
// what it does alone and unbounded.
func TestPagedPoolAtItsSmallest(t *testing.T) {
	m := tinyModel(t, "tiny-qwen3")
	span := func(lo, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = (lo + 7*i) % m.VocabSize
		}
		return out
	}
	// Prompt 0 continues a cached entry; the others share 40 tokens.
	cached := span(300, 30)
	prompts := [][]int{append(slices.Clone(cached), span(3, 4)...)}
	for i := range 3 {
		prompts = append(prompts, append(span(1, 40), span(50+i, 5)...))
	}
	s := Sampling{Temperature: 1, Seed: 4, MaxTokens: 40}
	want, err := Generate(context.Background(), m, prompts, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	per := (len(prompts[1]) + s.MaxTokens + KVBlock - 1) / KVBlock
	e := New(m, nil, Options{KVBudget: (per + 1) * KVBlock, PrefixBudget: -1})
	defer e.Close()
	c := m.NewCache(len(cached))
	if _, err := m.ForwardLast([][]int{cached}, []*qwen.Cache{c}); err != nil {
		t.Fatal(err)
	}
	e.Prefixes().Put(cached, c, "")
	got, err := batch(e, prompts, s)
	if err != nil {
		t.Fatal(err)
	}
	st := e.KV()
	for i := range want {
		if !slices.Equal(got[i].Tokens, want[i].Tokens) || !slices.Equal(got[i].LogProbs, want[i].LogProbs) {
			t.Errorf("prompt %d: %v in the smallest pool, %v unbounded", i, got[i].Tokens, want[i].Tokens)
		}
	}
	if st.Blocks != per+1 || st.Peak > st.Blocks {
		t.Fatalf("pool %d blocks (want %d), peak %d", st.Blocks, per+1, st.Peak)
	}
}

// batch generates prompts on e as one batch, prompt i from stream i (as
// Generate does on a fresh engine).
func batch(e *Engine, prompts [][]int, s Sampling) ([]Generation, error) {
	rs := make([]Request, len(prompts))
	for i, p := range prompts {
		rs[i] = Request{Prompt: p, Sampling: s}
		rs[i].Sampling.Stream = uint64(i)
	}
	return e.GenerateBatch(context.Background(), rs)
}

// TestPrefixReuseStaysInItsNamespace: a finished sequence's cache serves a
// later prompt of the same namespace only; the pinned system prompt
// serves every namespace. (serve keys namespaces by tenant, so one
// tenant's prompts never start from, and are never timed against, what
// another sent.)
func TestPrefixReuseStaysInItsNamespace(t *testing.T) {
	m := tinyModel(t, "tiny-qwen3")
	e := New(m, nil, Options{})
	defer e.Close()
	sys := []int{40, 41, 42, 43, 44, 45, 46, 47}
	if err := e.SetPrefix(sys); err != nil {
		t.Fatal(err)
	}
	secret := append(slices.Clone(sys), 100, 101, 102, 103, 104, 105, 106, 107, 108, 109)
	s := Sampling{MaxTokens: 3}
	gen := func(ns string) Generation {
		g, err := e.Generate(context.Background(), Request{Prompt: append(slices.Clone(secret), 7), Sampling: s, Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	reused := func() int64 { return e.Prefixes().Reused }
	alice := gen("alice")
	if got := reused(); got != int64(len(sys)) {
		t.Fatalf("the first request reused %d tokens, want the system prompt's %d", got, len(sys))
	}
	before := reused()
	bob := gen("bob")
	if got := reused() - before; got != int64(len(sys)) {
		t.Fatalf("another namespace's request reused %d tokens of the first's, want only the shared system prompt's %d", got, len(sys))
	}
	before = reused()
	gen("alice")
	if got := reused() - before; got != int64(len(secret)) {
		t.Fatalf("the same namespace reused %d tokens of its earlier prompt, want all but the last token's %d", got, len(secret))
	}
	if !slices.Equal(alice.Tokens, bob.Tokens) {
		t.Fatalf("the same prompt in two namespaces: %v and %v", alice.Tokens, bob.Tokens)
	}
}
