package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
)

// rolloutRef indexes one line of rollouts.jsonl: where it is and what the
// lists show, so a page reads only the lines it displays.
type rolloutRef struct {
	off    int64
	n      int
	Step   int     `json:"step"`
	Round  int     `json:"round"`
	Group  int     `json:"group"`
	Index  int     `json:"rollout"`
	Reward float64 `json:"reward"`
	TaskID string  `json:"task_id"`
	EM     float64 `json:"em"`
	Error  string  `json:"error"`
}

type rolloutFile struct {
	mu    sync.Mutex
	t     tail
	refs  []rolloutRef
	steps map[int][]int // step → indexes into refs, in file order
}

func (rs *runStore) rolloutsOf(r runInfo) (*rolloutFile, error) {
	rs.mu.Lock()
	f := rs.rolls[r.Dir]
	if f == nil {
		f = &rolloutFile{t: tail{path: filepath.Join(r.Dir, "rollouts.jsonl")}, steps: map[int][]int{}}
		rs.rolls[r.Dir] = f
	}
	rs.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.t.read(func(off int64, raw []byte) error {
		var ref rolloutRef
		if err := indexLine(raw, &ref); err != nil {
			return err
		}
		ref.off, ref.n = off, len(raw)
		f.steps[ref.Step] = append(f.steps[ref.Step], len(f.refs))
		f.refs = append(f.refs, ref)
		return nil
	}, func() {
		f.refs = f.refs[:0]
		clear(f.steps)
	})
	return f, err
}

// trajectoryKey opens a line's trajectory, most of its bytes. The trainer
// writes a record's keys sorted (Go's encoding of a map), so every field
// the index reads comes before it.
var trajectoryKey = []byte(`,"trajectory":`)

// indexLine reads the fields a rollout's index keeps from its line,
// skipping the trajectory when it comes last: a long run's first view
// indexes ten thousand lines. (A quote inside a JSON string is escaped, so
// the first unescaped occurrence is the key.)
func indexLine(raw []byte, ref *rolloutRef) error {
	if i := bytes.Index(raw, trajectoryKey); i > 0 {
		head := append(raw[:i:i], '}')
		if json.Unmarshal(head, ref) == nil && ref.Step > 0 {
			return nil
		}
		*ref = rolloutRef{}
	}
	return json.Unmarshal(raw, ref)
}

// groupSum is a group's line in a step's list.
type groupSum struct {
	Round, Group int
	TaskID       string
	K            int
	Mean         float64
	Min, Max     float64
	EM           float64 // mean
	Spread       float64 // max - min: 0 leaves GRPO nothing to learn from
	Errors       int
}

type stepsData struct {
	Run    runInfo
	NSteps int
	Step   int
	// The steps around this one and at the ends (-1, 0: none).
	Prev, Next  int
	First, Last int
	Groups      []groupSum
	Rollouts    int
	Rounds      bool
	Bad         []string
}

func (c *Console) rollouts(w http.ResponseWriter, r *http.Request) {
	run, ok := c.runs.run(r.URL.Query().Get("run"))
	if !ok || !run.Rollouts {
		c.fail(w, r, http.StatusNotFound, "no GRPO run of that name (a folder with rollouts.jsonl) below the runs folder")
		return
	}
	f, err := c.runs.rolloutsOf(run)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	f.mu.Lock()
	d := stepsData{Run: run, Rollouts: len(f.refs), Bad: append([]string(nil), f.t.bad...), Prev: -1, Next: -1}
	steps := make([]int, 0, len(f.steps))
	for s := range f.steps {
		steps = append(steps, s)
	}
	sort.Ints(steps)
	d.NSteps, d.Step = len(steps), -1
	if len(steps) > 0 {
		d.First, d.Last, d.Step = steps[0], steps[len(steps)-1], steps[len(steps)-1]
	}
	if n, err := strconv.Atoi(r.URL.Query().Get("step")); err == nil {
		d.Step = n
	}
	if i, ok := slices.BinarySearch(steps, d.Step); ok {
		if i > 0 {
			d.Prev = steps[i-1]
		}
		if i+1 < len(steps) {
			d.Next = steps[i+1]
		}
	}
	byGroup := map[[2]int]*groupSum{}
	for _, i := range f.steps[d.Step] {
		ref := f.refs[i]
		k := [2]int{ref.Round, ref.Group}
		g := byGroup[k]
		if g == nil {
			g = &groupSum{Round: ref.Round, Group: ref.Group, TaskID: ref.TaskID, Min: math.Inf(1), Max: math.Inf(-1)}
			byGroup[k] = g
		}
		d.Rounds = d.Rounds || ref.Round > 0
		g.K++
		g.Mean += ref.Reward
		g.EM += ref.EM
		g.Min, g.Max = math.Min(g.Min, ref.Reward), math.Max(g.Max, ref.Reward)
		if ref.Error != "" {
			g.Errors++
		}
	}
	f.mu.Unlock()
	for _, g := range byGroup {
		g.Mean /= float64(g.K)
		g.EM /= float64(g.K)
		g.Spread = g.Max - g.Min
		d.Groups = append(d.Groups, *g)
	}
	sort.Slice(d.Groups, func(i, j int) bool {
		a, b := d.Groups[i], d.Groups[j]
		return a.Round < b.Round || a.Round == b.Round && a.Group < b.Group
	})
	c.render(w, http.StatusOK, "rollouts", c.page(r, "runs", "Rollouts of "+run.Name, d))
}

// rolloutView is one rollout of a group, read whole.
type rolloutView struct {
	Index     int
	Reward    float64
	VsMean    float64 // reward minus the group's mean: the sign of its advantage
	Parts     []part
	Answer    string
	EM        float64
	Calls     map[string]float64
	Error     string
	Episode   *Episode
	Best      bool
	Formatted int
}

type part struct {
	Name  string
	Value float64
}

type groupData struct {
	Run             runInfo
	Step, Round     int
	Group           int
	TaskID          string
	Gold            string
	Rollouts        []rolloutView
	Parts           []string // the reward's part names, in the table's order
	HasTrajectories bool
	Mean            float64
}

// partOrder puts the composite reward's top-level parts first.
var partOrder = []string{"r_task", "r_context", "r_memory", "p_penalty", "r_compression", "r_preventive", "r_preservation",
	"r_storage", "r_maintenance", "r_relevance"}

func (c *Console) group(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	run, ok := c.runs.run(q.Get("run"))
	if !ok || !run.Rollouts {
		c.fail(w, r, http.StatusNotFound, "no GRPO run of that name below the runs folder")
		return
	}
	step, err1 := strconv.Atoi(q.Get("step"))
	group, err2 := strconv.Atoi(q.Get("group"))
	round, _ := strconv.Atoi(q.Get("round"))
	if err1 != nil || err2 != nil {
		c.fail(w, r, http.StatusBadRequest, "name the group with ?step=N&group=G")
		return
	}
	f, err := c.runs.rolloutsOf(run)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	// The group's lines, the last of each rollout winning (a resumed run
	// may have logged a step twice).
	f.mu.Lock()
	latest := map[int]rolloutRef{}
	for _, i := range f.steps[step] {
		ref := f.refs[i]
		if ref.Group == group && ref.Round == round {
			latest[ref.Index] = ref
		}
	}
	f.mu.Unlock()
	if len(latest) == 0 {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no rollouts of step %d, group %d in %s", step, group, run.Name))
		return
	}
	d, err := readGroup(f.t.path, latest)
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	d.Run, d.Step, d.Round, d.Group = run, step, round, group
	c.render(w, http.StatusOK, "group", c.page(r, "runs", fmt.Sprintf("Step %d, group %d", step, group), d))
}

// readGroup reads a group's rollouts from their lines.
func readGroup(path string, refs map[int]rolloutRef) (groupData, error) {
	var d groupData
	fh, err := os.Open(path)
	if err != nil {
		return d, err
	}
	defer fh.Close()
	seen := map[string]bool{}
	for _, ref := range refs {
		buf := make([]byte, ref.n)
		if _, err := fh.ReadAt(buf, ref.off); err != nil {
			return d, fmt.Errorf("%s: rollout %d: %w", path, ref.Index, err)
		}
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(buf, &rec); err != nil {
			return d, fmt.Errorf("%s: rollout %d: %w", path, ref.Index, err)
		}
		v := rolloutView{Index: ref.Index, Reward: ref.Reward, EM: ref.EM, Error: ref.Error}
		d.TaskID = ref.TaskID
		json.Unmarshal(rec["answer"], &v.Answer)
		json.Unmarshal(rec["tool_calls"], &v.Calls)
		json.Unmarshal(rec["format_errors"], &v.Formatted)
		if raw, ok := rec["trajectory"]; ok {
			var ep Episode
			if err := json.Unmarshal(raw, &ep); err == nil {
				v.Episode = &ep
				d.Gold = ep.Gold
				d.HasTrajectories = true
			}
		}
		for k, raw := range rec {
			var x float64
			if !isPart(k) || json.Unmarshal(raw, &x) != nil {
				continue
			}
			v.Parts = append(v.Parts, part{k, x})
			seen[k] = true
		}
		d.Rollouts = append(d.Rollouts, v)
	}
	for _, k := range partOrder {
		if seen[k] {
			d.Parts = append(d.Parts, k)
		}
	}
	sort.Slice(d.Rollouts, func(i, j int) bool { return d.Rollouts[i].Index < d.Rollouts[j].Index })
	best := 0
	for i, v := range d.Rollouts {
		d.Mean += v.Reward
		if v.Reward > d.Rollouts[best].Reward {
			best = i
		}
	}
	d.Mean /= float64(len(d.Rollouts))
	for i := range d.Rollouts {
		v := &d.Rollouts[i]
		v.VsMean = v.Reward - d.Mean
		// The parts in the table's column order.
		byName := map[string]float64{}
		for _, p := range v.Parts {
			byName[p.Name] = p.Value
		}
		v.Parts = v.Parts[:0]
		for _, k := range d.Parts {
			v.Parts = append(v.Parts, part{k, byName[k]})
		}
	}
	d.Rollouts[best].Best = true
	return d, nil
}

func isPart(k string) bool { return slices.Contains(partOrder, k) }
