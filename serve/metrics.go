package serve

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/agemem/agemem/llm/native"
	"github.com/agemem/agemem/model/engine"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the server's Prometheus series (names follow Prometheus'
// conventions: base units, _total counters).
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	tokens    *prometheus.CounterVec
	toolCalls *prometheus.CounterVec
	batch     prometheus.Histogram
	refused   *prometheus.CounterVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agemem_http_requests_total",
		Help: "HTTP requests by route and status code."}, []string{"route", "code"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "agemem_http_request_duration_seconds",
		Help: "HTTP request latency by route.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 15)}, []string{"route"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agemem_tokens_total",
		Help: "Tokens of chat completions: prompt (summed over the agent loop's policy calls) and completion."}, []string{"kind"})
	m.toolCalls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agemem_tool_calls_total",
		Help: "Memory tool calls the policy made, by tool and outcome."}, []string{"tool", "ok"})
	m.batch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "agemem_decode_batch_sequences",
		Help: "Sequences per decoding step (continuous batching).", Buckets: prometheus.ExponentialBuckets(1, 2, 8)})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agemem_refused_total",
		Help: "Connections and requests refused by a limit, by the limit's config key."}, []string{"limit"})
	m.reg.MustRegister(m.requests, m.latency, m.tokens, m.toolCalls, m.batch, m.refused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "agemem_queue_depth", Help: "Requests waiting for an agent-loop slot."},
			func() float64 { return float64(s.admit.queued()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "agemem_active_requests", Help: "Agent loops running."},
			func() float64 { return float64(s.admit.active()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "agemem_sessions", Help: "Server-side sessions held."},
			s.sessionGauge),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "agemem_kv_cache_blocks", Help: "Blocks of the paged KV pool (serve.kv_budget; 0 without)."},
			func() float64 { return float64(s.kv().Blocks) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "agemem_kv_cache_peak_blocks", Help: "The most KV pool blocks held at once."},
			func() float64 { return float64(s.kv().Peak) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "agemem_kv_preempted_total", Help: "Sequences that gave their KV blocks back to be recomputed later."},
			func() float64 { return float64(s.kv().Preempted) }),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(route string, code int, seconds float64) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(route).Observe(seconds)
}

// sessionGauge is the sessions held; NaN while the state cannot be read.
func (s *Server) sessionGauge() float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, err := s.state.sessions(ctx)
	if err != nil {
		return math.NaN()
	}
	return float64(n)
}

// step records one decoding step of the scheduler.
func (m *metrics) step(seqs, _ int) { m.batch.Observe(float64(seqs)) }

// kv is the native backend's paged KV pool's figures (zeros without one).
func (s *Server) kv() engine.KVStats {
	if e, ok := s.be.(*native.Engine); ok {
		return e.Batching().KV()
	}
	return engine.KVStats{}
}
