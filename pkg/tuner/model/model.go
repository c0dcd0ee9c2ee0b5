// Package model is the tuner's control model in pure functions: a device's
// transfer capacity fitted on its latencies, the headroom a stream may
// still take of it, whether a stream is bound by its window, the window
// that reaches a target rate by Little's law, and the random readers'
// budget of bytes queued. It knows the detector's statistics and nothing of
// descriptors, ladders or clocks: the tuner gives it numbers and reads
// numbers back.
//
// Little's law ties them: a stream keeps Q bytes in flight and reads at
// X = Q/L, L its latency. Below the device's capacity C more bytes in
// flight add throughput at the same latency; at C they only add latency
// (for every reader of the device).
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
// requests (issued with no other read in flight): their latency is the
// device's fixed cost plus their own bytes over its transfer rate,
// L ≈ L0 + size/B, fitted by least squares on the cells' medians at
// their mean sizes, cells of at least minCell requests, at least two
// sizes a factor two apart. Otherwise from its profile: when its median
// latency rises with the bytes queued around the requests (P50 ≈ L0 +
// Q/C, one slope over the depth buckets of every size class), the device
// is at its capacity, and its busy throughput over the window is that
// capacity (its transfer never idles while requests wait). The slope
// itself is no capacity: the depth a request completes with counts the
// requests behind it, not those it waited for, and on the detector's
// simulated lab device the slope said 1.8x (40 MB/s) and 4.8x (150 MB/s)
// the capacity. ok is false when neither can say: a device never idle has
// no unqueued requests, one never queued no rise.
//
// It is not the best rate seen: a fail-slow device (every request +3 ms)
// reads a stream at a fraction of its capacity, its L0 rises and its B
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

// Headroom is what of capacity c a stream may still take, in bytes per
// second: what the device leaves unread (c less its total, the random
// readers and every stream in it), and what contenders (sequential
// readers readaheadd does not serve: O_DIRECT, files outside the
// allow-paths) read beyond their fair share, c over the streams bound by
// their window and the contenders together: that share a larger window
// legitimately wins back. Zero or less: no headroom.
func Headroom(c, total float64, contenders []float64, bound int) float64 {
	h := c - total
	if n := max(bound, 1) + len(contenders); len(contenders) > 0 {
		fair := c / float64(n)
		for _, x := range contenders {
			h += max(0, x-fair)
		}
	}
	return h
}

// FillMin is the share of a stream's window that must be in flight for the
// stream to count as bound by it (the tuner's inflightFill): a sequential
// reader on asynchronous readahead keeps between half its window and all
// of it queued; one limited by its application leaves it mostly empty.
const FillMin = 0.4

// BusyMin is the share of the span a stream's requests must have been in
// flight for it to count as bound by its window: a reader that waits on
// its application most of the time is not waiting on its window.
const BusyMin = 0.5

// InFlight is a stream's bytes in flight, Q: its mean requests in flight
// while busy times their mean size.
func InFlight(fs detector.FileStats) float64 { return fs.Inflight * fs.MeanSize }

// Rate is what a stream reads by Little's law, X = Q/L with L its median
// latency, in bytes per second; 0 without a latency.
func Rate(fs detector.FileStats) float64 {
	if fs.P50 <= 0 {
		return 0
	}
	return InFlight(fs) / fs.P50.Seconds()
}

// WindowBound reports whether a stream with the window windowKB is bound
// by it over span, and why: sequential (minSeq or more), its bytes in
// flight filling at least FillMin of the window, and its requests in
// flight for at least BusyMin of span (its bytes over its busy rate).
// Whether the device has room for more is Headroom's, and the regimes are
// labels: a window-bound stream with headroom needs a step whatever they
// say (Needs).
func WindowBound(fs detector.FileStats, windowKB int, span time.Duration, minSeq float64) (bool, string) {
	switch {
	case fs.Sequentiality < minSeq:
		return false, "not sequential"
	case windowKB <= 0:
		return false, "window unknown"
	case fs.Inflight <= 0 || fs.MeanSize <= 0 || fs.BusyThroughput <= 0 || fs.Bytes == 0:
		return false, "no requests in flight"
	case InFlight(fs) < FillMin*float64(windowKB)*1024:
		return false, "its window is mostly empty"
	case span > 0 && float64(fs.Bytes)/fs.BusyThroughput < BusyMin*span.Seconds():
		return false, "idle most of the span"
	}
	return true, "its bytes in flight fill its window"
}

// Needs reports whether a stream bound by its window that reads x bytes
// per second needs a larger one: the device's headroom h must hold what a
// step has to gain to be kept, half the keep margin of x (a step to the
// capacity gains at least that).
func Needs(bound bool, h, x, margin float64) bool { return bound && h > margin/2*x }

// Grid is the tuner's ladder of windows: BaseKB times Growth to a power,
// capped at MaxKB (from a device's window, each step multiplies by
// Growth).
type Grid struct{ BaseKB, Growth, MaxKB int }

// Up is the smallest window of the grid at or above kb, at most MaxKB.
func (g Grid) Up(kb int) int {
	n := max(g.BaseKB, 1)
	for n < kb && n < g.MaxKB && g.Growth > 1 {
		n *= g.Growth
	}
	return min(n, g.MaxKB)
}

// Stream is a stream bound by its window, for its step: it reads X bytes
// per second at latency L with a window of WindowKB.
type Stream struct {
	X        float64
	L        time.Duration
	WindowKB int
}

// TargetKB is the window (KB, rounded up) stream s needs to read its
// target rate, 0 for none. Its target takes its share of the headroom h
// among the n streams bound by their windows, short of the capacity c by
// half the margin (where a step still pays): X_t = min(X + h/n,
// c/(1+margin/2)). Its latency without the queue its window makes is L
// less the wait behind half the window at c, and the target's window
// queues half of itself in turn: W_t = X_t(L - W/2c) / (1 - X_t/2c). L is
// the median for the median's rate, a tail latency to read through the
// tail. None without headroom, when the window's queue is all of L (the
// device binds it), or at a target of twice the capacity or more (the
// formula turns negative; only a margin under -1 sets one).
func TargetKB(s Stream, c, h float64, n int, margin float64) int {
	if h <= 0 || c <= 0 || s.X < 0 || s.L <= 0 || s.WindowKB <= 0 {
		return 0
	}
	xt := min(s.X+h/float64(max(n, 1)), c/(1+margin/2))
	bare := s.L.Seconds() - float64(s.WindowKB)*1024/(2*c)
	den := 1 - xt/(2*c)
	if bare <= 0 || den <= 0 {
		return 0
	}
	return int(math.Ceil(xt * bare / den / 1024))
}

// StepKB is the window on grid g that a step of stream s takes (TargetKB
// rounded up on the grid, at most its MaxKB), 0 for no step: no target, or
// none larger than its window.
func StepKB(s Stream, c, h float64, n int, margin float64, g Grid) int {
	t := TargetKB(s, c, h, n, margin)
	if t <= 0 {
		return 0
	}
	if kb := g.Up(t); kb > s.WindowKB {
		return kb
	}
	return 0
}

// TailBudget is the random readers' p99 budget: at most this many times
// their reference (the tuner's randTailBudget).
const TailBudget = 1.05

// Reader is one random reader beside the device's streams, for its budget.
type Reader struct {
	// Ref is the p99 it is held to (its reference, or its p99 at the
	// device's window); Now its p99 at the device's window now (what the
	// raised windows' account says it would be without them).
	Ref, Now time.Duration
	// Spared is the transfer a trim coming with the step spares each of
	// its requests, in bytes: the part of its read-around it will no
	// longer read (0 when Now was measured with its trim).
	Spared float64
}

// BudgetBytes is how many bytes the device's windows may still queue
// beyond its own window, over all knobs (file windows, priors, prefetch,
// the device's window times its streams): each byte queued delays a
// random reader's worst requests by slack transfers of a byte at capacity
// c (randSlack until steps show less; a learned delay k per byte is slack
// k*c), so a reader allows (TailBudget*Ref - Now)*c/slack bytes, plus
// Spared/slack (its trim spares it Spared/c of its latency); the least
// reader sets the budget, less raised, what the raised windows queue
// already. ok is false with no reader or no capacity;
// a budget of zero or less allows no step.
func BudgetBytes(readers []Reader, c, slack, raised float64) (float64, bool) {
	if len(readers) == 0 || c <= 0 || slack <= 0 {
		return 0, false
	}
	least := math.Inf(1)
	for _, r := range readers {
		room := (TailBudget*r.Ref.Seconds()-r.Now.Seconds())*c/slack + r.Spared/slack
		least = min(least, room)
	}
	return least - raised, true
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
