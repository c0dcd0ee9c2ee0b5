package detector

// Regimes of a device: its tail inflated, or its latency rising with other
// readers' load (contention).

import (
	"fmt"
	"time"
)

// stepDevice steps a device-level regime with its check's verdict; a device
// with nothing read in the window clears what is active or pending.
func (d *Detector) stepDevice(h *hyst, now int64, v verdict, conf float64, ev string) {
	if v == idle {
		if h.candidate() {
			h.step(belowExit, now, &d.cfg, 0, "")
		}
		return
	}
	h.step(v, now, &d.cfg, conf, ev)
}

// tailCheck judges tail inflation over devSet (the window, extended to
// DeviceMinSamples; its first nShort samples are within Window). Evaluate
// steps the regime with it; FastPath uses it for entry only.
func (d *Detector) tailCheck(ds *deviceState, devSet []sample, nShort int, devBusy, now int64, explained func(int32) bool) (verdict, float64, string) {
	cfg := &d.cfg
	sc := &d.sc
	if nShort == 0 {
		return idle, 0, ""
	}
	sc.vals, sc.ws = sc.vals[:0], sc.ws[:0]
	var wAll, wExcess uint64 // requests the samples stand for
	var quarters [4]bool
	oldest := devSet[len(devSet)-1].complete
	span := max(now-oldest, int64(cfg.Window))
	start := now - span
	srcAll := map[int32]int{}
	srcExcess := map[int32]bool{}
	var sumLat float64
	nExplained := 0
	for i := range devSet {
		s := &devSet[i]
		if explained(s.slot) {
			nExplained++
		}
		if s.flags&flagPostJump != 0 || explained(s.slot) {
			continue
		}
		sumLat += float64(s.lat) * float64(s.w())
		cb := &ds.base.classes[s.class]
		if !cb.learned(cfg.DeviceRegimeMinWindows) || !cb.tailLearned(cfg.DeviceRegimeMinWindows) {
			continue
		}
		sc.vals = append(sc.vals, float64(s.lat)/cb.p50)
		sc.ws = append(sc.ws, s.w())
		wAll += s.w()
		srcAll[s.slot]++
		if float64(s.lat) > cfg.TailMult*cb.p99 {
			wExcess += s.w()
			srcExcess[s.slot] = true
			q := (s.complete - start) * 4 / span
			quarters[max(0, min(q, 3))] = true
		}
	}
	n := len(sc.vals)
	if n < cfg.TailMinSamples {
		return unknown, 0, ""
	}
	// Shares and the median of the requests the samples stand for.
	n50 := wquantile(sc.vals, weightsOf(sc.ws), 0.5, &sc.wbuf)
	share := float64(wExcess) / float64(wAll)
	spread := 0
	for _, q := range quarters {
		if q {
			spread++
		}
	}
	active := 0
	for _, c := range srcAll {
		if c >= 3 {
			active++
		}
	}
	ev := fmt.Sprintf("device %s: %.1f%% of %d requests exceed %.1fx their size class's baseline p99 (entry at %.0f%%, healthy: <1%%), spread over %d of 4 quarters of the last %s, from %d of %d active sources; median %.2fx baseline",
		ds.dev, 100*share, n, cfg.TailMult, 100*cfg.TailShare, spread, time.Duration(span).Round(time.Millisecond), len(srcExcess), active, n50)
	// Requests in flight as contention counts them: a tail that comes with
	// a queue (the first second of a contention, before its median rises:
	// requests waiting behind large transfers) is queueing, not the device
	// stalling; a stall of a few percent of requests barely raises them.
	queued := false
	if base := &ds.base; base.inflightN >= cfg.BaselineMinWindows && base.inflight > 0 && devBusy > 0 {
		if inflight := sumLat / float64(devBusy); inflight >= cfg.ContentionDepthMult*base.inflight && inflight >= base.inflight+1 {
			queued = true
			ev += fmt.Sprintf("; but %.1f requests in flight against a healthy %.1f: queueing", inflight, base.inflight)
		}
	}
	// Beside a file in a file regime (whose window the tuner may have
	// widened), a lone other reader's slow requests are as likely its
	// queueing behind that file's transfers: a device stall needs two
	// sources then.
	lone := nExplained > 0 && len(srcExcess) < 2
	if lone && share >= cfg.TailShare {
		ev += fmt.Sprintf("; but %d requests are a file regime's and the excess comes from one other source", nExplained)
	}
	switch {
	case share < cfg.TailExitShare:
		return belowExit, 0, ev
	case share >= cfg.TailShare && n50 <= cfg.TailMedianMax && spread >= cfg.TailSpread && (active < 2 || len(srcExcess) >= 2) && !queued && !lone:
		return aboveEntry, confidence(share/cfg.TailShare, n, cfg.TailMinSamples), ev
	default:
		return between, 0, ev
	}
}

// contentionCheck judges contention over devSet (busy for devBusy ns), as
// tailCheck does tail inflation.
func (d *Detector) contentionCheck(ds *deviceState, devSet []sample, devBusy int64, explained func(int32) bool) (verdict, float64, string) {
	cfg := &d.cfg
	sc := &d.sc
	base := &ds.base
	if len(devSet) == 0 || devBusy <= 0 {
		return idle, 0, ""
	}
	if base.inflightN < cfg.BaselineMinWindows || base.inflight <= 0 {
		return unknown, 0, ""
	}
	sc.vals, sc.ws = sc.vals[:0], sc.ws[:0]
	var sumLat float64
	// Readers: files, and streams of unattributed requests (O_DIRECT
	// readers are readers too, though the probe cannot name their files).
	if sc.readers == nil {
		sc.readers = map[int64]int{}
	}
	readers := sc.readers
	clear(readers)
	depths := sc.depths[:0]
	for i := range devSet {
		s := &devSet[i]
		if s.flags&flagPostJump != 0 || explained(s.slot) {
			continue
		}
		// Weighted: Little's law over devBusy needs every request's time.
		sumLat += float64(s.lat) * float64(s.w())
		// A reader is a source of at least 3 samples (not requests: one
		// sampled random request stands for N, but is no stream).
		if s.slot == noSlot {
			readers[-1-int64(s.gen)]++
		} else {
			readers[int64(s.slot)]++
		}
		if cb := d.classRef(ds, s.class); cb != nil {
			sc.vals = append(sc.vals, float64(s.lat)/cb.p50)
			sc.ws = append(sc.ws, s.w())
			depths = append(depths, float64(s.depth))
		}
	}
	sc.depths = depths
	if len(sc.vals) < cfg.BaselineMinSamples {
		return unknown, 0, ""
	}
	// Latency against depth: normalised latency of requests issued at
	// above-median depth over that of the others (evidence only).
	sc.depthSel = append(sc.depthSel[:0], depths...)
	medDepth := selectPercentile(sc.depthSel, 0.5)
	var hiSum, loSum float64
	var hiN, loN int
	for i, v := range sc.vals {
		if depths[i] > medDepth {
			hiSum += v
			hiN++
		} else {
			loSum += v
			loN++
		}
	}
	slope := "n/a"
	if hiN > 0 && loN > 0 {
		slope = fmt.Sprintf("%.2fx", (hiSum/float64(hiN))/(loSum/float64(loN)))
	}
	n50 := wquantile(sc.vals, weightsOf(sc.ws), 0.5, &sc.wbuf)
	inflight := sumLat / float64(devBusy)
	nReaders := 0
	for _, c := range readers {
		if c >= 3 {
			nReaders++
		}
	}
	ev := fmt.Sprintf("device %s: median %.2fx baseline with %.1f requests in flight (healthy %.1f) from %d readers not under a per-file regime; latency above the median depth %s that below",
		ds.dev, n50, inflight, base.inflight, nReaders, slope)
	switch {
	case n50 < cfg.ContentionExitMult || inflight < 0.75*cfg.ContentionDepthMult*base.inflight:
		return belowExit, 0, ev
	case n50 >= cfg.ContentionLatencyMult && inflight >= cfg.ContentionDepthMult*base.inflight && inflight >= base.inflight+1 && nReaders >= cfg.ContentionMinReaders:
		margin := min(n50/cfg.ContentionLatencyMult, inflight/(cfg.ContentionDepthMult*base.inflight))
		return aboveEntry, confidence(margin, len(sc.vals), cfg.DeviceMinSamples), ev
	default:
		return between, 0, ev
	}
}
