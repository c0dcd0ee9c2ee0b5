package detector

import (
	"cmp"
	"math"
	"slices"
)

// Device-level statistics over samples of unequal weight.
//
// Above a disk's rate budget the probe streams 1 in N of its samplable
// requests (small ones, and those not read for a file) and every file read
// of 32 KiB or more, so one device window may mix records standing for one
// request with records standing for N. Counts, bytes and the sums behind
// means and Little's law then take each sample w times; percentiles are
// those of the requests the samples stand for (each sample w times); the
// device's busy time is estimated (devBusy). While every sample weighs 1
// (no sampling: the lab's slow devices, any disk under its budget) each of
// these is exactly the plain statistic.

// unitWeights reports whether every sample of set stands for itself.
func unitWeights(set []sample) bool {
	for i := range set {
		if set[i].weight > 1 {
			return false
		}
	}
	return true
}

// weighted is one value with the number of requests it stands for.
type weighted struct {
	v float64
	w uint64
}

// wquantile returns the p-quantile (nearest rank) of vals, vals[i] standing
// for ws[i] requests: percentile of the vals repeated by their weights,
// without repeating them. With ws nil (every weight equal: see weightsOf)
// it is selectPercentile(vals, p). It reorders vals; buf is scratch.
func wquantile(vals []float64, ws []uint64, p float64, buf *[]weighted) float64 {
	var q [1]float64
	wquantiles(vals, ws, []float64{p}, q[:], buf)
	return q[0]
}

// wquantiles is wquantile for several quantiles ps at once (one sort), into
// out.
func wquantiles(vals []float64, ws []uint64, ps, out []float64, buf *[]weighted) {
	if ws == nil {
		for i, p := range ps {
			out[i] = selectPercentile(vals, p)
		}
		return
	}
	if len(vals) == 0 {
		clear(out)
		return
	}
	b := (*buf)[:0]
	var total uint64
	for i, v := range vals {
		b = append(b, weighted{v, ws[i]})
		total += ws[i]
	}
	*buf = b
	slices.SortFunc(b, func(x, y weighted) int { return cmp.Compare(x.v, y.v) })
	for i, p := range ps {
		rank := uint64(max(1, math.Ceil(p*float64(total))))
		out[i] = b[len(b)-1].v
		var cum uint64
		for _, x := range b {
			cum += x.w
			if cum >= rank {
				out[i] = x.v
				break
			}
		}
	}
}

// devBusy returns the time at least one request of the device was in
// flight over set: the union of the samples' intervals when every sample
// stands for itself. When some stand for N requests, the union of the
// streamed ones misses the time only unstreamed requests were in flight
// (1 MiB direct reads at depth 4 streamed 1 in 8 cover half the time), and
// a throughput over it would read N/depth times too high. It is then
// estimated request by request: a request of latency L that completed with
// d requests of its block device in flight (Record.Depth, the kernel's
// count, itself included) shares its time with them and accounts for L/d
// of busy time; summed with the weights, kept between the union of the
// streamed intervals (a lower bound) and the set's span. A depth of 0
// (unknown) counts as 1.
func (d *Detector) devBusy(set []sample) int64 {
	sc := &d.sc
	sc.ivals = sc.ivals[:0]
	for i := range set {
		sc.ivals = append(sc.ivals, [2]int64{set[i].issue(), set[i].complete})
	}
	union := busyNS(sc.ivals)
	if unitWeights(set) || len(set) == 0 {
		return union
	}
	first, last := set[0].issue(), set[0].complete
	var est float64
	for i := range set {
		s := &set[i]
		first, last = min(first, s.issue()), max(last, s.complete)
		est += float64(s.w()) * float64(s.lat) / float64(max(s.depth, 1))
	}
	return max(union, min(int64(est), last-first))
}

// devSetStats fills dst's request count, bytes, percentiles, mean size and
// depth and busy throughput over a device window, and returns the
// device's busy time and the requests' summed latency (weighted: with the
// busy time, Little's law's mean in flight).
func (d *Detector) devSetStats(set []sample, dst *DeviceStats) (int64, float64) {
	if unitWeights(set) {
		return d.setStats(set, nil, &dst.Requests, &dst.Bytes, &dst.P50, &dst.P95, &dst.P99, &dst.MeanSize, &dst.MeanDepth, &dst.BusyThroughput)
	}
	sc := &d.sc
	sc.vals = sc.vals[:0]
	sc.ws = sc.ws[:0]
	var b, wn uint64
	var depth, sumLat float64
	for i := range set {
		s := &set[i]
		w := s.w()
		b += uint64(s.bytes) * w
		wn += w
		depth += float64(s.depth) * float64(w)
		sumLat += float64(s.lat) * float64(w)
		sc.vals = append(sc.vals, float64(s.lat))
		sc.ws = append(sc.ws, w)
	}
	dst.Requests, dst.Bytes = wn, b
	var q [3]float64
	wquantiles(sc.vals, weightsOf(sc.ws), []float64{0.50, 0.95, 0.99}, q[:], &sc.wbuf)
	dst.P50, dst.P95, dst.P99 = durNS(q[0]), durNS(q[1]), durNS(q[2])
	dst.MeanSize = float64(b) / float64(wn)
	dst.MeanDepth = depth / float64(wn)
	busy := d.devBusy(set)
	if busy > 0 {
		dst.BusyThroughput = float64(b) / (float64(busy) / 1e9)
	}
	return busy, sumLat
}

// weightsOf returns the weights to pass wquantile for values gathered
// from samples with weights ws: nil when they are all equal (the quantile
// is then the plain one, found by selection without sorting: a device
// read only by direct I/O above its budget has every record of one
// weight).
func weightsOf(ws []uint64) []uint64 {
	for _, w := range ws {
		if w != ws[0] {
			return ws
		}
	}
	return nil
}
