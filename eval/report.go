package eval

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/agemem/agemem/internal/chart"
	"github.com/agemem/agemem/memtools"
)

// Print writes the table: each figure with its standard error, J by
// question type, J on yes/no questions and the share answered "yes" (when
// there are any), context size and tool use per task.
func Print(w io.Writer, rows []Row) {
	types := Types(rows)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "method\ttasks\tJ\tEM\tMQ")
	for _, t := range types {
		fmt.Fprintf(tw, "\tJ %s", t)
	}
	yesNo := false
	for _, r := range rows {
		_, ok := r.ByAnswer[AnswerYesNo]
		yesNo = yesNo || ok
	}
	if yesNo {
		fmt.Fprint(tw, "\tJ yes/no\tsays yes")
	}
	fmt.Fprintln(tw, "\tanswered\tavg prompt tokens\tadd\tupdate\tdelete\tretrieve\tsummary\tfilter\tformat errors\tcontext full")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s", r.Policy, r.Tasks, r.J, r.EM, r.MQ)
		for _, t := range types {
			fmt.Fprintf(tw, "\t%s", r.ByType[t])
		}
		if yesNo {
			fmt.Fprintf(tw, "\t%s\t%.2f", r.ByAnswer[AnswerYesNo], r.SaysYes)
		}
		fmt.Fprintf(tw, "\t%.2f\t%.0f", r.Answered, r.PromptTokens)
		for _, t := range []string{memtools.ToolAdd, memtools.ToolUpdate, memtools.ToolDelete, memtools.ToolRetrieve, memtools.ToolSummary, memtools.ToolFilter} {
			fmt.Fprintf(tw, "\t%.2f", r.ToolCalls[t])
		}
		fmt.Fprintf(tw, "\t%.2f\t%.2f\n", r.FormatErrors, r.ContextFull)
	}
	tw.Flush()
}

// String is the mean ± its standard error.
func (s Stat) String() string { return fmt.Sprintf("%.3f ± %.3f", s.Mean, s.SE) }

func writeJSONFile(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// Chart draws the table as a PNG: J, EM and MQ of every method with their
// standard errors.
func Chart(path string, rows []Row) error {
	var names []string
	var vals, errs [][]float64
	for _, r := range rows {
		names = append(names, r.Policy)
		vals = append(vals, []float64{r.J.Mean, r.EM.Mean, r.MQ.Mean})
		errs = append(errs, []float64{r.J.SE, r.EM.SE, r.MQ.SE})
	}
	n := 0
	if len(rows) > 0 {
		n = rows[0].Tasks
	}
	return chart.Bars(path, fmt.Sprintf("Held-out tasks (%d): mean and standard error", n), "score (0 to 1)",
		names, []string{"J (judge)", "EM", "MQ (memory quality)"}, vals, errs)
}
