// Package workbench is the WorkBench benchmark (Styles et al., 2024) in
// Go: the sandbox databases of a workplace (emails, calendar, web
// analytics, project tasks, customer relationship manager, company
// directory), every tool with WorkBench's names, arguments, effects and
// messages (its src/tools/*.py, pandas semantics included where scoring
// can see them), its tasks, and its outcome-based scoring: a task is
// correct when the state after the agent's calls equals the state after
// the gold calls.
package workbench

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// CurrentTime is WorkBench's fixed "now" (HARDCODED_CURRENT_TIME).
const CurrentTime = "2023-11-30 00:00:00"

// Data is a directory holding WorkBench's sandbox files, as
// ../shared/data/workbench does: the five processed tables and the company
// directory (email_addresses.csv, one address a line, no header).
type Data struct {
	calendar, emails, analytics, tasks, crm *table
	directory                               []string
}

// Files are the sandbox tables' file names.
var Files = []string{"calendar_events.csv", "emails.csv", "analytics_data.csv", "project_tasks.csv",
	"customer_relationship_manager_data.csv", "email_addresses.csv"}

//go:embed data/*.csv
var embedded embed.FS

// Default is the sandbox WorkBench publishes, embedded (data/, from its
// repository at commit 42f1b6dc1898, MIT licence beside it).
func Default() *Data {
	sub, _ := fs.Sub(embedded, "data")
	d, err := LoadFS(sub)
	if err != nil {
		panic(err) // embedded and checked by the tests
	}
	return d
}

// Load reads the sandbox from a directory.
func Load(dir string) (*Data, error) {
	d, err := LoadFS(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return d, nil
}

// LoadFS reads the sandbox files from fsys.
func LoadFS(fsys fs.FS) (*Data, error) {
	d := &Data{}
	var err error
	for i, dst := range []**table{&d.calendar, &d.emails, &d.analytics, &d.tasks, &d.crm} {
		if *dst, err = readCSV(fsys, Files[i], nil); err != nil {
			return nil, fmt.Errorf("workbench: %w", err)
		}
	}
	dirT, err := readCSV(fsys, Files[5], []string{"email_address"})
	if err != nil {
		return nil, fmt.Errorf("workbench: %w", err)
	}
	for _, r := range dirT.rows {
		d.directory = append(d.directory, r.vals[0].s)
	}
	for _, c := range []struct {
		t    *table
		cols []string
	}{
		{d.calendar, []string{"event_id", "event_name", "participant_email", "event_start", "duration"}},
		{d.emails, []string{"email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body"}},
		{d.analytics, []string{"date_of_visit", "visitor_id", "page_views", "session_duration_seconds", "traffic_source", "user_engaged"}},
		{d.tasks, []string{"task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board"}},
		{d.crm, []string{"customer_id", "assigned_to_email", "customer_name", "customer_email", "customer_phone", "last_contact_date", "product_interest", "status", "follow_up_by", "notes"}},
	} {
		for _, col := range c.cols {
			if c.t.col(col) < 0 {
				return nil, fmt.Errorf("workbench: a table has no column %q (columns %v)", col, c.t.cols)
			}
		}
	}
	return d, nil
}

// Sandbox is one episode's state: the tables the tools change, from a
// fresh copy of the data (WorkBench's reset_state).
type Sandbox struct {
	d                            *Data
	calendar, emails, tasks, crm *table
	plots                        *table
	analytics                    *table
}

// New is a sandbox in the data's initial state.
func (d *Data) New() *Sandbox {
	return &Sandbox{d: d, calendar: d.calendar.clone(), emails: d.emails.clone(), tasks: d.tasks.clone(),
		crm: d.crm.clone(), analytics: d.analytics.clone(), plots: &table{cols: []string{"file_path"}}}
}

// Equal is WorkBench's is_correct comparison of two sandboxes: calendar,
// emails, plots, project tasks and customers, every column lower-cased
// except status, list_name and board.
func (s *Sandbox) Equal(o *Sandbox) bool {
	lower := func(col string) bool { return !slices.Contains([]string{"status", "list_name", "board"}, col) }
	return s.equal(o, lower)
}

// same is DataFrame.equals without lower-casing: whether anything changed
// (has_side_effects compares with the initial state this way).
func (s *Sandbox) same(o *Sandbox) bool { return s.equal(o, func(string) bool { return false }) }

func (s *Sandbox) equal(o *Sandbox, lower func(col string) bool) bool {
	return equalTables(s.calendar, o.calendar, lower) && equalTables(s.emails, o.emails, lower) &&
		equalTables(s.plots, o.plots, lower) && equalTables(s.tasks, o.tasks, lower) && equalTables(s.crm, o.crm, lower)
}

// Args are a call's arguments as WorkBench evaluates them: strings, by
// name (an argument not given is absent).
type Args map[string]string

// Tool is one WorkBench tool.
type Tool struct {
	Name        string
	Description string
	Params      []Param
	// SideEffects marks the tools whose calls exact-match scoring counts
	// (WorkBench's tools_with_side_effects).
	SideEffects bool
	run         func(s *Sandbox, a Args) (any, error)
}

// Param is one argument of a tool.
type Param struct {
	Name, Description string
	// Default is the value the Python signature gives ("" for None).
	Default string
}

// Domain is the tool's toolkit: the part of its name before the dot.
func (t Tool) Domain() string { d, _, _ := strings.Cut(t.Name, "."); return d }

// Call runs the named tool. The result is what the tool returns (a message
// string, a record, a list); err is a Python exception the call would
// raise (a bad regular expression, an unparsable date): WorkBench's scorer
// skips such a call, its agent shows the error.
func (s *Sandbox) Call(name string, a Args) (any, error) {
	t, ok := ByName(name)
	if !ok {
		return nil, fmt.Errorf("unknown tool %q", name)
	}
	for k := range a {
		if !slices.ContainsFunc(t.Params, func(p Param) bool { return p.Name == k }) {
			return nil, fmt.Errorf("%s() got an unexpected keyword argument '%s'", name, k)
		}
	}
	return t.run(s, a)
}

// ByName finds a tool.
func ByName(name string) (Tool, bool) {
	i := slices.IndexFunc(Tools, func(t Tool) bool { return t.Name == name })
	if i < 0 {
		return Tool{}, false
	}
	return Tools[i], true
}

// contains is pandas' str.contains(pattern, case=False): a regular
// expression searched anywhere, missing values never matching.
func contains(pattern string) (func(c cell) bool, error) {
	re, err := regexp.Compile("(?i)" + pattern)
	if err != nil {
		return nil, fmt.Errorf("re.error: %v", err)
	}
	return func(c cell) bool { return !c.null && re.MatchString(c.s) }, nil
}

// timestamp parses a date or date-time as pd.Timestamp does for the forms
// WorkBench's data and agents use.
func timestamp(v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	for _, f := range []string{"2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02 15:04", "2006-01-02T15:04", "2006-01-02", "2006/01/02", "2006-01-02 15:04:05.999999"} {
		if t, err := time.Parse(f, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("ValueError: could not convert string to Timestamp: %q", v)
}

func day(t time.Time) time.Time { return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC) }

// nextID is str(int(df[col].max()) + 1), zero-padded to 8 digits when pad.
func nextID(t *table, col string, pad bool) (string, error) {
	n, err := strconv.Atoi(t.maxOf(col))
	if err != nil {
		return "", fmt.Errorf("ValueError: invalid literal for int(): %q", t.maxOf(col))
	}
	id := strconv.Itoa(n + 1)
	if pad && len(id) < 8 {
		id = strings.Repeat("0", 8-len(id)) + id
	}
	return id, nil
}

// fieldOf is the by-id lookup the get_*_information_by_id tools share.
func fieldOf(t *table, idCol, id, field, what string) any {
	if id == "" {
		return what + " ID not provided."
	}
	if field == "" {
		return "Field not provided."
	}
	for _, r := range t.rows {
		if v := t.get(r, idCol); !v.null && v.s == id {
			c := t.col(field)
			if c < 0 {
				return "Field not found."
			}
			return map[string]any{field: value(r.vals[c])}
		}
	}
	return what + " not found."
}

func value(c cell) any {
	if c.null {
		return nil
	}
	return c.s
}

// countsByDay is df.groupby("date_of_visit") with f summing each row's
// contribution: a map from day to count, sorted by day.
func countsByDay(t *table, f func(r row) float64) map[string]float64 {
	out := map[string]float64{}
	for _, r := range t.rows {
		out[t.get(r, "date_of_visit").s] += f(r)
	}
	return out
}

// inRange keeps rows whose date column lies within [min, max] as strings
// compare (the analytics tools compare "YYYY-MM-DD" strings).
func inRange(t *table, col, lo, hi string) *table {
	return t.filter(func(r row) bool {
		v := t.get(r, col)
		if v.null {
			return false
		}
		return (lo == "" || v.s >= lo) && (hi == "" || v.s <= hi)
	})
}

// sortedKeys is a groupby's day order.
func sortedKeys(m map[string]float64) []string {
	k := make([]string, 0, len(m))
	for d := range m {
		k = append(k, d)
	}
	sort.Strings(k)
	return k
}
