package toolret

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// ReadQrels reads TREC qrels: "qid 0 docid rel" per line (rel an
// integer; 1 or more is relevant). Errors name the file and line.
func ReadQrels(path string) (map[string]Qrels, error) {
	out := map[string]Qrels{}
	err := eachLine(path, func(line int, f []string) error {
		if len(f) != 4 {
			return fmt.Errorf("want 4 fields (qid 0 docid rel), got %d", len(f))
		}
		rel, err := strconv.Atoi(f[3])
		if err != nil {
			return fmt.Errorf("relevance %q is not an integer", f[3])
		}
		if out[f[0]] == nil {
			out[f[0]] = Qrels{}
		}
		if _, dup := out[f[0]][f[2]]; dup {
			return fmt.Errorf("query %s judges %s twice", f[0], f[2])
		}
		out[f[0]][f[2]] = rel
		return nil
	})
	return out, err
}

// ReadRun reads a TREC run: "qid Q0 docid rank score tag" per line. As in
// trec_eval, the score orders the tools and the rank column is ignored; a
// tool listed twice for a query is an error.
func ReadRun(path string) (map[string]Run, error) {
	out := map[string]Run{}
	err := eachLine(path, func(line int, f []string) error {
		if len(f) != 6 {
			return fmt.Errorf("want 6 fields (qid Q0 docid rank score tag), got %d", len(f))
		}
		score, err := strconv.ParseFloat(f[4], 64)
		if err != nil {
			return fmt.Errorf("score %q is not a number", f[4])
		}
		if math.IsNaN(score) {
			return fmt.Errorf("score %q cannot be ordered", f[4]) // every comparison with NaN is false
		}
		if out[f[0]] == nil {
			out[f[0]] = Run{}
		}
		if _, dup := out[f[0]][f[2]]; dup {
			return fmt.Errorf("query %s lists %s twice", f[0], f[2])
		}
		out[f[0]][f[2]] = score
		return nil
	})
	return out, err
}

func eachLine(path string, fn func(line int, fields []string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if err := fn(line, fields); err != nil {
			return fmt.Errorf("%s:%d: %w", path, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// WriteRun writes runs as a TREC run file, each query's tools in rank
// order, tagged tag.
func WriteRun(w io.Writer, runs map[string]Run, tag string) error {
	qids := make([]string, 0, len(runs))
	for q := range runs {
		qids = append(qids, q)
	}
	sort.Strings(qids)
	bw := bufio.NewWriter(w)
	for _, q := range qids {
		for i, id := range Ranked(runs[q]) {
			fmt.Fprintf(bw, "%s Q0 %s %d %s %s\n", q, id, i+1, strconv.FormatFloat(runs[q][id], 'g', -1, 64), tag) // full precision: a re-read ranks alike
		}
	}
	return bw.Flush()
}

// WriteQrels writes judgments as TREC qrels ("qid 0 docid rel"), sorted.
func WriteQrels(w io.Writer, qrels map[string]Qrels) error {
	qids := make([]string, 0, len(qrels))
	for q := range qrels {
		qids = append(qids, q)
	}
	sort.Strings(qids)
	bw := bufio.NewWriter(w)
	for _, q := range qids {
		ids := make([]string, 0, len(qrels[q]))
		for id := range qrels[q] {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			fmt.Fprintf(bw, "%s 0 %s %d\n", q, id, qrels[q][id])
		}
	}
	return bw.Flush()
}
