package env

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/agemem/agemem/embed"
)

// SupportRecall is AgeMem's retrieval number: for each task, the question
// retrieves its top k among the task's sentences (supporting facts and
// distractor sentences), and recall is the fraction of supporting facts
// retrieved, averaged over tasks.
func SupportRecall(ctx context.Context, e embed.Embedder, tasks []Task, k int) (float64, error) {
	if len(tasks) == 0 {
		return 0, fmt.Errorf("no tasks to retrieve over")
	}
	if k < 1 {
		return 0, fmt.Errorf("recall@%d: k must be at least 1", k)
	}
	var total float64
	for _, t := range tasks {
		cands := slices.Clone(t.SupportingFacts)
		for _, d := range t.Distractors {
			cands = append(cands, splitSentences(d)...)
		}
		vs, err := e.Embed(ctx, append([]string{t.Question}, cands...))
		if err != nil {
			return 0, err
		}
		type hit struct {
			i int
			s float64
		}
		hits := make([]hit, len(cands))
		for i := range cands {
			hits[i] = hit{i, embed.Cosine(vs[0], vs[1+i])}
		}
		sort.SliceStable(hits, func(a, b int) bool { return hits[a].s > hits[b].s })
		found := 0
		for _, h := range hits[:min(k, len(hits))] {
			if h.i < len(t.SupportingFacts) {
				found++
			}
		}
		total += float64(found) / float64(max(1, len(t.SupportingFacts)))
	}
	return total / float64(len(tasks)), nil
}

// splitSentences cuts a paragraph after ". ", "? " and "! ".
func splitSentences(p string) []string {
	var out []string
	start := 0
	for i := 0; i+1 < len(p); i++ {
		if (p[i] == '.' || p[i] == '?' || p[i] == '!') && p[i+1] == ' ' {
			out = append(out, strings.TrimSpace(p[start:i+1]))
			start = i + 2
		}
	}
	if s := strings.TrimSpace(p[start:]); s != "" {
		out = append(out, s)
	}
	return out
}
