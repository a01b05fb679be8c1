package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFromEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want Launch
		err  string
	}{
		{name: "no launcher", env: nil, want: Launch{Rank: 0, Size: 1, LocalSize: 1, From: "none"}},
		{name: "torchrun", env: map[string]string{"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True"},
			want: Launch{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, MasterAddr: "node0", MasterPort: 29500, AgentStore: true, From: "torchrun"}},
		{name: "PyTorchJob", env: map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},
			want: Launch{Rank: 1, Size: 2, LocalSize: 1, MasterAddr: "job-master-0", MasterPort: 23456, From: "torchrun"}},
		{name: "Kubeflow Trainer", env: map[string]string{"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "trainjob-node-0-0.trainjob", "PET_MASTER_PORT": "29400"},
			want: Launch{Rank: 1, Size: 2, LocalSize: 1, MasterAddr: "trainjob-node-0-0.trainjob", MasterPort: 29400, From: "Kubeflow Trainer"}},
		{name: "Slurm", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)", "MASTER_ADDR": "gpu01", "MASTER_PORT": "29500"},
			want: Launch{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, MasterAddr: "gpu01", MasterPort: 29500, From: "Slurm"}},
		{name: "Slurm without MASTER_ADDR", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "MASTER_PORT": "29500"}, err: "$MASTER_ADDR is not set"},
		{name: "rank beyond the world", env: map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, err: "$RANK is 2, outside 0..1"},
		{name: "no world size", env: map[string]string{"RANK": "0"}, err: "$WORLD_SIZE is not set"},
		{name: "a rank that is not a number", env: map[string]string{"RANK": "one", "WORLD_SIZE": "2"}, err: `$RANK is "one"`},
		{name: "bad port", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "70000"}, err: "$MASTER_PORT is 70000"},
		{name: "Kubeflow Trainer with several processes per node", env: map[string]string{"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "8", "PET_MASTER_ADDR": "a", "PET_MASTER_PORT": "1"}, err: "PET_NPROC_PER_NODE is 8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := FromEnv(func(k string) string { return c.env[k] })
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("%+v, %v; want %+v", got, err, c.want)
			}
		})
	}
	l := Launch{MasterPort: 29500, AgentStore: true}
	if l.ControlPort(0) != 29501 || l.ControlPort(7000) != 7000 || (Launch{MasterPort: 29500}).ControlPort(0) != 29500 {
		t.Fatal("control port: torchrun's agent holds MASTER_PORT, cluster.port overrides")
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func testConfig() Config {
	c := DefaultConfig()
	c.Heartbeat, c.Timeout, c.Rendezvous, c.Collective = 100*time.Millisecond, time.Second, 10*time.Second, 10*time.Second
	return c
}

// start launches n ranks in this process, as n processes would start.
func start(t *testing.T, n int, cfg Config) []*Node {
	t.Helper()
	port := freePort(t)
	nodes := make([]*Node, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			// The ranks start in reverse: the others wait for rank 0 to come up.
			time.Sleep(time.Duration(n-r) * 20 * time.Millisecond)
			l := Launch{Rank: r, Size: n, LocalSize: 1, MasterAddr: "127.0.0.1", MasterPort: port, From: "torchrun"}
			nodes[r], errs[r] = Start(context.Background(), cfg, l, Hello{Device: "cpu", NCCLID: map[bool][]byte{true: []byte("id")}[r == 0]}, nil)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return nodes
}

// TestRanksGatherAndSum: three ranks meet, each sees every hello (rank 0's
// NCCL id among them), gathers come back in rank order, engines are
// shared out, and the ring sums.
func TestRanksGatherAndSum(t *testing.T) {
	nodes := start(t, 3, testConfig())
	defer func() {
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Go(n.Close)
		}
		wg.Wait()
	}()
	for _, n := range nodes {
		if len(n.Peers) != 3 || string(n.Peers[0].NCCLID) != "id" || n.RunID != nodes[0].RunID {
			t.Fatalf("rank %d: peers %+v run %s", n.Rank(), n.Peers, n.RunID)
		}
	}
	parts := make([][]json.RawMessage, 3)
	sums := make([][]float32, 3)
	var wg sync.WaitGroup
	for r, n := range nodes {
		wg.Go(func() {
			var err error
			if parts[r], err = n.Gather(context.Background(), "step-1", map[string]int{"rank": r}); err != nil {
				t.Error(err)
			}
			if err := n.Barrier(context.Background(), "b"); err != nil {
				t.Error(err)
			}
			sums[r] = []float32{float32(r), 1}
			if err := n.Ring.SumFloat32(sums[r]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for r := range 3 {
		if got := string(parts[r][2]); got != `{"rank":2}` {
			t.Fatalf("rank %d got part 2 = %s", r, got)
		}
		if sums[r][0] != 3 || sums[r][1] != 3 {
			t.Fatalf("rank %d: ring sum %v", r, sums[r])
		}
	}
	nodes[0].Server().SetEngines("v1", []string{"http://e0", "http://e1"})
	for r, n := range nodes {
		es, err := n.Engines(context.Background(), "v1")
		if err != nil {
			t.Fatal(err)
		}
		want := map[int]string{0: "http://e0", 1: "http://e1", 2: "http://e0"}[r]
		if len(es) != 2 || es[0].URL != want || !es[0].Preferred || es[1].Preferred {
			t.Fatalf("rank %d: engines %+v, want %s first and preferred", r, es, want)
		}
	}
}

// TestASilentRankStopsTheOthers: a rank that dies (its heartbeat stops, it
// never leaves) ends every other rank's context within cluster.timeout,
// naming it; a rank waiting in a gather for it returns the same reason.
func TestASilentRankStopsTheOthers(t *testing.T) {
	cfg := testConfig()
	nodes := start(t, 3, cfg)
	defer nodes[0].Close()
	defer nodes[1].Close()
	died := time.Now()
	close(nodes[2].stopBeat) // as SIGKILL leaves it: no leave, no more heartbeats
	nodes[2].Ring.Close()
	_, gerr := nodes[1].Gather(context.Background(), "never", 1)
	for _, n := range nodes[:2] {
		select {
		case <-n.Context().Done():
		case <-time.After(cfg.Timeout + 3*time.Second):
			t.Fatalf("rank %d still running %v after rank 2 died", n.Rank(), time.Since(died))
		}
		if err := context.Cause(n.Context()); !strings.Contains(err.Error(), "rank 2") || !strings.Contains(err.Error(), "no heartbeat") {
			t.Fatalf("rank %d stopped with %v, want rank 2 named", n.Rank(), err)
		}
	}
	if gerr == nil || !strings.Contains(gerr.Error(), "rank 2") {
		t.Fatalf("a gather waiting on the dead rank returned %v", gerr)
	}
	if el := time.Since(died); el > cfg.Timeout+2*time.Second {
		t.Fatalf("stopping took %v, cluster.timeout is %v", el, cfg.Timeout)
	}
}

// TestAFailureAbortsEveryRank: a rank's error reaches the others at once
// (not after the timeout), with its message.
func TestAFailureAbortsEveryRank(t *testing.T) {
	cfg := testConfig()
	cfg.Timeout = time.Minute
	nodes := start(t, 2, cfg)
	defer nodes[0].Close()
	nodes[1].Abort(errors.New("out of memory on cuda:1"))
	select {
	case <-nodes[0].Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("rank 0 did not hear of rank 1's failure")
	}
	if err := context.Cause(nodes[0].Context()); !strings.Contains(err.Error(), "rank 1 failed: out of memory on cuda:1") {
		t.Fatal(err)
	}
}

// TestRankZeroGoneStopsTheOthers: when rank 0 dies, the others stop
// within cluster.timeout, naming rank 0.
func TestRankZeroGoneStopsTheOthers(t *testing.T) {
	cfg := testConfig()
	nodes := start(t, 2, cfg)
	defer nodes[1].Close()
	nodes[0].hs.Close()
	close(nodes[0].stopBeat)
	select {
	case <-nodes[1].Context().Done():
	case <-time.After(cfg.Timeout + 3*time.Second):
		t.Fatal("rank 1 kept running without rank 0")
	}
	if err := context.Cause(nodes[1].Context()); !strings.Contains(err.Error(), "rank 0") {
		t.Fatal(err)
	}
}

// TestJSONRPCConformance: the endpoint answers JSON-RPC 2.0's error codes
// and batches as the specification writes them.
func TestJSONRPCConformance(t *testing.T) {
	s := NewServer(2, "run", time.Minute, time.Minute)
	srv := http.Server{Handler: s}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Close()
	post := func(body string) string {
		resp, err := http.Post("http://"+ln.Addr().String(), "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return string(raw)
	}
	for _, c := range []struct{ body, want string }{
		{`{`, `"code":-32700`},
		{`{"jsonrpc":"1.0","method":"status","id":1}`, `"code":-32600`},
		{`{"jsonrpc":"2.0","method":"reboot","id":2}`, `"code":-32601`},
		{`{"jsonrpc":"2.0","method":"heartbeat","params":{"rank":9},"id":3}`, `"code":-32602`},
		{`{"jsonrpc":"2.0","method":"heartbeat","params":{"rank":1,"bogus":1},"id":4}`, `"code":-32602`},
		{`{"jsonrpc":"2.0","method":"heartbeat","params":{"rank":1,"step":3},"id":5}`, `{"jsonrpc":"2.0","result":{"abort":""},"id":5}`},
		{`[{"jsonrpc":"2.0","method":"status","id":"a"},{"jsonrpc":"2.0","method":"nope","id":"b"}]`, `"id":"b"`},
	} {
		if got := post(c.body); !strings.Contains(got, c.want) {
			t.Errorf("%s -> %s, want %s", c.body, got, c.want)
		}
	}
}
