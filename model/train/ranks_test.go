package train

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cpu"
	"github.com/agemem/agemem/kernels/ring"
	"github.com/agemem/agemem/model/lora"
	"github.com/agemem/agemem/model/optim"
)

// allGather is an all-gather between goroutines standing for ranks (the
// control plane's gather does this between processes).
type allGather struct {
	mu    sync.Mutex
	cond  *sync.Cond
	parts map[string][][]float64
	size  int
}

func (a *allGather) exchange(rank int) func(string, []float64) ([][]float64, error) {
	return func(key string, mine []float64) ([][]float64, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.parts[key] == nil {
			a.parts[key] = make([][]float64, a.size)
		}
		a.parts[key][rank] = mine
		a.cond.Broadcast()
		for {
			done := true
			for _, p := range a.parts[key] {
				done = done && p != nil
			}
			if done {
				return a.parts[key], nil
			}
			a.cond.Wait()
		}
	}
}

// policySteps trains three GRPO-shaped steps through the Learner: a score
// of every micro-batch (π_old), then the policy loss over them and an
// update; it returns the trained weights and each step's loss sums.
func policySteps(t *testing.T, l Learner, p *Policy) (map[string][]float32, []PolicyStats) {
	t.Helper()
	loss := PolicyLoss{Clip: 0.2, Host: func(d, lp []float32, x PolicyInputs) kernels.PolicyStats {
		var st kernels.PolicyStats
		for i := range d {
			d[i] = -x.Adv[i] * x.Weight[i]
			st.Surrogate -= float64(x.Adv[i] * lp[i] * x.Weight[i])
			st.KL += float64(lp[i] - x.Old[i])
		}
		return st
	}}
	var stats []PolicyStats
	for s := range 3 {
		micro := []Batch{batch(5 * s), batch(5*s + 1), batch(5*s + 2), batch(5*s + 3), batch(5*s + 4)}
		old, err := l.Score(p.W, micro, TrainOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := l.AccumulatePolicy(micro, func(i int) TrainOptions { return TrainOptions{Dropout: true, Seed: uint64(10*s + i)} },
			func(i int) PolicyInputs {
				n := len(micro[i].LossRows)
				x := PolicyInputs{Old: old[i], Adv: make([]float32, n), Weight: make([]float32, n)}
				for j := range n {
					x.Adv[j], x.Weight[j] = float32(j%3)-1, 1/float32(5*n)
				}
				return x
			}, loss)
		if err != nil {
			t.Fatal(err)
		}
		stats = append(stats, st)
		if _, _, err := l.Update(); err != nil {
			t.Fatal(err)
		}
	}
	l.SyncHost()
	out := map[string][]float32{}
	for _, nv := range p.W.Trainable() {
		out[nv.Name] = append([]float32(nil), nv.V.Val...)
	}
	return out, stats
}

func openPolicy(t *testing.T, dir string) (*Policy, *Optimizer) {
	p, err := Open(dir, lora.Options{Enabled: true, R: 4, Alpha: 8, Dropout: 0.1, TargetModules: []string{"q_proj", "v_proj", "down_proj"}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return p, NewOptimizer(p, optim.Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, ClipNorm: 1}, 1e-2, optim.Schedule{}, 1, "")
}

// TestRanksMatchOneProcess: two ranks, each a process's learner on one CPU
// device, summing over a TCP ring, reach the weights and the loss sums of
// one process training on two devices, bit for bit, through Score,
// AccumulatePolicy and Update (five micro-batches: the ranks run three and
// two, as the devices do).
func TestRanksMatchOneProcess(t *testing.T) {
	dir := tinyDir(t)
	p, tr := openPolicy(t, dir)
	one, err := NewParallel(tr, []kernels.TrainBackend{cpu.New(), cpu.New()}, nil, LearnerOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, wantStats := policySteps(t, one, p)

	const size = 2
	lns := make([]net.Listener, size)
	addrs := make([]string, size)
	for i := range lns {
		lns[i], _ = net.Listen("tcp", "127.0.0.1:0")
		addrs[i] = lns[i].Addr().String()
	}
	ag := &allGather{parts: map[string][][]float64{}, size: size}
	ag.cond = sync.NewCond(&ag.mu)
	got := make([]map[string][]float32, size)
	gotStats := make([][]PolicyStats, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			rg, err := ring.Dial(context.Background(), ring.Options{Rank: r, Addrs: addrs, Listener: lns[r], RunID: "t", Timeout: 30 * time.Second})
			if err != nil {
				t.Error(err)
				return
			}
			defer rg.Close()
			p, tr := openPolicy(t, dir)
			l, err := newRankLearner(tr, []kernels.TrainBackend{cpu.New()}, LearnerOptions{Ranks: &Ranks{Rank: r, Size: size, Reduce: rg, Exchange: ag.exchange(r)}})
			if err != nil {
				t.Error(err)
				return
			}
			got[r], gotStats[r] = policySteps(t, l, p)
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for r := range size {
		if fmt.Sprint(gotStats[r]) != fmt.Sprint(wantStats) {
			t.Fatalf("rank %d's loss sums %v, one process's %v", r, gotStats[r], wantStats)
		}
		for name, w := range want {
			for i := range w {
				if got[r][name][i] != w[i] {
					t.Fatalf("rank %d: %s[%d] = %v, one process with two devices: %v", r, name, i, got[r][name][i], w[i])
				}
			}
		}
	}
}

func TestRankLearnerRefuses(t *testing.T) {
	dir := tinyDir(t)
	_, tr := openPolicy(t, dir)
	r := &Ranks{Rank: 0, Size: 2, Reduce: kernels.HostReduce{}, Exchange: func(string, []float64) ([][]float64, error) { return nil, nil }}
	if _, err := newRankLearner(tr, []kernels.TrainBackend{cpu.New(), cpu.New()}, LearnerOptions{Ranks: r}); err == nil || !strings.Contains(err.Error(), "trains on one") {
		t.Fatalf("two devices on a rank: %v", err)
	}
	if _, err := newRankLearner(tr, []kernels.TrainBackend{cpu.New()}, LearnerOptions{Ranks: r, ZeroStage: 1}); err == nil || !strings.Contains(err.Error(), "zero_stage") {
		t.Fatalf("ZeRO across processes: %v", err)
	}
}
