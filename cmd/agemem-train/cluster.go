package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/agemem/agemem/env"
	"github.com/agemem/agemem/kernels"
	"github.com/agemem/agemem/kernels/cuda"
	"github.com/agemem/agemem/rl"
	"github.com/agemem/agemem/rl/cluster"
	"github.com/agemem/agemem/setup"
)

// rankDevice is the device a rank of l trains on: model.devices[LOCAL_RANK]
// when the list names one per local rank, cuda:LOCAL_RANK when it says
// "cuda" (torchrun's habit), its one entry otherwise (CPU ranks may share
// "cpu"), and the CPU when it is empty.
func rankDevice(devices []string, l cluster.Launch) (string, error) {
	switch {
	case len(devices) == 0:
		return "cpu", nil
	case len(devices) == l.LocalSize && l.LocalSize > 1:
		return devices[l.LocalRank], nil
	case len(devices) == 1 && devices[0] == "cuda":
		return fmt.Sprintf("cuda:%d", l.LocalRank), nil
	case len(devices) == 1:
		return devices[0], nil
	}
	return "", fmt.Errorf("model.devices %v: a rank trains on one device; name one per local rank (%d on this machine), one for all, or cuda (cuda:$LOCAL_RANK)", devices, l.LocalSize)
}

// joinCluster makes o one rank of the run the launcher's variables
// describe (nothing for a run of one): it joins rank 0's control endpoint
// and sums gradients over NCCL where rank 0 is a GPU rank with NCCL, else
// over the TCP ring. finish must be called with the run's outcome: an
// error stops the other ranks at once, naming this one.
func joinCluster(ctx context.Context, cfg setup.Config, o *rl.Options[env.Outcome], log io.Writer) (finish func(error), err error) {
	l, err := cluster.FromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	if !l.Distributed() {
		return func(error) {}, nil
	}
	dev, err := rankDevice(cfg.Model.Devices, l)
	if err != nil {
		return nil, err
	}
	hello := cluster.Hello{Device: dev}
	gpu := strings.HasPrefix(dev, "cuda")
	if l.Rank == 0 && gpu {
		if hello.NCCLID, err = cuda.NCCLUniqueID(); err != nil {
			fmt.Fprintf(log, "cluster: NCCL unavailable (%v); gradients go over the TCP ring\n", err)
		}
	}
	node, err := cluster.Start(ctx, cfg.Cluster, l, hello, log)
	if err != nil {
		return nil, err
	}
	id := node.Peers[0].NCCLID
	reduceFor := func(be kernels.TrainBackend) (kernels.Reducer, error) {
		if len(id) == 0 {
			return node.Ring, nil
		}
		n, err := cuda.NewNCCLRank(be, id, l.Size, l.Rank)
		if err != nil {
			return nil, fmt.Errorf("rank 0 opened NCCL, this rank cannot: %w", err)
		}
		return n, nil
	}
	o.Learner.Devices, o.Learner.Ranks, o.Cluster = []string{dev}, rl.Ranks(node.Context(), node, reduceFor), node
	return func(err error) {
		if err != nil {
			node.Abort(err)
		}
		node.Close()
	}, nil
}

// printClusterPlan writes what train --dry-run adds for a run across
// processes or on remote engines: the ranks the launcher's variables
// describe, each rank's device, the engines and how adapters reach them,
// then the memory plan of one rank's device.
func printClusterPlan(w io.Writer, cfg setup.Config, deviceGiB float64) error {
	l, err := cluster.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	rc := cfg.RL
	if l.Distributed() {
		dev, err := rankDevice(cfg.Model.Devices, l)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "cluster: %d ranks (%s variables), %d per machine; this is rank %d (local rank %d) on %s\n", l.Size, l.From, l.LocalSize, l.Rank, l.LocalRank, dev)
		fmt.Fprintf(w, "  control endpoint: http://%s:%d/rpc (JSON-RPC 2.0); heartbeats every %v, a rank silent %v stops the run\n",
			l.MasterAddr, l.ControlPort(cfg.Cluster.Port), cfg.Cluster.Heartbeat, cfg.Cluster.Timeout)
		red := "a TCP ring (no GPU)"
		if strings.HasPrefix(dev, "cuda") {
			red = "NCCL across the ranks (ncclCommInitRank), or the TCP ring if rank 0 cannot load libnccl.so.2"
		}
		fmt.Fprintf(w, "  gradients: %s; one device per rank, micro-batch i on rank i mod %d\n", red, l.Size)
		fmt.Fprintf(w, "  rollouts: rank r plays groups r, r+%d, ... of each step's %d tasks x %d rollouts\n", l.Size, rc.BatchTasks, rc.K)
		cfg.Model.Devices = []string{dev}
	} else {
		fmt.Fprintf(w, "cluster: one process (no torchrun, Kubeflow or Slurm rank variables)\n")
	}
	if len(rc.Engines) > 0 {
		if !cfg.LoRA.Enabled {
			return fmt.Errorf("rl.engines needs lora.enabled: engines hot-load LoRA adapters, not full weights")
		}
		how := fmt.Sprintf("served over HTTP by rank 0 from %s/adapters", rc.Out)
		if rc.AdapterDir != "" {
			how = "read from " + rc.AdapterDir + " (a directory every engine must see)"
		}
		fmt.Fprintf(w, "engines: %d, adapters %s; a request times out after %v\n", len(rc.Engines), how, rc.EngineTimeout)
		for i, u := range rc.Engines {
			owner := i % max(l.Size, 1)
			if len(rc.Engines) < l.Size {
				owner = -1
			}
			if owner >= 0 {
				fmt.Fprintf(w, "  %s  (rank %d's; the others' when theirs fail)\n", u, owner)
			} else {
				fmt.Fprintf(w, "  %s  (shared: ranks r with r mod %d = %d)\n", u, len(rc.Engines), i)
			}
		}
	} else {
		fmt.Fprintf(w, "engines: none, rollouts decode in process on %s\n", cfg.Model.Device)
	}
	plan, err := setup.Plan(cfg)
	if err != nil {
		return err
	}
	if len(rc.Engines) > 0 {
		// The rollouts decode on the engines: no engine or KV cache here.
		plan.Engine.Bytes, plan.KV.Bytes = 0, 0
	}
	plan.Print(w, deviceGiB)
	return nil
}
