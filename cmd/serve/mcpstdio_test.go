package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestStdioGuardAnswersBadLines: over stdio, each line that is not a
// JSON-RPC 2.0 message gets JSON-RPC's error for it, with its id where it
// has a usable one, and the session goes on: the requests after it are
// answered (the SDK's transport alone ends the session on the first).
func TestStdioGuardAnswersBadLines(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, stdioGuard(inR, outW)) }()
	replies := bufio.NewScanner(outR)
	send := func(line string) {
		t.Helper()
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	// reply reads the next line written, as JSON.
	reply := func() map[string]any {
		t.Helper()
		if !replies.Scan() {
			t.Fatalf("no reply: %v", replies.Err())
		}
		var m map[string]any
		if err := json.Unmarshal(replies.Bytes(), &m); err != nil {
			t.Fatalf("reply %q: %v", replies.Text(), err)
		}
		return m
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`)
	if r := reply(); r["id"] != 1.0 || r["result"] == nil {
		t.Fatalf("initialize: %v", r)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	for i, c := range []struct { // line 3+2i, each followed by a ping
		line string
		code float64
		id   any
		says string
	}{
		{"not json", -32700, nil, "Parse error"},
		{`{"id": 3, "method": "ping"}`, -32600, 3.0, `"jsonrpc" must be "2.0"`},
		{`{"jsonrpc":"2.0","id":"x"}`, -32600, "x", "neither a method nor a result"},
		{`5`, -32600, nil, "a JSON object"},
		{`[]`, -32600, nil, "an empty batch"},
		{`{"jsonrpc":"2.0","id":[1],"method":"ping"}`, -32600, nil, "id is a string or a number"},
	} {
		send(c.line)
		r := reply()
		e, _ := r["error"].(map[string]any)
		if e == nil || e["code"] != c.code || r["id"] != c.id || !strings.Contains(e["message"].(string), c.says) ||
			!strings.Contains(e["message"].(string), fmt.Sprintf("line %d:", 3+2*i)) {
			t.Errorf("%s: %v", c.line, r)
		}
		send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, 100+i))
		if r := reply(); r["id"] != float64(100+i) || r["error"] != nil {
			t.Fatalf("ping after %s: %v", c.line, r)
		}
	}
	inW.Close()
	select {
	case err := <-done:
		if err != nil && err != io.EOF {
			t.Fatalf("session end: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the session did not end with its input")
	}
}
