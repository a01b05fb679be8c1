package rl

// A step spread over ranks and engines. Each rank plays the groups
// g ≡ rank (mod ranks) of a step's tasks, on its in-process engine or on
// its share of the remote engines, scores them, and hands them to the
// control plane's gather; every rank then holds the step's rollouts in
// batch order, so the advantages, micro-batches and updates are those of
// one process (model/train.Ranks). A process alone runs the same code
// with a gather of one.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"unsafe"

	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/llm"
	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/train"
	"github.com/agemem/agemem/rl/cluster"
	"github.com/agemem/agemem/rl/fleet"
	"github.com/agemem/agemem/rl/rollout"
)

// scored is a played rollout as the ranks exchange it: what the reward
// made of it, not the episode itself.
type scored struct {
	Index  int                `json:"index"`
	Group  int                `json:"group"`
	Total  float64            `json:"total"`
	Parts  map[string]float64 `json:"parts,omitempty"`
	Info   map[string]any     `json:"info,omitempty"`
	Err    string             `json:"err,omitempty"`
	Reruns int                `json:"reruns,omitempty"`
	Calls  []float64          `json:"calls,omitempty"`
}

func (s scored) score() rollout.Score {
	return rollout.Score{Total: s.Total, Parts: s.Parts, Info: s.Info, Calls: s.Calls}
}

// roundPart is one rank's share of a rollout round.
type roundPart struct {
	Rollouts []scored             `json:"rollouts"`
	Exps     []rollout.Experience `json:"exps"`
	// The rank's in-process engines' figures.
	Reused, KVPeak, Recomputed int
}

// spread is this process's place in a run: its rank, and the engines
// its rollouts use.
type spread struct {
	node       *cluster.Node // nil: a process alone
	rank, size int
	log        io.Writer
	// Remote engines (rl.engines): the fleet and publisher are rank 0's;
	// every rank holds the adapter's name and its share of the engines.
	fleet     *fleet.Fleet
	pub       *fleet.Publisher
	codec     *native.Codec
	adapter   fleet.Adapter // rank 0: the version published last
	older     fleet.Adapter // and the one before it
	name      string        // the adapter the next rollouts run
	urls      []string      // the engines that hold it, this rank's share first
	preferred int
}

func newSpread(node *cluster.Node, log io.Writer) *spread {
	sp := &spread{node: node, size: 1, log: log}
	if node != nil {
		sp.rank, sp.size = node.Rank(), node.Size()
	}
	return sp
}

func (sp *spread) lead() bool { return sp.rank == 0 }

// mine are the groups of a batch this rank plays.
func (sp *spread) mine(groups int) []int {
	var out []int
	for g := sp.rank; g < groups; g += sp.size {
		out = append(out, g)
	}
	return out
}

// gather exchanges the ranks' parts of a round and merges them in batch
// order, checking that each of the round's total rollouts came back
// exactly once: a step never drops or doubles a rollout, whatever failed.
func (sp *spread) gather(ctx context.Context, key string, part roundPart, total int) (roundPart, error) {
	var raws []json.RawMessage
	if sp.node == nil {
		raw, err := json.Marshal(part)
		if err != nil {
			return roundPart{}, fmt.Errorf("%s: %w", key, err)
		}
		raws = []json.RawMessage{raw}
	} else {
		var err error
		if raws, err = sp.node.Gather(ctx, key, part); err != nil {
			return roundPart{}, err
		}
	}
	var all roundPart
	for r, raw := range raws {
		var p roundPart
		if err := json.Unmarshal(raw, &p); err != nil {
			return roundPart{}, fmt.Errorf("%s: rank %d's part: %w", key, r, err)
		}
		all.Rollouts = append(all.Rollouts, p.Rollouts...)
		all.Exps = append(all.Exps, p.Exps...)
		all.Reused += p.Reused
		all.Recomputed += p.Recomputed
		all.KVPeak = max(all.KVPeak, p.KVPeak)
	}
	sort.Slice(all.Rollouts, func(i, j int) bool { return all.Rollouts[i].Index < all.Rollouts[j].Index })
	if len(all.Rollouts) != total {
		return roundPart{}, fmt.Errorf("%s: %d rollouts came back, the round played %d", key, len(all.Rollouts), total)
	}
	for i, r := range all.Rollouts {
		if r.Index != i {
			return roundPart{}, fmt.Errorf("%s: rollout %d came back twice or not at all", key, i)
		}
	}
	sort.SliceStable(all.Exps, func(i, j int) bool {
		a, b := all.Exps[i], all.Exps[j]
		return a.Rollout < b.Rollout || (a.Rollout == b.Rollout && a.Call < b.Call)
	})
	return all, nil
}

// exchange is train.Ranks' Exchange over the control plane's gather, the
// values sent as their bits (a NaN loss still crosses).
func (sp *spread) exchange(ctx context.Context) func(key string, mine []float64) ([][]float64, error) {
	return func(key string, mine []float64) ([][]float64, error) {
		bits := make([]uint64, len(mine))
		for i, v := range mine {
			bits[i] = math.Float64bits(v)
		}
		raws, err := sp.node.Gather(ctx, "exchange/"+key, bits)
		if err != nil {
			return nil, err
		}
		out := make([][]float64, len(raws))
		for r, raw := range raws {
			var b []uint64
			if err := json.Unmarshal(raw, &b); err != nil {
				return nil, fmt.Errorf("exchange %s: rank %d: %w", key, r, err)
			}
			out[r] = make([]float64, len(b))
			for i, x := range b {
				out[r][i] = math.Float64frombits(x)
			}
		}
		return out, nil
	}
}

// startEngines opens rl.engines: every rank's clients, and rank 0's
// publisher (rank 0 alone publishes and loads adapters).
func (sp *spread) startEngines(rc Config, codec *native.Codec) error {
	sp.codec = codec
	key := ""
	if rc.EngineKeyEnv != "" {
		if key = os.Getenv(rc.EngineKeyEnv); key == "" {
			return fmt.Errorf("rl.engine_key_env names $%s, which is empty: export the engines' API key there", rc.EngineKeyEnv)
		}
	}
	f, err := fleet.New(fleet.Options{URLs: rc.Engines, Key: key, Timeout: rc.EngineTimeout, Retries: rc.EngineRetries}, sp.log)
	if err != nil {
		return err
	}
	sp.fleet = f
	if !sp.lead() {
		return nil
	}
	dir, shared := rc.AdapterDir, rc.AdapterDir != ""
	if !shared {
		dir = filepath.Join(rc.Out, "adapters")
	}
	pub, err := fleet.NewPublisher(dir, "agemem", shared, rc.AdapterAddr)
	if err != nil {
		return err
	}
	sp.pub = pub
	return nil
}

func (sp *spread) close() {
	if sp.pub != nil {
		sp.pub.Close()
	}
}

// weightsSum is the SHA-256 of the trainable weights of a LoRA policy
// (the adapter, small): ranks compare it after every update, so ranks
// that drifted apart stop the run instead of training on. Full
// fine-tuning is not summed ("": its weights are the model's size).
func weightsSum(p *train.Policy, lora bool) string {
	if !lora {
		return ""
	}
	h := sha256.New()
	for _, nv := range p.W.Trainable() {
		if len(nv.V.Val) > 0 {
			h.Write(unsafe.Slice((*byte)(unsafe.Pointer(&nv.V.Val[0])), 4*len(nv.V.Val)))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// versionPart is what the ranks exchange after an update.
type versionPart struct {
	Sum     string   `json:"sum"`
	Adapter string   `json:"adapter,omitempty"`
	Engines []string `json:"engines,omitempty"`
}

// sync runs after each update (and before the first step): the ranks
// compare their weights, and with remote engines rank 0 publishes the
// adapter as version, has the engines load it, and every rank learns
// which engines hold it and which are its own.
func (sp *spread) sync(ctx context.Context, version int, p *train.Policy, lora bool) error {
	part := versionPart{Sum: weightsSum(p, lora)}
	if sp.pub != nil {
		ad, err := sp.pub.Publish(version, p.W.Adapter())
		if err != nil {
			return err
		}
		up, err := sp.fleet.Load(ctx, ad, sp.adapter.Name, func(u string) string { return sp.pub.PathFor(ad, u) })
		if err != nil {
			return err
		}
		// The version before the one the engines dropped goes: an engine
		// that reads its files lazily has had a whole step to.
		if sp.older.Name != "" && sp.older.Name != ad.Name && sp.older.Name != sp.adapter.Name {
			sp.pub.Remove(sp.older)
		}
		if sp.adapter.Name != ad.Name {
			sp.older, sp.adapter = sp.adapter, ad
		}
		part.Adapter, part.Engines = ad.Name, up
		if sp.node != nil {
			sp.node.Server().SetEngines(ad.Name, up)
		}
	}
	parts := []versionPart{part}
	if sp.node != nil {
		raws, err := sp.node.Gather(ctx, fmt.Sprintf("version-%d", version), part)
		if err != nil {
			return err
		}
		parts = make([]versionPart, len(raws))
		for r, raw := range raws {
			if err := json.Unmarshal(raw, &parts[r]); err != nil {
				return fmt.Errorf("version %d: rank %d: %w", version, r, err)
			}
		}
		for r, q := range parts {
			if q.Sum != parts[0].Sum {
				return fmt.Errorf("after %d updates rank %d's weights (sha256 %.12s) differ from rank 0's (%.12s): the ranks diverged; stop and --resume from the last checkpoint", version, r, q.Sum, parts[0].Sum)
			}
		}
	}
	if sp.codec == nil {
		return nil
	}
	sp.name = parts[0].Adapter
	if sp.node == nil {
		sp.urls, sp.preferred = parts[0].Engines, len(parts[0].Engines)
	} else {
		es, err := sp.node.Engines(ctx, sp.name)
		if err != nil {
			return err
		}
		sp.urls, sp.preferred = nil, 0
		for _, e := range es {
			sp.urls = append(sp.urls, e.URL)
			if e.Preferred {
				sp.preferred++
			}
		}
		sp.node.Report(version, sp.name)
	}
	return nil
}

// remote is this rank's rollout policies on the engines, answering with
// the current adapter, and how many (the first) are its own.
func (sp *spread) remote(budget int) ([]llm.Model, int, error) {
	ms, err := sp.fleet.Models(sp.urls, sp.name, sp.codec, llm.Sampling{MaxTokens: budget})
	return ms, sp.preferred, err
}

// checkAdapters refuses a step whose experiences were not all produced by
// the adapter it ran (a stale engine the fleet let through).
func (sp *spread) checkAdapters(exps []rollout.Experience) error {
	if sp.codec == nil {
		return nil
	}
	var bad []error
	for _, e := range exps {
		if e.Adapter != sp.name {
			bad = append(bad, fmt.Errorf("rollout %d call %d came from %q", e.Rollout, e.Call, e.Adapter))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("experiences not from adapter %s refused: %w", sp.name, errors.Join(bad...))
	}
	return nil
}

// Ranks are the learner's share of a run across processes: micro-batch i
// on rank i mod N, gradients summed by the reducer reduceFor makes for
// the rank's device (the node's TCP ring on CPUs, NCCL on GPUs), the
// loss's sums exchanged over the control plane.
func Ranks(ctx context.Context, node *cluster.Node, reduceFor func(kernels.TrainBackend) (kernels.Reducer, error)) *train.Ranks {
	sp := newSpread(node, nil)
	return &train.Ranks{Rank: node.Rank(), Size: node.Size(), ReduceFor: reduceFor, Exchange: sp.exchange(ctx)}
}
