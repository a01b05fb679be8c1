package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioGuard is the MCP stdio transport with one change: a line that is not
// a JSON-RPC 2.0 message is answered with JSON-RPC's error for it (-32700
// Parse error, -32600 Invalid Request; id null unless the line has a usable
// id) and dropped, where the SDK's transport ends the whole session on it.
// A client's one bad line should cost it that line, not its memory server.
// Only messages that pass reach the SDK, whose own write of each message is
// one call on the shared writer, so answers never interleave.
func stdioGuard(in io.Reader, out io.Writer) *mcp.IOTransport {
	w := &lockedWriter{w: out}
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), mcp.DefaultMaxLineLength)
		n := 0
		for sc.Scan() {
			n++
			line := bytes.TrimSpace(sc.Bytes())
			if len(line) == 0 {
				continue
			}
			if code, msg, id := checkMessage(line); code != 0 {
				reply, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id,
					"error": map[string]any{"code": code, "message": fmt.Sprintf("line %d: %s", n, msg)}})
				w.Write(append(reply, '\n'))
				continue
			}
			if _, err := pw.Write(append(line, '\n')); err != nil {
				return // the session ended
			}
		}
		err := sc.Err()
		if err == bufio.ErrTooLong {
			err = fmt.Errorf("line %d is longer than %d bytes", n+1, mcp.DefaultMaxLineLength)
		}
		pw.CloseWithError(err) // nil: end of input, the session's end
	}()
	return &mcp.IOTransport{Reader: pr, Writer: w}
}

// checkMessage returns 0 for a line the SDK may read (a JSON-RPC 2.0
// message, or a non-empty batch of them), else the JSON-RPC error code, its
// reason and the id to answer with.
func checkMessage(line []byte) (code int, msg string, id any) {
	if !json.Valid(line) {
		return -32700, "Parse error: not JSON", nil
	}
	var batch []json.RawMessage
	if json.Unmarshal(line, &batch) == nil {
		if len(batch) == 0 {
			return -32600, "Invalid Request: an empty batch", nil
		}
		for _, m := range batch {
			if code, msg, id := checkOne(m); code != 0 {
				return code, msg, id
			}
		}
		return 0, "", nil
	}
	return checkOne(line)
}

func checkOne(raw []byte) (code int, msg string, id any) {
	var m struct {
		Version string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  *string         `json:"method"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return -32600, "Invalid Request: a message is a JSON object", nil
	}
	var idv any
	if len(m.ID) > 0 {
		if json.Unmarshal(m.ID, &idv) != nil {
			idv = nil
		}
		switch idv.(type) {
		case string, float64, nil:
		default:
			return -32600, "Invalid Request: id is a string or a number", nil
		}
	}
	switch {
	case m.Version != "2.0":
		return -32600, `Invalid Request: "jsonrpc" must be "2.0"`, idv
	case m.Method == nil && m.Result == nil && m.Error == nil:
		return -32600, "Invalid Request: neither a method nor a result", idv
	}
	return 0, "", nil
}

// lockedWriter serialises whole writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Close leaves w open: stdout outlives the session.
func (l *lockedWriter) Close() error { return nil }
