// Package cluster runs data-parallel ranks of one training run across
// processes and machines, launched as torchrun, Kubeflow and Slurm launch
// PyTorch: each process reads its rank from the launcher's variables;
// rank 0 serves a small control endpoint, JSON-RPC 2.0 over HTTP, which
// every rank (rank 0 too) calls for the rendezvous, barriers, heartbeats,
// gathers, the rollout engines it may use, and aborts; and the ranks sum
// gradients over a TCP ring (kernels/ring) or NCCL. It is a control plane
// for one run, not a cluster framework: the launcher places and restarts
// processes.
package cluster

import (
	"fmt"
	"strconv"
	"strings"
)

// Launch is where this process stands in the run, as its launcher says.
type Launch struct {
	Rank, Size int
	// LocalRank and LocalSize are the process's place among the run's
	// processes on its machine (which GPU it takes).
	LocalRank, LocalSize int
	// MasterAddr and MasterPort are rank 0's host and the port the
	// launcher names for it.
	MasterAddr string
	MasterPort int
	// AgentStore: torchrun's agent already listens on MasterPort (its
	// TCPStore), so the control endpoint takes the next port.
	AgentStore bool
	// From names the launcher whose variables were read.
	From string
}

// Distributed reports whether the run spans more than this process.
func (l Launch) Distributed() bool { return l.Size > 1 }

// FromEnv reads the launcher's variables with getenv (os.Getenv):
//
//   - torchrun and Kubeflow's PyTorchJob: RANK, WORLD_SIZE, LOCAL_RANK,
//     LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
//   - Kubeflow Trainer (a process per node, not under torchrun): PET_NNODES,
//     PET_NODE_RANK, PET_NPROC_PER_NODE (1), PET_MASTER_ADDR, PET_MASTER_PORT;
//   - Slurm (srun, a task per rank): SLURM_PROCID, SLURM_NTASKS,
//     SLURM_LOCALID, SLURM_NTASKS_PER_NODE, with MASTER_ADDR and MASTER_PORT
//     exported by the batch script (Slurm names no rendezvous host).
//
// The first set found wins, in that order. With none, the process is a run
// of one (rank 0 of 1).
func FromEnv(getenv func(string) string) (Launch, error) {
	r := envReader{get: getenv}
	var l Launch
	switch {
	case getenv("RANK") != "" || getenv("WORLD_SIZE") != "":
		l = Launch{From: "torchrun", Rank: r.int("RANK", -1), Size: r.int("WORLD_SIZE", -1),
			LocalRank: r.int("LOCAL_RANK", 0), LocalSize: r.int("LOCAL_WORLD_SIZE", 1),
			MasterAddr: getenv("MASTER_ADDR"), MasterPort: r.int("MASTER_PORT", -1),
			AgentStore: strings.EqualFold(getenv("TORCHELASTIC_USE_AGENT_STORE"), "true")}
	case getenv("PET_NNODES") != "":
		per := r.int("PET_NPROC_PER_NODE", 1)
		if per != 1 && r.err == nil {
			r.err = fmt.Errorf("$PET_NPROC_PER_NODE is %d: without torchrun each node runs one process (set it to 1, or launch with torchrun, which sets RANK)", per)
		}
		l = Launch{From: "Kubeflow Trainer", Rank: r.int("PET_NODE_RANK", -1), Size: r.int("PET_NNODES", -1),
			LocalSize: 1, MasterAddr: getenv("PET_MASTER_ADDR"), MasterPort: r.int("PET_MASTER_PORT", -1)}
	case getenv("SLURM_PROCID") != "" && getenv("SLURM_NTASKS") != "":
		l = Launch{From: "Slurm", Rank: r.int("SLURM_PROCID", -1), Size: r.int("SLURM_NTASKS", -1),
			LocalRank: r.int("SLURM_LOCALID", 0), LocalSize: slurmTasksPerNode(getenv("SLURM_NTASKS_PER_NODE")),
			MasterAddr: getenv("MASTER_ADDR"), MasterPort: r.int("MASTER_PORT", -1)}
	default:
		return Launch{Rank: 0, Size: 1, LocalSize: 1, From: "none"}, nil
	}
	if r.err != nil {
		return l, r.err
	}
	v := func(name string) string { return l.varName(name) }
	switch {
	case l.Size < 1:
		return l, fmt.Errorf("$%s is %d: a run has at least one rank", v("size"), l.Size)
	case l.Rank < 0 || l.Rank >= l.Size:
		return l, fmt.Errorf("$%s is %d, outside 0..%d ($%s %d)", v("rank"), l.Rank, l.Size-1, v("size"), l.Size)
	case l.LocalSize < 1 || l.LocalRank < 0 || l.LocalRank >= l.LocalSize:
		return l, fmt.Errorf("$%s is %d, outside 0..%d", v("local"), l.LocalRank, l.LocalSize-1)
	case l.Size > 1 && l.MasterAddr == "":
		return l, fmt.Errorf("$%s is not set: name rank 0's host (under Slurm: export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))", v("addr"))
	case l.Size > 1 && (l.MasterPort < 1 || l.MasterPort > 65535):
		return l, fmt.Errorf("$%s is %d: want a TCP port rank 0 can listen on", v("port"), l.MasterPort)
	}
	return l, nil
}

// varName is the launcher's variable for a field, for error messages.
func (l Launch) varName(field string) string {
	names := map[string]map[string]string{
		"torchrun":         {"rank": "RANK", "size": "WORLD_SIZE", "local": "LOCAL_RANK", "addr": "MASTER_ADDR", "port": "MASTER_PORT"},
		"Kubeflow Trainer": {"rank": "PET_NODE_RANK", "size": "PET_NNODES", "local": "PET_NPROC_PER_NODE", "addr": "PET_MASTER_ADDR", "port": "PET_MASTER_PORT"},
		"Slurm":            {"rank": "SLURM_PROCID", "size": "SLURM_NTASKS", "local": "SLURM_LOCALID", "addr": "MASTER_ADDR", "port": "MASTER_PORT"},
	}
	return names[l.From][field]
}

// ControlPort is the port rank 0's control endpoint listens on: port when
// set (cluster.port), else the launcher's master port, or the one after
// it where torchrun's agent holds that one.
func (l Launch) ControlPort(port int) int {
	switch {
	case port > 0:
		return port
	case l.AgentStore:
		return l.MasterPort + 1
	}
	return l.MasterPort
}

// slurmTasksPerNode reads SLURM_NTASKS_PER_NODE ("4", or "4(x2)" as
// SLURM_TASKS_PER_NODE writes it); 1 when unset or unreadable.
func slurmTasksPerNode(v string) int {
	v, _, _ = strings.Cut(v, "(")
	v, _, _ = strings.Cut(v, ",")
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

type envReader struct {
	get func(string) string
	err error
}

// int reads an integer variable; def when unset.
func (r *envReader) int(name string, def int) int {
	v := strings.TrimSpace(r.get(name))
	if v == "" {
		if def < 0 && r.err == nil {
			r.err = fmt.Errorf("$%s is not set", name)
		}
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("$%s is %q, not an integer", name, v)
	}
	return n
}
