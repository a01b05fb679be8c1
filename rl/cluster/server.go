package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// The control endpoint's JSON-RPC 2.0 methods. Calls that wait for other
// ranks (rendezvous, gather, engines) are long polls: the server answers
// {"pending": true} after a while and the client calls again, so no proxy
// or HTTP timeout sees a request open for minutes.
const (
	mRendezvous = "rendezvous" // {rank, hello} -> {run_id, peers}
	mGather     = "gather"     // {rank, key, data} -> {parts} (a barrier gathers nothing)
	mHeartbeat  = "heartbeat"  // {rank, step, adapter} -> {abort}
	mEngines    = "engines"    // {rank, version} -> {engines}: the engines the rank may use
	mAbort      = "abort"      // {rank, reason}: stop every rank
	mLeave      = "leave"      // {rank}: finished; silence is no longer death
	mStatus     = "status"     // -> every rank's last heartbeat
)

// JSON-RPC 2.0's error codes, and ours (-32000 to -32099 are the
// server's to define).
const (
	codeParse          = -32700
	codeInvalidRequest = -32600
	codeNoMethod       = -32601
	codeInvalidParams  = -32602
	codeAborted        = -32001
)

// poll is how long a waiting call is held before it answers pending.
var poll = 10 * time.Second

// Hello is what a rank tells the others at the rendezvous.
type Hello struct {
	Rank     int    `json:"rank"`
	Host     string `json:"host"`
	PID      int    `json:"pid"`
	DataAddr string `json:"data_addr"` // where it accepts its ring neighbour
	Device   string `json:"device"`
	// NCCLID is rank 0's ncclUniqueId (GPU runs): every rank passes it to
	// ncclCommInitRank.
	NCCLID []byte `json:"nccl_id,omitempty"`
}

func (h Hello) String() string { return fmt.Sprintf("rank %d (%s, pid %d)", h.Rank, h.Host, h.PID) }

// RankStatus is a rank as rank 0 last heard of it.
type RankStatus struct {
	Hello
	Step    int    `json:"step"`
	Adapter string `json:"adapter"`
	// SilentFor is the time since its last heartbeat.
	SilentFor time.Duration `json:"silent_for_ns"`
	Left      bool          `json:"left"`
}

// Engine is a rollout engine as the engines call hands it to a rank.
type Engine struct {
	URL string `json:"url"`
	// Preferred engines are the rank's own share; the others take its
	// rollouts when its own fail.
	Preferred bool `json:"preferred"`
}

// Server is rank 0's control endpoint.
type Server struct {
	size    int
	runID   string
	timeout time.Duration
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	hellos  []*Hello
	seen    []time.Time
	step    []int
	adapter []string
	left    []bool
	gathers map[string]*gathering
	engines map[string][]string // adapter version -> the engines that hold it
	aborted error
}

type gathering struct {
	parts   []json.RawMessage
	have    []bool
	fetched []bool
}

// NewServer is the control endpoint of a run of size ranks; a rank silent
// for timeout after the rendezvous aborts the run, as does a rendezvous
// not complete within rendezvous.
func NewServer(size int, runID string, timeout, rendezvous time.Duration) *Server {
	s := &Server{size: size, runID: runID, timeout: timeout, changed: make(chan struct{}),
		hellos: make([]*Hello, size), seen: make([]time.Time, size), step: make([]int, size),
		adapter: make([]string, size), left: make([]bool, size), gathers: map[string]*gathering{}, engines: map[string][]string{}}
	go s.watch(rendezvous)
	return s
}

// notify wakes every waiting call; mu held.
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Abort stops the run: every waiting and later call fails with err.
func (s *Server) Abort(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted == nil {
		s.aborted = err
		s.notify()
	}
}

// watch aborts the run when a rank falls silent, or the rendezvous does
// not complete in time.
func (s *Server) watch(rendezvous time.Duration) {
	start := time.Now()
	tick := time.NewTicker(min(s.timeout/4, time.Second))
	defer tick.Stop()
	for range tick.C {
		s.mu.Lock()
		if s.aborted != nil || s.allLeft() {
			s.mu.Unlock()
			return
		}
		var missing []string
		var dead error
		for r, h := range s.hellos {
			switch {
			case h == nil:
				missing = append(missing, fmt.Sprint(r))
			case !s.left[r] && time.Since(s.seen[r]) > s.timeout:
				dead = fmt.Errorf("%s sent no heartbeat for %v: it died or hangs (cluster.timeout)", h, time.Since(s.seen[r]).Round(time.Second))
			}
		}
		s.mu.Unlock()
		switch {
		case dead != nil:
			s.Abort(dead)
		case len(missing) > 0 && time.Since(start) > rendezvous:
			s.Abort(fmt.Errorf("rank(s) %s did not join within %v (cluster.rendezvous): were they launched, and can they reach rank 0?", strings.Join(missing, ", "), rendezvous))
		}
	}
}

func (s *Server) allLeft() bool {
	for _, l := range s.left {
		if !l {
			return false
		}
	}
	return true
}

// Done is closed once every rank has left (or the run aborted).
func (s *Server) Done() <-chan struct{} {
	out := make(chan struct{})
	go func() {
		for {
			s.mu.Lock()
			over, ch := s.allLeft() || s.aborted != nil, s.changed
			s.mu.Unlock()
			if over {
				close(out)
				return
			}
			<-ch
		}
	}()
	return out
}

// SetEngines records the engines that hold adapter version v (rank 0's
// fleet, after loading it): ranks waiting in the engines call get their
// share.
func (s *Server) SetEngines(version string, urls []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.engines[version] = slices.Clone(urls)
	s.notify()
}

// Status is every rank as rank 0 last heard of it.
func (s *Server) Status() []RankStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RankStatus, s.size)
	for r := range out {
		if h := s.hellos[r]; h != nil {
			out[r].Hello = *h
			out[r].SilentFor = time.Since(s.seen[r])
		}
		out[r].Rank, out[r].Step, out[r].Adapter, out[r].Left = r, s.step[r], s.adapter[r], s.left[r]
	}
	return out
}

// share is rank's engines: engine e is rank e mod N's when there are at
// least as many engines as ranks, else rank r uses engine r mod E; every
// other engine is a fallback, least-loaded first being the rank's choice.
func share(urls []string, rank, size int) []Engine {
	out := make([]Engine, len(urls))
	for e, u := range urls {
		pref := e%size == rank
		if len(urls) < size {
			pref = rank%len(urls) == e
		}
		out[e] = Engine{URL: u, Preferred: pref}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Preferred && !out[j].Preferred })
	return out
}

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Message }

// ServeHTTP serves JSON-RPC 2.0 (single requests and batches) on POST.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "the control endpoint takes JSON-RPC 2.0 requests by POST", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<30))
	if err != nil {
		return
	}
	type request struct {
		JSONRPC string          `json:"jsonrpc"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
		ID      json.RawMessage `json:"id"`
	}
	type response struct {
		JSONRPC string          `json:"jsonrpc"`
		Result  any             `json:"result,omitempty"`
		Error   *rpcError       `json:"error,omitempty"`
		ID      json.RawMessage `json:"id"`
	}
	answer := func(q request) response {
		out := response{JSONRPC: "2.0", ID: q.ID}
		if out.ID == nil {
			out.ID = json.RawMessage("null")
		}
		if q.JSONRPC != "2.0" || q.Method == "" {
			out.Error = &rpcError{codeInvalidRequest, `not a JSON-RPC 2.0 request (want "jsonrpc": "2.0" and a method)`}
			return out
		}
		res, err := s.call(r.Context(), q.Method, q.Params)
		if err != nil {
			var re *rpcError
			if !errors.As(err, &re) {
				re = &rpcError{codeInvalidParams, err.Error()}
			}
			out.Error = re
			return out
		}
		out.Result = res
		return out
	}
	w.Header().Set("Content-Type", "application/json")
	trimmed := strings.TrimSpace(string(body))
	if strings.HasPrefix(trimmed, "[") {
		var qs []request
		if err := json.Unmarshal(body, &qs); err != nil || len(qs) == 0 {
			json.NewEncoder(w).Encode(response{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: &rpcError{codeInvalidRequest, "an empty or unreadable batch"}})
			return
		}
		out := make([]response, len(qs))
		for i, q := range qs {
			out[i] = answer(q)
		}
		json.NewEncoder(w).Encode(out)
		return
	}
	var q request
	if err := json.Unmarshal(body, &q); err != nil {
		json.NewEncoder(w).Encode(response{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: &rpcError{codeParse, "parse error: " + err.Error()}})
		return
	}
	json.NewEncoder(w).Encode(answer(q))
}

type rankParams struct {
	Rank    int             `json:"rank"`
	Hello   *Hello          `json:"hello,omitempty"`
	Key     string          `json:"key,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	Step    int             `json:"step,omitempty"`
	Adapter string          `json:"adapter,omitempty"`
	Version string          `json:"version,omitempty"`
	Reason  string          `json:"reason,omitempty"`
}

type pending struct {
	Pending bool `json:"pending"`
}

// call runs one method; waiting ones hold at most poll.
func (s *Server) call(ctx context.Context, method string, raw json.RawMessage) (any, error) {
	known := map[string]bool{mRendezvous: true, mGather: true, mHeartbeat: true, mEngines: true, mAbort: true, mLeave: true, mStatus: true}
	if !known[method] {
		return nil, &rpcError{codeNoMethod, fmt.Sprintf("no method %q (the control endpoint has rendezvous, gather, heartbeat, engines, abort, leave, status)", method)}
	}
	var p rankParams
	if method != mStatus {
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, &rpcError{codeInvalidParams, fmt.Sprintf("%s: params: %v", method, err)}
		}
		if p.Rank < 0 || p.Rank >= s.size {
			return nil, &rpcError{codeInvalidParams, fmt.Sprintf("%s: rank %d of a run of %d", method, p.Rank, s.size)}
		}
	}
	switch method {
	case mRendezvous:
		return s.rendezvous(ctx, p)
	case mGather:
		return s.gather(ctx, p)
	case mHeartbeat:
		s.mu.Lock()
		defer s.mu.Unlock()
		s.seen[p.Rank], s.step[p.Rank], s.adapter[p.Rank] = time.Now(), p.Step, p.Adapter
		var msg string
		if s.aborted != nil {
			msg = s.aborted.Error()
		}
		return map[string]string{"abort": msg}, nil
	case mEngines:
		return s.waitFor(ctx, func() (any, bool) {
			urls, ok := s.engines[p.Version]
			if !ok {
				return nil, false
			}
			return map[string][]Engine{"engines": share(urls, p.Rank, s.size)}, true
		})
	case mAbort:
		s.Abort(fmt.Errorf("rank %d failed: %s", p.Rank, p.Reason))
		return map[string]bool{"ok": true}, nil
	case mLeave:
		s.mu.Lock()
		defer s.mu.Unlock()
		s.left[p.Rank] = true
		s.notify()
		return map[string]bool{"ok": true}, nil
	}
	return s.Status(), nil
}

// waitFor holds until ready says so, the run aborts, or poll passes.
func (s *Server) waitFor(ctx context.Context, ready func() (any, bool)) (any, error) {
	t := time.NewTimer(poll)
	defer t.Stop()
	for {
		s.mu.Lock()
		if s.aborted != nil {
			err := s.aborted
			s.mu.Unlock()
			return nil, &rpcError{codeAborted, err.Error()}
		}
		res, ok := ready()
		ch := s.changed
		s.mu.Unlock()
		if ok {
			return res, nil
		}
		select {
		case <-ch:
		case <-t.C:
			return pending{true}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *Server) rendezvous(ctx context.Context, p rankParams) (any, error) {
	if p.Hello == nil {
		return nil, fmt.Errorf("rendezvous: no hello")
	}
	s.mu.Lock()
	if h := s.hellos[p.Rank]; h != nil && (h.Host != p.Hello.Host || h.PID != p.Hello.PID) {
		s.mu.Unlock()
		return nil, fmt.Errorf("rendezvous: rank %d already joined as %s: two processes were launched with rank %d", p.Rank, h, p.Rank)
	}
	h := *p.Hello
	h.Rank = p.Rank
	s.hellos[p.Rank], s.seen[p.Rank] = &h, time.Now()
	s.notify()
	s.mu.Unlock()
	return s.waitFor(ctx, func() (any, bool) {
		peers := make([]Hello, s.size)
		for r, h := range s.hellos {
			if h == nil {
				return nil, false
			}
			peers[r] = *h
		}
		return map[string]any{"run_id": s.runID, "peers": peers}, true
	})
}

// gather stores the rank's part of key and answers every part once all
// ranks gave theirs; the entry goes once every rank has its answer.
func (s *Server) gather(ctx context.Context, p rankParams) (any, error) {
	if p.Key == "" {
		return nil, fmt.Errorf("gather: no key")
	}
	s.mu.Lock()
	g := s.gathers[p.Key]
	if g == nil {
		g = &gathering{parts: make([]json.RawMessage, s.size), have: make([]bool, s.size), fetched: make([]bool, s.size)}
		s.gathers[p.Key] = g
	}
	if !g.have[p.Rank] {
		g.parts[p.Rank], g.have[p.Rank] = p.Data, true
		s.notify()
	}
	s.mu.Unlock()
	return s.waitFor(ctx, func() (any, bool) {
		for _, h := range g.have {
			if !h {
				return nil, false
			}
		}
		g.fetched[p.Rank] = true
		if !slices.Contains(g.fetched, false) {
			delete(s.gathers, p.Key)
		}
		return map[string][]json.RawMessage{"parts": g.parts}, true
	})
}
