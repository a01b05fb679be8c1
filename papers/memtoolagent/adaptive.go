// Package memtoolagent is MemToolAgent's memory of past tool use: entries
// of a query, the tool calls made, the feedback and (on failure) a
// reflection, recalled by similarity with an adaptive count, and the runs
// of the agent with it on WorkBench and NESTFUL.
package memtoolagent

import "github.com/agemem/agemem/internal/valid"

// Adaptive recall (MemToolAgent): the similarities of the stored entries to
// a new query, sorted descending as x, are differentiated by a centred
// least-squares slope over a window of R on each side,
//
//	y(j) = −Σ_{τ=−R..R} τ·x(j+τ) / Σ_{τ=−R..R} τ²,   j = R … |x|−R−1,
//
// so y is large where the similarities fall fastest; its peaks (as
// scipy.signal.find_peaks(y, prominence=1e-5) finds them) mark the edges
// between groups of similar entries, and the count recalled is set by the
// peak at position PeakNumber.
//
// What the paper leaves open, decided here:
//   - n counts the entries up to and including the steepest point: a peak
//     at x index j recalls the j+1 most similar entries (the centre of the
//     drop still belongs to the group above it, whose slope it measures).
//   - Fewer than 2R+1 entries leave no window: every entry is recalled (a
//     memory that small costs little to show).
//   - Fewer peaks than PeakNumber: the last peak found decides; no peak at
//     all (similarities that fall evenly): the Fallback most similar
//     entries (every entry if Fallback is 0).

// Counter decides how many of the entries, their similarities to the
// query x sorted descending, a query recalls: Adaptive (the paper's
// dynamic top-n), TopK (a fixed count) or Gap (Adaptive-k), the last two
// the paper's baselines (its Figure 5 sweeps the fixed k).
type Counter interface {
	Count(x []float64) int
}

// TopK recalls the K most similar entries (all, when fewer).
type TopK int

// Count implements Counter.
func (k TopK) Count(x []float64) int { return min(max(int(k), 0), len(x)) }

// Gap is Adaptive-k (Taguchi et al., 2025): it recalls the entries above
// the largest drop between neighbouring similarities (all of them when
// there are fewer than two).
type Gap struct{}

// Count implements Counter.
func (Gap) Count(x []float64) int {
	if len(x) < 2 {
		return len(x)
	}
	best := 0
	for i := 1; i+1 < len(x); i++ {
		if x[i]-x[i+1] > x[best]-x[best+1] {
			best = i
		}
	}
	return best + 1
}

// Adaptive holds the recall parameters (the "adaptive" keys of the
// memtoolagent section).
type Adaptive struct {
	R          int `yaml:"radius"`   // half window (the paper: 10)
	PeakNumber int `yaml:"peak"`     // which peak sets n, from 1 (the paper: 1, or 2 for PEToolBench)
	Fallback   int `yaml:"fallback"` // entries recalled when y has no peak (0: all)
}

// DefaultAdaptive is the paper's WorkBench setting.
func DefaultAdaptive() Adaptive { return Adaptive{R: 10, PeakNumber: 1, Fallback: 10} }

// Check names, by key, each parameter no recall can follow: a half window
// below 1 (no slope at all), a peak number below 1, a negative fallback.
func (a Adaptive) Check() error {
	var e valid.Errors
	if a.R < 1 {
		e.Add("radius", "%d: a half window R %d has no slope; want at least 1", a.R, a.R)
	}
	if a.PeakNumber < 1 {
		e.Add("peak", "%d: there is no peak number %d; want 1 or more", a.PeakNumber, a.PeakNumber)
	}
	if a.Fallback < 0 {
		e.Add("fallback", "%d: a fallback %d recalls nothing; want 0 (every entry) or more", a.Fallback, a.Fallback)
	}
	return e.Err()
}

// Count is how many of the entries with similarities x (sorted
// descending) to recall.
func (a Adaptive) Count(x []float64) int {
	if len(x) < 2*a.R+1 {
		return len(x)
	}
	y := Slope(x, a.R)
	peaks := FindPeaks(y, 1e-5)
	if len(peaks) == 0 {
		if a.Fallback <= 0 {
			return len(x)
		}
		return min(a.Fallback, len(x))
	}
	p := peaks[min(max(a.PeakNumber, 1), len(peaks))-1]
	return p + a.R + 1 // y[i] is x's index i+R
}

// Slope is y(j) for j = R … |x|−R−1, as y[j−R].
func Slope(x []float64, r int) []float64 {
	var den float64
	for t := -r; t <= r; t++ {
		den += float64(t * t)
	}
	if len(x) < 2*r+1 || den == 0 {
		return nil
	}
	y := make([]float64, len(x)-2*r)
	for j := r; j <= len(x)-r-1; j++ {
		var s float64
		for t := -r; t <= r; t++ {
			s += float64(t) * x[j+t]
		}
		y[j-r] = -s / den
	}
	return y
}

// FindPeaks returns the indices of y's peaks with a prominence of at least
// minProminence, as scipy.signal.find_peaks(y, prominence=minProminence):
// local maxima that are higher than both neighbours, a flat top (plateau)
// counted once at its middle (rounded down), the first and last samples
// never peaks; the prominence of a peak is its height above the higher of
// the lowest points on each side before a higher sample (or the border).
func FindPeaks(y []float64, minProminence float64) []int {
	var peaks []int
	for _, p := range localMaxima(y) {
		if prominence(y, p) >= minProminence {
			peaks = append(peaks, p)
		}
	}
	return peaks
}

func localMaxima(y []float64) []int {
	var out []int
	last := len(y) - 1
	for i := 1; i < last; i++ {
		if y[i-1] < y[i] {
			ahead := i + 1
			for ahead < last && y[ahead] == y[i] {
				ahead++
			}
			if y[ahead] < y[i] {
				out = append(out, (i+ahead-1)/2)
				i = ahead
			}
		}
	}
	return out
}

func prominence(y []float64, p int) float64 {
	leftMin := y[p]
	for i := p; i >= 0 && y[i] <= y[p]; i-- {
		leftMin = min(leftMin, y[i])
	}
	rightMin := y[p]
	for i := p; i < len(y) && y[i] <= y[p]; i++ {
		rightMin = min(rightMin, y[i])
	}
	return y[p] - max(leftMin, rightMin)
}
