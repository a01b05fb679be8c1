// Package chart draws the toolkit's figures with gonum/plot: curves of a
// run's logged metrics against its steps (SFT, GRPO, SimCSE) and bar
// charts of evaluation tables. Every figure has labelled axes, integer
// ticks on step axes, markers where a series has few points, and its
// legend below the data rather than over it.
package chart

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Point is one value of a series.
type Point struct{ X, Y float64 }

// Series is a named line.
type Series struct {
	Name   string
	Points []Point
	// Smooth, above 1, draws the points faint and over them their trailing
	// moving average over that many points (a noisy per-step reward reads
	// as a trend without hiding the steps it averages).
	Smooth int
}

// Figure size.
const (
	width  = 8 * vg.Inch
	height = 5 * vg.Inch
)

// palette colours series in order (matplotlib's tab10).
var palette = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}}

// sparse is the most points a series may have and still get markers.
const sparse = 40

// Lines draws series against steps into a PNG at path. xLabel and yLabel
// name the axes with their units (say "optimiser step", "loss (nats per
// token)"); x values are steps, so ticks are integers.
func Lines(path, title, xLabel, yLabel string, series []Series) error {
	p, entries, err := lines(title, xLabel, yLabel, series)
	if err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return save(path, p, entries)
}

// LinesSVG draws the same figure as Lines as an SVG document on w (text
// escaped, fonts named rather than embedded).
func LinesSVG(w io.Writer, title, xLabel, yLabel string, series []Series) error {
	p, entries, err := lines(title, xLabel, yLabel, series)
	if err != nil {
		return fmt.Errorf("chart %q: %w", title, err)
	}
	c := vgsvg.New(width, height)
	drawFigure(c, p, entries)
	_, err = c.WriteTo(w)
	return err
}

func lines(title, xLabel, yLabel string, series []Series) (*plot.Plot, []legendEntry, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	p.X.Tick.Marker = integerTicks{}
	p.Y.Tick.Marker = readableTicks{}
	p.Add(plotter.NewGrid())
	var entries []legendEntry
	for i, s := range series {
		if len(s.Points) == 0 {
			continue
		}
		xy := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			xy[j] = plotter.XY{X: pt.X, Y: pt.Y}
		}
		col := palette[i%len(palette)]
		name := s.Name
		if s.Smooth > 1 {
			faint, err := plotter.NewLine(xy)
			if err != nil {
				return nil, nil, fmt.Errorf("series %s: %w", s.Name, err)
			}
			faint.Color, faint.Width = color.RGBA{col.R, col.G, col.B, 70}, vg.Points(1)
			p.Add(faint)
			xy = movingAverage(xy, s.Smooth)
			name = fmt.Sprintf("%s (mean of %d)", s.Name, s.Smooth)
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, nil, fmt.Errorf("series %s: %w", s.Name, err)
		}
		l.Color, l.Width = col, vg.Points(1.5)
		p.Add(l)
		thumbs := []plot.Thumbnailer{l}
		if len(xy) <= sparse && s.Smooth <= 1 {
			sc, err := plotter.NewScatter(xy)
			if err != nil {
				return nil, nil, err
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: col, Radius: vg.Points(3), Shape: draw.CircleGlyph{}}
			p.Add(sc)
			thumbs = append(thumbs, sc)
		}
		entries = append(entries, legendEntry{name, thumbs})
	}
	if len(entries) == 0 {
		return nil, nil, fmt.Errorf("no points")
	}
	return p, entries, nil
}

// movingAverage is each point's mean with the window-1 points before it
// (fewer at the start).
func movingAverage(xy plotter.XYs, window int) plotter.XYs {
	out := make(plotter.XYs, len(xy))
	sum := 0.0
	for i, pt := range xy {
		sum += pt.Y
		if i >= window {
			sum -= xy[i-window].Y
		}
		out[i] = plotter.XY{X: pt.X, Y: sum / float64(min(i+1, window))}
	}
	return out
}

// Bars draws a grouped bar chart into a PNG at path: one group of bars per
// row (a method), one bar per column (a metric), each with its error bar
// (errs may be nil).
func Bars(path, title, yLabel string, rows, cols []string, values, errs [][]float64) error {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.Y.Label.Text = yLabel
	p.Y.Tick.Marker = readableTicks{}
	p.Add(plotter.NewGrid())
	w := vg.Points(min(40, 300/float64(max(len(cols), 1))))
	var entries []legendEntry
	for j, c := range cols {
		vals := make(plotter.Values, len(rows))
		for i := range rows {
			vals[i] = values[i][j]
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("chart %s: %s: %w", path, c, err)
		}
		b.Color = palette[j%len(palette)]
		b.LineStyle.Width = 0
		b.Offset = vg.Length(float64(j)-float64(len(cols)-1)/2) * w
		p.Add(b)
		entries = append(entries, legendEntry{c, []plot.Thumbnailer{b}})
		if errs != nil {
			pts := make(errorPoints, len(rows))
			for i := range rows {
				pts[i] = errorPoint{X: float64(i), Y: values[i][j], Err: errs[i][j]}
			}
			eb, err := plotter.NewYErrorBars(pts)
			if err != nil {
				return err
			}
			eb.LineStyle.Width = vg.Points(1)
			eb.CapWidth = w / 3
			off := b.Offset
			p.Add(offsetPlotter{eb, off})
		}
	}
	p.NominalX(rows...)
	p.X.Min, p.X.Max = -0.75, float64(len(rows))-0.25
	p.Y.Min = math.Min(0, p.Y.Min)
	return save(path, p, entries)
}

type errorPoint struct{ X, Y, Err float64 }

type errorPoints []errorPoint

func (e errorPoints) Len() int                    { return len(e) }
func (e errorPoints) XY(i int) (float64, float64) { return e[i].X, e[i].Y }
func (e errorPoints) YError(i int) (float64, float64) {
	return e[i].Err, e[i].Err
}

// offsetPlotter draws a plotter shifted horizontally by off (error bars
// over their bar in a group).
type offsetPlotter struct {
	*plotter.YErrorBars
	off vg.Length
}

func (o offsetPlotter) Plot(c draw.Canvas, p *plot.Plot) {
	c.Push()
	defer c.Pop()
	c.Translate(vg.Point{X: o.off})
	o.YErrorBars.Plot(c, p)
}

type legendEntry struct {
	name   string
	thumbs []plot.Thumbnailer
}

// save renders the plot as a PNG with its legend in a band below it,
// outside the data.
func save(path string, p *plot.Plot, entries []legendEntry) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	img := vgimg.New(width, height)
	drawFigure(img, p, entries)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return f.Close()
}

// drawFigure draws the plot on c with its legend in a band below the data.
func drawFigure(c vg.CanvasSizer, p *plot.Plot, entries []legendEntry) {
	dc := draw.New(c)
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	for _, e := range entries {
		leg.Add(e.name, e.thumbs...)
	}
	rows := (len(entries) + 3) / 4
	band := vg.Length(rows)*leg.TextStyle.Font.Size*1.6 + vg.Points(10)
	top := draw.Crop(dc, 0, 0, band, 0)
	p.Draw(top)
	bottom := draw.Crop(dc, 0, 0, 0, -(height - band))
	drawLegendRows(bottom, leg, entries)
}

// drawLegendRows lays the legend out in rows of four entries.
func drawLegendRows(c draw.Canvas, leg plot.Legend, entries []legendEntry) {
	const perRow = 4
	colW := (c.Max.X - c.Min.X) / perRow
	rowH := leg.TextStyle.Font.Size * 1.6
	for i, e := range entries {
		l := plot.NewLegend()
		l.Top, l.Left = true, true
		l.Add(e.name, e.thumbs...)
		x := c.Min.X + vg.Length(i%perRow)*colW
		y := c.Max.Y - vg.Length(i/perRow)*rowH
		cell := draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{Min: vg.Point{X: x + vg.Points(6), Y: y - rowH}, Max: vg.Point{X: x + colW, Y: y}}}
		l.Draw(cell)
	}
}

// integerTicks puts ticks on whole numbers: steps 1, 2 or 5 times a power
// of ten, about six of them.
type integerTicks struct{}

func (integerTicks) Ticks(lo, hi float64) []plot.Tick {
	step := niceStep((hi-lo)/6, true)
	var out []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+1e-9; v += step {
		out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', 0, 64)})
	}
	return out
}

// readableTicks are about six ticks at round values, labelled with as few
// digits as tell them apart.
type readableTicks struct{}

func (readableTicks) Ticks(lo, hi float64) []plot.Tick {
	if hi <= lo {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'g', 3, 64)}}
	}
	step := niceStep((hi-lo)/6, false)
	decimals := max(0, -int(math.Floor(math.Log10(step))))
	var out []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		if math.Abs(v) < step*1e-9 {
			v = 0
		}
		out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', decimals, 64)})
	}
	return out
}

// niceStep rounds raw up to 1, 2 or 5 times a power of ten (at least 1
// when whole).
func niceStep(raw float64, whole bool) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * p
	for _, m := range []float64{1, 2, 5} {
		if m*p >= raw {
			step = m * p
			break
		}
	}
	if whole {
		step = math.Max(1, math.Round(step))
	}
	return step
}
