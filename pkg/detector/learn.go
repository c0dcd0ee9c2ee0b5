package detector

// Learning a device's healthy baseline from the windows no regime explains.

import (
	"slices"
)

// learn folds a healthy window into the device baseline: per size class,
// requests not explained by a per-file regime and not right after a jump.
// Sequential files whose median stands apart from the rest (ShiftMult
// times the class reference: the learned median, or this window's before
// one is learned) are left out too: a file that is slow from the moment the
// daemon starts is not yet a shift candidate, and learning its latency as
// healthy would hide its shift for good. Random readers stay in: their
// small requests queue behind the streams' and are slower by nature, and
// leaving them out would make them look shifted against the rest.
func (d *Detector) learn(ds *deviceState, devSet []sample, devBusy int64, explained func(int32) bool, aggOf func(int32) *fileAgg) {
	cfg := &d.cfg
	var perClass [maxClass + 1][]float64
	// Each latency's weight, where a class mixes samples streamed one by
	// one with samples standing for N requests (weighted.go).
	var perClassW [maxClass + 1][]uint64
	mixed := !unitWeights(devSet)
	collect := func(skip func(*sample) bool) {
		for c := range perClass {
			perClass[c] = perClass[c][:0]
			perClassW[c] = perClassW[c][:0]
		}
		for i := range devSet {
			s := &devSet[i]
			if s.flags&flagPostJump != 0 || explained(s.slot) || skip(s) {
				continue
			}
			perClass[s.class] = append(perClass[s.class], float64(s.lat))
			if mixed {
				perClassW[s.class] = append(perClassW[s.class], s.w())
			}
		}
	}
	sc := &d.sc
	// classQ returns the p-quantiles of class c's latencies (sorting them).
	var qbuf [3]float64
	classQ := func(c int, ps ...float64) []float64 {
		xs := perClass[c]
		out := qbuf[:len(ps)]
		if ws := weightsOf(perClassW[c]); mixed && ws != nil {
			wquantiles(xs, ws, ps, out, &sc.wbuf)
			return out
		}
		slices.Sort(xs)
		for i, p := range ps {
			out[i] = percentile(xs, p)
		}
		return out
	}
	collect(func(*sample) bool { return false })
	var ref [maxClass + 1]float64
	for c := range perClass {
		if cb := d.classRef(ds, uint8(c)); cb != nil {
			ref[c] = cb.p50
		} else if len(perClass[c]) >= cfg.BaselineMinSamples {
			ref[c] = classQ(c, 0.5)[0]
		}
	}
	apart := func(s *sample) bool {
		a := aggOf(s.slot)
		if a == nil || a.stats.Requests < uint64(cfg.FileMinSamples) || a.stats.Sequentiality < cfg.StarvedMinSequential {
			return false
		}
		r := ref[a.domClass]
		return r > 0 && float64(a.stats.P50) >= cfg.ShiftMult*r
	}
	collect(apart)
	var sumLat, depth float64
	var n int
	var wn uint64
	for i := range devSet {
		s := &devSet[i]
		if s.flags&flagPostJump != 0 || explained(s.slot) || apart(s) {
			continue
		}
		sumLat += float64(s.lat) * float64(s.w())
		depth += float64(s.depth) * float64(s.w())
		wn += s.w()
		n++
	}
	for c := range perClass {
		xs := perClass[c]
		if len(xs) < cfg.BaselineMinSamples {
			continue
		}
		q := classQ(c, 0.5, 0.95, 0.99)
		ds.base.learnClass(uint8(c), q[0], q[1], q[2], len(xs) >= cfg.TailMinSamples, cfg.BaselineAlpha)
	}
	if n >= cfg.BaselineMinSamples && devBusy > 0 {
		ds.base.learnInflight(sumLat/float64(devBusy), depth/float64(wn), cfg.BaselineAlpha)
	}
}

func (d *Detector) fillBaselines(ds *deviceState, devSet []sample, dst *DeviceStats) {
	cfg := &d.cfg
	var classN [maxClass + 1]int
	for i := range devSet {
		classN[devSet[i].class]++
	}
	best, bestScore := -1, -1
	for c := range ds.base.classes {
		cb := &ds.base.classes[c]
		if cb.windows == 0 {
			continue
		}
		learned := cb.learned(cfg.BaselineMinWindows)
		dst.Baselines = append(dst.Baselines, ClassBaseline{Class: uint8(c), P50: durNS(cb.p50), P95: durNS(cb.p95), P99: durNS(cb.p99), Windows: cb.windows, Learned: learned})
		if learned {
			dst.BaselineLearned = true
			score := classN[c]*1_000_000 + cb.windows
			if score > bestScore {
				best, bestScore = c, score
			}
		}
	}
	if best >= 0 {
		cb := &ds.base.classes[best]
		dst.BaselineP50, dst.BaselineP95, dst.BaselineP99 = durNS(cb.p50), durNS(cb.p95), durNS(cb.p99)
	}
	if ds.base.inflightN >= cfg.BaselineMinWindows {
		dst.BaselineInflight = ds.base.inflight
	}
	dst.CapacityBPS = ds.base.capacity
}
