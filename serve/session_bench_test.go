package serve

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/memtools/ltm"
)

// BenchmarkServeSession: one conversation of 12 turns, each request
// resending every earlier turn (as OpenAI clients do), against the native
// backend on a random tiny Qwen3, with the prefix cache (serve.prefix_cache)
// and without it: the later turns' latency, which without the cache grows
// with the whole conversation's prefill.
func BenchmarkServeSession(b *testing.B) {
	pol := randomPolicy(b)
	words := strings.Fields("the river flows through the old town where the band was formed and the painter was born in a year nobody remembers")
	latency := func(cache int) time.Duration {
		c := testConfig(b)
		c.Agent.MaxSteps = 2
		c.Serve.PrefixCache = cache
		db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		s, err := New(with(c.options(), func(o *Options) { o.Native, o.Store = pol, db }))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		ts := newHTTPTest(s)
		defer ts.Close()
		var msgs []map[string]any
		var late time.Duration
		const turns, counted = 12, 4
		for turn := range turns {
			user := fmt.Sprintf("Turn %d: %s.", turn, strings.Join(words[turn%5:], " "))
			msgs = append(msgs, map[string]any{"role": "user", "content": user})
			t0 := time.Now()
			r := do(b, "POST", ts.URL+"/v1/chat/completions", aliceKey,
				map[string]any{"model": "agemem", "messages": msgs, "temperature": 0, "max_tokens": 8})
			if turn >= turns-counted {
				late += time.Since(t0)
			}
			if r.Status != 200 && r.Status != 422 { // a random model rarely writes a valid reply
				b.Fatalf("turn %d: status %d: %s", turn, r.Status, r.Body)
			}
			msgs = append(msgs, map[string]any{"role": "assistant", "content": "Noted."})
		}
		return late / counted
	}
	for range b.N {
		with, without := latency(1<<16), latency(0)
		b.ReportMetric(float64(with.Milliseconds()), "late-turn-ms")
		b.ReportMetric(float64(without.Milliseconds()), "late-turn-ms-uncached")
		b.Logf("serve session, turns 9-12 of 12 resending the conversation: %v a request with the prefix cache, %v without (%.2fx faster)",
			with, without, float64(without)/float64(with))
	}
}
