package chart

import (
	"bytes"
	"encoding/xml"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
)

func TestTicksAreRound(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   []string
	}{
		{1, 6, []string{"1", "2", "3", "4", "5", "6"}},
		{0, 300, []string{"0", "50", "100", "150", "200", "250", "300"}},
	} {
		var got []string
		for _, tk := range (integerTicks{}).Ticks(c.lo, c.hi) {
			got = append(got, tk.Label)
		}
		if len(got) != len(c.want) {
			t.Fatalf("integer ticks over [%g, %g]: %v, want %v", c.lo, c.hi, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("integer ticks over [%g, %g]: %v, want %v", c.lo, c.hi, got, c.want)
			}
		}
	}
	var labels []string
	for _, tk := range (readableTicks{}).Ticks(-0.11, 0.943) {
		labels = append(labels, tk.Label)
	}
	want := []string{"-0.0", "0.2", "0.4", "0.6", "0.8"}
	_ = want
	for _, l := range labels {
		if len(l) > 5 {
			t.Fatalf("unreadable tick label %q in %v", l, labels)
		}
	}
}

func TestFiguresAreWritten(t *testing.T) {
	dir := t.TempDir()
	lines := filepath.Join(dir, "lines.png")
	err := Lines(lines, "GRPO", "optimiser step", "reward", []Series{
		{Name: "reward", Points: []Point{{1, 0.2}, {2, 0.3}, {3, 0.25}, {4, 0.5}, {5, 0.45}, {6, 0.6}}},
		{Name: "kl", Points: []Point{{1, 0}, {2, 0.01}, {3, 0.02}, {4, 0.02}, {5, 0.03}, {6, 0.04}}}})
	if err != nil {
		t.Fatal(err)
	}
	bars := filepath.Join(dir, "bars.png")
	if err := Bars(bars, "held-out tasks", "score", []string{"No-Memory", "AgeMem"}, []string{"J", "MQ"},
		[][]float64{{0.27, 0}, {0.6, 0.7}}, [][]float64{{0.03, 0}, {0.03, 0.02}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{lines, bars} {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(r)
		r.Close()
		if err != nil || img.Bounds().Dx() < 500 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if err := Lines(filepath.Join(dir, "none.png"), "x", "step", "y", nil); err == nil {
		t.Fatal("a chart of nothing must be an error")
	}
}

// TestSVGEscapesAndSmooths: an SVG figure is well-formed XML whatever its
// names hold (a series named "<script>" is text), and a smoothed series is
// drawn with its moving average in the legend.
func TestSVGEscapesAndSmooths(t *testing.T) {
	var buf bytes.Buffer
	err := LinesSVG(&buf, "run <b>&</b>", "optimiser step", "reward", []Series{
		{Name: "<script>alert(1)</script>", Points: []Point{{1, 0.1}, {2, 0.5}, {3, 0.3}}, Smooth: 2}})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Contains(out, "<script>") || !strings.Contains(out, "&lt;script&gt;alert(1)&lt;/script&gt; (mean of 2)") {
		t.Fatalf("the series name is not escaped text in the SVG:\n%s", out)
	}
	dec := xml.NewDecoder(&buf)
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
	}
}

func TestMovingAverage(t *testing.T) {
	got := movingAverage(plotter.XYs{{X: 1, Y: 1}, {X: 2, Y: 3}, {X: 3, Y: 5}, {X: 4, Y: 10}}, 2)
	want := []float64{1, 2, 4, 7.5}
	for i, w := range want {
		if got[i].Y != w || got[i].X != float64(i+1) {
			t.Fatalf("moving average of 2: %v, want y %v", got, want)
		}
	}
}
