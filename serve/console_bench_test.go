package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agemem/agemem/memtools/ltm"
)

// BenchmarkConsolePages: the console's pages for a namespace of 10,000
// memories and 200 recent turns, each page's median latency over HTTP
// beside its anchor, the memory API's list of the same namespace (GET
// /v1/memories: what a page listing from the store would pay on every
// view). The first view after a start (or after another process changed
// the namespace's count) reads the namespace once.
func BenchmarkConsolePages(b *testing.B) {
	const memories, turns = 10000, 200
	c := testConfig(b)
	db, err := ltm.OpenSQLite(c.Memory.Path, ltm.SQLiteOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	s, err := New(with(c.options(), func(o *Options) { o.Backend, o.Store = newScripted(), db }))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	topics := []string{"cat", "tea", "work", "travel", "family", "music", "sport", "books"}
	entries := make([]ltm.Entry, memories)
	texts := make([]string, memories)
	for i := range entries {
		texts[i] = fmt.Sprintf("Memory %d: Alice mentioned %s on day %d, a detail worth keeping about %s.", i, topics[i%len(topics)], i%365, topics[(i/8)%len(topics)])
	}
	vecs, err := s.enc.Embed(context.Background(), texts)
	if err != nil {
		b.Fatal(err)
	}
	for i := range entries {
		entries[i] = ltm.Entry{ID: fmt.Sprintf("mem_%08x", i+1), Content: texts[i], Embedding: vecs[i],
			MemoryType: "fact", Metadata: map[string]any{"topic": topics[i%len(topics)]}}
	}
	if _, _, err := db.Import(context.Background(), "alice", entries); err != nil {
		b.Fatal(err)
	}
	for i := range turns {
		do(b, "POST", ts.URL+"/v1/chat/completions", aliceKey, chatBody(fmt.Sprintf("s%d", i%20), fmt.Sprintf("Turn %d about %s", i, topics[i%8])))
	}
	v := newVisitor(b, ts.URL)
	if code := v.login(aliceKey); code != http.StatusSeeOther {
		b.Fatalf("login: %d", code)
	}
	median := func(path string, n int) time.Duration {
		ds := make([]time.Duration, n)
		for i := range ds {
			req, _ := http.NewRequest("GET", ts.URL+path, nil)
			if strings.HasPrefix(path, "/v1/") {
				req.Header.Set("Authorization", "Bearer "+aliceKey)
			}
			t0 := time.Now()
			resp, err := v.c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ds[i] = time.Since(t0)
			if resp.StatusCode != 200 {
				b.Fatalf("%s: %d", path, resp.StatusCode)
			}
		}
		slices.Sort(ds)
		return ds[n/2]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for range b.N {
		anchor := median("/v1/memories", 3)
		s.lists.forget("alice")
		cold := median("/ui/memories", 1)
		pages := []struct{ name, path string }{
			{"memories, first page", "/ui/memories"},
			{"memories, page 100", "/ui/memories?offset=4950"},
			{"search (top 10)", "/ui/memories?q=what+does+alice+say+about+tea"},
			{"a memory", "/ui/memories/mem_00001388"},
			{"conversations", "/ui/conversations"},
			{"a conversation (10 turns)", "/ui/conversations/s7"},
			{"health", "/ui/health"},
		}
		var lines []string
		for _, p := range pages {
			d := median(p.path, 21)
			b.ReportMetric(ms(d), strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "").Replace(p.name)+"-ms")
			lines = append(lines, fmt.Sprintf("  %-28s %8.2f ms  (%.4fx the anchor)", p.name, ms(d), float64(d)/float64(anchor)))
		}
		b.ReportMetric(ms(anchor), "anchor-api-list-ms")
		b.ReportMetric(ms(cold), "first-view-ms")
		b.Logf("console of a namespace of %d memories and %d turns; anchor, GET /v1/memories of the namespace: %.1f ms\n"+
			"  first view (reads the namespace) %6.2f ms  (%.4fx the anchor)\n%s",
			memories, turns, ms(anchor), ms(cold), float64(cold)/float64(anchor), strings.Join(lines, "\n"))
	}
}
