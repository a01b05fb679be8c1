package engine

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Requests arriving at different moments share decoding steps, and each
// gets what it would get alone from Model.Generate: same tokens, same
// log-probabilities (within float rounding of the batched matmul). With a
// KV budget of 48 positions (3 blocks: the longest request's 39 positions
// fit, four together do not) the requests take turns in the pool, some
// preempted and recomputed, and still get the same.
func TestSchedulerMatchesGenerateAlone(t *testing.T) {
	for _, budget := range []int{0, 48} {
		kv := testSchedulerMatchesGenerateAlone(t, budget)
		if budget == 0 && kv != (KVStats{}) {
			t.Fatalf("no budget, yet KV stats %+v", kv)
		}
		if budget > 0 && (kv.Blocks != 3 || kv.Peak > 3 || kv.Peak < 2 || kv.Preempted == 0) {
			t.Fatalf("budget %d: %+v (want 3 blocks, at most 3 held, some preempted)", budget, kv)
		}
		t.Logf("budget %d: %+v", budget, kv)
	}
}

func testSchedulerMatchesGenerateAlone(t *testing.T, budget int) KVStats {
	m := tinyModel(t, "tiny-qwen3")
	sys := []int{40, 41, 42, 43, 44, 45, 46, 47}
	prompts := [][]int{
		append(slices.Clone(sys), 5, 6, 7),
		append(slices.Clone(sys), 9),
		{100, 200, 300}, // no shared prefix
		append(slices.Clone(sys), 11, 12, 13, 14, 15, 16, 17, 18, 19, 20),
		append(slices.Clone(sys), 5, 6),
		{7},
	}
	samplings := make([]Sampling, len(prompts))
	for i := range samplings {
		samplings[i] = Sampling{Temperature: 0.9, TopP: 0.95, Seed: uint64(10 + i), MaxTokens: 6 + 3*i, StopIDs: []int{3}}
	}
	want := make([]Generation, len(prompts))
	for i, p := range prompts {
		g, err := Generate(context.Background(), m, [][]int{p}, samplings[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = g[0]
	}
	var maxBatch atomic.Int64
	// The first step waits until every later request is on its way in and
	// then a little longer, so requests join steps already under way however
	// fast this machine decodes (a tiny model's steps take microseconds:
	// without the wait a loaded machine could finish each request before
	// the next arrived, and nothing would be batched).
	var arrived sync.WaitGroup
	arrived.Add(len(prompts) - 1)
	var firstStep sync.Once
	sc := New(m, nil, Options{MaxBatch: 4, PrefillChunk: 5, KVBudget: budget, OnStep: func(seqs, _ int) {
		firstStep.Do(func() {
			arrived.Wait()
			time.Sleep(20 * time.Millisecond)
		})
		if int64(seqs) > maxBatch.Load() {
			maxBatch.Store(int64(seqs))
		}
	}})
	defer sc.Close()
	if err := sc.SetPrefix(sys); err != nil {
		t.Fatal(err)
	}
	got := make([]Generation, len(prompts))
	streamed := make([][]int, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 2 * time.Millisecond) // staggered arrivals
			if i > 0 {
				arrived.Done()
			}
			g, err := sc.Generate(context.Background(), Request{Prompt: p, Sampling: samplings[i], OnToken: func(id int) { streamed[i] = append(streamed[i], id) }})
			if err != nil {
				t.Error(err)
			}
			got[i] = g
		})
	}
	wg.Wait()
	for i := range prompts {
		if !slices.Equal(got[i].Tokens, want[i].Tokens) || got[i].FinishReason != want[i].FinishReason {
			t.Fatalf("request %d: scheduled %v (%s), alone %v (%s)", i, got[i].Tokens, got[i].FinishReason, want[i].Tokens, want[i].FinishReason)
		}
		if !slices.Equal(streamed[i], got[i].Tokens) {
			t.Fatalf("request %d: streamed %v, returned %v", i, streamed[i], got[i].Tokens)
		}
		for j := range want[i].LogProbs {
			if d := math.Abs(float64(got[i].LogProbs[j] - want[i].LogProbs[j])); d > 1e-4 {
				t.Fatalf("request %d token %d: log-prob %g vs %g alone", i, j, got[i].LogProbs[j], want[i].LogProbs[j])
			}
		}
	}
	if maxBatch.Load() < 2 {
		t.Fatalf("no decoding step held more than one sequence: not batching")
	}
	if maxBatch.Load() > 4 {
		t.Fatalf("a step held %d sequences, above MaxBatch 4", maxBatch.Load())
	}
	if budget > 0 {
		// One request larger than the whole pool is refused, by name.
		if _, err := sc.Generate(context.Background(), Request{Prompt: prompts[3], Sampling: Sampling{MaxTokens: 40}}); err == nil || !strings.Contains(err.Error(), "exceeds the KV cache budget of 48 positions") {
			t.Fatalf("a request over the budget: %v", err)
		}
	}
	return sc.KV()
}

func TestSchedulerCancelAndClose(t *testing.T) {
	m := tinyModel(t, "tiny-qwen2")
	sc := New(m, nil, Options{MaxBatch: 2})
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err := sc.Generate(ctx, Request{Prompt: []int{1, 2, 3}, Sampling: Sampling{MaxTokens: 1000}, OnToken: func(int) {
		if n++; n == 3 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: err %v", err)
	}
	if n > 4 {
		t.Fatalf("a cancelled sequence kept decoding: %d tokens", n)
	}
	// Bad requests are refused before they reach the loop; the loop still serves.
	if _, err := sc.Generate(context.Background(), Request{Sampling: Sampling{MaxTokens: 2}}); err == nil {
		t.Fatal("empty prompt accepted")
	}
	if _, err := sc.Generate(context.Background(), Request{Prompt: []int{1}, Sampling: Sampling{MaxTokens: m.MaxPositions}}); err == nil {
		t.Fatal("a prompt past the model's positions was accepted")
	}
	if g, err := sc.Generate(context.Background(), Request{Prompt: []int{1, 2}, Sampling: Sampling{MaxTokens: 3}}); err != nil || len(g.Tokens) != 3 {
		t.Fatalf("after bad requests: %v, %v", g, err)
	}
	sc.Close()
	if _, err := sc.Generate(context.Background(), Request{Prompt: []int{1}, Sampling: Sampling{MaxTokens: 2}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// A caller who gives up while its request waits behind a full batch gets
// its error at the next step, not when the batch frees a place.
func TestSchedulerReleasesAWaitingCallerThatGaveUp(t *testing.T) {
	m := tinyModel(t, "tiny-qwen2")
	sc := New(m, nil, Options{MaxBatch: 1})
	defer sc.Close()
	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	started := make(chan struct{})
	var once sync.Once
	doneA := make(chan error, 1)
	go func() {
		_, err := sc.Generate(ctxA, Request{Prompt: []int{1, 2, 3}, Sampling: Sampling{MaxTokens: m.MaxPositions - 3}, OnToken: func(int) { once.Do(func() { close(started) }) }})
		doneA <- err
	}()
	<-started
	ctxB, stopB := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stopB()
	if _, err := sc.Generate(ctxB, Request{Prompt: []int{4, 5}, Sampling: Sampling{MaxTokens: 5}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the waiting request: %v", err)
	}
	select {
	case err := <-doneA:
		t.Fatalf("the running request ended first (%v): the waiting caller was held until its place came", err)
	default:
	}
	stopA()
	if err := <-doneA; !errors.Is(err, context.Canceled) {
		t.Fatalf("the running request: %v", err)
	}
}
