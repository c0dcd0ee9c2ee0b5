package detector

// Regimes of one file: its latency shifted against the device's baseline
// and its peers, slow starts of its extents, a stream starved by too few
// requests in flight.

import (
	"fmt"
	"slices"
	"time"
)

func (d *Detector) stepShift(ds *deviceState, f *fileState, a *fileAgg, peerN50, peerT95 float64, peerN, shiftedFiles int, others func() (float64, int), devBT, devMeanSize float64, now int64) {
	cfg := &d.cfg
	switch {
	case !a.inShort && f.shift.candidate():
		f.shift.step(belowExit, now, cfg, 0, "")
		return
	case a.nl < cfg.FileMinSamples:
		f.shift.step(unknown, now, cfg, 0, "")
		return
	case a.n50 < cfg.ShiftExitMult:
		ev := ""
		if f.shift.candidate() {
			ev = fmt.Sprintf("file %s: its %d requests take median %.2fx the device's healthy baseline (exit below %.2fx)", f.key, a.nl, a.n50, cfg.ShiftExitMult)
		}
		f.shift.step(belowExit, now, cfg, 0, ev)
		return
	case f.shift.candidate() && a.recentN >= cfg.FileMinSamples && a.recentN50 < cfg.ShiftExitMult:
		// Its latest requests are back to normal: the slowdown ended
		// (ExitAfter such evaluations in a row clear it).
		f.shift.step(belowExit, now, cfg, 0, fmt.Sprintf("file %s: its latest %d requests take median %.2fx the device's healthy baseline (exit below %.2fx)",
			f.key, a.recentN, a.recentN50, cfg.ShiftExitMult))
		return
	}
	ref := &ds.base.classes[a.domClass]
	ev := fmt.Sprintf("file %s: median %s = %.2fx and p95 %s = %.2fx the device's healthy baseline for %s requests (baseline median %s, p95 %s; %d requests)",
		f.key, a.stats.P50, a.n50, a.stats.P95, a.t95, className(a.domClass), fmtDur(ref.p50), fmtDur(ref.p95), a.nl)
	otherShifted := shiftedFiles
	if a.shifted && a.inShort {
		otherShifted--
	}
	saturated := ds.base.capacity > 0 && devBT >= cfg.StarvedDeviceSpare*ds.base.capacity
	if f.shift.active && otherShifted > 0 && peerN < cfg.PeerMinSamples && !saturated {
		// No file is normal: the others are slow too. A shift entered
		// while they were normal ends once the file is no longer apart
		// from them (the device slowed as a whole: its regimes say so).
		// On a busy lab host the file stood at 1.4-2.8x its baseline for
		// 10 s after its slowdown ended, the others at 0.9-1.1x its
		// median; during the slowdown at 1.4-1.8x theirs. Not on a
		// saturated device: there every request queues behind the
		// bytes ahead of it, the file's and the others' alike (held
		// below).
		if on50, on := others(); on >= cfg.PeerMinSamples && a.n50 < cfg.PeerMult*on50 {
			f.shift.step(belowExit, now, cfg, 0, ev+fmt.Sprintf("; no longer apart from the device's other requests (median %.2fx baseline, %d requests, %d other files slow too)", on50, on, otherShifted))
			return
		}
	}
	if !a.shifted {
		f.shift.step(between, now, cfg, 0, ev)
		return
	}
	if capBPS := ds.base.capacity; capBPS > 0 && devBT >= cfg.StarvedDeviceSpare*capBPS {
		// The device is bandwidth-saturated: every request waits for the
		// bytes queued ahead of it, so latency says nothing about a
		// per-request shift (it would look the same with or without one).
		// Hold an active shift (a larger window the tuner set keeps the
		// channel busy; backing off is how the tuner finds out) and do not
		// enter one.
		queue := a.stats.MeanDepth * devMeanSize / capBPS
		if a.stats.P50.Seconds() <= cfg.ShiftMult*queue {
			ev += fmt.Sprintf("; device saturated (%s of %s): the median is explained by queueing behind %.1f requests (%s), holding",
				fmtRate(devBT), fmtRate(capBPS), a.stats.MeanDepth, fmtDur(queue*1e9))
			if f.shift.active {
				f.shift.evidence = ev
				f.shift.step(unknown, now, cfg, 0, ev)
			} else {
				f.shift.step(between, now, cfg, 0, ev)
			}
			return
		}
	}
	if depthCap, ok := d.depthCap(ds); !f.shift.active && ok && a.stats.MeanDepth > depthCap {
		// Its latency rose with the queue: queueing, not the file.
		f.shift.step(between, now, cfg, 0, ev+fmt.Sprintf("; but its requests saw depth %.1f against a healthy %.1f", a.stats.MeanDepth, ds.base.depth))
		return
	}
	tailMargin := a.t95 / cfg.ShiftTailMult
	if cfg.ShiftBodyMult > 0 {
		tailMargin = max(tailMargin, a.n25/cfg.ShiftBodyMult)
	}
	margin := min(a.n50/cfg.ShiftMult, tailMargin)
	if peerN >= cfg.PeerMinSamples {
		// Apart from its peers: its median PeerMult above theirs, and its
		// p95 above their p95 or its lower quartile above their median (a
		// host's stalls land on the file's requests and the peers' alike,
		// and their p95 says which were in flight, not which is slower).
		apart := a.t95 / (cfg.PeerMult * max(peerT95, 1e-9))
		if cfg.bodyApart(a.n25, peerN50) {
			apart = max(apart, a.n25/(cfg.PeerMult*max(peerN50, 1e-9)))
		}
		if peerN50 >= cfg.ShiftMult || a.n50 < cfg.PeerMult*peerN50 || apart < 1 {
			// Others are slow too (device-wide) or the file is not clearly
			// apart from its peers: not a file-level shift; hold.
			f.shift.step(between, now, cfg, 0, ev+fmt.Sprintf("; peers not normal: median %.2fx, p95 %.2fx baseline", peerN50, peerT95))
			return
		}
		margin = min(margin, a.n50/(cfg.PeerMult*max(peerN50, 1e-9)), apart)
		ev += fmt.Sprintf("; other files normal: median %.2fx, p95 %.2fx baseline (%d requests)", peerN50, peerT95, peerN)
		f.shift.step(aboveEntry, now, cfg, confidence(margin, a.nl, cfg.FileMinSamples), ev)
		return
	}
	if shiftedFiles > 1 && !f.shift.active {
		// No normal peer, but other files are as slow: device-wide.
		f.shift.step(between, now, cfg, 0, ev+fmt.Sprintf("; %d files are slow at once: not a file-level shift", shiftedFiles))
		return
	}
	if !cfg.LoneFileShift {
		f.shift.step(between, now, cfg, 0, ev+"; no other file active to compare with")
		return
	}
	f.shift.step(aboveEntry, now, cfg, 0.7*confidence(margin, a.nl, cfg.FileMinSamples), ev+"; no other file active to compare with")
}

func (d *Detector) stepExtent(ds *deviceState, f *fileState, a *fileAgg, win []sample, nShort int, now int64) {
	cfg := &d.cfg
	if !a.inShort {
		if f.extent.candidate() {
			f.extent.step(belowExit, now, cfg, 0, "")
		}
		return
	}
	if a.stats.Sequentiality < cfg.ExtentMinSequential {
		// A random reader (4 KB mmap faults, say) is not one whose reads
		// find new extents: clear what a sequential phase may have entered.
		if f.extent.candidate() {
			f.extent.step(belowExit, now, cfg, 0, fmt.Sprintf("file %s: sequential %.0f%%, below %.0f%%: not judged for extent starts", f.key, 100*a.stats.Sequentiality, 100*cfg.ExtentMinSequential))
		}
		return
	}
	if f.extent.candidate() {
		// The end is judged on the post-jump requests of the latest
		// quarter window: over the whole window, those before the end keep
		// the median up for half a window.
		nRecent := 0
		for nRecent < nShort && win[nRecent].complete > now-int64(cfg.Window)/4 {
			nRecent++
		}
		if v, _, ev := d.judgeExtent(f, a, win, nRecent, now); v == belowExit {
			f.extent.step(belowExit, now, cfg, 0, ev)
			return
		}
	}
	v, conf, ev := d.judgeExtent(f, a, win, nShort, now)
	f.extent.step(v, now, cfg, conf, ev)
}

// judgeExtent compares a sequential file's requests right after jumps
// with its steady ones. Evaluate steps the regime with it; FastPath uses it
// for entry only.
func (d *Detector) judgeExtent(f *fileState, a *fileAgg, win []sample, nShort int, now int64) (verdict, float64, string) {
	cfg := &d.cfg
	sc := &d.sc
	// Post-jump requests: those in the short window, extended back to
	// ExtentMinSamples; steady requests: the rest of the file's window.
	sc.vals, sc.vals2 = sc.vals[:0], sc.vals2[:0]
	var jumps, crossings int
	oldest := now
	for _, i := range a.all {
		s := &win[i]
		if s.flags&flagPostJump == 0 {
			continue
		}
		if int(i) < nShort || len(sc.vals) < cfg.ExtentMinSamples {
			sc.vals = append(sc.vals, float64(s.lat))
			if s.flags&flagJump != 0 {
				jumps++
			}
			if s.flags&flagCross != 0 {
				crossings++
			}
			oldest = min(oldest, s.complete)
		}
	}
	for _, i := range a.set {
		if s := &win[i]; s.flags&flagPostJump == 0 {
			sc.vals2 = append(sc.vals2, float64(s.lat))
		}
	}
	if len(sc.vals) < cfg.ExtentMinSamples || crossings < 2 || len(sc.vals2) < cfg.ExtentMinSamples {
		return unknown, 0, ""
	}
	slices.Sort(sc.vals)
	slices.Sort(sc.vals2)
	post, steady := percentile(sc.vals, 0.5), percentile(sc.vals2, 0.5)
	medRatio := post / max(steady, 1)
	// The slower of two views must both agree: a device whose requests
	// fall in two latency modes (one served at once, one queued behind
	// another) has a median that jumps between the modes when a sample's
	// share of the upper one crosses half. A healthy fragmented file's
	// post-jump median then read 1.65x its steady one while the trimmed
	// means stayed within 1.33x; an extent start lifts both (2.2-2.6x).
	tmRatio := trimmedMean(sc.vals) / max(trimmedMean(sc.vals2), 1)
	ratio := min(medRatio, tmRatio)
	sc.extentRatio, sc.extentCrossings = ratio, crossings
	ev := fmt.Sprintf("file %s: the first %d requests after each of %d jumps (%d of them extent crossings) in the last %s take median %s, %.2fx the file's steady median %s (trimmed means %.2fx); %d extent crossings seen since tracked",
		f.key, cfg.ExtentRequests, jumps, crossings, time.Duration(now-oldest).Round(time.Millisecond), fmtDur(post), medRatio, fmtDur(steady), tmRatio, f.crossings)
	switch {
	case ratio >= cfg.ExtentMult:
		return aboveEntry, confidence(ratio/cfg.ExtentMult, len(sc.vals), cfg.ExtentMinSamples), ev
	case ratio < cfg.ExtentExitMult:
		return belowExit, 0, ev
	default:
		return between, 0, ev
	}
}

func (d *Detector) stepStarved(ds *deviceState, f *fileState, a *fileAgg, devBT float64, now int64) {
	cfg := &d.cfg
	st := &a.stats
	capBPS := ds.base.capacity
	if !a.inShort {
		if f.starved.candidate() {
			f.starved.step(belowExit, now, cfg, 0, "")
		}
		return
	}
	if capBPS <= 0 || st.Requests < uint64(cfg.FileMinSamples) || st.BusyThroughput <= 0 || st.MeanSize <= 0 {
		f.starved.step(unknown, now, cfg, 0, "")
		return
	}
	// The median, not the mean: robust to a window that straddles the onset
	// and to a few slow requests.
	lat := st.P50.Seconds()
	needed := lat * capBPS / st.MeanSize
	bound := st.Inflight * st.MeanSize / lat
	ev := fmt.Sprintf("file %s: sequential %.0f%%, %.1f requests of %s in flight at median latency %s bound it to %s (measured %s while busy); hiding that latency at the device's capacity %s needs %.1f in flight (device busy at %s)",
		f.key, 100*st.Sequentiality, st.Inflight, fmtBytes(st.MeanSize), st.P50.Round(time.Microsecond), fmtRate(bound), fmtRate(st.BusyThroughput), fmtRate(capBPS), needed, fmtRate(devBT))
	switch {
	case st.Sequentiality < cfg.StarvedMinSequential || st.Inflight >= cfg.StarvedExitFrac*needed || st.BusyThroughput >= cfg.StarvedDeviceSpare*capBPS ||
		devBT >= cfg.StarvedDeviceSpare*capBPS:
		// A saturated device has no spare bandwidth for a larger window to
		// use: the stream is not starved (holding here would keep a regime
		// entered in a brief lull alive while the device stays busy).
		f.starved.step(belowExit, now, cfg, 0, ev)
	case st.Inflight < cfg.StarvedInflightFrac*needed && st.BusyThroughput < cfg.StarvedThroughputFrac*capBPS && devBT < cfg.StarvedDeviceSpare*capBPS &&
		busyShare(st, cfg.Window) >= cfg.StarvedMinBusy:
		margin := min(cfg.StarvedInflightFrac*needed/st.Inflight, cfg.StarvedThroughputFrac*capBPS/st.BusyThroughput)
		f.starved.step(aboveEntry, now, cfg, confidence(margin, int(st.Requests), cfg.FileMinSamples), ev)
	default:
		f.starved.step(between, now, cfg, 0, ev)
	}
}

// busyShare is the share of the window the file had a request in flight:
// its throughput over the window against its throughput while busy.
func busyShare(st *FileStats, window time.Duration) float64 {
	if st.BusyThroughput <= 0 {
		return 0
	}
	return float64(st.Bytes) / window.Seconds() / st.BusyThroughput
}
