package failslow

import (
	"math"

	"github.com/readaheadd/readaheadd/pkg/detector"
)

// RefSize is the smallest request size at which disks are compared
// through their cost models: 128 KiB, the kernel's default readahead
// window. Models are compared at the smallest size both disks read in
// quantity, but not below RefSize: a fixed cost added to every request
// shows most at small sizes (at 1-2 MiB the transfer time dilutes it), and
// no model is extrapolated below the sizes it was fitted on.
const RefSize = 128 << 10

// ModelMaxDepth is the deepest depth bucket whose cells feed a cost model
// (1: one or two requests in flight): requests that queued little.
const ModelMaxDepth = 1

// Model is a disk's read latency as a fixed cost per request plus a cost
// per byte, fitted on its lightly queued cells, one point per size class
// (the cell's 10th percentile at its mean size).
type Model struct {
	FixedNS   float64 // ns per request
	PerByteNS float64 // ns per byte
	Points    int     // size classes fitted on
	Requests  int     // requests in those cells
	MinSize   float64 // bytes: the smallest point's mean request size
}

// At is the model's latency in ns for a request of size bytes.
func (m Model) At(size float64) float64 { return m.FixedNS + m.PerByteNS*size }

// Valid reports whether the model can be used: at least two size classes
// and a positive latency at its smallest size.
func (m Model) Valid() bool { return m.Points >= 2 && m.At(m.MinSize) > 0 }

// CompareAt is the size at which models a and b are compared: the larger
// of their smallest sizes, and at least RefSize.
func CompareAt(a, b Model) float64 { return max(a.MinSize, b.MinSize, RefSize) }

// FitModel fits a Model on profile's cells with at least minCell requests
// at depth bucket ModelMaxDepth or less (and, at depth 2, not queued
// behind larger requests), taking each class's shallowest such cell: Theil-Sen (the median of the pairwise slopes, then the median
// intercept), which one odd class cannot swing. A negative slope (noise
// between close sizes) is taken as zero.
func FitModel(profile []detector.LatencyCell, minCell int) Model {
	type pt struct{ x, y float64 }
	var pts []pt
	var m Model
	lastClass := -1
	for _, c := range profile { // sorted by class, then depth
		if int(c.Class) == lastClass || c.Depth > ModelMaxDepth || c.Requests < minCell || c.P10 <= 0 || c.MeanSize <= 0 {
			continue
		}
		// Two in flight, the other one larger: it waited behind more than
		// its own bytes.
		if c.Depth > 0 && c.QueueBytes > 2*c.MeanSize*1.25 {
			continue
		}
		lastClass = int(c.Class)
		pts = append(pts, pt{c.MeanSize, float64(c.P10)})
		m.Requests += c.Requests
	}
	m.Points = len(pts)
	if len(pts) > 0 {
		m.MinSize = pts[0].x
	}
	if len(pts) < 2 {
		return m
	}
	var slopes []float64
	for i := range pts {
		for j := i + 1; j < len(pts); j++ {
			if dx := pts[j].x - pts[i].x; dx > 0 {
				slopes = append(slopes, (pts[j].y-pts[i].y)/dx)
			}
		}
	}
	if len(slopes) == 0 {
		m.Points = 1
		return m
	}
	m.PerByteNS = math.Max(0, median(slopes))
	icepts := make([]float64, len(pts))
	for i, p := range pts {
		icepts[i] = p.y - m.PerByteNS*p.x
	}
	m.FixedNS = median(icepts)
	return m
}
