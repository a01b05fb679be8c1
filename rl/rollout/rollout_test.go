package rollout_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/rl/rollout"
	"github.com/agemem/agemem/setup"
)

// echo answers every conversation in the AgeMem format and records the
// size of each batch it is sent.
type echo struct {
	mu      sync.Mutex
	batches []int
	seeds   []uint64
}

func (e *echo) Chat(ctx context.Context, req llm.Request) (llm.Response, error) {
	out, err := e.ChatBatch(ctx, []llm.Request{req})
	return out[0], err
}

// ChatBatch answers every conversation and records the batch's size and
// seed.
func (e *echo) ChatBatch(_ context.Context, reqs []llm.Request) ([]llm.Response, error) {
	e.mu.Lock()
	e.batches = append(e.batches, len(reqs))
	if s := reqs[0].Sampling; s != nil {
		e.seeds = append(e.seeds, s.Seed)
	}
	e.mu.Unlock()
	out := make([]llm.Response, len(reqs))
	for i, r := range reqs {
		n := len(r.Messages)
		out[i] = llm.Reply(fmt.Sprintf("<think>%d messages</think><answer>yes</answer>", n))
		out[i].PromptIDs, out[i].ResponseIDs, out[i].LogProbs = []int{n}, []int{1, 2}, []float32{-0.1, -0.2}
	}
	return out, nil
}

// ageMem is the paper's environment over tasks, built as training builds it.
func ageMem(ts []env.Task) *env.AgeMem {
	return setup.AgeMem(setup.Default(), setup.Helpers{}, ts, nil)
}

func indices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func tasks(n int) []env.Task {
	var buf bytes.Buffer
	env.WriteHotpot(&buf, env.NewSynth(5).Generate(n))
	var ts []env.Task
	env.StreamHotpot(&buf, func(t env.Task) error { ts = append(ts, t); return nil })
	return ts
}

func TestRolloutsAreBatchedAndReproducible(t *testing.T) {
	ts := tasks(2)
	run := func() (*echo, []rollout.Rollout[env.Outcome], []rollout.Experience) {
		p := &echo{}
		rs, exps, err := rollout.Run(context.Background(), p, ageMem(ts), indices(2), rollout.Options{K: 3, Seed: 9, Sampling: &llm.Sampling{Temperature: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return p, rs, exps
	}
	p, rs, exps := run()
	if len(rs) != 6 || rs[0].Group != 0 || rs[3].Group != 1 || rs[4].Result.Task.ID != ts[1].ID || rs[4].Task != 1 {
		t.Fatalf("rollouts are not task-major groups of K: %d", len(rs))
	}
	if p.batches[0] != 6 {
		t.Fatalf("first batch of %d conversations, want all 6 rollouts", p.batches[0])
	}
	calls := 0
	for _, b := range p.batches {
		calls += b
	}
	if calls != len(exps) {
		t.Fatalf("%d policy calls, %d experiences", calls, len(exps))
	}
	next := map[int]int{} // each rollout's calls in order
	for _, e := range exps {
		if e.Call != next[e.Rollout] || len(e.ResponseIDs) != 2 {
			t.Fatalf("experience %+v", e)
		}
		next[e.Rollout]++
	}
	if len(p.batches) > calls/6+len(ts[0].Context)+len(ts[1].Context)+20 {
		t.Fatalf("%d batches for %d calls: rollouts were not decoded together", len(p.batches), calls)
	}
	p2, _, exps2 := run()
	if fmt.Sprint(p.batches, p.seeds) != fmt.Sprint(p2.batches, p2.seeds) || len(exps2) != len(exps) {
		t.Fatal("a second run batched or seeded differently")
	}
	for i := range exps {
		if exps[i].Rollout != exps2[i].Rollout || exps[i].PromptIDs[0] != exps2[i].PromptIDs[0] {
			t.Fatal("a second run produced different experiences")
		}
	}
}

// failing rejects conversations longer than a limit, as the native policy
// rejects over-long prompts: the rollouts that hit it fail, the run does not.
type failing struct{ echo }

func (f *failing) ChatBatch(ctx context.Context, reqs []llm.Request) ([]llm.Response, error) {
	for i, r := range reqs {
		if len(r.Messages) > 6 {
			return nil, fmt.Errorf("conversation %d is too long", i)
		}
	}
	return f.echo.ChatBatch(ctx, reqs)
}

func TestABadConversationFailsItsRolloutNotTheRun(t *testing.T) {
	rs, _, err := rollout.Run(context.Background(), &failing{}, ageMem(tasks(1)), indices(1), rollout.Options{K: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Err == nil {
			t.Fatal("a rollout whose context outgrew the limit did not fail")
		}
	}
}

func TestKMustBePositive(t *testing.T) {
	if _, _, err := rollout.Run(context.Background(), &echo{}, ageMem(tasks(1)), indices(1), rollout.Options{K: 0}); err == nil {
		t.Fatal("K = 0 accepted")
	}
	if _, _, err := rollout.Run(context.Background(), &echo{}, ageMem(tasks(1)), []int{1}, rollout.Options{K: 1}); err == nil {
		t.Fatal("a task beyond the environment accepted")
	}
}

// TestRunOnSpreadsOverPolicies: with two policies (two GPUs), each decodes
// its half of the rollouts in batches of that half, and the rollouts come
// back in task-major order with every experience.
func TestRunOnSpreadsOverPolicies(t *testing.T) {
	ts := tasks(2)
	a, b := &echo{}, &echo{}
	o := rollout.Options{K: 3, Seed: 9, Sampling: &llm.Sampling{Temperature: 1}}
	e := ageMem(ts)
	rs, exps, err := rollout.RunOn(context.Background(), []llm.Model{a, b}, e, indices(2), o)
	if err != nil {
		t.Fatal(err)
	}
	one, oneExps, _ := rollout.Run(context.Background(), &echo{}, e, indices(2), o)
	if len(rs) != 6 || len(exps) != len(oneExps) {
		t.Fatalf("%d rollouts, %d experiences; one policy: %d, %d", len(rs), len(exps), len(one), len(oneExps))
	}
	for i, r := range rs {
		if r.Group != i/3 || r.Result.Task.ID != ts[i/3].ID || r.Err != nil {
			t.Fatalf("rollout %d: group %d task %s err %v", i, r.Group, r.Result.Task.ID, r.Err)
		}
	}
	for _, p := range []*echo{a, b} {
		if len(p.batches) == 0 || p.batches[0] != 3 {
			t.Fatalf("each policy must batch its 3 rollouts together: %v", p.batches)
		}
	}
	if _, _, err := rollout.RunOn(context.Background(), nil, e, indices(2), o); err == nil {
		t.Fatal("no policy must be an error")
	}
}

// seeded answers as a server would, one call at a time, with a response
// token drawn from the call's seed; it fails (as an engine that died) once
// failAfter calls have been answered, when failAfter > 0.
type seeded struct {
	mu        sync.Mutex
	name      string
	calls     int
	failAfter int
}

func (s *seeded) Chat(_ context.Context, req llm.Request) (llm.Response, error) {
	s.mu.Lock()
	s.calls++
	dead := s.failAfter > 0 && s.calls > s.failAfter
	s.mu.Unlock()
	if dead {
		return llm.Response{}, &rollout.EngineError{Engine: s.name, Err: fmt.Errorf("connection refused")}
	}
	tok := int(req.Sampling.Seed % 1000)
	out := llm.Reply(fmt.Sprintf("<think>%d</think><answer>yes</answer>", tok))
	out.PromptIDs, out.ResponseIDs, out.Model = []int{len(req.Messages)}, []int{tok}, s.name
	return out, nil
}

func sampled(exps []rollout.Experience) string {
	var b bytes.Buffer
	for _, e := range exps {
		fmt.Fprintf(&b, "%d/%d:%v ", e.Rollout, e.Call, e.ResponseIDs)
	}
	return b.String()
}

// TestSamplesDoNotDependOnWhoPlays: a rollout samples the same whether one
// engine plays the batch, two engines split it, or two ranks each play
// half of the groups: each call's seed is its rollout's and its own.
func TestSamplesDoNotDependOnWhoPlays(t *testing.T) {
	e := ageMem(tasks(2))
	o := rollout.Options{K: 3, Seed: 5, Sampling: &llm.Sampling{Temperature: 1}}
	_, one, err := rollout.RunOn(context.Background(), []llm.Model{&seeded{name: "a"}}, e, indices(2), o)
	if err != nil {
		t.Fatal(err)
	}
	_, two, _ := rollout.RunOn(context.Background(), []llm.Model{&seeded{name: "a"}, &seeded{name: "b"}}, e, indices(2), o)
	var halves []rollout.Experience
	for g := range 2 {
		og := o
		og.Groups = []int{g}
		rs, exps, err := rollout.RunOn(context.Background(), []llm.Model{&seeded{name: "a"}}, e, indices(2), og)
		if err != nil || len(rs) != 3 || rs[0].Index != 3*g || rs[0].Group != g {
			t.Fatalf("group %d alone: %v, %+v", g, err, rs)
		}
		halves = append(halves, exps...)
	}
	if sampled(one) != sampled(two) || sampled(one) != sampled(halves) || len(one) == 0 {
		t.Fatalf("one engine: %s\ntwo engines: %s\ntwo ranks: %s", sampled(one), sampled(two), sampled(halves))
	}
}

// TestAFailedEngineReRunsItsRollouts: an engine that dies mid-batch has its
// unfinished rollouts played again from their start on the other engine:
// every rollout comes back once, with the samples of a batch without the
// failure, and the re-runs are counted.
func TestAFailedEngineReRunsItsRollouts(t *testing.T) {
	e := ageMem(tasks(2))
	o := rollout.Options{K: 3, Seed: 5, Sampling: &llm.Sampling{Temperature: 1}}
	_, want, err := rollout.RunOn(context.Background(), []llm.Model{&seeded{name: "a"}, &seeded{name: "b"}}, e, indices(2), o)
	if err != nil {
		t.Fatal(err)
	}
	a, b := &seeded{name: "a"}, &seeded{name: "b", failAfter: 4}
	rs, got, err := rollout.RunOn(context.Background(), []llm.Model{a, b}, e, indices(2), o)
	if err != nil {
		t.Fatal(err)
	}
	reruns := 0
	for i, r := range rs {
		reruns += r.Reruns
		if r.Index != i || r.Engine != 0 || r.Err != nil {
			t.Fatalf("rollout %d: index %d engine %d err %v: every rollout must end on the live engine", i, r.Index, r.Engine, r.Err)
		}
	}
	if reruns != 3 {
		t.Fatalf("%d re-runs, want engine b's 3 rollouts", reruns)
	}
	if sampled(got) != sampled(want) {
		t.Fatalf("with the failure: %s\nwithout: %s", sampled(got), sampled(want))
	}
	for _, x := range got {
		if x.Adapter != "a" {
			t.Fatalf("an experience of the dead engine survived: %+v", x)
		}
	}
	_, _, err = rollout.RunOn(context.Background(), []llm.Model{&seeded{name: "a", failAfter: 1}, &seeded{name: "b", failAfter: 1}}, e, indices(2), o)
	if err == nil || !strings.Contains(err.Error(), "every engine failed") || !strings.Contains(err.Error(), "engine a") || !strings.Contains(err.Error(), "engine b") {
		t.Fatalf("both engines dead: %v", err)
	}
}
