package workbench

import (
	"encoding/csv"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
)

// cell is one value of a table: a string, or missing (pandas' NaN, which
// read_csv(dtype=str) gives an empty field, and None a tool may store).
type cell struct {
	s    string
	null bool
	// ts marks a pandas Timestamp (send_email's sent_datetime): shown as its
	// string, but not a string to .str.lower(), which makes it missing in
	// the comparison.
	ts bool
}

func str(s string) cell { return cell{s: s} }

// row is a row and its index label: pandas keeps labels through filters,
// and two of WorkBench's tools append at label len(table), which
// overwrites a row when an earlier delete left that label in use. Scoring
// compares tables label by label, so labels are part of the state.
type row struct {
	label int
	vals  []cell
}

// table is the little of a pandas DataFrame the WorkBench tools use.
type table struct {
	cols []string
	rows []row
}

// readCSV reads a CSV file as pandas.read_csv(path, dtype=str) does:
// every value a string, empty fields missing, labels 0..n-1. header false
// takes the column names from names (read_csv(header=None, names=...)).
func readCSV(fsys fs.FS, path string, names []string) (*table, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	t := &table{cols: names}
	if names == nil {
		if t.cols, err = r.Read(); err != nil {
			return nil, fmt.Errorf("%s: header: %w", path, err)
		}
	}
	r.FieldsPerRecord = len(t.cols)
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		vals := make([]cell, len(rec))
		for i, v := range rec {
			vals[i] = cell{s: v, null: v == ""}
		}
		t.rows = append(t.rows, row{label: len(t.rows), vals: vals})
	}
	return t, nil
}

func (t *table) clone() *table {
	c := &table{cols: t.cols, rows: make([]row, len(t.rows))}
	for i, r := range t.rows {
		c.rows[i] = row{label: r.label, vals: slices.Clone(r.vals)}
	}
	return c
}

// col is the index of column name (-1: none).
func (t *table) col(name string) int { return slices.Index(t.cols, name) }

// get is row r's value of column name.
func (t *table) get(r row, name string) cell { return r.vals[t.col(name)] }

// has reports whether column name holds v in some row (v in df[name].values).
func (t *table) has(name, v string) bool {
	c := t.col(name)
	for _, r := range t.rows {
		if !r.vals[c].null && r.vals[c].s == v {
			return true
		}
	}
	return false
}

// filter keeps the rows keep accepts, labels unchanged (df[mask]).
func (t *table) filter(keep func(r row) bool) *table {
	out := &table{cols: t.cols}
	for _, r := range t.rows {
		if keep(r) {
			out.rows = append(out.rows, r)
		}
	}
	return out
}

// set assigns v to column name of the rows where match holds
// (df.loc[mask, name] = v).
func (t *table) set(match func(r row) bool, name string, v cell) {
	c := t.col(name)
	for i := range t.rows {
		if match(t.rows[i]) {
			t.rows[i].vals[c] = v
		}
	}
}

// maxOf is the largest present value of a string column (df[name].max()).
func (t *table) maxOf(name string) string {
	c := t.col(name)
	m := ""
	for _, r := range t.rows {
		if !r.vals[c].null && r.vals[c].s > m {
			m = r.vals[c].s
		}
	}
	return m
}

// concat appends a row given by column name; ignoreIndex labels it
// len(t) (pd.concat(..., ignore_index=True) relabels 0..n-1: the earlier
// labels become their positions too), otherwise 0 (a one-row frame's own
// label, kept by pd.concat).
func (t *table) concat(vals map[string]cell, ignoreIndex bool) {
	r := row{vals: make([]cell, len(t.cols))}
	for i, c := range t.cols {
		v, ok := vals[c]
		if !ok {
			v = cell{null: true}
		}
		r.vals[i] = v
	}
	t.rows = append(t.rows, r)
	if ignoreIndex {
		for i := range t.rows {
			t.rows[i].label = i
		}
	}
}

// locSet is df.loc[label] = vals: it overwrites the row labelled label
// if there is one (every such row), otherwise appends one with that label.
func (t *table) locSet(label int, vals []cell) {
	found := false
	for i := range t.rows {
		if t.rows[i].label == label {
			t.rows[i].vals = slices.Clone(vals)
			found = true
		}
	}
	if !found {
		t.rows = append(t.rows, row{label: label, vals: slices.Clone(vals)})
	}
}

// records is df.to_dict(orient="records"): each row as a map, missing
// values as nil.
func (t *table) records() []map[string]any {
	out := make([]map[string]any, len(t.rows))
	for i, r := range t.rows {
		m := make(map[string]any, len(t.cols))
		for j, c := range t.cols {
			if r.vals[j].null {
				m[c] = nil
			} else {
				m[c] = r.vals[j].s
			}
		}
		out[i] = m
	}
	return out
}

// equalTables is DataFrame.equals after WorkBench lower-cases the columns
// lower names (.str.lower(), which also makes a non-string Timestamp
// missing): the same columns, the same labels in the same order, the same
// values, missing where missing.
func equalTables(a, b *table, lower func(col string) bool) bool {
	if !slices.Equal(a.cols, b.cols) || len(a.rows) != len(b.rows) {
		return false
	}
	for i := range a.rows {
		ra, rb := a.rows[i], b.rows[i]
		if ra.label != rb.label {
			return false
		}
		for j, c := range a.cols {
			x, y := ra.vals[j], rb.vals[j]
			if lower(c) {
				x.null, y.null = x.null || x.ts, y.null || y.ts
				x.s, y.s = strings.ToLower(x.s), strings.ToLower(y.s)
			} else if x.ts != y.ts {
				return false
			}
			if x.null || y.null {
				if x.null != y.null {
					return false
				}
				continue
			}
			if x.s != y.s {
				return false
			}
		}
	}
	return true
}
