package console

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/agemem/agemem/internal/chart"
)

// chartSpec is one of a run page's charts: the metrics it draws (those a
// run logged), smoothed when Smooth is set.
type chartSpec struct {
	Title, YLabel string
	Metrics       []string
	Smooth        bool
}

// charts are drawn in this order where a run logged them: GRPO's reward
// and its components, KL and loss; validation J; SFT's and pretraining's
// losses.
var charts = []chartSpec{
	{"Reward and its components", "reward", []string{"reward", "r_task", "r_context", "r_memory"}, true},
	{"KL to the reference policy", "KL (nats per token)", []string{"kl"}, false},
	{"Loss", "loss", []string{"loss", "val_loss"}, false},
	{"Validation J", "J", []string{"val_j"}, false},
	{"Held-out copy loss", "loss", []string{"copy_loss"}, false},
}

type runRow struct {
	runInfo
	Steps  int
	Reward string
	Last   string // the last step's headline figures
}

type runsData struct {
	Runs  []runRow
	Evals []evalFile
}

func (c *Console) runList(w http.ResponseWriter, r *http.Request) {
	runs, evals, err := c.runs.scan()
	if err != nil {
		c.failErr(w, r, err)
		return
	}
	d := runsData{Evals: evals}
	for _, run := range runs {
		row := runRow{runInfo: run}
		if m, err := c.runs.metricsOf(run); err == nil {
			v := m.view()
			row.Steps = v.Steps
			var figs []string
			for _, k := range []string{"reward", "loss", "kl", "val_j"} {
				if x, ok := v.Last[k]; ok {
					figs = append(figs, fmt.Sprintf("%s %.4g", k, x))
				}
			}
			row.Last = strings.Join(figs, ", ")
		}
		d.Runs = append(d.Runs, row)
	}
	p := c.page(r, "runs", "Training runs", d)
	for _, run := range runs {
		if run.Live {
			p.Refresh = int(c.o.Config.Refresh.Seconds())
		}
	}
	c.render(w, http.StatusOK, "runs", p)
}

// chartLink is an <img> of a chart.
type chartLink struct {
	Title string
	URL   string
}

type runData struct {
	Runs    []runInfo
	Charts  []chartLink
	Keys    []string // every metric logged, for the custom chart
	Chosen  []string
	Table   []lastRow
	Bad     []string
	Smooth  int
	Compare bool
}

// lastRow is one metric's last value in each run.
type lastRow struct {
	Key    string
	Values []string
}

func (c *Console) runPage(w http.ResponseWriter, r *http.Request) {
	c.showRuns(w, r, []string{r.URL.Query().Get("name")}, false)
}

// compare draws the chosen runs (?run=a&run=b) on the same charts.
func (c *Console) compare(w http.ResponseWriter, r *http.Request) {
	names := r.URL.Query()["run"]
	if len(names) == 0 {
		c.fail(w, r, http.StatusBadRequest, "choose the runs to compare on the runs page")
		return
	}
	c.showRuns(w, r, names, true)
}

func (c *Console) showRuns(w http.ResponseWriter, r *http.Request, names []string, compare bool) {
	q := r.URL.Query()
	d := runData{Compare: compare, Chosen: q["metric"]}
	d.Smooth, _ = strconv.Atoi(q.Get("smooth"))
	views := make([]metricsView, 0, len(names))
	keys := map[string]bool{}
	for _, name := range names {
		run, ok := c.runs.run(name)
		if !ok {
			c.fail(w, r, http.StatusNotFound, "no run named "+strconv.Quote(name)+" below the runs folder")
			return
		}
		m, err := c.runs.metricsOf(run)
		if err != nil {
			c.failErr(w, r, err)
			return
		}
		v := m.view()
		for _, k := range v.Keys {
			keys[k] = true
		}
		d.Runs, d.Bad = append(d.Runs, run), append(d.Bad, v.Bad...)
		views = append(views, v)
	}
	for k := range keys {
		d.Keys = append(d.Keys, k)
	}
	slices.Sort(d.Keys)
	link := func(title, ylabel string, metrics []string, smooth bool) chartLink {
		v := url.Values{}
		for i, run := range d.Runs {
			v.Add("run", run.Name)
			v.Add("v", strconv.FormatInt(views[i].Size, 10)) // a new URL as the run grows
		}
		for _, m := range metrics {
			v.Add("metric", m)
		}
		if smooth {
			v.Set("smooth", strconv.Itoa(d.Smooth))
		} else {
			v.Set("smooth", "1")
		}
		v.Set("title", title)
		v.Set("y", ylabel)
		return chartLink{title, Prefix + "/runs/chart.svg?" + v.Encode()}
	}
	if len(d.Chosen) > 0 {
		d.Charts = append(d.Charts, link(strings.Join(d.Chosen, ", "), "", d.Chosen, true))
	}
	for _, spec := range charts {
		var ms []string
		for _, m := range spec.Metrics {
			// Several runs on one chart: the headline metric alone, or
			// the chart would hold runs × components lines.
			if keys[m] && (!compare || len(ms) == 0) {
				ms = append(ms, m)
			}
		}
		if len(ms) > 0 {
			d.Charts = append(d.Charts, link(spec.Title, spec.YLabel, ms, spec.Smooth))
		}
	}
	for _, k := range d.Keys {
		row := lastRow{Key: k}
		for _, v := range views {
			s := ""
			if x, ok := v.Last[k]; ok {
				s = fmt.Sprintf("%.4g", x)
			}
			row.Values = append(row.Values, s)
		}
		d.Table = append(d.Table, row)
	}
	title := "Run " + names[0]
	if compare {
		title = "Compare " + strings.Join(names, ", ")
	}
	p := c.page(r, "runs", title, d)
	for _, run := range d.Runs {
		if run.Live {
			p.Refresh = int(c.o.Config.Refresh.Seconds())
		}
	}
	c.render(w, http.StatusOK, "run", p)
}

// autoSmooth is the moving-average window for n points: a tenth of them,
// none below 20 points.
func autoSmooth(n int) int {
	if n < 20 {
		return 1
	}
	return min(n/10, 50)
}

// chart draws runs' metrics as an SVG (?run=…&metric=…&smooth=N&title=…&y=…),
// cached by its query and the runs' sizes.
func (c *Console) chart(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	names, metrics := q["run"], q["metric"]
	if len(names) == 0 || len(metrics) == 0 || len(names)*len(metrics) > 40 {
		c.fail(w, r, http.StatusBadRequest, "a chart names 1 to 40 run × metric lines (?run=…&metric=…)")
		return
	}
	views := make([]metricsView, len(names))
	key := r.URL.RawQuery
	for i, name := range names {
		run, ok := c.runs.run(name)
		if !ok {
			c.fail(w, r, http.StatusNotFound, "no run named "+strconv.Quote(name))
			return
		}
		m, err := c.runs.metricsOf(run)
		if err != nil {
			c.failErr(w, r, err)
			return
		}
		views[i] = m.view(metrics...)
		key += "|" + strconv.FormatInt(views[i].Size, 10)
	}
	svg, ok := c.runs.charts.get(key)
	if !ok {
		smooth, _ := strconv.Atoi(q.Get("smooth"))
		var series []chart.Series
		for i, name := range names {
			for _, k := range metrics {
				label := k
				if len(names) > 1 {
					label = name + ": " + k
				}
				n := smooth
				if n == 0 {
					n = autoSmooth(len(views[i].Series[k]))
				}
				series = append(series, chart.Series{Name: label, Points: views[i].Series[k], Smooth: n})
			}
		}
		title := q.Get("title")
		if title == "" {
			title = strings.Join(metrics, ", ")
		}
		ylabel := q.Get("y")
		if ylabel == "" {
			ylabel = strings.Join(metrics, ", ")
		}
		var buf bytes.Buffer
		if err := chart.LinesSVG(&buf, clip(80, title), "optimiser step", clip(60, ylabel), series); err != nil {
			c.fail(w, r, http.StatusNotFound, "nothing to draw: the runs logged none of "+strings.Join(metrics, ", "))
			return
		}
		svg = buf.Bytes()
		c.runs.charts.put(key, svg)
	}
	// The figure is a document of its own: no script, its inline styles
	// only.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Write(svg)
}

// svgCache keeps recent figures (a page of charts redrawn on every refresh
// costs nothing while the run did not move).
type svgCache struct {
	mu sync.Mutex
	m  map[string][]byte
}

const maxCharts = 256

func (s *svgCache) get(k string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[k]
	return b, ok
}

func (s *svgCache) put(k string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxCharts {
		s.m = map[string][]byte{}
	}
	s.m[k] = b
}
