package serve

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/agemem/agemem/console"
	"github.com/agemem/agemem/memtools/ltm"
)

// HTTPStatus lets the console show an API error with its status.
func (e *apiError) HTTPStatus() int { return e.Status }

// consoleError is aerr as an error (nil stays nil: a nil *apiError in an
// error interface would not be).
func consoleError(aerr *apiError) error {
	if aerr == nil {
		return nil
	}
	return aerr
}

// mountConsole serves the console at /ui: logins by the server's API keys,
// the memory pages on the memory API's operations, the conversation pages
// on the journal, the health page on the metrics, and the training runs of
// serve.console.runs.
func (s *Server) mountConsole(mux *http.ServeMux) error {
	o := console.Options{Config: s.cfg.Console, Open: console.Principal(s.keys.open), Memories: consoleMemories{s},
		Conversations: s.journal, Health: s.healthFigures, Logger: s.log}
	if len(s.keys.keys) > 0 {
		o.Login = func(key string) (console.Principal, bool) {
			p, aerr := s.keys.lookup(key)
			return console.Principal(p), aerr == nil
		}
	}
	c, err := console.New(o)
	if err != nil {
		return err
	}
	// A console request acts as its login's principal: the audit trail
	// names the key as the API's does.
	mux.Handle("/ui/", c) // console.Prefix, written out for the OpenAPI test
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	return nil
}

// consoleMemories are the console's memory operations: the memory API's.
type consoleMemories struct{ s *Server }

func as(ctx context.Context, by console.Principal) context.Context {
	return withPrincipal(ctx, principal(by))
}

func (m consoleMemories) Page(ctx context.Context, ns string, offset, limit int) ([]ltm.Entry, int, error) {
	st, aerr := m.s.openStore(ns)
	if aerr != nil {
		return nil, 0, aerr
	}
	es, n, err := m.s.lists.page(ctx, st, ns, offset, limit)
	if err != nil {
		return nil, 0, m.s.storeError(err)
	}
	return es, n, nil
}

func (m consoleMemories) Search(ctx context.Context, ns, query string, topK int) ([]ltm.Scored, error) {
	hits, aerr := m.s.searchEntries(ctx, ns, memorySearch{Query: query, TopK: min(topK, m.s.tools.MaxTopK)})
	return hits, consoleError(aerr)
}

func (m consoleMemories) Get(ctx context.Context, ns, id string) (ltm.Entry, error) {
	st, aerr := m.s.openStore(ns)
	if aerr == nil {
		aerr = checkID(id)
	}
	if aerr != nil {
		return ltm.Entry{}, aerr
	}
	e, err := st.Get(ctx, id)
	if err != nil {
		return ltm.Entry{}, m.s.storeError(err)
	}
	e.Embedding = nil
	return e, nil
}

func (m consoleMemories) Add(ctx context.Context, by console.Principal, ns string, w console.Write) (ltm.Entry, error) {
	e, aerr := m.s.addEntry(as(ctx, by), ns, "console", memoryWrite{Content: w.Content, Metadata: w.Metadata, MemoryType: w.MemoryType})
	return e, consoleError(aerr)
}

func (m consoleMemories) Update(ctx context.Context, by console.Principal, ns, id string, w console.Write) (ltm.Entry, error) {
	e, aerr := m.s.updateEntry(as(ctx, by), ns, id, "console", memoryWrite{Content: w.Content, Metadata: w.Metadata})
	return e, consoleError(aerr)
}

func (m consoleMemories) Delete(ctx context.Context, by console.Principal, ns, id string) error {
	return consoleError(m.s.deleteEntry(as(ctx, by), ns, id, "console"))
}

func (m consoleMemories) Export(ctx context.Context, ns string, w io.Writer) error {
	st, aerr := m.s.openStore(ns)
	if aerr != nil {
		return aerr
	}
	all, err := st.List(ctx)
	if err != nil {
		return m.s.storeError(err)
	}
	return ltm.WriteJSONL(w, all)
}

func (m consoleMemories) Namespaces(ctx context.Context) ([]string, error) {
	ns, err := m.s.db.Namespaces(ctx)
	if err != nil {
		return nil, m.s.storeError(err)
	}
	return ns, nil
}

// healthFigures are the figures a person checks first, read from the
// server's Prometheus registry (the numbers /metrics serves).
func (s *Server) healthFigures() []console.Figure {
	fams, _ := s.metrics.reg.Gather()
	by := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		by[f.GetName()] = f
	}
	// sum adds a family's samples whose labels pass keep (nil: all).
	sum := func(name string, keep func(map[string]string) bool) float64 {
		f := by[name]
		if f == nil {
			return 0
		}
		total := 0.0
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if keep != nil && !keep(labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				total += m.GetCounter().GetValue()
			case m.Gauge != nil:
				total += m.GetGauge().GetValue()
			}
		}
		return total
	}
	code := func(prefix string) func(map[string]string) bool {
		return func(l map[string]string) bool { return strings.HasPrefix(l["code"], prefix) }
	}
	num := func(v float64) string {
		if v == math.Trunc(v) && math.Abs(v) < 1e15 {
			return fmt.Sprintf("%.0f", v)
		}
		return fmt.Sprintf("%.3g", v)
	}
	mean := func(name string, keep func(map[string]string) bool) (float64, uint64) {
		f := by[name]
		if f == nil {
			return 0, 0
		}
		var s float64
		var n uint64
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if h := m.GetHistogram(); h != nil && (keep == nil || keep(labels)) {
				s += h.GetSampleSum()
				n += h.GetSampleCount()
			}
		}
		if n == 0 {
			return 0, 0
		}
		return s / float64(n), n
	}
	chatMean, chats := mean("agemem_http_request_duration_seconds", func(l map[string]string) bool { return l["route"] == "POST /v1/chat/completions" })
	batchMean, decodeSteps := mean("agemem_decode_batch_sequences", nil)
	refused := map[string]float64{}
	if f := by["agemem_refused_total"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				refused[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	var refusedBy []string
	for k, v := range refused {
		refusedBy = append(refusedBy, fmt.Sprintf("%s %s", k, num(v)))
	}
	sort.Strings(refusedBy)
	fig := func(name, value, help string) console.Figure {
		return console.Figure{Name: name, Value: value, Help: help}
	}
	if len(refusedBy) == 0 {
		refusedBy = []string{"none"}
	}
	return []console.Figure{
		fig("uptime", time.Since(time.Unix(s.created, 0)).Round(time.Second).String(), "since the server started"),
		fig("ready", fmt.Sprint(s.ready.Load()), "whether /readyz answers ready"),
		fig("requests", num(sum("agemem_http_requests_total", nil)), "HTTP requests answered, every route"),
		fig("server errors (5xx)", num(sum("agemem_http_requests_total", code("5"))), "requests the server failed"),
		fig("client errors (4xx)", num(sum("agemem_http_requests_total", code("4"))), "requests refused as invalid, unauthorised or over a limit"),
		fig("chat completions", fmt.Sprint(chats), "POST /v1/chat/completions answered"),
		fig("chat latency (mean)", fmt.Sprintf("%.3f s", chatMean), "a chat completion's mean duration, agent loop included"),
		fig("active agent loops", num(sum("agemem_active_requests", nil)), fmt.Sprintf("running now (serve.max_concurrent %d)", s.cfg.MaxConcurrent)),
		fig("queue", num(sum("agemem_queue_depth", nil)), fmt.Sprintf("requests waiting for a slot (serve.max_queue %d)", s.cfg.MaxQueue)),
		fig("sessions", num(sum("agemem_sessions", nil)), fmt.Sprintf("server-side sessions held (serve.max_sessions %d)", s.cfg.MaxSessions)),
		fig("decode batch (mean)", fmt.Sprintf("%.2f", batchMean), fmt.Sprintf("sequences per decoding step over %d steps (serve.max_batch %d)", decodeSteps, s.cfg.MaxBatch)),
		fig("KV blocks in use", num(sum("agemem_kv_cache_blocks", nil)), "blocks of the paged KV pool held now (serve.kv_budget; 0 without)"),
		fig("KV blocks peak", num(sum("agemem_kv_cache_peak_blocks", nil)), "the most held at once"),
		fig("KV preemptions", num(sum("agemem_kv_preempted_total", nil)), "sequences that gave their blocks back to be recomputed"),
		fig("tokens", fmt.Sprintf("%s prompt, %s completion", num(sum("agemem_tokens_total", func(l map[string]string) bool { return l["kind"] == "prompt" })),
			num(sum("agemem_tokens_total", func(l map[string]string) bool { return l["kind"] == "completion" }))), "over every policy call of the agent loop"),
		fig("tool calls", fmt.Sprintf("%s ok, %s failed", num(sum("agemem_tool_calls_total", func(l map[string]string) bool { return l["ok"] == "true" })),
			num(sum("agemem_tool_calls_total", func(l map[string]string) bool { return l["ok"] == "false" }))), "memory tools the policy called"),
		fig("refused", strings.Join(refusedBy, ", "), "connections and requests refused, by the limit's config key"),
		fig("goroutines", num(sum("go_goroutines", nil)), "Go runtime"),
		fig("resident memory", fmt.Sprintf("%.0f MiB", sum("process_resident_memory_bytes", nil)/(1<<20)), "the process's RSS"),
	}
}
