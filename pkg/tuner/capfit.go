package tuner

// The device's transfer capacity fitted on its unqueued reads
// (model.CapacityFit), whose latency is a fixed cost plus bytes over the
// rate: a fail-slow device raises the fixed cost, not the rate. Unqueued
// reads are few per window, so each Step's cells join a decaying pool per
// size class (capPool). The detector's own regimes keep its decaying peak.

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/tuner/model"
)

const (
	// capMinCell: the decayed requests a pooled size class needs to be a point.
	capMinCell = 8
	// satFreshAge: a saturation point learned this recently wins over a higher
	// fit (the step saw the device now); older, the larger of the two wins.
	satFreshAge = 5 * time.Minute
	// capSaveMoved: a fit moved by more than this share is saved with the priors.
	capSaveMoved = 0.05
)

// fitCapacity pools ds's unqueued cells and fits the device's transfer
// capacity on the pool (or the window's profile); a fit that cannot say
// leaves the last. A fit that moved by capSaveMoved is saved with the priors.
func (t *Tuner) fitCapacity(ds detector.DeviceStats, now time.Duration) {
	f := t.capFits[ds.Device]
	if f == nil {
		if _, watched := t.watchedAt[ds.Device]; !watched {
			return // as many devices as are watched
		}
		f = &capFit{}
		t.capFits[ds.Device] = f
	}
	f.pool.add(now, ds.Unqueued)
	ds.Unqueued = f.pool.pooled()
	c, ok := model.CapacityFit(ds, capMinCell)
	if !ok {
		return
	}
	f.last, f.ok = c, true
	if d := t.devs[ds.Device]; d != nil && d.name != "" {
		if old := t.mem.Fitted(d.name); old == 0 || math.Abs(c.BPS-old) > capSaveMoved*old {
			t.mem.SetFitted(d.name, c.BPS, time.Now())
		}
	}
}

// fitted is the device's fitted transfer capacity: this run's last fit,
// else the one saved with the priors; 0 when none.
func (t judgeCtx) fitted(dev probe.Dev) float64 {
	if f := t.capFits[dev]; f != nil && f.ok {
		return f.last.BPS
	}
	if d := t.devs[dev]; d != nil && d.name != "" {
		return t.mem.Fitted(d.name)
	}
	return 0
}

// capSource says which knowledge a capacity comes from.
type capSource string

const (
	capNone       capSource = ""
	capFitted     capSource = "fit"        // fitted on the device's latencies
	capSaturation capSource = "saturation" // a step that added bytes in flight and no throughput
	capPeak       capSource = "peak"       // the detector's decaying best rate seen
	// capPeakOverFit: the peak, above the fit: the device read faster
	// than the fit says (it serves several requests at once, say).
	capPeakOverFit capSource = "peak over fit"
)

// known reports whether the capacity is the model's, not the best rate seen
// (on a device slow from the start, its slow rate).
func (s capSource) known() bool { return s == capFitted || s == capSaturation || s == capPeakOverFit }

// capacity is the device's one capacity in bytes per second and where it
// comes from: a saturation point learned within satFreshAge; else the fit,
// raised to an older saturation point or to the peak above it (an unqueued
// fit can underestimate a device serving several requests at once); else
// the saturation point; else the detector's peak; 0 when nothing knows.
func (t judgeCtx) capacity(dev probe.Dev) (float64, capSource) {
	d := t.devs[dev]
	peak, fit, sat := t.dstats[dev].CapacityBPS, t.fitted(dev), t.learnedCapacity(d)
	switch {
	case d != nil && t.satFresh(d, sat):
		return sat, capSaturation
	case fit > 0:
		c, src := fit, capFitted
		if sat > c {
			c, src = sat, capSaturation
		}
		if peak > c {
			c, src = peak, capPeakOverFit
		}
		return c, src
	case sat > 0:
		return sat, capSaturation
	}
	if peak > 0 {
		return peak, capPeak
	}
	return 0, capNone
}

// satFresh reports whether d's saturation point sat is within satFreshAge.
func (t judgeCtx) satFresh(d *devState, sat float64) bool {
	return sat > 0 && d.satSeen && t.deps.Clock.Now()-d.satAt <= satFreshAge
}

// knownCapacity is the device's capacity if the model knows it, else 0.
func (t judgeCtx) knownCapacity(dev probe.Dev) float64 {
	if c, src := t.capacity(dev); src.known() {
		return c
	}
	return 0
}

// capacityOrBusy is the device's capacity, or before anything knows it
// what it reads now (its other readers included): a lower bound.
func (t judgeCtx) capacityOrBusy(dev probe.Dev) float64 {
	if c, _ := t.capacity(dev); c > 0 {
		return c
	}
	return t.dstats[dev].BusyThroughput
}

// logCapacity logs, at debug, a device's capacity and its sources.
func (t judgeCtx) logCapacity(dev probe.Dev) {
	if !t.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	d := t.devs[dev]
	var name string
	sat, fresh := t.learnedCapacity(d), false
	if d != nil {
		name, fresh = d.name, t.satFresh(d, sat)
	}
	var last model.Capacity
	if f := t.capFits[dev]; f != nil {
		last = f.last
	}
	c, src := t.capacity(dev)
	t.log.Debug("tuner: device capacity", "dev", dev.String(), "device", name, "capacity_mbps", c/1e6, "source", string(src),
		"fitted_mbps", t.fitted(dev)/1e6, "fit_from", last.From, "fit_fixed", last.Fixed, "fit_points", last.Points,
		"fit_requests", last.Requests, "saturation_mbps", sat/1e6, "saturation_fresh", fresh,
		"peak_mbps", t.dstats[dev].CapacityBPS/1e6, "busy_mbps", t.dstats[dev].BusyThroughput/1e6, "bytes", t.dstats[dev].Bytes)
}

// learnedCapacity is the capacity learnCapacity learned for d, or 0.
func (t *Tuner) learnedCapacity(d *devState) float64 {
	if d == nil {
		return 0
	}
	return t.mem.Capacity(d.name)
}
