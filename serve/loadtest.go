package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// LoadOptions shape a load test: Clients concurrent clients, each sending
// chat completions back to back (cycling through Prompts) until Duration
// has passed; requests in flight then finish and are counted.
type LoadOptions struct {
	URL         string // the server's base URL
	Key         string
	Model       string
	Clients     int
	Duration    time.Duration
	Prompts     []string
	MaxTokens   int     // 0: the server's default
	Temperature float64 // sent with every request
}

// LoadReport is what a load test measured. Errors counts every request that
// did not get 200, by status ("transport" for connection failures).
type LoadReport struct {
	Clients          int
	Seconds          float64
	Requests, OK     int
	Errors           map[string]int
	CompletionTokens int
	PromptTokens     int
	P50, P90, P99    time.Duration
}

// RPS is successful requests per second.
func (r LoadReport) RPS() float64 { return float64(r.OK) / r.Seconds }

// TokensPerSecond is generated (completion) tokens per second.
func (r LoadReport) TokensPerSecond() float64 { return float64(r.CompletionTokens) / r.Seconds }

func (r LoadReport) String() string {
	var errs []string
	for k, v := range r.Errors {
		errs = append(errs, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(errs)
	e := "0"
	if len(errs) > 0 {
		e = strings.Join(errs, ", ")
	}
	return fmt.Sprintf("%d clients, %.1f s: %d requests, %.2f req/s, %.0f completion tokens/s (%.0f prompt tokens/s), latency p50 %s p90 %s p99 %s, errors %s",
		r.Clients, r.Seconds, r.Requests, r.RPS(), r.TokensPerSecond(), float64(r.PromptTokens)/r.Seconds,
		r.P50.Round(time.Millisecond), r.P90.Round(time.Millisecond), r.P99.Round(time.Millisecond), e)
}

// LoadTest runs the test and reports; it fails only if it cannot run.
func LoadTest(ctx context.Context, o LoadOptions) (LoadReport, error) {
	if o.Clients < 1 || o.Duration <= 0 || len(o.Prompts) == 0 {
		return LoadReport{}, fmt.Errorf("load test: need clients ≥ 1, a positive duration and at least one prompt")
	}
	if o.Model == "" {
		o.Model = "agemem"
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: o.Clients, MaxIdleConnsPerHost: o.Clients}}
	defer client.CloseIdleConnections()
	url := strings.TrimSuffix(o.URL, "/") + "/v1/chat/completions"
	rep := LoadReport{Clients: o.Clients, Errors: map[string]int{}}
	var mu sync.Mutex
	var lat []time.Duration
	start := time.Now()
	deadline := start.Add(o.Duration)
	var wg sync.WaitGroup
	for c := range o.Clients {
		wg.Go(func() {
			for i := c; time.Now().Before(deadline) && ctx.Err() == nil; i += o.Clients {
				body := map[string]any{"model": o.Model, "temperature": o.Temperature,
					"messages": []map[string]string{{"role": "user", "content": o.Prompts[i%len(o.Prompts)]}}}
				if o.MaxTokens > 0 {
					body["max_tokens"] = o.MaxTokens
				}
				raw, _ := json.Marshal(body)
				req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(raw))
				req.Header.Set("Content-Type", "application/json")
				if o.Key != "" {
					req.Header.Set("Authorization", "Bearer "+o.Key)
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				var out struct {
					Usage usage `json:"usage"`
				}
				status := "transport"
				if err == nil {
					status = fmt.Sprint(resp.StatusCode)
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					json.Unmarshal(b, &out)
				}
				d := time.Since(t0)
				mu.Lock()
				rep.Requests++
				if status == "200" {
					rep.OK++
					lat = append(lat, d)
					rep.CompletionTokens += out.Usage.CompletionTokens
					rep.PromptTokens += out.Usage.PromptTokens
				} else {
					rep.Errors[status]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	rep.Seconds = time.Since(start).Seconds()
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	rep.P50, rep.P90, rep.P99 = q(0.50), q(0.90), q(0.99)
	return rep, nil
}
