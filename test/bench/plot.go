package bench

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

var (
	colDefault = color.RGBA{R: 200, G: 60, B: 50, A: 255}
	colOracle  = color.RGBA{R: 60, G: 110, B: 200, A: 255}
	colDaemon  = color.RGBA{R: 30, G: 150, B: 60, A: 255}
	colEvent   = color.RGBA{R: 120, G: 120, B: 120, A: 255}
)

// Write stores the report in dir: README.md, results.json and the plots.
func Write(r *Report, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plots, err := Plots(r, dir)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(r.Markdown(plots)), 0o644)
}

func slug(s string) string {
	r := strings.NewReplacer("+", "", ".", "_", " ", "-", "/", "-")
	return r.Replace(s)
}

// Plots draws the PNGs and returns their file names.
func Plots(r *Report, dir string) ([]string, error) {
	var names []string
	for _, g := range r.Groups() {
		if g.Daemon() == nil || g.Default() == nil {
			continue
		}
		name := fmt.Sprintf("timeline-%s-%s.png", slug(g.Workload), slug(g.Regime))
		if err := timelinePlot(g, filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		names = append(names, name)
	}
	for _, g := range r.Groups() {
		if g.Regime == RHealthy || g.Daemon() == nil || len(g.Daemon().LatPreMs) == 0 {
			continue
		}
		name := fmt.Sprintf("latency-cdf-%s-%s.png", slug(g.Workload), slug(g.Regime))
		if err := cdfPlot(g, filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		names = append(names, name)
	}
	for _, w := range []string{WSeq, WSendfile, WHDFS} {
		name := fmt.Sprintf("sweep-%s.png", slug(w))
		ok, err := sweepPlot(r, w, filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if ok {
			names = append(names, name)
		}
	}
	return names, nil
}

func line(pts plotter.XYs, c color.Color, dashed bool) (*plotter.Line, error) {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.Color = c
	l.Width = vg.Points(1.2)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	return l, nil
}

func timelinePlot(g Group, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, %s: throughput per 100 ms", g.Workload, g.Regime)
	p.X.Label.Text = "seconds since regime onset"
	p.Y.Label.Text = "MB/s"
	if strings.HasPrefix(g.Workload, "hdfs") {
		p.Y.Label.Text = "device MB/s"
	}
	ymax := 0.0
	for _, a := range []struct {
		r *Result
		c color.Color
	}{{g.Default(), colDefault}, {g.Oracle(), colOracle}, {g.Daemon(), colDaemon}} {
		if a.r == nil || len(a.r.Timeline) == 0 {
			continue
		}
		pts := make(plotter.XYs, len(a.r.Timeline))
		for i, q := range a.r.Timeline {
			pts[i].X, pts[i].Y = q.T, q.MBps
			ymax = math.Max(ymax, q.MBps)
		}
		l, err := line(pts, a.c, false)
		if err != nil {
			return err
		}
		p.Add(l)
		label := a.r.Arm
		if a.r == g.Oracle() {
			label += " (oracle)"
		}
		p.Legend.Add(label, l)
	}
	if ymax == 0 {
		ymax = 1
	}
	d := g.Daemon()
	var evs []EventAt
	if d != nil {
		evs = d.Events
	}
	if len(evs) == 0 {
		evs = []EventAt{{T: 0, What: "onset"}}
	}
	for i, e := range evs {
		l, err := line(plotter.XYs{{X: e.T, Y: 0}, {X: e.T, Y: ymax * 1.05}}, colEvent, true)
		if err != nil {
			return err
		}
		p.Add(l)
		if i == 0 {
			p.Legend.Add("regime change", l)
		}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: e.T, Y: ymax * (1.08 + 0.06*float64(i%3))}}, Labels: []string{e.What}})
		if err == nil {
			p.Add(lb)
		}
	}
	if d != nil && len(d.Actions) > 0 {
		// Decisions only: re-applications to new descriptors would hide them.
		var pts plotter.XYs
		var labels []string
		dec, _ := decisions(d.Actions)
		for _, a := range dec {
			pts = append(pts, plotter.XY{X: a.At.Seconds(), Y: ymax * 0.95})
			labels = append(labels, fmt.Sprintf("%s %d->%d %s", strings.TrimSuffix(a.Action, "_window"), a.FromKB, a.ToKB, a.Result))
		}
		if len(pts) > 0 {
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return err
			}
			sc.Color = colDaemon
			sc.Radius = vg.Points(3)
			p.Add(sc)
			p.Legend.Add("readaheadd action", sc)
		}
	}
	p.Y.Min, p.Y.Max = 0, ymax*1.3
	p.Legend.Top = false
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p.Save(8*vg.Inch, 4*vg.Inch, path)
}

func cdfXY(v []float64) plotter.XYs {
	pts := make(plotter.XYs, len(v))
	for i, x := range v {
		pts[i].X = x
		pts[i].Y = float64(i+1) / float64(len(v))
	}
	return pts
}

func cdfPlot(g Group, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, %s: block read latency CDF", g.Workload, g.Regime)
	p.X.Label.Text = "request latency (ms, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	d, def := g.Daemon(), g.Default()
	series := []struct {
		name   string
		v      []float64
		c      color.Color
		dashed bool
	}{
		{"before onset (readaheadd run, healthy)", d.LatPreMs, colEvent, true},
		{"after onset, default 128 KB", def.LatPostMs, colDefault, false},
		{"after onset, readaheadd", d.LatPostMs, colDaemon, false},
	}
	if o := g.Oracle(); o != nil && o != def {
		series = append(series, struct {
			name   string
			v      []float64
			c      color.Color
			dashed bool
		}{"after onset, " + o.Arm + " (oracle)", o.LatPostMs, colOracle, false})
	}
	for _, s := range series {
		var v []float64
		for _, x := range s.v {
			if x > 0 {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			continue
		}
		l, err := line(cdfXY(v), s.c, s.dashed)
		if err != nil {
			return err
		}
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(5)
	p.Legend.YOffs = vg.Points(20)
	p.Add(plotter.NewGrid())
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}

var sweepColors = []color.Color{
	color.RGBA{R: 30, G: 30, B: 30, A: 255}, colDefault, color.RGBA{R: 230, G: 120, B: 20, A: 255}, colOracle,
	color.RGBA{R: 140, G: 60, B: 170, A: 255}, color.RGBA{R: 20, G: 160, B: 160, A: 255}, color.RGBA{R: 160, G: 120, B: 60, A: 255},
}

func sweepPlot(r *Report, workload, path string) (bool, error) {
	p := plot.New()
	p.Title.Text = workload + ": throughput by static read_ahead_kb, readaheadd's point per regime"
	p.X.Label.Text = "read_ahead_kb (log2)"
	p.Y.Label.Text = "MB/s after onset"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = kbTicks{}
	n := 0
	for _, g := range r.Groups() {
		if g.Workload != workload {
			continue
		}
		var pts plotter.XYs
		var dpt plotter.XYs
		for _, a := range g.Arms {
			if a.Arm == Readaheadd.Name {
				// Drawn at the window it started from, as a marker.
				dpt = append(dpt, plotter.XY{X: float64(a.KB), Y: a.MBps})
				continue
			}
			pts = append(pts, plotter.XY{X: float64(a.KB), Y: a.MBps})
		}
		if len(pts) < 2 {
			continue
		}
		c := sweepColors[n%len(sweepColors)]
		l, err := line(pts, c, false)
		if err != nil {
			return false, err
		}
		p.Add(l)
		p.Legend.Add(g.Regime, l)
		if len(dpt) > 0 {
			// readaheadd as a horizontal dashed line across the sweep:
			// where it sits relative to the best static value is the point.
			hl, err := line(plotter.XYs{{X: pts[0].X, Y: dpt[0].Y}, {X: pts[len(pts)-1].X, Y: dpt[0].Y}}, c, true)
			if err != nil {
				return false, err
			}
			p.Add(hl)
			sc, err := plotter.NewScatter(dpt)
			if err != nil {
				return false, err
			}
			sc.Color = c
			sc.Radius = vg.Points(4)
			p.Add(sc)
		}
		n++
	}
	if n == 0 {
		return false, nil
	}
	if l, err := line(plotter.XYs{{X: 128, Y: 0}}, colEvent, true); err == nil {
		p.Legend.Add("readaheadd (dashed, circle at its start window)", l)
	}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return false, err
	}
	return true, nil
}

// kbTicks labels powers of two.
type kbTicks struct{}

func (kbTicks) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for v := 64.0; v <= 8192; v *= 2 {
		if v >= min*0.99 && v <= max*1.01 {
			out = append(out, plot.Tick{Value: v, Label: fmt.Sprintf("%.0f", v)})
		}
	}
	return out
}
