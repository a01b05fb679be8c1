package serve

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/agemem/agemem/memtools/ltm"
)

// An MCP client's open stream (the SDK client holds a GET open for what
// the server sends unasked) does not hold shutdown to its timeout: Serve
// ends it and returns promptly.
func TestShutdownEndsMCPStreams(t *testing.T) {
	c := testConfig(t)
	c.Serve.ShutdownTimeout = 30 * time.Second
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store = newScripted(), db }))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	cs, err := mcpSession(t, "http://"+ln.Addr().String(), aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the client's GET stream is open
	start := time.Now()
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Serve returned %v after shutdown began", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still waiting on the MCP stream 10 s into a 30 s shutdown timeout")
	}
}
