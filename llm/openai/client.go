package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Client talks to one server. It is safe for concurrent use.
type Client struct {
	base, key string
	cfg       Config
	hc        *http.Client
}

// New is a client of c.BaseURL sending key (if not empty) as a bearer
// token; hc nil is a client without an overall timeout (c.Timeout bounds
// each attempt).
func New(c Config, key string, hc *http.Client) (*Client, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("openai: %w", err)
	}
	if hc == nil {
		hc = &http.Client{}
	}
	return &Client{base: strings.TrimSuffix(c.BaseURL, "/"), key: key, cfg: c, hc: hc}, nil
}

// BaseURL is the server's API root.
func (c *Client) BaseURL() string { return c.base }

// WireMessage is a chat message as the protocol has it.
type WireMessage struct {
	Role       string         `json:"role"`
	Content    string         `json:"content"`
	ToolCalls  []WireToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	Name       string         `json:"name,omitempty"`
}

// WireToolCall is one function call of an assistant message; Arguments is the
// JSON text the model wrote (it may not parse: the caller decides).
type WireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// WireTool is a function the model may call, its parameters a JSON Schema.
type WireTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string `json:"name"`
		Description string `json:"description,omitempty"`
		Parameters  any    `json:"parameters"`
	} `json:"function"`
}

// ChatRequest is the subset of the request this toolkit sends.
type ChatRequest struct {
	Model       string        `json:"model"`
	Messages    []WireMessage `json:"messages"`
	Tools       []WireTool    `json:"tools,omitempty"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
	Temperature *float64      `json:"temperature,omitempty"`
	TopP        *float64      `json:"top_p,omitempty"`
	Seed        *int64        `json:"seed,omitempty"`
	Stream      bool          `json:"stream,omitempty"`
	// StreamOptions asks a streaming server for the usage at the end.
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options,omitempty"`
}

// Usage counts tokens as the server does.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// ChatResponse is the first choice of a completion, streamed or not.
type ChatResponse struct {
	Message      WireMessage
	FinishReason string
	Usage        Usage
}

// Error is a request the server refused or that failed for good. Its text
// names the server, the model and what to do.
type Error struct {
	Server, Model string
	Status        int // 0: no HTTP reply (connection, timeout)
	Attempts      int
	Message       string
}

func (e *Error) Error() string {
	what := fmt.Sprintf("status %d", e.Status)
	if e.Status == 0 {
		what = "no reply"
	}
	s := "openai server " + e.Server
	if e.Model != "" {
		s += fmt.Sprintf(", model %q", e.Model)
	}
	s += fmt.Sprintf(": %s after %d attempt(s): %s", what, e.Attempts, e.Message)
	switch {
	case e.Status == 401 || e.Status == 403:
		s += " (check the API key in the variable openai.api_key_env names)"
	case e.Status == 404:
		s += " (check openai.base_url, which should end in /v1, and that the server serves the model)"
	case e.Status == 429:
		s += " (the server's rate limit: lower the concurrency or raise openai.max_retries)"
	case e.Status == 0 || e.Status >= 500:
		s += " (is the server up and reachable? openai.timeout bounds each attempt)"
	}
	return s
}

// retryable: rate limits, server errors and failures without a reply.
func retryable(status int) bool { return status == 0 || status == 429 || status >= 500 }

// post sends body to path, retrying as Config says, and returns the 200
// reply (the caller closes its body and cancels its context after reading).
func (c *Client) post(ctx context.Context, path, model string, body any) (*http.Response, context.CancelFunc, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	fail := &Error{Server: c.base, Model: model}
	for attempt := 0; ; attempt++ {
		fail.Attempts = attempt + 1
		actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		req, err := http.NewRequestWithContext(actx, "POST", c.base+path, bytes.NewReader(raw))
		if err != nil {
			cancel()
			return nil, nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := c.hc.Do(req)
		var wait time.Duration
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			fail.Status, fail.Message = 0, err.Error()
			if errors.Is(err, context.DeadlineExceeded) {
				fail.Message = fmt.Sprintf("no reply within openai.timeout (%v)", c.cfg.Timeout)
			}
		} else if resp.StatusCode == http.StatusOK {
			return resp, cancel, nil
		} else {
			fail.Status, fail.Message = resp.StatusCode, errorMessage(resp.Body)
			wait = retryAfter(resp.Header.Get("Retry-After"))
			resp.Body.Close()
			cancel()
		}
		if !retryable(fail.Status) || attempt >= c.cfg.MaxRetries {
			return nil, nil, fail
		}
		if wait == 0 {
			// Exponential backoff with jitter: 1×, 2×, 4×… of RetryBackoff.
			wait = c.cfg.RetryBackoff << attempt
			wait += time.Duration(rand.Int64N(int64(wait)/2 + 1))
		}
		select {
		case <-time.After(min(wait, time.Minute)):
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// errorMessage is the message of an OpenAI-shaped error body, or the body.
func errorMessage(r io.Reader) string {
	raw, _ := io.ReadAll(io.LimitReader(r, 64<<10))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	if s := strings.TrimSpace(string(raw)); s != "" {
		return s
	}
	return "(empty body)"
}

// retryAfter reads Retry-After: seconds or an HTTP date; 0 if absent.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// Chat runs a completion. With onDelta set the reply is streamed and
// onDelta gets the content so far after every piece.
func (c *Client) Chat(ctx context.Context, req ChatRequest, onDelta func(content string)) (ChatResponse, error) {
	req.Stream = onDelta != nil
	if req.Stream {
		req.StreamOptions = &struct {
			IncludeUsage bool `json:"include_usage"`
		}{true}
	}
	resp, cancel, err := c.post(ctx, "/chat/completions", req.Model, req)
	if err != nil {
		return ChatResponse{}, err
	}
	defer cancel()
	defer resp.Body.Close()
	bad := func(format string, args ...any) error {
		return &Error{Server: c.base, Model: req.Model, Status: 200, Attempts: 1, Message: "unreadable reply: " + fmt.Sprintf(format, args...)}
	}
	if !req.Stream {
		var r struct {
			Choices []struct {
				Message      WireMessage `json:"message"`
				FinishReason string      `json:"finish_reason"`
			} `json:"choices"`
			Usage Usage `json:"usage"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&r); err != nil {
			return ChatResponse{}, bad("%v", err)
		}
		if len(r.Choices) == 0 {
			return ChatResponse{}, bad("no choices")
		}
		return ChatResponse{Message: r.Choices[0].Message, FinishReason: r.Choices[0].FinishReason, Usage: r.Usage}, nil
	}
	return readStream(resp.Body, onDelta, bad)
}

// readStream assembles a streamed completion: content pieces in order,
// tool calls from their pieces by index, the finish reason and the usage.
func readStream(body io.Reader, onDelta func(string), bad func(string, ...any) error) (ChatResponse, error) {
	var out ChatResponse
	out.Message.Role = "assistant"
	var content strings.Builder
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	done := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue // comments, event names, blank separators
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content   string `json:"content"`
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *Usage `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return out, bad("a stream event is not JSON: %v", err)
		}
		if chunk.Error != nil {
			return out, bad("the server failed mid-stream: %s", chunk.Error.Message)
		}
		if chunk.Usage != nil {
			out.Usage = *chunk.Usage
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content != "" {
				content.WriteString(ch.Delta.Content)
				onDelta(content.String())
			}
			for _, tc := range ch.Delta.ToolCalls {
				if tc.Index < 0 || tc.Index > 1024 {
					return out, bad("tool call index %d", tc.Index)
				}
				for len(out.Message.ToolCalls) <= tc.Index {
					out.Message.ToolCalls = append(out.Message.ToolCalls, WireToolCall{Type: "function"})
				}
				t := &out.Message.ToolCalls[tc.Index]
				if tc.ID != "" {
					t.ID = tc.ID
				}
				t.Function.Name += tc.Function.Name
				t.Function.Arguments += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				out.FinishReason = *ch.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		return out, bad("the stream broke off: %v", err)
	}
	if !done && out.FinishReason == "" {
		return out, bad("the stream ended without a finish reason or [DONE]")
	}
	out.Message.Content = content.String()
	return out, nil
}

// Embeddings embeds texts with model, in order.
func (c *Client) Embeddings(ctx context.Context, model string, texts []string) ([][]float32, error) {
	resp, cancel, err := c.post(ctx, "/embeddings", model, map[string]any{"model": model, "input": texts})
	if err != nil {
		return nil, err
	}
	defer cancel()
	defer resp.Body.Close()
	var r struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(&r); err != nil {
		return nil, &Error{Server: c.base, Model: model, Status: 200, Attempts: 1, Message: "unreadable embeddings: " + err.Error()}
	}
	out := make([][]float32, len(texts))
	for _, d := range r.Data {
		if d.Index < 0 || d.Index >= len(out) || out[d.Index] != nil {
			return nil, &Error{Server: c.base, Model: model, Status: 200, Attempts: 1, Message: fmt.Sprintf("embedding index %d for %d texts", d.Index, len(texts))}
		}
		out[d.Index] = d.Embedding
	}
	for i, v := range out {
		if len(v) == 0 {
			return nil, &Error{Server: c.base, Model: model, Status: 200, Attempts: 1, Message: fmt.Sprintf("no embedding for text %d of %d", i, len(texts))}
		}
	}
	return out, nil
}
