// Package model is the tuner's model of a device in pure functions: its
// transfer capacity fitted on its latencies. It knows the detector's
// statistics and nothing of descriptors, ladders or clocks.
//
// By Little's law a stream keeps Q bytes in flight and reads at X = Q/L,
// L its latency. Below the device's capacity C more bytes in flight add
// throughput at the same latency; at C they only add latency (for every
// reader of the device).
package model

import (
	"math"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
)

// Capacity is a device's transfer capacity fitted on its latencies.
type Capacity struct {
	BPS float64 // bytes per second through the device's transfer
	// Fixed is the latency of a request of no bytes (L0): a fail-slow
	// device's added cost shows here, not in BPS. Zero when saturated.
	Fixed    time.Duration
	Points   int    // cells fitted
	Requests int    // requests in those cells
	From     string // "unqueued" (size fit) or "saturated" (busy rate at a rising queue)
}

// riseMin: latency rises with the bytes queued when, over the depths of
// the profile, it rises by at least this share of its shallowest median: a
// device below its capacity serves its queue in parallel at one latency
// (a fail-slow one too: +3 ms at every depth), and noise on a flat line is
// no rise.
const riseMin = 0.2

// CapacityFit is the device's transfer capacity. First from its unqueued
// requests (no other read in flight): latency is a fixed cost plus bytes
// over the transfer rate, L ≈ L0 + size/B, fitted by least squares on the
// medians of cells of at least minCell requests, two sizes a factor two
// apart. Otherwise from its profile: when the median latency rises with the
// bytes queued (P50 ≈ L0 + Q/C), the device is at its capacity and its busy
// throughput is that capacity; the slope itself is not (a request's depth
// counts those behind it, not those it waited for: docs/tuner.md). ok is
// false when neither can say. It is not the best rate seen: a fail-slow
// device reads a stream at a fraction of its capacity, its L0 rises, B
// stays, and its latency does not rise with depth.
func CapacityFit(ds detector.DeviceStats, minCell int) (Capacity, bool) {
	if c, ok := sizeFit(ds.Unqueued, minCell); ok {
		return c, true
	}
	c, rising := queueRise(ds.Profile, minCell)
	if !rising || ds.BusyThroughput <= 0 {
		return Capacity{}, false
	}
	c.BPS, c.From = ds.BusyThroughput, "saturated"
	return c, true
}

// sizeFit fits latency on size over the unqueued cells.
func sizeFit(cells []detector.LatencyCell, minCell int) (Capacity, bool) {
	var xs, ys []float64
	var c Capacity
	for _, u := range cells {
		if u.Requests < minCell || u.MeanSize <= 0 || u.P50 <= 0 {
			continue
		}
		xs = append(xs, u.MeanSize)
		ys = append(ys, float64(u.P50))
		c.Requests += u.Requests
	}
	if len(xs) < 2 || slices.Max(xs) < 2*slices.Min(xs) {
		return Capacity{}, false
	}
	slope, icept := leastSquares(xs, ys)
	if slope <= 0 {
		return Capacity{}, false
	}
	c.BPS = 1e9 / slope // slope in ns per byte
	c.Fixed = time.Duration(icept)
	c.Points, c.From = len(xs), "unqueued"
	return c, true
}

// queueRise reports whether the profile's median latency rises with the
// bytes queued around the requests: the pooled slope over each size
// class's depth buckets (cells of at least minCell requests), across the
// widest span of bytes queued fitted, at least riseMin of the lowest
// median. c counts the cells and requests it looked at.
func queueRise(cells []detector.LatencyCell, minCell int) (c Capacity, rising bool) {
	byClass := map[uint8][]detector.LatencyCell{}
	for _, u := range cells {
		if u.Requests >= minCell && u.P50 > 0 && u.QueueBytes > 0 {
			byClass[u.Class] = append(byClass[u.Class], u)
		}
	}
	var sxy, sxx float64
	lowest, span := math.Inf(1), 0.0
	for _, cs := range byClass {
		if len(cs) < 2 {
			continue
		}
		xs, ys := make([]float64, len(cs)), make([]float64, len(cs))
		for i, u := range cs {
			xs[i], ys[i] = u.QueueBytes, float64(u.P50)
			c.Requests += u.Requests
		}
		mx, my := mean(xs), mean(ys)
		for i := range xs {
			sxy += (xs[i] - mx) * (ys[i] - my)
			sxx += (xs[i] - mx) * (xs[i] - mx)
		}
		c.Points += len(cs)
		lowest = min(lowest, slices.Min(ys))
		span = max(span, slices.Max(xs)-slices.Min(xs))
	}
	if sxx <= 0 || sxy <= 0 {
		return c, false
	}
	return c, sxy/sxx*span >= riseMin*lowest
}

func leastSquares(xs, ys []float64) (slope, icept float64) {
	mx, my := mean(xs), mean(ys)
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return 0, my
	}
	slope = sxy / sxx
	return slope, my - slope*mx
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}
