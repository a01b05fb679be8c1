package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Metrics appends one JSON object per line to a file and keeps every
// numeric series for the curves.
type Metrics struct {
	f      *os.File
	w      *bufio.Writer
	Series map[string][]Point
}

// Point is one value of a series at a step.
type Point struct{ Step, Value float64 }

// OpenMetrics creates (or, when resuming, appends to) path, and its folder.
func OpenMetrics(path string, appendTo bool) (*Metrics, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	m := &Metrics{Series: map[string][]Point{}}
	if appendTo {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
		if err := m.readBack(path); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, err
	}
	m.f, m.w = f, bufio.NewWriter(f)
	return m, nil
}

// readBack loads the series of an earlier run so the curves stay whole.
func (m *Metrics) readBack(path string) error {
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for i, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		m.keep(rec)
	}
	return nil
}

func (m *Metrics) keep(rec map[string]any) {
	step, _ := rec["step"].(float64)
	for k, v := range rec {
		if f, ok := v.(float64); ok && k != "step" {
			m.Series[k] = append(m.Series[k], Point{step, f})
		}
	}
}

// Log writes one record; "step" should be among its keys.
func (m *Metrics) Log(rec map[string]any) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	var back map[string]any
	json.Unmarshal(raw, &back)
	m.keep(back)
	if _, err := m.w.Write(append(raw, '\n')); err != nil {
		return err
	}
	return m.w.Flush()
}

// Close flushes and closes the file; closing again does nothing.
func (m *Metrics) Close() error {
	if m.f == nil {
		return nil
	}
	f := m.f
	m.f = nil
	if err := m.w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// palette colours the series of one plot.
var palette = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255}, {148, 103, 189, 255}}

// Plot draws the named series against step as a PNG line chart with axes,
// tick labels and a legend.
func Plot(path, title string, series map[string][]Point) error {
	const W, H, left, right, top, bottom = 720, 420, 64, 16, 32, 40
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	names := make([]string, 0, len(series))
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for name, pts := range series {
		if len(pts) == 0 {
			continue
		}
		names = append(names, name)
		for _, p := range pts {
			if math.IsNaN(p.Value) || math.IsInf(p.Value, 0) {
				continue
			}
			xmin, xmax = math.Min(xmin, p.Step), math.Max(xmax, p.Step)
			ymin, ymax = math.Min(ymin, p.Value), math.Max(ymax, p.Value)
		}
	}
	sort.Strings(names)
	if len(names) == 0 || math.IsInf(xmin, 0) {
		return fmt.Errorf("plot %s: no points", path)
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax == ymin {
		ymax, ymin = ymax+0.5, ymin-0.5
	}
	pad := (ymax - ymin) * 0.05
	ymin, ymax = ymin-pad, ymax+pad
	px := func(x float64) int { return left + int((x-xmin)/(xmax-xmin)*float64(W-left-right)) }
	py := func(y float64) int { return H - bottom - int((y-ymin)/(ymax-ymin)*float64(H-top-bottom)) }
	grey, black := color.RGBA{200, 200, 200, 255}, color.RGBA{0, 0, 0, 255}
	for i := 0; i <= 4; i++ {
		y := ymin + (ymax-ymin)*float64(i)/4
		line(img, left, py(y), W-right, py(y), grey)
		text(img, 4, py(y)+4, fmt.Sprintf("%.3g", y), black)
		x := xmin + (xmax-xmin)*float64(i)/4
		text(img, px(x)-12, H-bottom+16, fmt.Sprintf("%.0f", x), black)
	}
	line(img, left, H-bottom, W-right, H-bottom, black)
	line(img, left, top, left, H-bottom, black)
	text(img, left, 18, title, black)
	text(img, W/2-12, H-6, "step", black)
	for i, name := range names {
		c := palette[i%len(palette)]
		var prev *Point
		for _, p := range series[name] {
			if math.IsNaN(p.Value) || math.IsInf(p.Value, 0) {
				continue
			}
			if prev != nil {
				line(img, px(prev.Step), py(prev.Value), px(p.Step), py(p.Value), c)
			} else {
				img.Set(px(p.Step), py(p.Value), c)
			}
			prev = &p
		}
		lx := W - right - 150
		ly := top + 14*(i+1)
		line(img, lx, ly-4, lx+20, ly-4, c)
		text(img, lx+26, ly, name, black)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// line draws with Bresenham's algorithm.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}

// Progress draws a one-line progress bar on a terminal and plain log lines
// elsewhere (every tenth of the run), with the latest figures.
type Progress struct {
	w        io.Writer
	total    int
	tty      bool
	start    time.Time
	lastTick int
}

// NewProgress reports on w; tty selects the redrawn bar.
func NewProgress(w io.Writer, total int, tty bool) *Progress {
	return &Progress{w: w, total: total, tty: tty, start: time.Now(), lastTick: -1}
}

// Update shows step (1-based) of the total with a status.
func (p *Progress) Update(step int, status string) {
	el := time.Since(p.start)
	eta := time.Duration(0)
	if step > 0 {
		eta = el / time.Duration(step) * time.Duration(p.total-step)
	}
	if p.tty {
		const width = 30
		n := width * step / max(p.total, 1)
		fmt.Fprintf(p.w, "\r[%s%s] %d/%d %s eta %s ", strings.Repeat("=", n), strings.Repeat(" ", width-n), step, p.total, status, eta.Round(time.Second))
		if step == p.total {
			fmt.Fprintln(p.w)
		}
		return
	}
	if tick := 10 * step / max(p.total, 1); tick != p.lastTick || step == p.total {
		p.lastTick = tick
		fmt.Fprintf(p.w, "step %d/%d %s (%s elapsed)\n", step, p.total, status, el.Round(time.Second))
	}
}
