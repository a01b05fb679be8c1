package workbench

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The sandbox's read-only tools: searches and lookups, which change no
// state and so are scored by the actions around them.

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// intCounts is a groupby's per-day counts as integers.
func intCounts(m map[string]float64) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = int(v)
	}
	return out
}

func searchEvents(s *Sandbox, a Args) (any, error) {
	match, err := contains(a["query"])
	if err != nil {
		return nil, err
	}
	t := s.calendar.filter(func(r row) bool {
		return match(s.calendar.get(r, "event_name")) || match(s.calendar.get(r, "participant_email"))
	})
	lo, hi, err := bounds(a["time_min"], a["time_max"])
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for i, rec := range t.records() {
		if lo != nil || hi != nil {
			start, err := timestamp(pyStr(t.get(t.rows[i], "event_start")))
			if err != nil {
				return nil, err
			}
			if (lo != nil && start.Before(*lo)) || (hi != nil && start.After(*hi)) {
				continue
			}
		}
		out = append(out, rec)
	}
	if len(out) == 0 {
		return "No events found.", nil
	}
	return out[:min(5, len(out))], nil
}

// bounds parses the optional lower and upper time bounds of a search.
func bounds(lo, hi string) (*time.Time, *time.Time, error) {
	var out [2]*time.Time
	for i, v := range []string{lo, hi} {
		if v == "" {
			continue
		}
		t, err := timestamp(v)
		if err != nil {
			return nil, nil, err
		}
		out[i] = &t
	}
	return out[0], out[1], nil
}

func searchEmails(s *Sandbox, a Args) (any, error) {
	words := strings.Fields(strings.ToLower(a["query"]))
	e := s.emails
	t := e.filter(func(r row) bool {
		all := strings.ToLower(pyStr(e.get(r, "subject")) + " " + pyStr(e.get(r, "body")) + " " + pyStr(e.get(r, "sender/recipient")))
		for _, w := range words {
			if !strings.Contains(all, w) {
				return false
			}
		}
		return true
	})
	// sort_values("sent_datetime", ascending=False): strings compare as
	// strings; a sent email's Timestamp among them cannot be compared.
	rows := slices.Clone(t.rows)
	kinds := map[bool]bool{}
	for _, r := range rows {
		kinds[t.get(r, "sent_datetime").ts] = true
	}
	if len(kinds) > 1 {
		return nil, fmt.Errorf("TypeError: '<' not supported between instances of 'Timestamp' and 'str'")
	}
	sort.SliceStable(rows, func(i, j int) bool {
		return pyStr(t.get(rows[i], "sent_datetime")) > pyStr(t.get(rows[j], "sent_datetime"))
	})
	t = &table{cols: t.cols, rows: rows}
	lo, hi, err := bounds(a["date_min"], a["date_max"])
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for i, rec := range t.records() {
		if lo != nil || hi != nil {
			sent, err := timestamp(pyStr(t.get(t.rows[i], "sent_datetime")))
			if err != nil {
				return nil, err
			}
			d := day(sent)
			if (lo != nil && d.Before(day(*lo))) || (hi != nil && d.After(day(*hi))) {
				continue
			}
		}
		out = append(out, rec)
	}
	if len(out) == 0 {
		return "No emails found.", nil
	}
	return out[:min(5, len(out))], nil
}

func visitorInfo(s *Sandbox, a Args) (any, error) {
	id := a["visitor_id"]
	if id == "" {
		return "Visitor ID not provided.", nil
	}
	t := s.analytics.filter(func(r row) bool { v := s.analytics.get(r, "visitor_id"); return !v.null && v.s == id })
	if len(t.rows) == 0 {
		return "Visitor not found.", nil
	}
	recs := t.records()
	for _, r := range recs {
		r["user_engaged"] = r["user_engaged"] == "True" // read as a boolean column
	}
	return recs, nil
}

func averageSession(s *Sandbox, a Args) (any, error) {
	t := inRange(s.analytics, "date_of_visit", a["time_min"], a["time_max"])
	sum, n := map[string]float64{}, map[string]float64{}
	for _, r := range t.rows {
		v, err := strconv.ParseFloat(pyStr(t.get(r, "session_duration_seconds")), 64)
		if err != nil {
			return nil, fmt.Errorf("ValueError: could not convert string to float: %q", pyStr(t.get(r, "session_duration_seconds")))
		}
		d := t.get(r, "date_of_visit").s
		sum[d] += v
		n[d]++
	}
	out := make(map[string]float64, len(sum))
	for _, d := range sortedKeys(sum) {
		out[d] = sum[d] / n[d]
	}
	return out, nil
}

// searchBy keeps the rows whose column matches each given pattern
// (str.contains(v, case=False) per field, in order).
func searchBy(t *table, a Args, fields []string) (*table, error) {
	for _, f := range fields {
		if v := a[f]; v != "" {
			match, err := contains(v)
			if err != nil {
				return nil, err
			}
			t = t.filter(func(r row) bool { return match(t.get(r, f)) })
		}
	}
	return t, nil
}

func anyGiven(a Args, keys []string) bool {
	return slices.ContainsFunc(keys, func(k string) bool { return a[k] != "" })
}

func searchTasks(s *Sandbox, a Args) (any, error) {
	fields := []string{"task_name", "assigned_to_email", "list_name", "due_date", "board"}
	if !anyGiven(a, fields) {
		return "No search parameters provided.", nil
	}
	t, err := searchBy(s.tasks, a, fields)
	if err != nil {
		return nil, err
	}
	return listOf(t.records()), nil
}

// listOf keeps an empty result a list, as Python's [] is.
func listOf(recs []map[string]any) []map[string]any {
	if recs == nil {
		return []map[string]any{}
	}
	return recs
}

func searchCustomers(s *Sandbox, a Args) (any, error) {
	dates := []string{"last_contact_date_min", "last_contact_date_max", "follow_up_by_min", "follow_up_by_max"}
	fields := []string{"customer_name", "customer_email", "product_interest", "status", "assigned_to_email"}
	if !anyGiven(a, append(slices.Clone(fields), dates...)) {
		return "No search parameters provided. Please provide at least one parameter.", nil
	}
	t, err := searchBy(s.crm, a, fields)
	if err != nil {
		return nil, err
	}
	for _, d := range dates {
		v := a[d]
		if v == "" {
			continue
		}
		col, upper := strings.TrimSuffix(strings.TrimSuffix(d, "_min"), "_max"), strings.HasSuffix(d, "_max")
		// String comparison; a missing date compares false, as NaN does.
		t = t.filter(func(r row) bool {
			c := t.get(r, col)
			if c.null {
				return false
			}
			if upper {
				return c.s <= v
			}
			return c.s >= v
		})
	}
	recs := listOf(t.records())
	return recs[:min(5, len(recs))], nil
}

func findEmailAddress(s *Sandbox, a Args) (any, error) {
	name, ok := a["name"]
	if !ok || name == "" {
		return "Name not provided.", nil
	}
	// str.contains(name): a case-sensitive regular expression, the name
	// lower-cased first.
	re, err := regexp.Compile(strings.ToLower(name))
	if err != nil {
		return nil, fmt.Errorf("re.error: %v", err)
	}
	out := []string{}
	for _, e := range s.d.directory {
		if re.MatchString(e) {
			out = append(out, e)
		}
	}
	return out, nil
}
