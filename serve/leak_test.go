package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"testing"
	"time"
)

// goroutines is the count once the runtime settles (handlers that just
// returned may still be unwinding).
func goroutines(want int) int {
	n := runtime.NumGoroutine()
	for i := 0; i < 100 && n > want; i++ {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}

// TestNoGoroutineOutlivesItsRequest: every failure path of streamed and
// plain chat (a model that breaks the format, bad requests, unknown model,
// a missing key) leaves no goroutine behind.
func TestNoGoroutineOutlivesItsRequest(t *testing.T) {
	ts := start(t, testConfig(t), newScripted())
	// Warm up: the first requests start the server's own long-lived
	// goroutines (connections, the HTTP client's pool).
	for range 3 {
		do(t, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody("", "Break", "stream", true))
	}
	before := goroutines(0)
	cases := []struct {
		name string
		key  string
		body any
	}{
		{"broken format, streamed", aliceKey, chatBody("", "Break", "stream", true)},
		{"broken format", aliceKey, chatBody("", "Break")},
		{"bad json, streamed", aliceKey, `{"model": "agemem", "stream": true, "messages": [`},
		{"unknown model, streamed", aliceKey, map[string]any{"model": "nope", "stream": true, "messages": []map[string]any{{"role": "user", "content": "hi"}}}},
		{"no key, streamed", "", chatBody("", "hi", "stream", true)},
	}
	// The client goes away while the model is still working: the request
	// ("Wait" blocks until the client's context ends) must clean up too.
	gone := func(stream bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		raw, _ := json.Marshal(chatBody("", "Wait", "stream", stream))
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/chat/completions", bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	for _, stream := range []bool{true, false} {
		for range 20 {
			gone(stream)
		}
		if after := goroutines(before); after > before+2 {
			t.Fatalf("client gone (stream %v): %d goroutines after 20 requests, %d before", stream, after, before)
		}
	}
	for _, c := range cases {
		for range 40 {
			do(t, "POST", ts.URL+"/v1/chat/completions", c.key, c.body)
		}
		if after := goroutines(before); after > before+2 {
			t.Fatalf("%s: %d goroutines after 40 requests, %d before", c.name, after, before)
		}
	}
}
