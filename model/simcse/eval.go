package simcse

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/agemem/agemem/embed"
)

// Pair is one STS example: two sentences and a gold similarity.
type Pair struct {
	A, B  string
	Score float64
}

// ReadSTS reads an STS-B-format TSV file: GLUE's layout (a header naming
// sentence1, sentence2 and score), the original STS-B layout (genre,
// file, year, id, score, sentence1, sentence2, no header), or three
// columns (sentence1, sentence2, score). A malformed line is an error
// naming it.
func ReadSTS(path string) ([]Pair, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	var out []Pair
	a, b, s := -1, -1, -1
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), "\r")
		if text == "" {
			continue
		}
		cols := strings.Split(text, "\t")
		if line == 1 {
			for i, c := range cols {
				switch strings.ToLower(strings.TrimSpace(c)) {
				case "sentence1":
					a = i
				case "sentence2":
					b = i
				case "score":
					s = i
				}
			}
			if a >= 0 && b >= 0 && s >= 0 {
				continue // a header
			}
			switch {
			case len(cols) == 3:
				a, b, s = 0, 1, 2
			case len(cols) >= 7:
				a, b, s = 5, 6, 4
			default:
				return nil, fmt.Errorf("%s:1: %d columns: want a header with sentence1, sentence2 and score, STS-B's 7 columns or 3 (sentence1, sentence2, score)", path, len(cols))
			}
		}
		if len(cols) <= max(a, b, s) {
			return nil, fmt.Errorf("%s:%d: %d columns, want at least %d", path, line, len(cols), max(a, b, s)+1)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(cols[s]), 64)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: score %q is not a number", path, line, cols[s])
		}
		out = append(out, Pair{cols[a], cols[b], v})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) < 2 {
		return nil, fmt.Errorf("%s: %d pairs; a correlation needs at least 2", path, len(out))
	}
	return out, nil
}

// WriteSTS writes pairs in the three-column layout.
func WriteSTS(path string, pairs []Pair) error {
	var b strings.Builder
	b.WriteString("sentence1\tsentence2\tscore\n")
	for _, p := range pairs {
		fmt.Fprintf(&b, "%s\t%s\t%g\n", p.A, p.B, p.Score)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// Spearman is the rank correlation of x and y, ties given their average
// rank (scipy.stats.spearmanr).
func Spearman(x, y []float64) float64 {
	rx, ry := ranks(x), ranks(y)
	return pearson(rx, ry)
}

func ranks(x []float64) []float64 {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return x[idx[a]] < x[idx[b]] })
	r := make([]float64, len(x))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && x[idx[j+1]] == x[idx[i]] {
			j++
		}
		avg := float64(i+j)/2 + 1
		for k := i; k <= j; k++ {
			r[idx[k]] = avg
		}
		i = j + 1
	}
	return r
}

func pearson(x, y []float64) float64 {
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx /= float64(len(x))
	my /= float64(len(y))
	var sxy, sxx, syy float64
	for i := range x {
		sxy += (x[i] - mx) * (y[i] - my)
		sxx += (x[i] - mx) * (x[i] - mx)
		syy += (y[i] - my) * (y[i] - my)
	}
	if sxx == 0 || syy == 0 {
		return 0
	}
	return sxy / math.Sqrt(sxx*syy)
}

// STS is the Spearman correlation between the embedder's cosine and the
// gold scores.
func STS(ctx context.Context, e embed.Embedder, pairs []Pair) (float64, error) {
	var texts []string
	for _, p := range pairs {
		texts = append(texts, p.A, p.B)
	}
	vs, err := e.Embed(ctx, texts)
	if err != nil {
		return 0, err
	}
	cos, gold := make([]float64, len(pairs)), make([]float64, len(pairs))
	for i, p := range pairs {
		cos[i] = float64(embed.Cosine(vs[2*i], vs[2*i+1]))
		gold[i] = p.Score
	}
	return Spearman(cos, gold), nil
}
