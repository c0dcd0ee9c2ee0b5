package tuner

import (
	"math"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/tuner/model"
)

// capHalfLife: a Step's unqueued cells count half after this long (the
// detector's LongWindow): long enough to fill two size classes' cells, short
// enough to refit a device whose rate changed within a few half-lives.
const capHalfLife = 10 * time.Second

// capPool is a device's unqueued latency cells pooled across Steps, per
// size class: decayed requests, and their decayed sums of mean size and
// median latency weighted by requests. A detector window reaching back past
// the last Step counts its older requests again: the pool leans to them.
type capPool struct {
	at    time.Duration
	cells map[uint8]*poolCell
}

type poolCell struct{ n, size, lat float64 }

// add decays the pool to now and adds the window's unqueued cells.
func (p *capPool) add(now time.Duration, cells []detector.LatencyCell) {
	if p.cells == nil {
		p.cells = map[uint8]*poolCell{}
	}
	if now > p.at && p.at > 0 {
		f := math.Exp2(-float64(now-p.at) / float64(capHalfLife))
		for k, c := range p.cells {
			c.n, c.size, c.lat = c.n*f, c.size*f, c.lat*f
			if c.n < 0.5 {
				delete(p.cells, k)
			}
		}
	}
	p.at = max(p.at, now)
	for _, u := range cells {
		if u.Requests <= 0 || u.MeanSize <= 0 || u.P50 <= 0 {
			continue
		}
		c := p.cells[u.Class]
		if c == nil {
			c = &poolCell{}
			p.cells[u.Class] = c
		}
		n := float64(u.Requests)
		c.n += n
		c.size += n * u.MeanSize
		c.lat += n * float64(u.P50)
	}
}

// pooled is the pool as unqueued cells: per size class, its decayed
// requests (rounded down), mean size and request-weighted median latency.
func (p *capPool) pooled() []detector.LatencyCell {
	out := make([]detector.LatencyCell, 0, len(p.cells))
	for k, c := range p.cells {
		out = append(out, detector.LatencyCell{Class: k, Requests: int(c.n), MeanSize: c.size / c.n, P50: time.Duration(c.lat / c.n)})
	}
	slices.SortFunc(out, func(a, b detector.LatencyCell) int { return int(a.Class) - int(b.Class) })
	return out
}

// capFit is a device's pool and the last capacity fitted on it, kept for
// every device the detector reports, so a fit precedes any decision there.
type capFit struct {
	pool capPool
	last model.Capacity
	ok   bool
}
