package console

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"time"
)

// evalRow is the part of a row of agemem-train eval's JSON report (eval.Row,
// which sits above the console's layer) the tables show; the console's
// tests read a report eval wrote and find each row's figures on the page.
type evalRow struct {
	Policy       string             `json:"policy"`
	Tasks        int                `json:"tasks"`
	J            evalStat           `json:"j"`
	EM           evalStat           `json:"em"`
	MQ           evalStat           `json:"mq"`
	Answered     float64            `json:"answered"`
	PromptTokens float64            `json:"avg_prompt_tokens"`
	ToolCalls    map[string]float64 `json:"avg_tool_calls"`
	FormatErrors float64            `json:"avg_format_errors"`
	ContextFull  float64            `json:"context_full"`
}

type evalStat struct {
	Mean float64 `json:"mean"`
	SE   float64 `json:"se"`
}

// evalFile is one report.
type evalFile struct {
	Name     string
	Path     string
	Size     int64
	Modified time.Time
	Rows     []evalRow
}

// maxEvalBytes skips JSON files too large to be a report (a tokenizer, a
// dataset) without reading them.
const maxEvalBytes = 8 << 20

// evalAt reads path if it is an evaluation report (a JSON array of rows
// that name a policy and a task count), remembering it while its size and
// time hold. The caller holds rs.mu.
func (rs *runStore) evalAt(path, name string, d fs.DirEntry) *evalFile {
	info, err := d.Info()
	if err != nil || info.Size() > maxEvalBytes || info.Size() < 2 {
		return nil
	}
	if ef := rs.evalMem[path]; ef != nil && ef.Size == info.Size() && ef.Modified.Equal(info.ModTime()) {
		if ef.Rows == nil {
			return nil
		}
		return ef
	}
	ef := &evalFile{Name: name, Path: path, Size: info.Size(), Modified: info.ModTime()}
	rs.evalMem[path] = ef
	raw, err := os.ReadFile(path)
	if err != nil || raw[0] != '[' {
		return nil
	}
	var rows []evalRow
	if json.Unmarshal(raw, &rows) != nil || len(rows) == 0 {
		return nil
	}
	for _, r := range rows {
		if r.Policy == "" || r.Tasks == 0 {
			return nil
		}
	}
	ef.Rows = rows
	return ef
}

// evalTool is a tool column: the tool's name and its short header.
type evalTool struct{ Name, Label string }

// evalTools are the tool columns, in Figure 7's order.
var evalTools = []evalTool{{"Add_memory", "add"}, {"Update_memory", "update"}, {"Delete_memory", "delete"},
	{"Retrieve_memory", "retrieve"}, {"Summary_context", "summary"}, {"Filter_context", "filter"}}

type evalsData struct {
	Files []evalFile
	Tools []evalTool
}

// evals shows the chosen reports' rows in one table (?file=a&file=b),
// every report when none is chosen.
func (c *Console) evals(w http.ResponseWriter, r *http.Request) {
	_, all, err := c.runs.scan()
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	want := r.URL.Query()["file"]
	d := evalsData{Tools: evalTools}
	for _, ef := range all {
		if len(want) == 0 || slices.Contains(want, ef.Name) {
			d.Files = append(d.Files, ef)
		}
	}
	if len(want) > 0 && len(d.Files) < len(want) {
		c.fail(w, r, http.StatusNotFound, "no evaluation report of that name below the runs folder")
		return
	}
	c.render(w, http.StatusOK, "evals", c.page(r, "runs", "Evaluations", d))
}
