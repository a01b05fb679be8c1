package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ybbus/jsonrpc/v3"

	"github.com/agemem/agemem/kernels/ring"
)

// Node is this process's rank in a run: its client of rank 0's control
// endpoint (and, on rank 0, the endpoint itself), its heartbeat, and its
// place in the gradient ring.
type Node struct {
	Launch Launch
	// Peers are every rank's hello, rank order; RunID names the run.
	Peers []Hello
	RunID string
	// Ring sums gradients between the ranks (kernels.Reducer).
	Ring *ring.Ring

	cfg      Config
	rpc      jsonrpc.RPCClient
	endpoint string
	server   *Server
	hs       *http.Server
	ctx      context.Context
	cancel   context.CancelCauseFunc
	log      io.Writer
	step     atomic.Int64
	adapter  atomic.Value // string
	stopBeat chan struct{}
	beatDone chan struct{}
	once     sync.Once
}

// Start joins the run l describes: rank 0 serves the control endpoint on
// cluster.port; every rank listens for its ring neighbour, joins the
// rendezvous (waiting for rank 0 to come up), connects the ring and starts
// its heartbeat. hello's Device and NCCLID (rank 0, GPU runs) are passed
// to every rank. The node's Context ends, with the reason as its cause,
// when any rank fails, falls silent or leaves rank 0 unreachable for
// cluster.timeout.
func Start(ctx context.Context, cfg Config, l Launch, hello Hello, log io.Writer) (*Node, error) {
	if log == nil {
		log = io.Discard
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	n := &Node{Launch: l, cfg: cfg, log: log, stopBeat: make(chan struct{}), beatDone: make(chan struct{})}
	n.adapter.Store("")
	n.ctx, n.cancel = context.WithCancelCause(context.Background())
	port := l.ControlPort(cfg.Port)
	n.endpoint = "http://" + net.JoinHostPort(l.MasterAddr, strconv.Itoa(port)) + "/rpc"
	if l.Rank == 0 {
		id := make([]byte, 8)
		rand.Read(id)
		n.server = NewServer(l.Size, hex.EncodeToString(id), cfg.Timeout, cfg.Rendezvous)
		ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
		if err != nil {
			return nil, fmt.Errorf("cluster: rank 0's control endpoint on port %d (cluster.port, else $%s): %w", port, l.varName("port"), err)
		}
		mux := http.NewServeMux()
		mux.Handle("/rpc", n.server)
		n.hs = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go n.hs.Serve(ln)
		fmt.Fprintf(log, "cluster: rank 0 serves the control endpoint on port %d for %d ranks (%s)\n", port, l.Size, l.From)
	}
	n.rpc = jsonrpc.NewClientWithOpts(n.endpoint, &jsonrpc.RPCClientOpts{HTTPClient: &http.Client{Timeout: poll + 30*time.Second}})
	self := advertise(l.MasterAddr, port)
	data, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(cfg.DataPort)))
	if err != nil {
		n.shutdown()
		return nil, fmt.Errorf("cluster: rank %d's ring port %d (cluster.data_port): %w", l.Rank, cfg.DataPort, err)
	}
	hello.Rank, hello.Host, hello.PID = l.Rank, self, os.Getpid()
	hello.DataAddr = net.JoinHostPort(self, strconv.Itoa(data.Addr().(*net.TCPAddr).Port))
	var rv struct {
		RunID string  `json:"run_id"`
		Peers []Hello `json:"peers"`
	}
	deadline := time.Now().Add(cfg.Rendezvous)
	if err := n.wait(ctx, mRendezvous, rankParams{Rank: l.Rank, Hello: &hello}, &rv, deadline); err != nil {
		data.Close()
		n.shutdown()
		return nil, fmt.Errorf("cluster: rank %d joining the rendezvous at %s: %w", l.Rank, n.endpoint, err)
	}
	n.Peers, n.RunID = rv.Peers, rv.RunID
	addrs := make([]string, len(rv.Peers))
	for i, p := range rv.Peers {
		addrs[i] = p.DataAddr
	}
	// The heartbeat starts before the ring so that a rank stuck
	// connecting is still seen alive while its neighbours come up.
	go n.beat()
	n.Ring, err = ring.Dial(n.ctx, ring.Options{Rank: l.Rank, Addrs: addrs, Listener: data, RunID: rv.RunID, Timeout: cfg.Collective})
	if err != nil {
		n.Abort(err)
		n.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	fmt.Fprintf(log, "cluster: rank %d of %d joined run %s (ring through %s)\n", l.Rank, l.Size, rv.RunID, hello.DataAddr)
	return n, nil
}

// advertise is this host's address as rank 0 sees it: the local address
// of a route to rank 0 (no packet is sent), or the hostname.
func advertise(master string, port int) string {
	c, err := net.Dial("udp", net.JoinHostPort(master, strconv.Itoa(port)))
	if err == nil {
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).IP.String()
	}
	h, _ := os.Hostname()
	return h
}

// Rank and Size are this rank and the run's.
func (n *Node) Rank() int { return n.Launch.Rank }
func (n *Node) Size() int { return n.Launch.Size }

// Context ends when the run is aborted; its cause says why.
func (n *Node) Context() context.Context { return n.ctx }

// Server is rank 0's control endpoint (nil on other ranks).
func (n *Node) Server() *Server { return n.server }

// Report sets what the heartbeat tells rank 0: the step and the adapter
// version this rank's rollouts use.
func (n *Node) Report(step int, adapter string) {
	n.step.Store(int64(step))
	n.adapter.Store(adapter)
}

// beat sends a heartbeat every cluster.heartbeat; an abort in the answer,
// or rank 0 unreachable for cluster.timeout, ends the node's context.
func (n *Node) beat() {
	defer close(n.beatDone)
	t := time.NewTicker(n.cfg.Heartbeat)
	defer t.Stop()
	lastOK := time.Now()
	for {
		var out struct {
			Abort string `json:"abort"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Heartbeat+5*time.Second)
		err := n.rpc.CallFor(ctx, &out, mHeartbeat, rankParams{Rank: n.Launch.Rank, Step: int(n.step.Load()), Adapter: n.adapter.Load().(string)})
		cancel()
		switch {
		case err == nil && out.Abort != "":
			n.cancel(errors.New(out.Abort))
			return
		case err == nil:
			lastOK = time.Now()
		case time.Since(lastOK) > n.cfg.Timeout:
			n.cancel(fmt.Errorf("rank 0's control endpoint %s unreachable for %v: rank 0 died or its host is unreachable (cluster.timeout): %v", n.endpoint, time.Since(lastOK).Round(time.Second), err))
			return
		}
		select {
		case <-t.C:
		case <-n.stopBeat:
			return
		case <-n.ctx.Done():
			return
		}
	}
}

// wait calls a waiting method until it answers (not pending) into out,
// retrying while rank 0 is unreachable, until deadline.
func (n *Node) wait(ctx context.Context, method string, p rankParams, out any, deadline time.Time) error {
	var lastErr error
	for {
		if err := n.failure(ctx); err != nil {
			return err
		}
		resp, err := n.rpc.Call(ctx, method, p)
		switch {
		case err == nil && resp.Error != nil:
			err = errors.New(resp.Error.Message)
			if resp.Error.Code == codeAborted {
				n.cancel(err)
			}
			return err
		case err == nil:
			var pend pending
			if resp.GetObject(&pend) == nil && pend.Pending {
				if time.Now().After(deadline) {
					return fmt.Errorf("%s: still waiting after %v", method, time.Until(deadline).Abs().Round(time.Second))
				}
				continue
			}
			return resp.GetObject(out)
		}
		// No reply: rank 0 not up yet (the rendezvous), or gone.
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no reply from rank 0: %w", method, lastErr)
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
		case <-n.ctx.Done():
		}
	}
}

// failure is why waiting should stop: the caller gave up or the run
// aborted.
func (n *Node) failure(ctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if n.ctx.Err() != nil {
		return context.Cause(n.ctx)
	}
	return nil
}

// Gather hands rank 0 this rank's part of key (any JSON value) and returns
// every rank's, rank order, once all have given theirs. The wait is
// bounded by cluster.timeout's heartbeats, not by time: rollouts may take
// long, a dead rank is noticed by its silence.
func (n *Node) Gather(ctx context.Context, key string, part any) ([]json.RawMessage, error) {
	raw, err := json.Marshal(part)
	if err != nil {
		return nil, fmt.Errorf("gather %s: %w", key, err)
	}
	var out struct {
		Parts []json.RawMessage `json:"parts"`
	}
	if err := n.wait(ctx, mGather, rankParams{Rank: n.Launch.Rank, Key: key, Data: raw}, &out, time.Now().Add(100*365*24*time.Hour)); err != nil {
		return nil, fmt.Errorf("gather %s: %w", key, err)
	}
	if len(out.Parts) != n.Launch.Size {
		return nil, fmt.Errorf("gather %s: %d parts from a run of %d ranks", key, len(out.Parts), n.Launch.Size)
	}
	return out.Parts, nil
}

// Barrier returns once every rank has reached name.
func (n *Node) Barrier(ctx context.Context, name string) error {
	_, err := n.Gather(ctx, "barrier/"+name, nil)
	return err
}

// Engines are the rollout engines that hold adapter version, this rank's
// share first (Server.SetEngines on rank 0 says which hold it).
func (n *Node) Engines(ctx context.Context, version string) ([]Engine, error) {
	var out struct {
		Engines []Engine `json:"engines"`
	}
	if err := n.wait(ctx, mEngines, rankParams{Rank: n.Launch.Rank, Version: version}, &out, time.Now().Add(100*365*24*time.Hour)); err != nil {
		return nil, fmt.Errorf("engines holding %s: %w", version, err)
	}
	return out.Engines, nil
}

// Status is every rank as rank 0 last heard of it.
func (n *Node) Status(ctx context.Context) ([]RankStatus, error) {
	var out []RankStatus
	err := n.rpc.CallFor(ctx, &out, mStatus)
	return out, err
}

// Abort tells every rank that this one failed with err (best effort: the
// others also notice its silence).
func (n *Node) Abort(err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n.rpc.Call(ctx, mAbort, rankParams{Rank: n.Launch.Rank, Reason: err.Error()})
	n.cancel(err)
}

// Close leaves the run (so that this rank's silence is no longer taken
// for death) and closes the ring. On rank 0 it first waits, up to
// cluster.timeout, for the others to leave, since they call its endpoint
// to the end.
func (n *Node) Close() {
	n.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.rpc.Call(ctx, mLeave, rankParams{Rank: n.Launch.Rank})
		cancel()
		close(n.stopBeat)
		<-n.beatDone
		if n.server != nil {
			select {
			case <-n.server.Done():
			case <-time.After(n.cfg.Timeout):
			}
		}
		if n.Ring != nil {
			n.Ring.Close()
		}
		n.shutdown()
		n.cancel(errors.New("the rank left the run"))
	})
}

func (n *Node) shutdown() {
	if n.hs != nil {
		n.hs.Close()
	}
}
