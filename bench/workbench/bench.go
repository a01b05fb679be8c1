package workbench

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
)

// Split holds out one query per template to build the memory from
// (MemToolAgent's WorkBench protocol: the first query of each
// base_template, in file order); the rest are the test set.
func Split(tasks []Task) (memory, test []Task) {
	seen := map[string]bool{}
	for _, t := range tasks {
		if !seen[t.BaseTemplate] {
			seen[t.BaseTemplate] = true
			memory = append(memory, t)
			continue
		}
		test = append(test, t)
	}
	return memory, test
}

// Domain is a task's domain as WorkBench reports accuracy: its one
// domain, or "multi_domain".
func (t Task) Domain() string {
	if len(t.Domains) == 1 {
		return t.Domains[0]
	}
	return "multi_domain"
}

// Result is a benchmark run.
type Result struct {
	Memory bool `json:"memory"`
	// Search is set when FitText's agent played (SearchBench).
	Search     *SearchStats    `json:"search,omitempty"`
	Accuracy   Stat            `json:"accuracy"`
	ByDomain   map[string]Stat `json:"by_domain"`
	ExactMatch float64         `json:"exact_match"`
	// SideEffects is the share of test queries whose actions changed the
	// state wrongly.
	SideEffects float64 `json:"side_effects"`
	// InputTokens and OutputTokens are the agent's means per test query.
	InputTokens  float64 `json:"input_tokens"`
	OutputTokens float64 `json:"output_tokens"`
	// MemorySize is the entries stored before the test queries; Recalled
	// the entries each test query was shown.
	MemorySize int   `json:"memory_size"`
	Recalled   []int `json:"recalled,omitempty"`
	// ExtractorErrors counts failures stored without a reflection because
	// the extractor failed.
	ExtractorErrors int   `json:"extractor_errors,omitempty"`
	Runs            []Run `json:"runs"`
}

// Stat is a share with its standard error and count.
type Stat struct {
	Mean float64 `json:"mean"`
	SE   float64 `json:"se"`
	N    int     `json:"n"`
}

func statOf(v []bool) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	var k float64
	for _, b := range v {
		if b {
			k++
		}
	}
	p := k / float64(len(v))
	s := Stat{Mean: p, N: len(v)}
	if len(v) > 1 {
		s.SE = math.Sqrt(p * (1 - p) / float64(len(v)-1))
	}
	return s
}

// Fill fills in the result's runs and their statistics.
func (res *Result) Fill(test []Task, runs []Run) {
	byDomain := map[string][]bool{}
	var all []bool
	for i, t := range test {
		r := runs[i]
		res.Runs = append(res.Runs, r)
		all = append(all, r.Correct)
		byDomain[t.Domain()] = append(byDomain[t.Domain()], r.Correct)
		if r.ExactMatch {
			res.ExactMatch += 1 / float64(len(test))
		}
		if r.SideEffects {
			res.SideEffects += 1 / float64(len(test))
		}
		res.InputTokens += float64(r.InputTokens) / float64(len(test))
		res.OutputTokens += float64(r.OutputTokens) / float64(len(test))
	}
	res.Accuracy = statOf(all)
	for k, v := range byDomain {
		res.ByDomain[k] = statOf(v)
	}
}

// Domains are the domains of results, sorted.
func Domains(rs []Result) []string {
	seen := map[string]bool{}
	for _, r := range rs {
		for k := range r.ByDomain {
			seen[k] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Label names a result's agent: "memory on" or "memory off" for the
// function-calling loop, "dfsdt <retrieval>" for FitText's.
func (res Result) Label() string {
	switch {
	case res.Search != nil:
		return "dfsdt " + res.Search.Retrieval
	case res.Memory:
		return "memory on"
	}
	return "memory off"
}

// Print writes results as a table: accuracy overall and per domain with
// standard errors, exact match, wrong side effects, memory size and the
// mean entries recalled; for searches, the mean model calls a query.
func Print(w io.Writer, rs []Result) {
	doms := Domains(rs)
	fmt.Fprintf(w, "%-18s %-16s", "agent", "accuracy")
	for _, d := range doms {
		fmt.Fprintf(w, " %-16s", d)
	}
	fmt.Fprintf(w, " %-11s %-12s %-11s %s\n", "exact match", "side effects", "memory size", "recalled (mean)")
	for _, r := range rs {
		fmt.Fprintf(w, "%-18s %-16s", r.Label(), fmtStat(r.Accuracy))
		for _, d := range doms {
			fmt.Fprintf(w, " %-16s", fmtStat(r.ByDomain[d]))
		}
		var rec float64
		for _, n := range r.Recalled {
			rec += float64(n) / float64(len(r.Recalled))
		}
		fmt.Fprintf(w, " %-11.3f %-12.3f %-11d %.1f\n", r.ExactMatch, r.SideEffects, r.MemorySize, rec)
	}
	for _, r := range rs {
		if r.InputTokens+r.OutputTokens > 0 {
			fmt.Fprintf(w, "%s: %.0f input and %.0f output tokens a query\n", r.Label(), r.InputTokens, r.OutputTokens)
		}
	}
	for _, r := range rs {
		if st := r.Search; st != nil {
			fmt.Fprintf(w, "%s: %.1f agent calls, %.1f strategy calls, %.2f retrievals (%.2f duplicates skipped), %.1f pruned a query; %.3f answered\n",
				r.Label(), st.Queries, st.StrategyCalls, st.Retrievals, st.Duplicates, st.Pruned, st.Answered)
		}
	}
}

func fmtStat(s Stat) string { return strings.TrimSpace(fmt.Sprintf("%.3f ± %.3f", s.Mean, s.SE)) }

// SearchStats are a search run's means per query.
type SearchStats struct {
	Retrieval     string  `json:"retrieval"` // the FitText strategy, or "none"
	Answered      float64 `json:"answered"`
	Queries       float64 `json:"agent_calls"`
	StrategyCalls float64 `json:"strategy_calls"`
	Retrievals    float64 `json:"retrievals"`
	Duplicates    float64 `json:"duplicates"`
	Pruned        float64 `json:"pruned"`
}
