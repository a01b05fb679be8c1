package memtool

import (
	"encoding/json"
	"math"
	"slices"
)

// Metrics are the paper's measures of a session (Eq. 1-5).
type Metrics struct {
	// RemovalRatio is ΣR_t / ΣA_t over the session (Eq. 1; 0 when nothing
	// was added).
	RemovalRatio float64 `json:"removal_ratio"`
	// AvgRemovalRatio3T is Eq. 2: the mean over windows of three turns of
	// the window's ΣR/ΣA. Decided here where the paper is silent: a window
	// that added nothing is left out of the mean (0/0), and a window's
	// ratio is capped at 1 (removing tools added before the window cannot
	// make it more than complete). NaN when no window added a tool.
	AvgRemovalRatio3T float64 `json:"avg_removal_ratio_3t"`
	// AvgResidual3T is Eq. 3: after each peak of the tool count (a turn
	// whose count is higher than the turn before's and not lower than the
	// turn after's), the mean count of the next three turns, averaged over
	// peaks; peaks with fewer than three turns after them use those there
	// are. NaN without a peak.
	AvgResidual3T float64 `json:"avg_residual_3t"`
	// ToolCorrectness is Eq. 5 as DeepEval computes it by default: per
	// turn, the share of the expected tools that were called (by name),
	// averaged over the turns that expect tools.
	ToolCorrectness float64 `json:"tool_correctness"`
	// TaskCompletion is the mean judge score of the answers (Eq. 4).
	TaskCompletion float64 `json:"task_completion"`
	// MaxCount is the largest tool count at the end of a turn, LimitHits
	// the searches that hit L, Answered the share of turns answered.
	MaxCount  int     `json:"max_count"`
	LimitHits int     `json:"limit_hits"`
	Failed    int     `json:"failed_turns"` // turns whose model call failed
	Answered  float64 `json:"answered"`
	Turns     int     `json:"turns"`
}

// Measure computes the metrics of a session's turns; gold[i] are turn i's
// expected tools and completion[i] its judged task completion.
func Measure(turns []TurnResult, gold [][]string, completion []float64) Metrics {
	m := Metrics{Turns: len(turns)}
	n := len(turns)
	if n == 0 {
		return m
	}
	add, rem, count := make([]float64, n), make([]float64, n), make([]float64, n)
	var sumA, sumR float64
	var answered float64
	for i, t := range turns {
		add[i], rem[i], count[i] = float64(len(t.Added)), float64(len(t.Removed)), float64(t.Count)
		sumA += add[i]
		sumR += rem[i]
		m.MaxCount = max(m.MaxCount, t.Count)
		m.LimitHits += t.LimitHits
		if t.Error != "" {
			m.Failed++
		}
		if t.HasAnswer {
			answered++
		}
	}
	m.Answered = answered / float64(n)
	if sumA > 0 {
		m.RemovalRatio = sumR / sumA
	}
	m.AvgRemovalRatio3T = avgRemovalRatio(add, rem, 3)
	m.AvgResidual3T = avgResidual(count, 3)
	var tc float64
	var tn int
	for i, t := range turns {
		if i >= len(gold) || len(gold[i]) == 0 {
			continue
		}
		hit := 0
		for _, g := range gold[i] {
			if slices.Contains(t.Called, g) {
				hit++
			}
		}
		tc += float64(hit) / float64(len(gold[i]))
		tn++
	}
	if tn > 0 {
		m.ToolCorrectness = tc / float64(tn)
	}
	var cs float64
	for _, c := range completion {
		cs += c
	}
	if len(completion) > 0 {
		m.TaskCompletion = cs / float64(len(completion))
	}
	return m
}

func avgRemovalRatio(add, rem []float64, w int) float64 {
	var sum float64
	var k int
	for t := w - 1; t < len(add); t++ {
		var a, r float64
		for i := t - w + 1; i <= t; i++ {
			a += add[i]
			r += rem[i]
		}
		if a == 0 {
			continue
		}
		sum += math.Min(r/a, 1)
		k++
	}
	if k == 0 {
		return math.NaN()
	}
	return sum / float64(k)
}

func avgResidual(count []float64, w int) float64 {
	var sum float64
	var k int
	for t := range count {
		prev := 0.0 // the session starts with no tools
		if t > 0 {
			prev = count[t-1]
		}
		if count[t] <= prev || (t+1 < len(count) && count[t+1] > count[t]) || t+1 >= len(count) {
			continue
		}
		var s float64
		j := 0
		for i := t + 1; i <= t+w && i < len(count); i++ {
			s += count[i]
			j++
		}
		sum += s / float64(j)
		k++
	}
	if k == 0 {
		return math.NaN()
	}
	return sum / float64(k)
}

// MarshalJSON writes the measures that have no value (NaN) as null.
func (m Metrics) MarshalJSON() ([]byte, error) {
	type plain Metrics
	orNil := func(v float64) *float64 {
		if math.IsNaN(v) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		plain
		AvgRemovalRatio3T *float64 `json:"avg_removal_ratio_3t"`
		AvgResidual3T     *float64 `json:"avg_residual_3t"`
	}{plain(m), orNil(m.AvgRemovalRatio3T), orNil(m.AvgResidual3T)})
}
